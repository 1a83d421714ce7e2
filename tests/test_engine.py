"""The engine's graph machinery: import, planning, memory reuse, forward and
backward through fan-out, residuals, shared weights, several inputs and
outputs, re-planning, and its errors. Values are checked against torch."""
import copy
import threading
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from aidge_interop import load_onnx


def _model(nodes, inputs, outputs, inits=(), opset=20):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _residual_model():
    """y = tanh(x * w) + x ; z = y * y (fan-out of x and y, two outputs)."""
    w = np.linspace(-1, 1, 6).reshape(2, 3)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"], name="mul_w"),
        helper.make_node("Tanh", ["xw"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "x"], ["y"], name="residual"),
        helper.make_node("Mul", ["y", "y"], ["z"], name="square"),
    ]
    return _model(nodes, [("x", ["N", 2, 3])], ["y", "z"], [("w", w)]), w


def _residual_torch(x, w):
    y = torch.tanh(x * w) + x
    return y, y * y


@pytest.mark.parametrize("batch", [1, 4])
def test_residual_fanout_two_outputs_forward_backward(batch):
    model, w = _residual_model()
    g = load_onnx(model)
    x = np.random.default_rng(batch).standard_normal((batch, 2, 3))
    y, z = g.forward([x], need_backward=True, input_grads=True)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    yt, zt = _residual_torch(xt, wt)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(z, zt.detach().numpy(), rtol=1e-12)
    gy, gz = np.ones_like(y), np.full_like(z, 0.5)
    (gx,) = g.backward([gy, gz])
    torch.autograd.backward([yt, zt], [torch.tensor(gy), torch.tensor(gz)])
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.grads()["w"], wt.grad.numpy(), rtol=1e-12)


def test_two_batch_sizes_replan_and_grads_accumulate():
    model, w = _residual_model()
    g = load_onnx(model)
    total = np.zeros_like(w)
    for batch in (3, 5, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 2, 3))
        g.forward([x], need_backward=True)
        g.backward([np.ones((batch, 2, 3)), None])
        wt = torch.tensor(w, requires_grad=True)
        (torch.tanh(torch.tensor(x) * wt) + torch.tensor(x)).sum().backward()
        total += wt.grad.numpy()
    np.testing.assert_allclose(g.grads()["w"], total, rtol=1e-12)  # accumulated
    g.zero_grad()
    assert not g.grads()["w"].any()


def test_shared_weight_and_two_inputs():
    """a*w + b*w: one parameter used twice gets the sum of both gradients."""
    w = np.array([0.5, -2.0, 3.0])
    nodes = [helper.make_node("Mul", ["a", "w"], ["aw"]), helper.make_node("Mul", ["b", "w"], ["bw"]),
             helper.make_node("Add", ["aw", "bw"], ["y"])]
    g = load_onnx(_model(nodes, [("a", [3]), ("b", [3])], ["y"], [("w", w)]))
    a, b = np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 4.0])
    (y,) = g.forward([a, b], need_backward=True, input_grads=True)
    np.testing.assert_allclose(y, a * w + b * w)
    ga, gb = g.backward([np.ones(3)])
    np.testing.assert_allclose(ga, w)
    np.testing.assert_allclose(gb, w)
    np.testing.assert_allclose(g.grads()["w"], a + b)


def test_memory_plan_reuses_buffers_in_eval():
    """A chain of 20 Tanh: with liveness reuse the arena holds ~2 buffers,
    with keep_intermediates all 20."""
    nodes = [helper.make_node("Tanh", [f"v{i}"], [f"v{i + 1}"]) for i in range(20)]
    x = np.random.default_rng(0).standard_normal((64, 64))
    g = load_onnx(_model(nodes, [("v0", [64, 64])], ["v20"]))
    (y,) = g.forward([x])
    ref = x
    for _ in range(20):
        ref = np.tanh(ref)
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    one = x.nbytes
    reused = g.memory_stats()["arena_bytes"]
    assert reused <= 2 * one + 128
    with pytest.raises(ValueError, match="overwritten"):
        g.intermediate("v5")
    g.keep_intermediates = True
    g.forward([x])
    assert g.memory_stats()["arena_bytes"] >= 20 * one
    np.testing.assert_allclose(g.intermediate("v5"), np.tanh(np.tanh(np.tanh(np.tanh(np.tanh(x))))))


