"""Recipe fuse_linear (csrc/recipes.c) and its operator FusedMatMul
(csrc/ops/matmul.c): ``Transpose(W) -> MatMul -> Add(b)``, the form torch's
exporter gives an ``nn.Linear`` on 3-D inputs, as one node reading W in
place (transB) and adding b after its product.

The rewrite is exact: the rewritten graph's outputs, input gradients and
parameter gradients are bit for bit those of the unrewritten graph, and stay
so after SGD steps (the same GEMM library on the same operands, the bias
added after the product as the Add did, its gradient reduced by the Add's
function). Against torch and onnx.reference the usual float32 tolerances
apply (another GEMM's order of sums). Each case the recipe leaves alone
names its reason.
"""
import copy

import numpy as np
import onnx.reference
import pytest
import torch
from onnx import helper, numpy_helper

import aidge_interop
from aidge_interop import SGD, load_onnx, recipes, wrap
from graph_builders import model

RTOL, ATOL = 1e-5, 1e-5  # float32 against torch / onnx.reference: another order of sums
K, N = 24, 40


def _rng(seed=0):
    return np.random.default_rng(seed)


def _linear(x_shape, transpose=True, bias=True, bias_first=False, perm=(1, 0), w_shape=None,
            bias_value=None, extra_nodes=(), extra_outputs=(), dtype=np.float32, n=N):
    """x (..., K) -> [Transpose(W) ->] MatMul -> [Add(b) ->] y, W (n, K) when
    transposed, else (K, n)."""
    rng = _rng()
    k = x_shape[-1]
    w_shape = w_shape or ((n, k) if transpose else (k, n))
    inits = {"W": rng.standard_normal(w_shape).astype(dtype)}
    nodes, b_name = [], "W"
    if transpose:
        nodes.append(helper.make_node("Transpose", ["W"], ["Wt"], name="t", perm=list(perm)))
        b_name = "Wt"
    nodes.append(helper.make_node("MatMul", ["x", b_name], ["mm" if bias else "y"], name="mm"))
    if bias:
        inits["b"] = (rng.standard_normal(n) if bias_value is None else bias_value).astype(dtype)
        nodes.append(helper.make_node("Add", ["b", "mm"] if bias_first else ["mm", "b"], ["y"],
                                      name="add"))
    nodes += list(extra_nodes)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    info = helper.make_tensor_value_info
    outs = [info("y", elem, None)] + [info(o, elem, None) for o in extra_outputs]
    graph = helper.make_graph(nodes, "g", [info("x", elem, list(x_shape))], outs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _train(graph, xs, steps=3, lr=0.05):
    """Forward, backward (of sum(y^2) / 2 and the other outputs' sums), a
    plain SGD step on the parameters' engine memory; per step: outputs,
    input gradient, parameter gradients (copies)."""
    graph._g.training = True
    record = []
    for _ in range(steps):
        graph.zero_grad()
        ys = graph.forward([xs], input_grads=True)
        dx, = graph.backward([ys[0]] + [np.ones_like(y) for y in ys[1:]])
        grads = {k: v.copy() for k, v in graph.grads().items()}
        record.append(([y.copy() for y in ys], dx.copy(), grads))
        for k, p in graph.parameters().items():
            p -= lr * graph.grads()[k]
    return record


def _same(actual, desired, exact, what):
    """Bit for bit, or (a transposed weight in a small product) to float32
    rounding: OpenBLAS's small-matrix kernels (M N K up to about 64^3) sum
    in an order that depends on the operands' layout."""
    if exact:
        np.testing.assert_array_equal(actual, desired, err_msg=what)
    else:
        scale = max(1.0, float(np.abs(desired).max(initial=0)))
        np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-6 * scale, err_msg=what)


def _assert_same_training(proto, xs, report_changes=None, exact=True):
    """fuse_linear on a graph of `proto` leaves forward, gradients and SGD
    steps as they were (bit for bit when `exact`); returns the report and
    the graph."""
    plain, fused = load_onnx(proto), load_onnx(proto)
    report = recipes.fuse_linear(fused)
    if report_changes is not None:
        assert len(report) == report_changes, str(report)
    for step, (a, b) in enumerate(zip(_train(plain, xs), _train(fused, xs))):
        for i, (ya, yb) in enumerate(zip(a[0], b[0])):
            _same(yb, ya, exact, f"output {i}, step {step}")
        _same(b[1], a[1], exact, f"input gradient, step {step}")
        assert a[2].keys() == b[2].keys()
        for k in a[2]:
            _same(b[2][k], a[2][k], exact, f"grad '{k}', step {step}")
    return report, fused


