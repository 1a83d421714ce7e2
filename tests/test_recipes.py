"""Graph recipes (aidge_interop.recipes, csrc/recipes.c, csrc/ops/fused.c).

Every rewrite must leave the outputs as they were: each model of the suite
(eval mode) runs on the engine before and after, and against torch; fused
operators must give the same gradients as the nodes they replace (same
kernels: exactly equal) and as torch autograd; every skip names its reason.
"""
import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

import aidge_interop
from aidge_interop import load_onnx, recipes
from aidge_interop.compare.locate import torch_graph
from graph_builders import model
from models import SAMPLE_SHAPES

RTOL, ATOL = 1e-4, 1e-5  # float32, BatchNorm folded: rounding differs in the last bits
SUITE = {k: (f, (2 if k == "mobilenet" else 3,) + s) for k, (f, s) in SAMPLE_SHAPES.items()}
PIPELINE = ("constant_fold", "fuse_batchnorm", "remove_flatten", "fuse_activation")


def _suite_graph(name):
    factory, shape = SUITE[name]
    net = factory().eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    graph, _, _ = torch_graph(net, [x], "test")
    with torch.no_grad():
        ref = net(x).numpy()
    return graph, x.numpy(), ref


def _ops(graph):
    return [n["op_type"] for n in graph.nodes()]


@pytest.mark.parametrize("name", list(SUITE))
def test_recipes_preserve_outputs_of_the_suite(name):
    graph, x, ref = _suite_graph(name)
    before = graph.forward(x)[0]
    np.testing.assert_allclose(before, ref, rtol=RTOL, atol=ATOL)
    n_bn = _ops(graph).count("BatchNormalization")
    for recipe in PIPELINE:
        report = recipes.RECIPES[recipe](graph)
        assert report.recipe == recipe and len(report.nodes) == len(report)
        after = graph.forward(x)[0]
        np.testing.assert_allclose(after, before, rtol=RTOL, atol=ATOL, err_msg=recipe)
        np.testing.assert_allclose(after, ref, rtol=RTOL, atol=ATOL, err_msg=recipe)
        if recipe == "fuse_batchnorm":  # every BatchNorm of the suite follows a Conv/Gemm
            assert len(report) == n_bn and not report.skipped
    ops = _ops(graph)
    assert "BatchNormalization" not in ops
    assert not {"Flatten", "Shape", "Gather"} & set(ops)
    # another batch size: nothing the recipes did depends on it
    x5 = np.random.default_rng(2).standard_normal((5,) + x.shape[1:]).astype(np.float32)
    factory, _ = SUITE[name]
    with torch.no_grad():
        ref5 = factory().eval()(torch.from_numpy(x5)).numpy()
    np.testing.assert_allclose(graph.forward(x5)[0], ref5, rtol=RTOL, atol=ATOL)
    # expand_metaops undoes the fusions (the Flatten stays removed), restore_flatten
    # the Flatten: the unfused graph (BatchNorms stay folded)
    fused = [n for n in graph.nodes() if n["op_type"].startswith("Fused")]
    report = recipes.expand_metaops(graph)
    assert len(report) == sum("activation" in n["attrs"] for n in fused)
    assert [n["name"] for n in graph.nodes() if n["op_type"].startswith("Fused")] == \
        [n["name"] for n in fused if "flatten_axis" in n["attrs"]]
    assert not any("activation" in n["attrs"] for n in graph.nodes())
    np.testing.assert_allclose(graph.forward(x5)[0], ref5, rtol=RTOL, atol=ATOL)
    report = recipes.restore_flatten(graph)
    assert len(report) == sum("flatten_axis" in n["attrs"] for n in fused)
    assert not any(op.startswith("Fused") for op in _ops(graph))
    np.testing.assert_allclose(graph.forward(x5)[0], ref5, rtol=RTOL, atol=ATOL)
    assert [r.recipe for r in graph.history] == list(PIPELINE) + ["expand_metaops",
                                                                  "restore_flatten"]