def _conv_bn_relu_model():
    """x -> Conv -> BatchNorm (training) -> Relu -> Flatten -> Gemm -> y."""
    rng = np.random.default_rng(7)
    inits = {"w": rng.normal(0, 0.5, (4, 2, 3, 3)), "scale": rng.uniform(0.5, 1.5, 4),
             "shift": rng.normal(0, 0.5, 4), "mean": np.zeros(4), "var": np.ones(4),
             "fc": rng.normal(0, 0.3, (3, 4 * 5 * 5))}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"],
                         ["b"], name="bn", training_mode=1),
        helper.make_node("Relu", ["b"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc", transB=1),
    ]
    return _model(nodes, [("x", ["N", 2, 5, 5])], ["y"], list(inits.items())), inits


def test_results_held_keep_their_values_and_released_ones_are_reused():
    """A result the caller still holds (or a view of it) is never the next
    forward's output; once released, the next forward writes into its
    memory (no allocation), with the right values."""
    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])]
    g = load_onnx(_model(nodes, [("x", [3, 4])], ["y"]))
    xs = np.random.default_rng(3).standard_normal((4, 3, 4))
    want = np.tanh(xs) * xs
    ptr = lambda a: a.__array_interface__["data"][0]  # noqa: E731

    (y0,) = g.forward([xs[0]])
    y0_copy = y0.copy()
    (y1,) = g.forward([xs[1]])  # y0 is held: y1 has memory of its own
    assert ptr(y1) != ptr(y0)
    view, p1 = y1[1:], ptr(y1)
    view_copy = view.copy()
    del y1
    (y2,) = g.forward([xs[2]])  # a view of y1 is held
    assert ptr(y2) != p1
    p2 = ptr(y2)
    del y2
    (y3,) = g.forward([xs[3]])  # nothing holds y2: its memory is y3's
    assert ptr(y3) == p2
    np.testing.assert_array_equal(y0, y0_copy)
    np.testing.assert_array_equal(view, view_copy)
    for got, want_i in ((y0, want[0]), (view, want[1][1:]), (y3, want[3])):
        np.testing.assert_allclose(got, want_i, rtol=1e-14, atol=0)

    # input gradients: the same rule (d/dx tanh(x) x = (1 - tanh^2) x + tanh)
    def grad(i):
        g.forward([xs[i]], need_backward=True, input_grads=True)
        return g.backward([np.ones((3, 4))])[0]

    want_dx = (1 - np.tanh(xs) ** 2) * xs + np.tanh(xs)
    dx0 = grad(0)
    dx0_copy = dx0.copy()
    dx1 = grad(1)
    assert ptr(dx1) != ptr(dx0)
    p1 = ptr(dx1)
    del dx1
    dx2 = grad(2)
    assert ptr(dx2) == p1
    np.testing.assert_array_equal(dx0, dx0_copy)
    for got, want_i in ((dx0, want_dx[0]), (dx2, want_dx[2])):
        np.testing.assert_allclose(got, want_i, rtol=1e-13, atol=0)

    # the same through torch tensors (DLPack results of a wrapped module)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    am = aidge_interop.wrap(copy.deepcopy(model), [(3, 4)])
    xt = torch.tensor(xs, dtype=torch.float32)
    with torch.no_grad():
        outs = [am(x) for x in xt]
        for i in range(len(xt)):
            torch.testing.assert_close(outs[i], model(xt[i]))
        assert len({o.data_ptr() for o in outs}) == len(outs)
        p = outs[-1].data_ptr()
        del outs
        again = am(xt[0])
        assert again.data_ptr() == p
        torch.testing.assert_close(again, model(xt[0]))
    # gradients torch accumulates into x.grad: the first one becomes x.grad
    # (held), the later ones are added to it and released
    xg, xr = xt[1].clone().requires_grad_(), xt[1].clone().requires_grad_()
    for _ in range(3):
        am(xg).square().sum().backward()
        model(xr).square().sum().backward()
        torch.testing.assert_close(xg.grad, xr.grad)


def test_training_plan_frees_what_no_backward_reads():
    """With need_backward, a value that no backward reads (the BatchNorm's
    output: Relu's gradient reads Relu's output, the BatchNorm's its input)
    dies at its last forward use; the values backward reads stay, and the
    gradients are torch's."""
    proto, v = _conv_bn_relu_model()
    g = load_onnx(proto)
    g.training = True
    x = np.random.default_rng(8).standard_normal((3, 2, 5, 5))
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    with pytest.raises(ValueError, match="overwritten"):
        g.intermediate("b")
    xt = torch.tensor(x, requires_grad=True)
    w, fc = (torch.tensor(v[k], requires_grad=True) for k in ("w", "fc"))
    c = torch.nn.functional.conv2d(xt, w, padding=1)
    b = torch.nn.functional.batch_norm(c, None, None, torch.tensor(v["scale"]),
                                       torch.tensor(v["shift"]), training=True)
    r = torch.relu(b)
    ref = r.flatten(1) @ fc.T
    np.testing.assert_allclose(y, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g.intermediate("c"), c.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g.intermediate("r"), r.detach().numpy(), rtol=1e-10, atol=1e-12)
    gy = np.random.default_rng(9).standard_normal(y.shape)
    (dx,) = g.backward([gy])
    ref.backward(torch.tensor(gy))
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    for name, t in (("w", w), ("fc", fc)):
        np.testing.assert_allclose(g.grads()[name], t.grad.numpy(), rtol=1e-9, atol=1e-12)
    g.keep_intermediates = True  # every value readable again
    g.forward([x], need_backward=True)
    np.testing.assert_allclose(g.intermediate("b"), b.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["lenet", "kws", "mobilenet", "resnet", "perceptron"])
