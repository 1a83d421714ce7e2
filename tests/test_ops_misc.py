"""Issue 46's remaining ONNX operators: ScatterElements, Scatter, TensorScatter,
ReverseSequence, Det, NonZero, Compress, Unique, NonMaxSuppression, RoiAlign and
DeformConv. Values against torch, ONNX's reference implementation or numpy;
gradients against torch or float64 central differences. The operators whose
output length depends on values (NonZero, Compress, Unique,
NonMaxSuppression) also run on values computed inside the graph, and re-plan
when the values change.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import aidge_interop
from op_harness import check_op, make_model

RNG = np.random.default_rng(46)


def _ref(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)


def _run(model, feeds, **kw):
    return aidge_interop.load_onnx(model).forward(list(feeds.values()), **kw)


def _fd_check(model, feeds, wrt, eps=1e-6, rtol=1e-6, atol=1e-8):
    """Gradients of sum(y * dy) for the float64 inputs `wrt` against central
    differences of the engine's own forward."""
    g = aidge_interop.load_onnx(model)
    names = list(feeds)
    (y,) = g.forward(list(feeds.values()), need_backward=True, input_grads=True)
    dy = RNG.standard_normal(y.shape)
    grads = g.backward([dy])
    probe = aidge_interop.load_onnx(model)

    def f(vals):
        return float(np.sum(probe.forward(vals)[0] * dy))

    for name in wrt:
        i = names.index(name)
        num = np.zeros_like(feeds[name])
        for k in np.ndindex(num.shape):
            vals = [v.copy() for v in feeds.values()]
            vals[i][k] += eps
            up = f(vals)
            vals[i][k] -= 2 * eps
            num[k] = (up - f(vals)) / (2 * eps)
        np.testing.assert_allclose(grads[i], num, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of '{name}'")


# ---------------------------------------------------------------- ScatterElements, Scatter

TORCH_REDUCE = {"mul": "prod", "max": "amax", "min": "amin"}


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_against_torch(reduction, axis):
    """Values and both gradients against torch.scatter / scatter_add /
    scatter_reduce(include_self=True); ties of max and min (data equal to an
    update) and a zero update of mul included. Reduction none has no
    repeated places (their order is unspecified in torch)."""
    x = RNG.standard_normal((3, 4, 5)).round(1)
    ax = axis % 3
    shape = [3, 4, 5]
    shape[ax] = 3
    if reduction == "none":  # each place once: a permutation along the axis
        idx = np.argsort(RNG.random([3, 4, 5]), axis=ax).take(range(3), axis=ax)
    else:
        idx = RNG.integers(0, [3, 4, 5][ax], shape)
    upd = RNG.standard_normal(shape).round(1)
    if reduction in ("max", "min"):  # a tie between data and an update
        at = tuple(0 for _ in shape)
        tgt = list(at)
        tgt[ax] = idx[at]
        upd[at] = x[tuple(tgt)]
    if reduction == "mul":
        upd.flat[5] = 0.0
    neg = np.where(RNG.random(shape) < 0.5, idx - [3, 4, 5][ax], idx)  # negative indices

    def ref(x, u, i):
        i = i % [3, 4, 5][ax]
        if reduction == "none":
            return torch.scatter(x, ax, i, u)
        if reduction == "add":
            return torch.scatter_add(x, ax, i, u)
        return torch.scatter_reduce(x, ax, i, u, TORCH_REDUCE[reduction], include_self=True)

    attrs = {"axis": axis} | ({} if reduction == "none" else {"reduction": reduction})
    check_op("ScatterElements", {"x": x, "u": upd}, ref, consts={"i": neg}, attrs=attrs,
             input_order=["x", "i", "u"], opset=18)
    # against ONNX's reference too, indices a graph input
    model = make_model("ScatterElements", {"x": x, "i": neg, "u": upd}, attrs, opset=18)
    feeds = {"x": x, "i": neg, "u": upd}
    np.testing.assert_array_equal(_run(model, feeds)[0], _ref(model, feeds)[0])


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_integer_reductions(reduction):
    x = RNG.integers(-5, 5, (4, 3)).astype(np.int32)
    idx = RNG.integers(0, 4, (6, 3))
    upd = RNG.integers(-5, 5, (6, 3)).astype(np.int32)
    model = make_model("ScatterElements", {"x": x, "i": idx, "u": upd},
                       {"reduction": reduction}, opset=18)
    feeds = {"x": x, "i": idx, "u": upd}
    np.testing.assert_array_equal(_run(model, feeds)[0], _ref(model, feeds)[0])


def test_scatter_deprecated():
    x = np.zeros((3, 3), np.float32)
    idx = np.array([[1, 0, 2], [0, 2, 1]])
    upd = RNG.standard_normal((2, 3)).astype(np.float32)
    check_op("Scatter", {"x": x, "u": upd},
             lambda x, u, i: torch.scatter(x, 1, i, u), consts={"i": idx}, attrs={"axis": 1},
             input_order=["x", "i", "u"], opset=10)


def test_scatter_elements_bad_inputs():
    x = np.zeros((3, 3), np.float32)
    model = make_model("ScatterElements", {"x": x, "i": np.array([[3]]), "u": x[:1, :1]},
                       opset=18)
    with pytest.raises(IndexError, match="ScatterElements node.*index 3 is out of range"):
        _run(model, {"x": x, "i": np.array([[3]]), "u": x[:1, :1]})
    model = make_model("ScatterElements", {"x": x, "i": np.zeros((2, 2), np.int64),
                                           "u": x[:1]}, opset=18)
    with pytest.raises(ValueError, match="ScatterElements node.*one shape"):
        _run(model, {"x": x, "i": np.zeros((2, 2), np.int64), "u": x[:1]})


# ---------------------------------------------------------------- TensorScatter

@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1, 2])
def test_tensor_scatter(mode, axis):
    cache = RNG.standard_normal((2, 5, 6, 3))
    ushape = list(cache.shape)
    ushape[axis] = 2
    upd = RNG.standard_normal(ushape)
    L = cache.shape[axis]
    wi = np.array([L - 2, 1]) if mode == "linear" else np.array([L - 1, 3])
    feeds = {"c": cache, "u": upd, "w": wi}
    model = make_model("TensorScatter", feeds, {"axis": axis, "mode": mode}, opset=24)
    np.testing.assert_allclose(_run(model, feeds)[0], _ref(model, feeds)[0], rtol=0, atol=0)
    _fd_check(model, feeds, ["c", "u"])