def test_expand_metaops_restores_names_and_order():
    graph, x, _ = _suite_graph("lenet")
    original = [(n["name"], n["op_type"], n["inputs"], n["outputs"]) for n in graph.nodes()]
    recipes.remove_flatten(graph)
    recipes.fuse_activation(graph)
    assert _ops(graph) == ["FusedConv", "MaxPool", "FusedConv", "MaxPool", "FusedGemm",
                           "FusedGemm", "Gemm"]
    recipes.expand_metaops(graph)  # the fusions only: the first Gemm still reads unflattened
    assert _ops(graph) == ["Conv", "Relu", "MaxPool", "Conv", "Relu", "MaxPool", "FusedGemm",
                           "Relu", "Gemm", "Relu", "Gemm"]
    assert graph.nodes()[6]["attrs"]["flatten_axis"] == 1
    assert recipes.restore_flatten(graph) == [
        f"FusedGemm '{original[7][0]}' expanded into Flatten, Gemm"]
    restored = [(n["name"], n["op_type"], n["inputs"], n["outputs"]) for n in graph.nodes()]
    assert restored == original
    assert not any(k in n["attrs"] for n in graph.nodes()
                   for k in ("activation", "flatten_axis", "activation_node"))


def test_expand_metaops_keeps_the_flatten_removed():
    """Aidge's notebook order: remove_flatten, fuse_batchnorm, expand_metaops.
    The Flatten stays removed (a FusedGemm that fuses nothing else is left
    alone, with the reason), the outputs are unchanged; restore_flatten
    gives it back."""
    graph, x, ref = _suite_graph("lenet")
    assert len(recipes.remove_flatten(graph)) == 1
    recipes.fuse_batchnorm(graph)
    report = recipes.expand_metaops(graph)
    gemm = next(n for n in graph.nodes() if n["op_type"] == "FusedGemm")
    assert list(report) == [] and report.skipped == [
        f"FusedGemm '{gemm['name']}' kept: it fuses only a Flatten (remove_flatten; "
        "restore_flatten gives it back)"]
    assert "Flatten" not in _ops(graph)
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=RTOL, atol=ATOL)
    assert len(recipes.restore_flatten(graph)) == 1
    assert "Flatten" in _ops(graph) and "FusedGemm" not in _ops(graph)
    assert len(recipes.restore_flatten(graph)) == 0  # nothing left to restore
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=RTOL, atol=ATOL)


def test_restore_flatten_keeps_the_fusions():
    """restore_flatten undoes remove_flatten only: a FusedGemm with an
    activation stays fused, reading the Flatten again; one Flatten read by
    two Gemms comes back once, with its names."""
    rng = np.random.default_rng(12)
    inits = {k: rng.normal(0, 1, (3, 8)).astype(np.float32) for k in ("w1", "w2")}
    nodes = [helper.make_node("Flatten", ["x"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w1"], ["a"], name="fc1", transB=1),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Gemm", ["f", "w2"], ["b"], name="fc2", transB=1),
             helper.make_node("Add", ["r", "b"], ["y"], name="add")]
    graph = load_onnx(model(nodes, [("x", (2, 2, 4))], [("y", (2, 3))], inits))
    original = [(n["name"], n["op_type"], n["inputs"], n["outputs"]) for n in graph.nodes()]
    x = rng.standard_normal((2, 2, 4)).astype(np.float32)
    ref = np.maximum(x.reshape(2, 8) @ inits["w1"].T, 0) + x.reshape(2, 8) @ inits["w2"].T
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=1e-5, atol=1e-6)
    assert len(recipes.remove_flatten(graph)) == 2
    assert len(recipes.fuse_activation(graph)) == 1
    assert _ops(graph) == ["FusedGemm", "FusedGemm", "Add"]
    assert len(recipes.restore_flatten(graph)) == 2
    assert _ops(graph) == ["Flatten", "FusedGemm", "Gemm", "Add"]
    fc1 = graph.nodes()[1]
    assert fc1["inputs"][0] == "f" and fc1["attrs"]["activation"] == "Relu"
    assert "flatten_axis" not in fc1["attrs"]
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=1e-5, atol=1e-6)
    assert len(recipes.expand_metaops(graph)) == 1
    restored = [(n["name"], n["op_type"], n["inputs"], n["outputs"]) for n in graph.nodes()]
    assert restored == original
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["lenet", "perceptron"])
def test_fused_backward_equals_unfused(name):
    """Training through FusedConv/FusedGemm (Relu, flatten): the same kernels
    as the nodes they replace, so gradients are equal to the last bit."""
    plain, x, _ = _suite_graph(name)
    fused, _, _ = _suite_graph(name)
    recipes.remove_flatten(fused)
    assert len(recipes.fuse_activation(fused)) >= 1
    gy = np.random.default_rng(3).standard_normal(plain.forward(x)[0].shape).astype(np.float32)
    results = []
    for graph in (plain, fused):
        graph.training = True
        graph.zero_grad()
        y = graph.forward(x, need_backward=True, input_grads=True)[0]
        dx = graph.backward([gy])[0]
        results.append((y, dx, {k: v.copy() for k, v in graph.grads().items()}))
    (y0, dx0, g0), (y1, dx1, g1) = results
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_array_equal(dx1, dx0)
    assert g1.keys() == g0.keys()
    for k in g0:
        np.testing.assert_array_equal(g1[k], g0[k], err_msg=k)