def _ops(graph):
    return [n["op_type"] for n in graph.nodes()]


@pytest.mark.parametrize("x_shape", [(K,), (5, K), (3, 7, K), (2, 3, 4, K), (0, 4, K)],
                         ids=["1d", "2d", "3d", "4d", "empty"])
@pytest.mark.parametrize("transpose,bias", [(True, True), (True, False), (False, True)],
                         ids=["transposed+bias", "transposed", "bias"])
def test_fused_linear_is_exact(x_shape, transpose, bias):
    proto = _linear(x_shape, transpose, bias)
    xs = _rng(1).standard_normal(x_shape).astype(np.float32)
    report, fused = _assert_same_training(proto, xs, report_changes=1, exact=not transpose)
    assert _ops(fused) == ["FusedMatMul"] and not report.skipped
    assert report.nodes == ["mm"]
    assert ("transposed in place" in report[0]) == transpose
    assert ("adds bias 'b'" in report[0]) == bias
    # against onnx.reference, on the weights the SGD steps left
    sess = onnx.reference.ReferenceEvaluator(_with_initializers(proto, fused.parameters()))
    np.testing.assert_allclose(fused.forward([xs])[0], sess.run(None, {"x": xs})[0],
                               rtol=RTOL, atol=ATOL)


def _with_initializers(proto, values):
    proto = copy.deepcopy(proto)
    for init in proto.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    return proto


def test_fused_linear_float64_and_bias_first():
    proto = _linear((3, 5, K), bias_first=True, dtype=np.float64)
    xs = _rng(1).standard_normal((3, 5, K))
    report, fused = _assert_same_training(proto, xs, report_changes=1, exact=False)
    assert _ops(fused) == ["FusedMatMul"]
    ref = onnx.reference.ReferenceEvaluator(proto).run(None, {"x": xs})[0]
    plain = load_onnx(proto).forward([xs])[0]
    np.testing.assert_allclose(plain, ref, rtol=1e-12, atol=1e-12)


def test_large_products_are_bit_for_bit():
    """Products beyond OpenBLAS's small-matrix kernels (a transformer's
    Linears: here 128 rows, 128 -> 256) run its packed kernels, whose sums
    do not depend on the layout: the transposed weight read in place gives
    the very bits of the Transpose + MatMul + Add."""
    proto = _linear((2, 64, 128), n=256)
    xs = _rng(1).standard_normal((2, 64, 128)).astype(np.float32)
    _assert_same_training(proto, xs, report_changes=1, exact=True)


def test_transposed_weight_read_elsewhere_keeps_its_transpose():
    """W^T also feeds another MatMul (folded too) and a graph output (the
    Transpose stays for it): every value right, W's gradient the sum of both
    products'."""
    extra = [helper.make_node("MatMul", ["x", "Wt"], ["z"], name="mm2"),
             helper.make_node("Identity", ["Wt"], ["wt_out"], name="id")]
    proto = _linear((3, 4, K), extra_nodes=extra, extra_outputs=["z", "wt_out"])
    xs = _rng(1).standard_normal((3, 4, K)).astype(np.float32)
    report, fused = _assert_same_training(proto, xs, report_changes=2, exact=False)
    assert sorted(report.nodes) == ["mm", "mm2"]
    assert report.skipped == ["Transpose 't' kept: its output is also read elsewhere"]
    assert _ops(fused).count("Transpose") == 1 and _ops(fused).count("FusedMatMul") == 2


def test_transposed_weight_read_only_by_products_goes():
    extra = [helper.make_node("MatMul", ["x", "Wt"], ["z"], name="mm2")]
    proto = _linear((3, 4, K), extra_nodes=extra, extra_outputs=["z"])
    xs = _rng(1).standard_normal((3, 4, K)).astype(np.float32)
    report, fused = _assert_same_training(proto, xs, report_changes=2, exact=False)
    assert "Transpose" not in _ops(fused) and not report.skipped


def test_product_read_elsewhere_keeps_its_add():
    extra = [helper.make_node("Relu", ["mm"], ["r"], name="relu")]
    proto = _linear((3, 4, K), extra_nodes=extra, extra_outputs=["r"])
    xs = _rng(1).standard_normal((3, 4, K)).astype(np.float32)
    report, fused = _assert_same_training(proto, xs, report_changes=1, exact=False)
    assert "bias" not in report[0] and _ops(fused) == ["FusedMatMul", "Add", "Relu"]