def test_tensor_scatter_linear_overflow():
    feeds = {"c": np.zeros((1, 4, 2)), "u": np.ones((1, 2, 2)), "w": np.array([3])}
    model = make_model("TensorScatter", feeds, {"axis": 1}, opset=24)
    with pytest.raises(IndexError, match="TensorScatter node.*position 4 of axis 1"):
        _run(model, feeds)


# ---------------------------------------------------------------- ReverseSequence

@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    x = RNG.standard_normal((4, 4, 3) if batch_axis else (4, 5, 3))
    lens = np.array([4, 1, 0, 2])
    feeds = {"x": x, "lens": lens}
    model = make_model("ReverseSequence", feeds,
                       {"batch_axis": batch_axis, "time_axis": time_axis}, opset=10)
    np.testing.assert_array_equal(_run(model, feeds)[0], _ref(model, feeds)[0])
    _fd_check(model, feeds, ["x"])


def test_reverse_sequence_bad_length():
    feeds = {"x": np.zeros((3, 2)), "lens": np.array([1, 4])}
    model = make_model("ReverseSequence", feeds, opset=10)
    with pytest.raises(ValueError, match=r"ReverseSequence node.*sequence_lens\[1\] is 4"):
        _run(model, feeds)


# ---------------------------------------------------------------- Det

@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 1), (5, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_det(shape, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    check_op("Det", {"x": x}, torch.linalg.det, opset=22)


def test_det_singular_gradient():
    """A rank-deficient matrix: det 0, but the gradient (the adjugate) is not."""
    a = RNG.standard_normal((3, 2))
    x = np.stack([a @ RNG.standard_normal((2, 3)), np.zeros((3, 3))])
    x[1, 0, 0] = 2.0  # rank 1: zero gradient
    check_op("Det", {"x": x}, torch.linalg.det, opset=22)


# ---------------------------------------------------------------- NonZero, Compress, Unique

def test_nonzero_replans_on_new_values():
    x = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, -1.0]], np.float32)
    model = make_model("NonZero", {"x": x}, opset=13)
    g = aidge_interop.load_onnx(model)
    for v in (x, np.zeros_like(x), np.ones_like(x), np.float32([[np.nan, 0, 0], [0, 3, 0]])):
        (y,) = g.forward([v])
        assert y.dtype == np.int64
        np.testing.assert_array_equal(y, np.array(np.nonzero(v)))