def test_fused_relu_gradient_passes_nan_like_torch():
    """A NaN output of a fused Relu passes its gradient, as torch's Relu
    (and the engine's Relu node) does: the mask is y <= 0 -> 0, not y > 0."""
    rng = np.random.default_rng(8)
    w = rng.normal(0, 1, (3, 4)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], name="fc", transB=1),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = load_onnx(model(nodes, [("x", (2, 4))], [("y", (2, 3))], {"w": w}))
    recipes.fuse_activation(graph)
    assert _ops(graph) == ["FusedGemm"]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    x[1, 2] = np.nan  # row 1 of the output is all NaN
    gy = rng.standard_normal((2, 3)).astype(np.float32)
    graph.training = True
    y = graph.forward(x, need_backward=True, input_grads=True)[0]
    dx = graph.backward([gy])[0]
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.relu(xt @ torch.from_numpy(w).T)
    yt.backward(torch.from_numpy(gy))
    assert np.isnan(y[1]).all()
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isfinite(dx[1]).all()  # dy went through the NaN row, times finite weights


def _conv_clip_model(clip_inputs, opset=17):
    rng = np.random.default_rng(4)
    w = rng.normal(0, 1, (3, 2, 3, 3)).astype(np.float32)
    b = np.array([0.0, 0.5, -0.5], np.float32)
    inits = {"w": w, "b": b, "fc.w": rng.normal(0, 1, (4, 3 * 4 * 4)).astype(np.float32)}
    nodes = [helper.make_node("Constant", [], [k], name=k,
                              value=numpy_helper.from_array(np.array(v, np.float32)))
             for k, v in (("lo", 0.0), ("hi", 1.0))]  # what torch.clamp exports
    nodes += [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Clip", ["c", *clip_inputs], ["r"], name="clip"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc.w"], ["y"], name="fc", transB=1),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    return model(nodes, [("x", (1, 2, 6, 6))], [("z", (1, 4))], inits, opset)