@pytest.mark.parametrize("kind,why", [
    ("3d_weight", "its weight is not 2-D"),
    ("identity_perm", "its perm is not [1, 0]"),
    ("computed", "it transposes a graph input or a computed value, not a weight"),
])
def test_transposes_left_alone_say_why(kind, why):
    if kind == "3d_weight":  # a batched weight (2, N, K), its last two axes swapped
        proto = _linear((2, 3, K), bias=False, perm=(0, 2, 1), w_shape=(2, N, K))
    elif kind == "identity_perm":  # (K, N) "transposed" by perm [0, 1]
        proto = _linear((3, K), bias=False, perm=(0, 1), w_shape=(K, N))
    else:  # x^T @ x-like: the transposed operand is an activation
        t = helper.make_node("Transpose", ["x"], ["xt"], name="t", perm=[1, 0])
        mm = helper.make_node("MatMul", ["x", "xt"], ["y"], name="mm")
        proto = model([t, mm], [("x", (3, K))], [("y", (3, 3))], {})
    xs = _rng(1).standard_normal((2, 3, K) if kind == "3d_weight" else (3, K))
    report, fused = _assert_same_training(proto, xs.astype(np.float32), report_changes=0)
    assert report.skipped == [f"MatMul 'mm': Transpose 't' not folded: {why}"]
    assert _ops(fused) == ["Transpose", "MatMul"]


@pytest.mark.parametrize("bias_value,why", [
    (np.ones((1, N)), "not a vector of one value per output column (b (1, 40)"),
    (np.ones(1), "not a vector of one value per output column (b (1,)"),
    (np.ones((3, 4, N)), "not a vector of one value per output column (b (3, 4, 40)"),
], ids=["row", "scalar", "per_row"])
def test_biases_that_are_not_per_column_vectors_stay_adds(bias_value, why):
    proto = _linear((3, 4, K), bias_value=bias_value)
    xs = _rng(1).standard_normal((3, 4, K)).astype(np.float32)
    report, fused = _assert_same_training(proto, xs, report_changes=1, exact=False)
    assert "bias" not in report[0]  # the Transpose is still folded
    assert len(report.skipped) == 1 and why in report.skipped[0], report.skipped
    assert report.skipped[0].startswith("Add 'add' not fused into MatMul 'mm': ")
    assert _ops(fused) == ["FusedMatMul", "Add"]


def test_computed_bias_stays_an_add():
    rng = _rng()
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["x", "Wt"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "c"], ["y"], name="add")]
    proto = model(nodes, [("x", (3, K)), ("c", (3, N))], [("y", (3, N))],
                  {"W": rng.standard_normal((N, K)).astype(np.float32)})
    graph = load_onnx(proto)
    report = recipes.fuse_linear(graph)
    assert len(report) == 1 and "computed, not a bias initializer" in report.skipped[0]
    x, c = (rng.standard_normal(s).astype(np.float32) for s in ((3, K), (3, N)))
    np.testing.assert_array_equal(graph.forward([x, c])[0], load_onnx(proto).forward([x, c])[0])


def test_fused_matmul_checks_its_operands():
    """A FusedMatMul written by hand: a bias of the wrong shape is refused
    naming the node."""
    rng = _rng()
    node = helper.make_node("FusedMatMul", ["x", "W", "b"], ["y"], name="fm",
                            domain="aidge_interop", transB=1)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", 1, [3, K])],
        [helper.make_tensor_value_info("y", 1, None)],
        [numpy_helper.from_array(rng.standard_normal((N, K)).astype(np.float32), "W"),
         numpy_helper.from_array(np.ones((1, N), np.float32), "b")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("aidge_interop", 1)])
    g = load_onnx(proto)
    with pytest.raises(ValueError, match="FusedMatMul node 'fm'.*bias must have shape"):
        g.forward([np.ones((3, K), np.float32)])


# -- wrap: on by default, against torch ------------------------------------------------------


class Block(torch.nn.Module):
    """A pre-norm transformer block of Linears (a ViT's), tokens (B, T, D)."""

    def __init__(self, d=32, heads=4, ff=64):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0,
                                                      activation="gelu", batch_first=True,
                                                      norm_first=True)
        self.head = torch.nn.Linear(d, 10)

    def forward(self, x):
        return self.head(self.layer(x))