def test_nonzero_of_a_computed_value():
    """NonZero(x > 0) feeding a GatherND (torch's x[x > 0] in ONNX): the
    comparison is computed when the graph is planned, the whole graph runs at
    forward, and the gradient reaches x."""
    nodes = [helper.make_node("Constant", [], ["zero"], value=helper.make_tensor(
                 "zero", TensorProto.DOUBLE, [], [0.0])),
             helper.make_node("Greater", ["x", "zero"], ["m"]),
             helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"]),
             helper.make_node("GatherND", ["x", "idx"], ["y"])]
    graph = helper.make_graph(nodes, "select",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    g = aidge_interop.load_onnx(model)
    for _ in range(3):
        x = RNG.standard_normal((3, 4))
        (y,) = g.forward([x], need_backward=True, input_grads=True)
        xt = torch.tensor(x, requires_grad=True)
        yt = xt[xt > 0]
        np.testing.assert_array_equal(y, yt.detach().numpy())
        dy = RNG.standard_normal(y.shape)
        (gx,) = g.backward([dy])
        yt.backward(torch.tensor(dy))
        np.testing.assert_array_equal(gx, xt.grad.numpy())


def test_compress_of_a_parameter_dependent_condition():
    """h = x @ w with w a trainable initializer, y = h[h > 0]: the plan
    computes h with w's value, w gets its gradient, and a change of w (in
    place, as an optimizer does) re-plans."""
    w = RNG.standard_normal((3, 4))
    nodes = [helper.make_node("Constant", [], ["zero"], value=helper.make_tensor(
                 "zero", TensorProto.DOUBLE, [], [0.0])),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Greater", ["h", "zero"], ["c"]),
             helper.make_node("Reshape", ["h", "flat"], ["hf"]),
             helper.make_node("Reshape", ["c", "flat"], ["cf"]),
             helper.make_node("Compress", ["hf", "cf"], ["y"], axis=0)]
    graph = helper.make_graph(
        nodes, "param", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([-1]), "flat")])
    g = aidge_interop.load_onnx(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert "w" in g.parameters()
    x = RNG.standard_normal((2, 3))
    for step in range(3):
        g.zero_grad()
        (y,) = g.forward([x], need_backward=True)
        wt = torch.tensor(g.parameters()["w"].copy(), requires_grad=True)
        h = (torch.tensor(x) @ wt).reshape(-1)
        yt = h[h > 0]
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-14)
        dy = RNG.standard_normal(y.shape)
        g.backward([dy])
        yt.backward(torch.tensor(dy))
        np.testing.assert_allclose(g.grads()["w"], wt.grad.numpy(), rtol=1e-14)
        g.parameters()["w"][:] = -g.parameters()["w"] + step  # another number kept


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = RNG.standard_normal((3, 4))
    n = x.size if axis is None else x.shape[axis]
    cond = RNG.random(n - 1) < 0.6  # shorter than the axis: the rest dropped
    attrs = {} if axis is None else {"axis": axis}
    model = make_model("Compress", {"x": x, "c": cond}, attrs, opset=11)
    feeds = {"x": x, "c": cond}
    np.testing.assert_array_equal(_run(model, feeds)[0], np.compress(cond, x, axis=axis))
    # gradient against torch's boolean indexing, the condition a constant
    full = np.concatenate([cond, [False]])

    def ref(x, c):
        if axis is None:
            return x.reshape(-1)[torch.tensor(full)]
        return x[torch.tensor(full)] if axis == 0 else x[:, torch.tensor(full)]

    check_op("Compress", {"x": x}, ref, consts={"c": cond}, attrs=attrs, opset=11)