def test_fused_clip_forward_and_backward_against_torch():
    """Clip's gradient passes at its bounds (torch.clamp): the fused node keeps
    a mask, since the output cannot tell x == min from x < min. Zero inputs
    make the first channel's pre-activation exactly 0 == min."""
    graph = load_onnx(_conv_clip_model(["lo", "hi"]))  # Conv, Clip, Flatten, Gemm, Relu
    x = np.random.default_rng(5).standard_normal((2, 2, 6, 6)).astype(np.float32)
    x[0] = 0.0
    graph.forward(x)
    recipes.remove_flatten(graph)
    report = recipes.fuse_activation(graph)
    assert _ops(graph) == ["FusedConv", "FusedGemm"], report
    clip = next(n for n in graph.nodes() if n["op_type"] == "FusedConv")["attrs"]
    assert clip["activation"] == "Clip" and clip["activation_params"] == (0.0, 1.0)
    gy = np.random.default_rng(6).standard_normal((2, 4)).astype(np.float32)
    graph.training = True
    y = graph.forward(x, need_backward=True, input_grads=True)[0]
    dx = graph.backward([gy])[0]
    p = {k: torch.tensor(v, requires_grad=True) for k, v in graph.parameters().items()}
    xt = torch.tensor(x, requires_grad=True)
    r = torch.clamp(torch.nn.functional.conv2d(xt, p["w"], p["b"]), 0.0, 1.0)
    yt = torch.relu(r.flatten(1) @ p["fc.w"].T)
    yt.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    for k, g in graph.grads().items():
        np.testing.assert_allclose(g, p[k].grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    recipes.expand_metaops(graph)
    assert _ops(graph) == ["Conv", "Clip", "FusedGemm", "Relu"]
    graph.training = False
    np.testing.assert_allclose(graph.forward(x)[0], y, rtol=0, atol=0)
    recipes.restore_flatten(graph)
    assert _ops(graph) == ["Conv", "Clip", "Flatten", "Gemm", "Relu"]
    np.testing.assert_allclose(graph.forward(x)[0], y, rtol=0, atol=0)


def test_fuse_activation_skips_a_clip_with_computed_bounds():
    proto = _conv_clip_model(["lo", "hi"])
    proto.graph.node.insert(2, helper.make_node("Neg", ["lo"], ["neg_lo"], name="neg"))
    clip = next(n for n in proto.graph.node if n.op_type == "Clip")
    clip.input[1] = "neg_lo"  # Clip(c, -lo, hi): computed, until constant_fold
    graph = load_onnx(proto)
    report = recipes.fuse_activation(graph)
    assert report.skipped == ["Clip 'clip' not fused: its bounds are not constants"]
    assert recipes.constant_fold(graph) == ["Neg 'neg' folded into constant 'neg_lo' "
                                            "(float32, scalar)"]
    assert recipes.fuse_activation(graph) == ["Conv 'conv' + Clip 'clip' -> FusedConv 'conv'"]


def test_recipes_on_a_training_graph_leave_its_state_alone():
    """The re-plan after a recipe is an eval forward: BatchNorm running
    statistics are not updated by it, and the graph stays in training mode."""
    graph, x, _ = _suite_graph("resnet")
    graph.training = True
    graph.forward(x, need_backward=True)
    buffers = {k: v.copy() for k, v in graph.buffers().items()}
    assert len(recipes.remove_flatten(graph)) == 1
    assert graph.training and graph._g.need_backward
    for k, v in graph.buffers().items():
        np.testing.assert_array_equal(v, buffers[k], err_msg=k)
    assert all(n["output_shapes"][0] is not None for n in graph.nodes())


@pytest.mark.parametrize("recipe", ["fuse_batchnorm", "batchnorm_epilogue"])
def test_batchnorm_recipes_refuse_training_mode(recipe):
    graph, _, _ = _suite_graph("resnet")
    graph.training = True
    with pytest.raises(ValueError, match=f"{recipe}: .*training mode.*batch statistics"):
        recipes.RECIPES[recipe](graph)
    assert "BatchNormalization" in _ops(graph)  # untouched


def _bn_model(producer: str, bias: str, extra_reader: bool = False):
    """X -> Conv/Gemm -> BatchNormalization [-> also Relu of the Conv output]."""
    rng = np.random.default_rng(7)
    c = 5
    inits = {"scale": rng.uniform(0.5, 1.5, c), "shift": rng.normal(0, 0.1, c),
             "mean": rng.normal(0, 0.1, c), "var": rng.uniform(0.5, 1.5, c)}
    inits = {k: v.astype(np.float32) for k, v in inits.items()}
    if producer == "Conv":
        inits["w"] = rng.normal(0, 1, (c, 3, 3, 3)).astype(np.float32)
        x, args, kw = ("x", (1, 3, 5, 5)), {}, {}
    else:  # Gemm with B (K, N), transB=0, alpha and beta not 1
        inits["w"] = rng.normal(0, 1, (6, c)).astype(np.float32)
        x, kw = ("x", (1, 6)), {"alpha": 0.5, "beta": 2.0}
    if bias == "vector":
        inits["b"] = rng.normal(0, 1, c).astype(np.float32)
    elif bias == "scalar":
        inits["b"] = np.array([0.3], np.float32)
    ins = ["x", "w"] + (["b"] if bias != "none" else [])
    nodes = [helper.make_node(producer, ins, ["p"], name="prod", **kw),
             helper.make_node("BatchNormalization", ["p", "scale", "shift", "mean", "var"],
                              ["y"], name="bn", epsilon=1e-3)]
    outputs = [("y", (1, c))]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["r"], name="relu"))
        outputs.append(("r", (1, c)))
    return model(nodes, [x], outputs, inits)