def test_dead_values_are_not_read_by_backward(name, monkeypatch):
    """The operators' AI_OP_BWD_NO_X / NO_Y declarations: a training step
    of each model gives exactly the gradients of a plan that frees nothing
    (keep_intermediates), with every value that dies before backward filled
    with NaN as it dies (AIDGE_INTEROP_POISON_DEAD) or reused."""
    from models import SAMPLE_SHAPES

    factory, shape = SAMPLE_SHAPES[name]
    net = factory().train()
    x = torch.randn((2,) + shape, generator=torch.Generator().manual_seed(3))
    results = []
    for poison in (False, True):
        if poison:
            monkeypatch.setenv("AIDGE_INTEROP_POISON_DEAD", "1")
        am = aidge_interop.wrap(copy.deepcopy(net), [tuple(x.shape)])
        am._graph.keep_intermediates = not poison  # the reference keeps every value
        xg = x.clone().requires_grad_(True)
        out = am(xg)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), xg.grad, [p.grad.clone() for p in am.parameters()]))
    (y0, dx0, g0), (y1, dx1, g1) = results
    assert torch.equal(y0, y1) and torch.equal(dx0, dx1)
    assert len(g0) == len(g1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert torch.isfinite(dx1).all()


def test_nodes_report_shapes_after_forward():
    model, _ = _residual_model()
    g = load_onnx(model)
    g.forward([np.zeros((2, 2, 3))])
    by_name = {n["name"]: n for n in g.nodes()}
    assert by_name["residual"]["op_type"] == "Add"
    assert by_name["residual"]["output_shapes"] == [(2, 2, 3)]
    assert by_name["mul_w"]["input_shapes"] == [(2, 2, 3), (2, 3)]


def test_constant_node_and_integer_initializer_are_constants():
    c = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([2.0, 3.0])))
    g = load_onnx(_model([c, helper.make_node("Mul", ["x", "c"], ["y"])], [("x", [2])], ["y"]))
    assert "c" not in g.parameters()
    np.testing.assert_allclose(g.forward([np.array([1.0, 1.0])])[0], [2.0, 3.0])
    assert g.memory_stats()["planned_nodes"] == 1


# ---------------------------------------------------------------- errors

def test_unknown_operator_names_op_node_and_opset():
    node = helper.make_node("FancyOp", ["x"], ["y"], name="my_node")
    with pytest.raises(NotImplementedError, match=r"FancyOp.*my_node.*opset 20"):
        load_onnx(_model([node], [("x", [2])], ["y"]))


def test_dangling_value_is_named():
    node = helper.make_node("Add", ["x", "nowhere"], ["y"], name="add1")
    with pytest.raises(ValueError, match=r"add1.*nowhere.*dangling"):
        load_onnx(_model([node], [("x", [2])], ["y"]))


def test_cycle_is_an_error():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
             helper.make_node("Tanh", ["a"], ["b"], name="n2")]
    with pytest.raises(ValueError, match="cycle"):
        load_onnx(_model(nodes, [("x", [2])], ["a"]))


def test_wrong_inputs_are_named():
    model, _ = _residual_model()
    g = load_onnx(model)
    with pytest.raises(ValueError, match="takes 1 inputs"):
        g.forward([np.zeros((1, 2, 3)), np.zeros(1)])
    with pytest.raises(TypeError, match="'x' expects float64, got float32"):
        g.forward([np.zeros((1, 2, 3), np.float32)])
    with pytest.raises(ValueError, match=r"graph input 'x' has shape \(1, 4, 3\), the model "
                       r"declares \(\?, 2, 3\): dim 1 is 4, 2 expected"):
        g.forward([np.zeros((1, 4, 3))])
    model.graph.input[0].type.tensor_type.ClearField("shape")  # undeclared: the node says why
    with pytest.raises(ValueError, match=r"mul_w.*broadcast"):
        load_onnx(model).forward([np.zeros((1, 4, 3))])