class Tied(torch.nn.Module):
    """Two Linears sharing one weight, on 3-D inputs."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(16, 16)
        self.dec = torch.nn.Linear(16, 16)
        self.dec.weight = self.enc.weight

    def forward(self, x):
        return self.dec(torch.tanh(self.enc(x)))


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.GELU(), torch.nn.Linear(48, 8))


@pytest.mark.parametrize("make,shape", [(_mlp, (3, 5, 16)), (Block, (2, 9, 32)),
                                        (Tied, (2, 6, 16))], ids=["mlp", "block", "tied"])
def test_wrapped_linears_train_like_torch(make, shape):
    torch.manual_seed(0)
    net = make().train()
    x = torch.randn(shape)
    wrapped = wrap(copy.deepcopy(net), (x,))
    nodes = wrapped._graph.nodes()
    ops = [n["op_type"] for n in nodes]
    # every product of a weight is fused (an attention's output projection,
    # on 2-D rows, is exported as a Gemm): no Transpose or MatMul reads one
    weights = {name for name, _ in net.named_parameters()}
    assert "FusedMatMul" in ops
    assert not [n["name"] for n in nodes if n["op_type"] in ("Transpose", "MatMul")
                and weights & set(n["inputs"])]
    assert list(wrapped.state_dict()) == list(net.state_dict())
    for (n, p), q in zip(net.named_parameters(), wrapped.parameters()):
        assert q.shape == p.shape, n
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), net(x), rtol=RTOL, atol=ATOL)
    opt_t, opt_a = torch.optim.SGD(net.parameters(), lr=0.05), SGD(wrapped, lr=0.05)
    for step in range(3):
        xt = torch.randn(shape).requires_grad_()
        xa = xt.detach().clone().requires_grad_()
        for m, opt, inp in ((net, opt_t, xt), (wrapped, opt_a, xa)):
            opt.zero_grad()
            m(inp).square().mean().backward()
            opt.step()
        torch.testing.assert_close(xa.grad, xt.grad, rtol=1e-4, atol=1e-6,
                                   msg=f"input grad, step {step}")
        for (n, p), q in zip(net.named_parameters(), wrapped.parameters()):
            assert q.grad.shape == p.shape, n  # in the weight's own layout
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6,
                                       msg=f"grad {n}, step {step}")
    for (n, p), q in zip(net.named_parameters(), wrapped.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=n)


def _encoder():
    """A transformer's sizes: every product beyond OpenBLAS's small-matrix
    kernels (see test_large_products_are_bit_for_bit)."""
    return torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, activation="gelu",
                                            batch_first=True, norm_first=True)


@pytest.mark.parametrize("make,shape,exact", [(_encoder, (2, 64, 128), True),
                                              (Block, (2, 9, 32), False),
                                              (Tied, (2, 6, 16), False)],
                         ids=["encoder", "block", "tied"])
def test_wrapped_graph_against_the_exported_one(make, shape, exact):
    """wrap's rewritten graph against load_onnx of its own export
    (unrewritten): forward, input and parameter gradients, three SGD steps;
    bit for bit at a transformer's sizes."""
    torch.manual_seed(0)
    wrapped = wrap(make(), (torch.randn(shape),))
    xs = _rng(3).standard_normal(shape).astype(np.float32)
    plain = load_onnx(wrapped.onnx_model)
    fused = aidge_interop.Graph(wrapped._graph, wrapped.onnx_model)
    assert "FusedMatMul" in _ops(fused) and "FusedMatMul" not in _ops(plain)
    for step, (a, b) in enumerate(zip(_train(plain, xs), _train(fused, xs))):
        _same(b[0][0], a[0][0], exact, f"output, step {step}")
        _same(b[1], a[1], exact, f"input gradient, step {step}")
        for k in a[2]:
            _same(b[2][k], a[2][k], exact, f"grad '{k}', step {step}")


def test_quantize_takes_a_fused_linear():
    """The int8 quantizer reads a FusedMatMul on 2-D rows as the Gemm it is:
    the same quantized model as from the unrewritten graph."""
    from aidge_interop import quantize

    proto = _linear((4, K))
    calib = _rng(2).standard_normal((16, K)).astype(np.float32)
    fused = load_onnx(proto)
    assert len(recipes.fuse_linear(fused)) == 1
    q_plain, q_fused = quantize(load_onnx(proto), [calib]), quantize(fused, [calib])
    x = _rng(3).integers(-128, 128, (4, K)).astype(np.int8)  # quantized inputs
    np.testing.assert_array_equal(q_fused.graph.forward([x])[0], q_plain.graph.forward([x])[0])