@pytest.mark.parametrize("producer,bias", [("Conv", "vector"), ("Conv", "none"),
                                           ("Gemm", "vector"), ("Gemm", "none"),
                                           ("Gemm", "scalar")])
def test_fuse_batchnorm_arithmetic(producer, bias):
    proto = _bn_model(producer, bias)
    graph = load_onnx(proto)
    shape = (4, 3, 5, 5) if producer == "Conv" else (4, 6)
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
    import onnxruntime

    session = onnxruntime.InferenceSession(proto.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    ref = session.run(None, {"x": x})[0]
    report = recipes.fuse_batchnorm(graph)
    assert report == [f"BatchNormalization 'bn' folded into {producer} 'prod' (weight 'w' and "
                      f"bias '{'b' if bias == 'vector' else 'w.bias'}' rescaled)"]
    assert report.nodes == ["prod"]
    assert _ops(graph) == [producer]
    assert set(graph.parameters()) == {"w", "b" if bias == "vector" else "w.bias"}
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("producer,bias", [("Conv", "vector"), ("Conv", "none"),
                                           ("Gemm", "vector"), ("Gemm", "none"),
                                           ("Gemm", "scalar")])
def test_batchnorm_epilogue_against_onnxruntime_and_back(producer, bias):
    """The BatchNorm applied by the Conv/Gemm to its output: ONNX Runtime's
    numbers, weights untouched, statistics read at each forward (a change
    shows at once), and expand_metaops gives the original graph back."""
    import onnxruntime

    proto = _bn_model(producer, bias)
    graph = load_onnx(proto)
    original = [(n["name"], n["op_type"], n["inputs"], n["outputs"]) for n in graph.nodes()]
    weights = {k: v.copy() for k, v in graph.parameters().items()}
    shape = (4, 3, 5, 5) if producer == "Conv" else (4, 6)
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
    session = onnxruntime.InferenceSession(proto.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    report = recipes.batchnorm_epilogue(graph)
    assert report == [f"BatchNormalization 'bn' applied by Fused{producer} 'prod' to its output "
                      "(weights unchanged)"]
    assert _ops(graph) == ["Fused" + producer]
    for k, v in graph.parameters().items():
        np.testing.assert_array_equal(v, weights[k])
    recipes.fuse_activation(graph)  # nothing to fuse: no error either
    np.testing.assert_allclose(graph.forward(x)[0], session.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
    # new statistics, read by the next forward (ONNX Runtime on the same values)
    for name, value in (("mean", 0.7), ("var", 2.5)):
        graph._g.value(name).numpy()[:] = value
        init = next(i for i in proto.graph.initializer if i.name == name)
        init.CopyFrom(numpy_helper.from_array(np.full(5, value, np.float32), name))
    session = onnxruntime.InferenceSession(proto.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(graph.forward(x)[0], session.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
    graph.training = True  # the node has no backward: a clear error, naming it
    y = graph.forward(x, need_backward=True)[0]
    with pytest.raises(ValueError, match="'prod'.*inference-only"):
        graph.backward([np.ones_like(y)])
    graph.training = False
    assert len(recipes.expand_metaops(graph)) == 1
    restored = [(n["name"], n["op_type"], n["inputs"], n["outputs"]) for n in graph.nodes()]
    assert restored == original
    np.testing.assert_allclose(graph.forward(x)[0], session.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_batchnorm_epilogue_rows(dtype):
    """FusedGemm's BatchNorm epilogue on (N, M) rows, float32 and float64, with
    37 channels (vector body and tail) on 3 rows, and a Relu after it,
    against NumPy in float64 from the same values."""
    from onnx import TensorProto

    rng = np.random.default_rng(11)
    k, c = 20, 37
    vals = {"w": rng.normal(0, 1, (c, k)), "b": rng.normal(0, 1, c),
            "scale": rng.uniform(0.5, 1.5, c), "shift": rng.normal(0, 0.5, c),
            "mean": rng.normal(0, 0.5, c), "var": rng.uniform(0.5, 1.5, c)}
    vals = {n: v.astype(dtype) for n, v in vals.items()}
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["p"], name="prod", transB=1),
             helper.make_node("BatchNormalization", ["p", "scale", "shift", "mean", "var"],
                              ["q"], name="bn", epsilon=1e-3),
             helper.make_node("Relu", ["q"], ["y"], name="relu")]
    proto = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, ["N", k])],
                          [helper.make_tensor_value_info("y", elem, ["N", c])],
                          [numpy_helper.from_array(v, n) for n, v in vals.items()]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = load_onnx(proto)
    assert recipes.batchnorm_epilogue(graph) and recipes.fuse_activation(graph)
    assert _ops(graph) == ["FusedGemm"]
    x = rng.standard_normal((3, k)).astype(dtype)
    v = {n: a.astype(np.float64) for n, a in vals.items()}
    p = x.astype(np.float64) @ v["w"].T + v["b"]
    ref = np.maximum((p - v["mean"]) / np.sqrt(v["var"] + 1e-3) * v["scale"] + v["shift"], 0)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("recipe,verdict", [("fuse_batchnorm", "not folded"),
                                            ("batchnorm_epilogue", "kept")])
def test_batchnorm_recipes_skip_with_reasons(recipe, verdict):
    graph = load_onnx(_bn_model("Conv", "vector", extra_reader=True))
    report = recipes.RECIPES[recipe](graph)
    assert report == [] and report.skipped == [
        f"BatchNormalization 'bn' {verdict}: the output of the node before it is also read "
        "elsewhere"]
    assert report.skipped_nodes == ["bn"]
    assert _ops(graph) == ["Conv", "BatchNormalization", "Relu"]


def _reshape_model(shape, computed=False):
    rng = np.random.default_rng(9)
    inits = {"w": rng.normal(0, 1, (3, 12)).astype(np.float32)}
    nodes = []
    if computed:  # x.view(x.size(0), -1), as the TorchScript exporter writes it
        inits.update(idx=np.array(0, np.int64), minus1=np.array([-1], np.int64),
                     axes=np.array([0], np.int64))
        nodes += [helper.make_node("Shape", ["x"], ["s"], name="shape"),
                  helper.make_node("Gather", ["s", "idx"], ["n"], name="gather"),
                  helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
                  helper.make_node("Concat", ["n1", "minus1"], ["target"], name="cat", axis=0)]
    else:
        inits["target"] = np.array(shape, np.int64)
    nodes += [helper.make_node("Reshape", ["x", "target"], ["f"], name="reshape"),
              helper.make_node("Gemm", ["f", "w"], ["y"], name="fc", transB=1)]
    return model(nodes, [("x", (1, 3, 2, 2))], [("y", (1, 3))], inits)


@pytest.mark.parametrize("shape,removed", [((-1, 12), True), ((0, -1), True), ((0, 12), True),
                                           ((2, -1), False), ((-1, 6), None)])
def test_remove_flatten_reshape(shape, removed):
    x = np.random.default_rng(10).standard_normal((2, 3, 2, 2)).astype(np.float32)
    if removed is None:  # (-1, 6) does not fit a Gemm of K = 12 at all
        graph = load_onnx(_reshape_model(shape))
        with pytest.raises(ValueError):
            graph.forward(x)
        return
    graph = load_onnx(_reshape_model(shape))
    before = graph.forward(x)[0]
    report = recipes.remove_flatten(graph)
    if removed:
        assert report == ["Reshape 'reshape' removed: Gemm 'fc' reads its input flattened at "
                          "axis 1 (FusedGemm)"]
        assert _ops(graph) == ["FusedGemm"]
        x3 = np.random.default_rng(11).standard_normal((3, 3, 2, 2)).astype(np.float32)
        np.testing.assert_allclose(graph.forward(x3)[0], x3.reshape(3, 12) @
                                   graph.parameters()["w"].T, rtol=1e-5, atol=1e-6)
    else:
        assert report == [] and "batch dimension free" in report.skipped[0]
    np.testing.assert_allclose(graph.forward(x)[0], before, rtol=0, atol=0)


def test_remove_flatten_needs_a_constant_target_shape():
    graph = load_onnx(_reshape_model(None, computed=True))
    x = np.ones((2, 3, 2, 2), np.float32)
    graph.forward(x)
    report = recipes.remove_flatten(graph)
    assert report == [] and "computed, not a constant" in report.skipped[0]
    assert recipes.constant_fold(graph) == []  # it depends on the input's shape


def test_constant_fold_the_pad_subgraph():
    """DS-CNN's ZeroPad2d exports a Shape/Gather/.../Cast chain on a constant:
    folded into the pads, valid for any batch size."""
    graph, x, ref = _suite_graph("kws")
    n_nodes = len(graph.nodes())
    report = recipes.constant_fold(graph)
    assert len(report) == 12 and all("folded into constant" in line for line in report)
    assert len(graph.nodes()) == n_nodes - 12
    pad = next(n for n in graph.nodes() if n["op_type"] == "Pad")
    kinds = {v["name"]: v["kind"] for v in graph._g.values()}
    assert kinds[pad["inputs"][1]] == "const"
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=RTOL, atol=ATOL)


def test_recipes_take_a_graph():
    with pytest.raises(TypeError, match="fuse_batchnorm: argument 'graph' must be"):
        recipes.fuse_batchnorm("model.onnx")
    graph, _, _ = _suite_graph("perceptron")
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        graph._g.apply_recipe("nope")


def test_fused_operators_are_registered_and_checked():
    ops = aidge_interop.supported_operators()
    assert ops["FusedConv"] == {"domain": "aidge_interop", "backward": True}
    assert ops["FusedGemm"] == {"domain": "aidge_interop", "backward": True}
    bad = _conv_clip_model(["lo", "hi"])
    conv = next(n for n in bad.graph.node if n.op_type == "Conv")
    conv.op_type, conv.domain = "FusedConv", "aidge_interop"
    conv.attribute.append(helper.make_attribute("activation", "Swish"))
    bad.opset_import.append(helper.make_opsetid("aidge_interop", 1))
    with pytest.raises(ValueError, match="FusedConv node 'conv': activation 'Swish'"):
        load_onnx(bad)


def _pad_conv_model(mode="constant", value=None, pads=(0, 0, 2, 1, 0, 0, 3, 0), axes=None,
                    conv_pads=(1, 0, 0, 1), opset=20, extra=None):
    """x (N, 3, 7, 6) -> Pad -> Conv 4@3x2 (conv_pads) -> y; ``extra``: "output"
    (the padded value is a graph output too) or "relu" (a Relu reads it too)."""
    rng = np.random.default_rng(20)
    inits = {"w": rng.standard_normal((4, 3, 3, 2)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)}
    pad_in = ["x"]
    attrs = {"mode": mode}
    if opset < 11:
        attrs["pads"] = list(pads)
        if value is not None:
            attrs["value"] = value
    else:
        inits["pads"] = np.array(pads, np.int64)
        pad_in.append("pads")
        if value is not None or axes is not None:
            inits["value"] = np.array(0.0 if value is None else value, np.float32)
            pad_in.append("value")
        if axes is not None:
            inits["axes"] = np.array(axes, np.int64)
            pad_in.append("axes")
    nodes = [helper.make_node("Pad", pad_in, ["p"], name="pad", **attrs),
             helper.make_node("Conv", ["p", "w", "b"], ["y"], name="conv",
                              pads=list(conv_pads))]
    outputs = [("y", (1, 4, 1, 1))]
    if extra == "output":
        outputs.append(("p", (1, 3, 1, 1)))
    elif extra == "relu":
        nodes.append(helper.make_node("Relu", ["p"], ["r"], name="relu"))
        outputs.append(("r", (1, 3, 1, 1)))
    return model(nodes, [("x", (1, 3, 7, 6))], outputs, inits, opset=opset), inits


@pytest.mark.parametrize("case,kw", [
    ("spatial", {}),
    ("explicit zero value", {"value": 0.0}),
    ("axes", {"pads": (2, 0, 1, 3), "axes": (2, 3)}),
    ("negative axes", {"pads": (0, 2, 3, 1), "axes": (-1, -2)}),
    ("opset 10 attributes", {"opset": 10}),
])
def test_fuse_pad_moves_a_zero_pad_into_the_conv(case, kw):
    onnx_model, inits = _pad_conv_model(**kw)
    graph = load_onnx(onnx_model)
    x = np.random.default_rng(21).standard_normal((2, 3, 7, 6)).astype(np.float32)
    before = graph.forward(x)[0]
    report = recipes.fuse_pad(graph)
    assert report == ["Pad 'pad' removed: Conv 'conv' pads its input itself"], case
    assert _ops(graph) == ["Conv"]
    # against torch: the Pad's padding (per axis, ONNX order) then the Conv's
    pads, axes = kw.get("pads", (0, 0, 2, 1, 0, 0, 3, 0)), kw.get("axes", (0, 1, 2, 3))
    before_after = {a % 4: (pads[i], pads[len(axes) + i]) for i, a in enumerate(axes)}
    t_pad = [v for a in (3, 2) for v in before_after.get(a, (0, 0))]
    ref = torch.nn.functional.conv2d(  # the conv's own pads (1, 0, 0, 1): top 1, right 1
        torch.nn.functional.pad(torch.nn.functional.pad(torch.from_numpy(x), t_pad),
                                [0, 1, 1, 0]),
        torch.from_numpy(inits["w"]), torch.from_numpy(inits["b"])).numpy()
    after = graph.forward(x)[0]
    np.testing.assert_allclose(after, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
    x5 = np.random.default_rng(22).standard_normal((5, 3, 7, 6)).astype(np.float32)
    assert graph.forward(x5)[0].shape == (5,) + after.shape[1:]


@pytest.mark.parametrize("kw,reason", [
    ({"value": 0.5}, "a value other than +0"),
    ({"value": -0.0}, "a value other than +0"),
    ({"mode": "reflect"}, "mode is not 'constant'"),
    ({"mode": "edge"}, "mode is not 'constant'"),
    ({"pads": (1, 0, 0, 0, 0, 0, 0, 0)}, "batch or channel axis"),
    ({"pads": (0, 0, -1, 0, 0, 0, 1, 0)}, "crops"),
    ({"extra": "output"}, "graph output"),
    ({"extra": "relu"}, "other than a Conv"),
])
def test_fuse_pad_keeps_a_pad_the_conv_cannot_take(kw, reason):
    graph = load_onnx(_pad_conv_model(**kw)[0])
    x = np.random.default_rng(23).standard_normal((2, 3, 7, 6)).astype(np.float32)
    before = graph.forward(x)
    report = recipes.fuse_pad(graph)
    assert report == [] and len(report.skipped) == 1 and reason in report.skipped[0]
    assert "Pad" in _ops(graph)
    for a, b in zip(graph.forward(x), before):
        np.testing.assert_array_equal(a, b)


def test_fuse_pad_on_kws_and_its_gradient():
    """DS-CNN's ZeroPad2d (after constant_fold): the first conv pads; outputs
    equal, and a training graph's input gradient is still torch's."""
    graph, x, ref = _suite_graph("kws")
    recipes.constant_fold(graph)
    before = graph.forward(x)[0]
    report = recipes.fuse_pad(graph)
    assert len(report) == 1 and "Pad" not in _ops(graph)
    np.testing.assert_allclose(graph.forward(x)[0], before, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(graph.forward(x)[0], ref, rtol=RTOL, atol=ATOL)
    # backward through the padding conv: the input gradient against torch's
    onnx_model, inits = _pad_conv_model()
    graph = load_onnx(onnx_model)
    recipes.fuse_pad(graph)
    xt = torch.randn(2, 3, 7, 6, requires_grad=True)
    # W: 1 before (Pad), 1 after (Conv); H: 2 + 1 before, 3 after
    yt = torch.nn.functional.conv2d(
        torch.nn.functional.pad(xt, [1, 1, 3, 3]), torch.from_numpy(inits["w"]),
        torch.from_numpy(inits["b"]))
    g = torch.randn_like(yt)
    yt.backward(g)
    y = graph.forward(xt.detach().numpy(), need_backward=True, input_grads=True)[0]
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    dx = graph.backward([g.numpy()])[0]
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_fuse_pad_keeps_a_pad_with_repeated_axes():
    """A Pad the engine refuses (an axis twice) stays, and still fails at
    forward, naming the node: the recipe does not make it run."""
    graph = load_onnx(_pad_conv_model(pads=(1, 2, 1, 2), axes=(2, 2))[0])
    report = recipes.fuse_pad(graph)
    assert report == [] and "repeated" in report.skipped[0]
    with pytest.raises(ValueError, match="Pad node 'pad': axis 2 appears twice"):
        graph.forward(np.zeros((2, 3, 7, 6), np.float32))