def test_compress_condition_computed_in_the_graph():
    """Compress(x, x[:, 0] > 0, axis 0) with the gradient to x; new values
    re-plan (another number of rows)."""
    nodes = [helper.make_node("Constant", [], ["i0"], value=helper.make_tensor(
                 "i0", TensorProto.INT64, [], [0])),
             helper.make_node("Constant", [], ["zero"], value=helper.make_tensor(
                 "zero", TensorProto.DOUBLE, [], [0.0])),
             helper.make_node("Gather", ["x", "i0"], ["col"], axis=1),
             helper.make_node("Greater", ["col", "zero"], ["c"]),
             helper.make_node("Compress", ["x", "c"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "rows",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [6, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    g = aidge_interop.load_onnx(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)]))
    for _ in range(3):
        x = RNG.standard_normal((6, 3))
        (y,) = g.forward([x], need_backward=True, input_grads=True)
        xt = torch.tensor(x, requires_grad=True)
        yt = xt[xt[:, 0] > 0]
        np.testing.assert_array_equal(y, yt.detach().numpy())
        dy = RNG.standard_normal(y.shape)
        yt.backward(torch.tensor(dy))
        np.testing.assert_array_equal(g.backward([dy])[0], xt.grad.numpy())


def _unique_ref(x, axis, sorted_):
    """numpy.unique, renumbered by first occurrence when not sorted (ONNX's
    reference takes the unsorted Y along axis 0 whatever the axis)."""
    xx = x.ravel() if axis is None else x
    y, first, inverse, counts = np.unique(xx, True, True, True, axis=axis)
    inverse = inverse.reshape(-1)
    if not sorted_:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = np.take(xx, first, axis=0 if axis is None else axis)
    return [y] + [v.astype(np.int64) for v in (first, inverse, counts)]


@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_unique(sorted_, axis, dtype):
    x = RNG.integers(0, 3, (4, 3)).astype(dtype)
    x[2] = x[0]  # a repeated row and column
    x[:, 2] = x[:, 1]
    attrs = {"sorted": sorted_} | ({} if axis is None else {"axis": axis})
    model = make_model("Unique", {"x": x}, attrs, n_outputs=4, opset=11)
    got = _run(model, {"x": x})
    for i, (a, b) in enumerate(zip(got, _unique_ref(x, axis, sorted_))):
        assert a.dtype == b.dtype, f"output {i}"
        np.testing.assert_array_equal(a, b, err_msg=f"output {i}")
    if sorted_ or axis in (None, 0):  # and ONNX's reference where it is right
        for a, b in zip(got, _ref(model, {"x": x.ravel() if axis is None else x})):
            np.testing.assert_array_equal(a, b)


def test_unique_nan_and_fewer_outputs():
    x = np.array([2.0, np.nan, 1.0, np.nan, 2.0], np.float32)
    model = make_model("Unique", {"x": x}, n_outputs=2, opset=11)
    y, first = _run(model, {"x": x})
    np.testing.assert_array_equal(y, [1.0, 2.0, np.nan])
    np.testing.assert_array_equal(first, [2, 0, 1])


# ---------------------------------------------------------------- NonMaxSuppression

def _random_boxes(b, n):
    xy = RNG.random((b, n, 2)) * 10
    wh = RNG.random((b, n, 2)) * 4 + 0.5
    return np.concatenate([xy, xy + wh], axis=2).astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("with_score", [True, False])
def test_nms_against_reference(center, with_score):
    boxes = _random_boxes(2, 30)
    scores = RNG.random((2, 3, 30)).astype(np.float32)
    scores[0, 0, 5] = scores[0, 0, 7]  # a tie: the lower index first
    feeds = {"boxes": boxes, "scores": scores, "max": np.array([6], np.int64),
             "iou": np.array([0.3], np.float32)}
    if with_score:
        feeds["score"] = np.array([0.4], np.float32)
    model = make_model("NonMaxSuppression", feeds, {"center_point_box": center}, opset=11)
    g = aidge_interop.load_onnx(model)
    (got,) = g.forward(list(feeds.values()))
    np.testing.assert_array_equal(got, _ref(model, feeds)[0])
    # new scores re-plan: another number of boxes kept
    feeds["scores"] = (scores ** 3).astype(np.float32)
    feeds["max"] = np.array([10], np.int64)
    (got,) = g.forward(list(feeds.values()))
    np.testing.assert_array_equal(got, _ref(model, feeds)[0])


def test_nms_without_limit_selects_nothing():
    feeds = {"boxes": _random_boxes(1, 4), "scores": RNG.random((1, 1, 4)).astype(np.float32)}
    model = make_model("NonMaxSuppression", feeds, opset=11)
    (got,) = _run(model, feeds)
    assert got.shape == (0, 3) and got.dtype == np.int64


# ---------------------------------------------------------------- RoiAlign

ROIS = np.array([[0.5, 1.0, 6.0, 5.5], [2.2, 0.3, 4.1, 7.9], [-1.0, -1.0, 3.0, 2.0],
                 [7.0, 7.0, 7.5, 7.2]])


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling", [0, 2])
def test_roi_align(mode, ctm, sampling):
    x = RNG.standard_normal((2, 3, 8, 8))
    feeds = {"x": x, "rois": ROIS.copy(), "bi": np.array([0, 1, 1, 0])}
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "output_height": 3,
             "output_width": 2, "sampling_ratio": sampling, "spatial_scale": 0.75}
    model = make_model("RoiAlign", feeds, attrs, opset=16)
    np.testing.assert_allclose(_run(model, feeds)[0], _ref(model, feeds)[0], rtol=1e-12,
                               atol=1e-12)
    _fd_check(model, feeds, ["x"])