def test_backward_needs_a_forward_with_gradients():
    model, _ = _residual_model()
    g = load_onnx(model)
    with pytest.raises(ValueError, match="forward first"):
        g.backward([None, None])
    g.forward([np.zeros((1, 2, 3))])
    with pytest.raises(ValueError, match="need_backward"):
        g.backward([None, None])
    g.forward([np.zeros((1, 2, 3))], need_backward=True)
    with pytest.raises(ValueError, match="gradient of output 'y'"):
        g.backward([np.zeros((2, 2, 3)), None])


def test_corrupt_bytes_and_missing_file():
    with pytest.raises(ValueError, match="not a valid ONNX model"):
        load_onnx(b"\x08\x07garbage")
    with pytest.raises(FileNotFoundError, match="no ONNX file"):
        load_onnx("/nonexistent/model.onnx")


def test_two_graphs_in_two_threads_match_sequential():
    model, _ = _residual_model()
    xs = [np.random.default_rng(i).standard_normal((256, 2, 3)) for i in range(2)]
    expected = [load_onnx(model).forward([x]) for x in xs]
    graphs = [load_onnx(model) for _ in xs]
    results = [None, None]

    def run(i):
        for _ in range(50):
            results[i] = graphs[i].forward([xs[i]])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, e in zip(results, expected):
        for a, b in zip(r, e):
            np.testing.assert_array_equal(a, b)


def test_supported_operators_lists_backward():
    ops = aidge_interop.supported_operators()
    assert ops["Relu"]["backward"] and not ops["Equal"]["backward"]


def test_shape_computed_at_run_time_is_refused_with_the_node_named():
    """Reshape's shape from a float input (not constant at plan time)."""
    nodes = [helper.make_node("Cast", ["f"], ["s"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_me")]
    g = load_onnx(_model(nodes, [("x", [2, 3]), ("f", [2])], ["y"]))
    with pytest.raises(NotImplementedError, match="reshape_me.*constant"):
        g.forward([np.zeros((2, 3)), np.array([3.0, 2.0])])


def _int_model(nodes, inputs, outputs):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def test_small_integer_input_that_sets_a_shape_is_read_at_plan_time():
    """A Reshape's shape as a graph input: its values are part of the plan
    (a new value re-plans), on the first call and the later ones."""
    g = load_onnx(_int_model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                             [("x", TensorProto.DOUBLE, [2, 6]), ("s", TensorProto.INT64, [2])],
                             ["y"]))
    x = np.arange(12.0).reshape(2, 6)
    for shape in ([3, 4], [4, 3], [12, 1], [3, 4]):
        (y,) = g.forward([x, np.array(shape, np.int64)])
        np.testing.assert_array_equal(y, x.reshape(shape))


def test_token_ids_are_not_read_at_plan_time():
    """Small integer inputs that no shape depends on (token ids, masks) run
    with the graph instead of being folded into the plan, so new ids do not
    re-plan: Cast(ids) is a planned node, not a constant of the plan."""
    nodes = [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.DOUBLE),
             helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("Add", ["e", "f"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [5])],
                          [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                          [numpy_helper.from_array(np.arange(10.0) * 3, "table")])
    graph = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]))
    rng = np.random.default_rng(0)
    for _ in range(3):
        ids = rng.integers(0, 10, 5)
        (y,) = graph.forward([ids])
        np.testing.assert_array_equal(y, np.arange(10.0)[ids] * 3 + ids)
    assert graph.memory_stats()["planned_nodes"] == 3


@pytest.mark.parametrize("shape", [(2, 3, 0), (0, 4)], ids=str)
def test_layer_normalization_over_an_empty_axis_or_no_rows(shape):
    # issue 46 (fuzzer, UBSan): with no normalised values the backward's
    # scale and bias sums have no workspace (memset on NULL); no rows: no state
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    w, b = rng.standard_normal(shape[-1:]), rng.standard_normal(shape[-1:])
    node = helper.make_node("LayerNormalization", ["x", "w", "b"], ["y", "mean", "invstd"],
                            name="ln", axis=-1)
    model = _model([node], [("x", list(shape))], ["y", "mean", "invstd"], [("w", w), ("b", b)],
                   opset=17)
    g = load_onnx(model)
    got = g.forward([x], need_backward=True, input_grads=True)
    # the statistics of no values are NaN, as ONNX's reference (numpy) has them
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = ReferenceEvaluator(model).run(None, {"x": x})
    assert [a.shape for a in got] == [a.shape for a in want]
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-6)
    gy = rng.standard_normal(shape)
    (gx,) = g.backward([gy, None, None])
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    torch.nn.functional.layer_norm(xt, shape[-1:], wt, bt).backward(torch.tensor(gy))
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.grads()["w"], wt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.grads()["b"], bt.grad.numpy(), rtol=1e-12)