# ---------------------------------------------------------------- DeformConv

@pytest.mark.parametrize("case", [
    dict(c=2, oc=4, k=(2, 2)),
    dict(c=4, oc=2, k=(3, 2), group=2, offset_group=2, pads=[1, 0, 1, 1], strides=[2, 1]),
    dict(c=2, oc=2, k=(2, 2), dilations=[2, 1], mask=False, bias=False),
], ids=["plain", "groups-pads-strides", "dilations-nomask"])
@pytest.mark.parametrize("opset", [19, 22])
def test_deform_conv(case, opset):
    c, oc, (kh, kw) = case["c"], case["oc"], case["k"]
    group, og = case.get("group", 1), case.get("offset_group", 1)
    pads, strides, dil = case.get("pads", [0] * 4), case.get("strides", [1, 1]), \
        case.get("dilations", [1, 1])
    H, W = 5, 4
    oh = (H + pads[0] + pads[2] - ((kh - 1) * dil[0] + 1)) // strides[0] + 1
    ow = (W + pads[1] + pads[3] - ((kw - 1) * dil[1] + 1)) // strides[1] + 1
    feeds = {"x": RNG.standard_normal((2, c, H, W)),
             "w": RNG.standard_normal((oc, c // group, kh, kw)),
             # odd sixteenths: the sampling points are exact in float32 (ONNX's
             # reference rounds them so in its GridSample) and never on a
             # pixel (where the bilinear sample has a kink)
             "offset": (np.round(RNG.standard_normal((2, og * kh * kw * 2, oh, ow)) * 12)
                        + 0.5) / 8}
    order = ["x", "w", "offset"]
    if case.get("bias", True):
        feeds["b"] = RNG.standard_normal(oc)
        order.append("b")
    if case.get("mask", True):
        feeds["mask"] = RNG.random((2, og * kh * kw, oh, ow))
        order += [""] * (4 - len(order)) + ["mask"]
    attrs = {"group": group, "offset_group": og, "pads": pads, "strides": strides,
             "dilations": dil, "kernel_shape": [kh, kw]}
    model = make_model("DeformConv", feeds, attrs, opset=opset, input_order=order)
    np.testing.assert_allclose(_run(model, feeds)[0], _ref(model, feeds)[0], rtol=1e-10,
                               atol=1e-10)
    _fd_check(model, feeds, list(feeds), rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- ai.onnx.preview.training

TRAINING = "ai.onnx.preview.training"


# attribute values that are their float32's shortest decimal (ONNX's
# reference computes with the float32 attribute, the engine with that
# decimal, the value the author wrote: onnx/importer.py's _float_attr), and
# the defaults
@pytest.mark.parametrize("op,states,attrs", [
    ("Adagrad", 1, {"decay_factor": 0.125, "epsilon": 2.0 ** -11, "norm_coefficient": 2.0 ** -6}),
    ("Adagrad", 1, {}),
    ("Momentum", 1, {"alpha": 0.875, "beta": 0.5, "mode": "standard",
                     "norm_coefficient": 2.0 ** -5}),
    ("Momentum", 1, {"alpha": 0.75, "beta": 0.25, "mode": "nesterov", "norm_coefficient": 0.0}),
    ("Adam", 2, {"alpha": 0.875, "beta": 0.9375, "epsilon": 2.0 ** -10,
                 "norm_coefficient": 2.0 ** -6, "norm_coefficient_post": 2.0 ** -5}),
    ("Adam", 2, {}),
])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("t", [0, 4])
def test_training_optimizers(op, states, attrs, n, t):
    """One update of n float64 tensors against ONNX's reference: its update
    formulas with the attributes as the engine reads them (the defaults as
    decimals), and its evaluator where that keeps float64 (not Adam's
    several tensors: it casts them to float32)."""
    from onnx.reference.ops.aionnx_preview_training import op_adagrad, op_adam, op_momentum

    shapes = [(3, 4), (5,), (2, 2, 2)][:n]
    feeds = {"r": np.array(0.1), "t": np.array(t, np.int64)}
    for kind in ["x", "g"] + [f"s{k}" for k in range(states)]:
        for i, s in enumerate(shapes):
            v = RNG.standard_normal(s)
            feeds[f"{kind}{i}"] = np.abs(v) if kind == f"s{states - 1}" else v  # H >= 0
    model = make_model(op, feeds, attrs, n_outputs=n * (1 + states), domain=TRAINING,
                       opset=20)
    got = _run(model, feeds)
    v = list(feeds.values())
    parts = list(zip(*[v[2 + k * n: 2 + (k + 1) * n] for k in range(2 + states)]))
    a = {"norm_coefficient": 0.0, "epsilon": 1e-6, "decay_factor": 0.0, "alpha": 0.9,
         "beta": 0.999, "norm_coefficient_post": 0.0} | attrs
    if op == "Adagrad":
        res = [op_adagrad._apply_adagrad(v[0], v[1], *p, a["norm_coefficient"], a["epsilon"],
                                         a["decay_factor"]) for p in parts]
    elif op == "Momentum":
        fn = op_momentum._apply_momentum if a["mode"] == "standard" else \
            op_momentum._apply_nesterov
        res = [fn(v[0], v[1], *p, a["norm_coefficient"], a["alpha"], a["beta"]) for p in parts]
    else:
        res = [op_adam._apply_adam(v[0], v[1], *p, a["norm_coefficient"],
                                   a["norm_coefficient_post"], a["alpha"], a["beta"],
                                   a["epsilon"]) for p in parts]
    wants = [[out[k] for k in range(1 + states) for out in res]]
    if attrs and not (op == "Adam" and n > 1):
        wants.append(_ref(model, feeds))
    for want in wants:
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=f"output {i}")


def test_momentum_needs_its_attributes():
    feeds = {"r": np.array(0.1), "t": np.array(0, np.int64), "x": np.ones(2), "g": np.ones(2),
             "v": np.ones(2)}
    model = make_model("Momentum", feeds, {"alpha": 0.9, "beta": 0.1, "mode": "standard"},
                       n_outputs=2, domain=TRAINING)
    with pytest.raises(ValueError, match="Momentum node.*norm_coefficient is required"):
        _run(model, feeds)


def test_bad_geometry_is_refused():
    feeds = {"x": np.zeros((1, 1, 2, 2)), "w": np.zeros((1, 1, 3, 3)),
             "offset": np.zeros((1, 18, 1, 1))}
    model = make_model("DeformConv", feeds, opset=19)
    with pytest.raises(ValueError, match="DeformConv node.*larger than the padded input"):
        _run(model, feeds)
    feeds = {"x": np.zeros((1, 1, 0, 3)), "rois": np.zeros((1, 4)), "bi": np.zeros(1, np.int64)}
    model = make_model("RoiAlign", feeds, opset=16)
    with pytest.raises(ValueError, match="RoiAlign node.*no pixel to sample"):
        _run(model, feeds)
