"""The spatial operators of ops/grid_sample.c, ops/resize.c, ops/pool.c,
ops/norm.c (LRN), ops/fold.c and ConvTranspose's output_shape: values
against torch (onnx.reference where torch lacks the mode), gradients
against torch autograd or float64 finite differences."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx.reference import ReferenceEvaluator

import aidge_interop
from op_harness import check_op, make_model


def _x(shape, dtype=np.float64, seed=0, lo=None, hi=None):
    rng = np.random.default_rng(seed)
    if lo is not None:
        return rng.uniform(lo, hi, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _reference(op_type, inputs, attrs, opset=22, consts=None, input_order=None):
    model = make_model(op_type, inputs, attrs, consts, opset=opset, input_order=input_order)
    return ReferenceEvaluator(model).run(None, dict(inputs))[0]


def _engine(op_type, inputs, attrs, opset=22, consts=None, input_order=None):
    model = make_model(op_type, inputs, attrs, consts, opset=opset, input_order=input_order)
    return aidge_interop.load_onnx(model, param_kinds={n: "const" for n in consts or {}})


def _finite_differences(g, inputs, wrt, eps=1e-6, seed=1):
    """The engine's gradient of sum(gy * y) in inputs[wrt] against central
    differences (float64)."""
    names = list(inputs)
    (y,) = g.forward([inputs[n] for n in names], need_backward=True, input_grads=True)
    gy = np.random.default_rng(seed).standard_normal(y.shape)
    grads = g.backward([gy])
    ours = grads[names.index(wrt)]
    num = np.zeros_like(inputs[wrt])
    for i in range(num.size):
        vals = []
        for step in (eps, -eps):
            moved = dict(inputs)
            moved[wrt] = inputs[wrt].copy()
            moved[wrt].flat[i] += step
            vals.append(np.sum(gy * g.forward([moved[n] for n in names])[0]))
        num.flat[i] = (vals[0] - vals[1]) / (2 * eps)
    np.testing.assert_allclose(ours, num, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- GridSample

GRID_CASES = [(mode, pad, ac) for mode in ("bilinear", "nearest", "bicubic")
              for pad in ("zeros", "border", "reflection") for ac in (0, 1)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode,pad,ac", GRID_CASES,
                         ids=[f"{m}-{p}-ac{a}" for m, p, a in GRID_CASES])
def test_grid_sample_2d_as_torch(mode, pad, ac, dtype):
    """Values and gradients (input and grid) as F.grid_sample, with points
    outside the input (grid in [-1.4, 1.4])."""
    x = _x((2, 3, 5, 4), dtype)
    grid = _x((2, 6, 7, 2), dtype, seed=1, lo=-1.4, hi=1.4)
    onnx_mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    check_op("GridSample", {"x": x, "grid": grid},
             lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=pad,
                                        align_corners=bool(ac)),
             attrs={"mode": onnx_mode, "padding_mode": pad, "align_corners": ac}, opset=22)


VOLUME_CASES = [(mode, pad, ac) for mode in ("bilinear", "nearest")
                for pad in ("zeros", "border", "reflection") for ac in (0, 1)]


@pytest.mark.parametrize("mode,pad,ac", VOLUME_CASES,
                         ids=[f"{m}-{p}-ac{a}" for m, p, a in VOLUME_CASES])
def test_grid_sample_3d_as_torch(mode, pad, ac):
    x = _x((2, 2, 3, 4, 5))
    grid = _x((2, 3, 2, 4, 3), seed=1, lo=-1.3, hi=1.3)
    check_op("GridSample", {"x": x, "grid": grid},
             lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=pad,
                                        align_corners=bool(ac)),
             attrs={"mode": "linear" if mode == "bilinear" else mode, "padding_mode": pad,
                    "align_corners": ac})


@pytest.mark.parametrize("ac", [0, 1])
@pytest.mark.parametrize("rank", [3, 5])
def test_grid_sample_cubic_1d_3d_as_onnx_reference(rank, ac):
    """Cubic in 1 and 3 spatial dims (torch has 2 only): values as ONNX's
    reference (zeros padding: where it and torch agree), gradients by finite
    differences."""
    x = _x((1, 2) + (4, 3, 5)[:rank - 2])
    grid = _x((1,) + (3, 2, 2)[:rank - 2] + (rank - 2,), seed=1, lo=-1.2, hi=1.2)
    attrs = {"mode": "cubic", "align_corners": ac}
    g = _engine("GridSample", {"x": x, "grid": grid}, attrs)
    np.testing.assert_allclose(g.forward([x, grid])[0],
                               _reference("GridSample", {"x": x, "grid": grid}, attrs),
                               rtol=1e-5, atol=1e-6)
    _finite_differences(g, {"x": x, "grid": grid}, "grid")


def test_grid_sample_opset_16_names_and_refusals():
    x = _x((1, 1, 3, 3), np.float32)
    grid = _x((1, 2, 2, 2), np.float32, lo=-1, hi=1)
    check_op("GridSample", {"x": x, "grid": grid},
             lambda x, g: F.grid_sample(x, g, mode="bicubic", align_corners=False),
             attrs={"mode": "bicubic"}, opset=16)
    with pytest.raises(ValueError, match="GridSample node.*mode 'cubic'"):
        _engine("GridSample", {"x": x, "grid": grid}, {"mode": "cubic"}, opset=16)
    with pytest.raises(ValueError, match="GridSample node.*padding_mode 'wrap'"):
        _engine("GridSample", {"x": x, "grid": grid}, {"padding_mode": "wrap"})
    with pytest.raises(ValueError, match="GridSample node.*grid has rank 4"):
        _engine("GridSample", {"x": x, "grid": _x((1, 2, 2, 3), np.float32)}, {}) \
            .forward([x, _x((1, 2, 2, 3), np.float32)])


# ---------------------------------------------------------------- Resize

def _resize(x, attrs, scales=None, sizes=None, roi=None, opset=19):
    consts, order = {}, ["x", "", "", ""]
    for k, (name, v, dt) in enumerate((("roi", roi, np.float32), ("scales", scales, np.float32),
                                       ("sizes", sizes, np.int64))):
        if v is not None:
            consts[name] = np.array(v, dt)
            order[k + 1] = name
    while order[-1] == "":
        order.pop()
    return {"x": x}, consts, order, attrs, opset


CUBIC_CASES = [((2, 3, 5, 6), dict(size=(9, 4)), 0), ((2, 3, 5, 6), dict(size=(9, 4)), 1),
               ((1, 2, 8, 7), dict(size=(3, 5)), 0), ((1, 2, 4, 5), dict(scale_factor=2.0), 0),
               ((1, 2, 4, 5), dict(scale_factor=0.5), 0), ((1, 2, 4, 5), dict(size=(8, 11)), 1)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,kw,ac", CUBIC_CASES,
                         ids=[f"{s}-{kw}-ac{ac}" for s, kw, ac in CUBIC_CASES])
def test_resize_cubic_as_torch_bicubic(shape, kw, ac, dtype):
    """mode cubic (A = -0.75, no exclude_outside) is torch's bicubic:
    values and the input's gradient."""
    x = _x(shape, dtype)
    coord = "align_corners" if ac else "half_pixel"
    if "size" in kw:
        inputs, consts, order, attrs, opset = _resize(
            x, {"mode": "cubic", "coordinate_transformation_mode": coord},
            sizes=list(shape[:2]) + list(kw["size"]))
    else:
        s = kw["scale_factor"]
        inputs, consts, order, attrs, opset = _resize(
            x, {"mode": "cubic", "coordinate_transformation_mode": coord}, scales=[1, 1, s, s])
    check_op("Resize", inputs,
             lambda x, *_: F.interpolate(x, mode="bicubic", align_corners=bool(ac), **kw),
             attrs=attrs, consts=consts, input_order=order, opset=opset)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("size", [(3, 2), (5, 9), (2, 7)])
def test_resize_antialias_as_onnx_reference(size, mode, dtype):
    """antialias=1 (a kernel stretched by 1 / scale when downsampling), with
    and without exclude_outside: values as ONNX's reference, gradients by
    finite differences."""
    x = _x((1, 2, 7, 8), dtype)
    for exclude in (0, 1):
        inputs, consts, order, attrs, _ = _resize(
            x, {"mode": mode, "antialias": 1, "exclude_outside": exclude},
            sizes=[1, 2, *size])
        g = _engine("Resize", inputs, attrs, opset=19, consts=consts, input_order=order)
        # (the reference's cubic coefficients are off in the 7th digit: 0.42874975
        # where the exact normalised weight is 0.42875)
        rtol = 1e-12 if dtype == np.float64 and mode == "linear" else 1e-5
        np.testing.assert_allclose(
            g.forward([x])[0],
            _reference("Resize", inputs, attrs, 19, consts, order), rtol=rtol, atol=rtol)
        if dtype == np.float64:
            _finite_differences(g, inputs, "x")


@pytest.mark.parametrize("mode,a", [("linear", -0.75), ("cubic", -0.5)])
def test_resize_antialias_as_torch(mode, a):
    """torch's antialiased bilinear and bicubic are antialias=1 with
    exclude_outside=1 (its kernel stops at the border), bicubic with
    cubic_coeff_a=-0.5: values and the input's gradient."""
    x = _x((2, 3, 9, 10))
    inputs, consts, order, attrs, opset = _resize(
        x, {"mode": mode, "antialias": 1, "exclude_outside": 1, "cubic_coeff_a": a},
        sizes=[2, 3, 4, 3])
    torch_mode = "bilinear" if mode == "linear" else "bicubic"
    check_op("Resize", inputs,
             lambda x, *_: F.interpolate(x, size=(4, 3), mode=torch_mode, antialias=True),
             attrs=attrs, consts=consts, input_order=order, opset=opset)


@pytest.mark.parametrize("attrs,roi,sizes,scales", [
    ({"mode": "linear"}, [0, 0, 0.4, 0.6, 1, 1, 0.6, 0.8], [1, 2, 3, 3], None),
    ({"mode": "cubic", "extrapolation_value": 10.0}, [0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7],
     [1, 2, 3, 3], None),
    ({"mode": "nearest", "axes": [3, 2]}, [0.6, 0.4, 0.8, 0.6], [3, 4], None),
    ({"mode": "linear", "extrapolation_value": -1.0}, [0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], None,
     [1, 1, 1.5, 2]),
], ids=["linear", "cubic-extrapolation", "nearest-axes", "scales"])
def test_resize_tf_crop_and_resize_as_onnx_reference(attrs, roi, sizes, scales):
    x = _x((1, 2, 4, 5))
    attrs = dict(attrs, coordinate_transformation_mode="tf_crop_and_resize")
    inputs, consts, order, attrs, _ = _resize(x, attrs, roi=roi, sizes=sizes, scales=scales)
    g = _engine("Resize", inputs, attrs, opset=19, consts=consts, input_order=order)
    np.testing.assert_allclose(g.forward([x])[0],
                               _reference("Resize", inputs, attrs, 19, consts, order),
                               rtol=1e-6, atol=1e-6)
    _finite_differences(g, inputs, "x")


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners",
                                   "pytorch_half_pixel", "half_pixel_symmetric"])
def test_resize_cubic_exclude_outside_as_onnx_reference(coord):
    x = _x((1, 2, 4, 5))
    for scales in ([1, 1, 0.8, 1.6], [1, 1, 2, 0.5]):
        attrs = {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1,
                 "coordinate_transformation_mode": coord}
        inputs, consts, order, attrs, _ = _resize(x, attrs, scales=scales)
        g = _engine("Resize", inputs, attrs, opset=19, consts=consts, input_order=order)
        ref = _reference("Resize", inputs, attrs, 19, consts, order)
        if coord == "align_corners":  # the engine's length is the integer one (docs)
            continue
        np.testing.assert_allclose(g.forward([x])[0], ref, rtol=1e-6, atol=1e-6)
        _finite_differences(g, inputs, "x")


def test_resize_scales_as_graph_input_read_at_plan_time():
    """scales given as a graph input: read when the graph is planned, and a
    new value re-plans (the output's shape follows)."""
    x = _x((1, 1, 3, 4), np.float32)
    model = make_model("Resize", {"x": x, "scales": np.ones(4, np.float32)},
                       {"mode": "linear"}, opset=19, input_order=["x", "", "scales"])
    g = aidge_interop.load_onnx(model)
    for scales in ([1, 1, 2, 2], [1, 1, 0.5, 1.5]):
        s = np.array(scales, np.float32)
        ref = ReferenceEvaluator(model).run(None, {"x": x, "scales": s})[0]
        np.testing.assert_allclose(g.forward([x, s])[0], ref, rtol=1e-6, atol=1e-6)


def _upsample_model(mode, opset, scales, dtype):
    from onnx import helper, TensorProto

    if opset == 7:
        node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales)
        inits = []
    else:
        node = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)
        inits = [helper.make_tensor("s", TensorProto.FLOAT, [4], scales)]
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", t, None)],
                              [helper.make_tensor_value_info("y", t, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_as_onnxruntime(mode, opset):
    """The deprecated Upsample (scales an attribute at opset 7, an input at
    9): Resize with asymmetric coordinates and floor; values as ONNX
    Runtime, gradients by finite differences."""
    import onnxruntime as ort

    x = _x((1, 2, 3, 4), np.float32)
    scales = [1.0, 1.0, 2.0, 1.5]
    model = _upsample_model(mode, opset, scales, np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(aidge_interop.load_onnx(model).forward([x])[0], ref,
                               rtol=1e-6, atol=1e-6)
    g = aidge_interop.load_onnx(_upsample_model(mode, opset, scales, np.float64))
    _finite_differences(g, {"x": x.astype(np.float64)}, "x")
    bad = _upsample_model(mode, opset, [1.0, 1.0, 0.5, 1.0], np.float32)
    with pytest.raises(ValueError, match=r"Upsample node.*scales\[2\] is 0.5; >= 1 expected"):
        aidge_interop.load_onnx(bad).forward([x])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 0.6, 0.6], [1, 1, 1.7, 2.5], [1, 1, 0.5, 0.3]])
def test_resize_10_as_onnxruntime(scales, mode):
    """Resize-10 (X and scales): asymmetric, nearest by floor upsampling and
    ceil downsampling, as ONNX Runtime."""
    import onnxruntime as ort

    x = _x((1, 2, 4, 6), np.float32)
    model = make_model("Resize", {"x": x}, {"mode": mode},
                       consts={"s": np.array(scales, np.float32)}, opset=10)
    model.ir_version = 7
    model.graph.output[0].type.tensor_type.elem_type = 1  # (float, for ONNX Runtime)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    g = aidge_interop.load_onnx(model, param_kinds={"s": "const"})
    np.testing.assert_allclose(g.forward([x])[0], ref, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- LpPool, MaxPool Indices

LP_CASES = [
    ((2, 3, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 1]}, 2),
    ((2, 3, 7, 6), {"kernel_shape": [3, 3], "pads": [1, 0, 2, 1]}, 2),
    ((2, 3, 7, 6), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, 4),
    ((2, 3, 9), {"kernel_shape": [4], "strides": [3]}, 2),
    ((1, 2, 5, 4, 6), {"kernel_shape": [2, 2, 3]}, 2),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,attrs,p", LP_CASES, ids=[str(c[1]) for c in LP_CASES])
def test_lp_pool_as_torch(shape, attrs, p, dtype):
    """LpPool with even p is torch's lp_pool (x^p = |x|^p there) on the
    zero-padded input (ceil_mode's last windows: padded at the end, where
    torch's lp_pool would scale their sum): values and the input's
    gradient."""
    x = _x(shape, dtype)
    nsp = len(shape) - 2
    k, st = attrs["kernel_shape"], attrs.get("strides", [1] * nsp)
    pads = list(attrs.get("pads", [0] * 2 * nsp))
    for d in range(nsp):
        if attrs.get("ceil_mode"):
            span = shape[2 + d] + pads[d] + pads[nsp + d] - k[d]
            pads[nsp + d] += -span % st[d]
    torch_pad = [v for d in reversed(range(nsp)) for v in (pads[d], pads[nsp + d])]
    lp = [None, F.lp_pool1d, F.lp_pool2d, F.lp_pool3d][nsp]
    if nsp == 1:  # (lp_pool1d takes ints)
        k, st = k[0], st[0]
    check_op("LpPool", {"x": x}, lambda x: lp(F.pad(x, torch_pad), p, k, st),
             attrs=dict(attrs, p=p), opset=22)


@pytest.mark.parametrize("p", [1, 3])
def test_lp_pool_odd_p_dilations_finite_differences(p):
    """Odd p takes |x| (ONNX; torch's x^p differs): values as NumPy's sum,
    gradients by finite differences, with dilations and auto_pad."""
    x = _x((1, 2, 6, 5))
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 1], "auto_pad": "SAME_UPPER", "p": p}
    g = _engine("LpPool", {"x": x}, attrs)
    y = g.forward([x])[0]
    # SAME_UPPER, stride 1: window extents 3 and 2, pads (1, 0) then (1, 1) at the end
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 1)])
    ref = np.zeros_like(y)
    for i in range(6):
        for j in range(5):
            win = xp[:, :, i:i + 3:2, j:j + 2]
            ref[:, :, i, j] = (np.abs(win) ** p).sum(axis=(2, 3)) ** (1 / p)
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    _finite_differences(g, {"x": x}, "x")


def test_maxpool_indices_storage_order_column_major():
    """storage_order=1: Indices count the first spatial dim fastest; they
    read the maxima back from the transposed planes."""
    x = _x((2, 3, 5, 6))
    model = make_model("MaxPool", {"x": x}, {"kernel_shape": [2, 3], "strides": [2, 2],
                                             "storage_order": 1}, n_outputs=2, opset=12)
    y, ind = aidge_interop.load_onnx(model).forward([x])
    flat = np.stack([x[n, c].ravel(order="F") for n in range(2) for c in range(3)]).ravel()
    np.testing.assert_array_equal(flat[ind], y)
    ref = F.max_pool2d(torch.tensor(x), (2, 3), (2, 2))
    np.testing.assert_array_equal(y, ref.numpy())


# ---------------------------------------------------------------- MaxUnpool, LRN

@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_max_unpool_as_torch(nsp):
    """MaxPool's values and Indices unpooled: torch's max_unpool (whose
    indices count within each plane); the gradient gathers dY back."""
    shape = (2, 3) + (6, 5, 4)[:nsp]
    x = _x(shape)
    k, s = [2] * nsp, [2] * nsp
    pool = make_model("MaxPool", {"x": x}, {"kernel_shape": k, "strides": s}, n_outputs=2,
                      opset=12)
    y, ind = aidge_interop.load_onnx(pool).forward([x])
    plane = int(np.prod(shape[2:]))
    offsets = (np.arange(6).reshape(2, 3) * plane).reshape((2, 3) + (1,) * nsp)
    unpool = [None, F.max_unpool1d, F.max_unpool2d, F.max_unpool3d][nsp]
    check_op("MaxUnpool", {"y": y}, lambda y, i, out: unpool(y, i - torch.tensor(offsets), k,
                                                               s, output_size=shape[2:]),
             attrs={"kernel_shape": k, "strides": s},
             consts={"i": ind, "shape": np.array(shape, np.int64)},
             input_order=["y", "i", "shape"], opset=22)


def test_max_unpool_output_shape_and_bad_indices():
    """The indices count in output_shape, as torch's max_unpool and ONNX
    Runtime (ONNX's reference counts them in the unpooled shape, then pads
    it); an index outside the output is an IndexError."""
    x = _x((1, 2, 2, 2))
    ind = np.array([[[[0, 3], [8, 15]], [[27, 29], [36, 49]]]], np.int64)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    consts = {"i": ind, "shape": np.array([1, 2, 5, 5], np.int64)}
    g = _engine("MaxUnpool", {"x": x}, attrs, consts=consts, input_order=["x", "i", "shape"])
    ref = F.max_unpool2d(torch.tensor(x), torch.tensor(ind - [[[[0]], [[25]]]]), 2, 2,
                         output_size=(5, 5))
    np.testing.assert_array_equal(g.forward([x])[0], ref.numpy())
    _finite_differences(g, {"x": x}, "x")
    bad = _engine("MaxUnpool", {"x": x}, attrs, consts={"i": ind}, input_order=["x", "i"])
    with pytest.raises(IndexError, match=r"MaxUnpool node.*I\[6\] is 36; outside the 32"):
        bad.forward([x])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,size", [((2, 7, 4, 3), 3), ((2, 6, 5), 5), ((1, 4, 2, 2, 3), 1)])
def test_lrn_as_torch(shape, size, dtype):
    """Odd sizes are torch's LocalResponseNorm: values and gradient."""
    x = _x(shape, dtype)
    attrs = {"size": size, "alpha": 0.3, "beta": 0.6, "bias": 1.5}
    check_op("LRN", {"x": x}, lambda x: F.local_response_norm(x, size, 0.3, 0.6, 1.5),
             attrs=attrs, opset=13)


def test_lrn_even_size_finite_differences():
    """An even size sums floor((size-1)/2) channels before and ceil after
    (ONNX; torch's window leans the other way): NumPy's sum, finite
    differences."""
    x = _x((2, 6, 3, 2))
    attrs = {"size": 4, "alpha": 0.5, "beta": 0.8, "bias": 2.0}
    g = _engine("LRN", {"x": x}, attrs, opset=13)
    sq = np.zeros_like(x)
    for c in range(6):
        sq[:, c] = (x[:, max(0, c - 1):min(6, c + 3)] ** 2).sum(axis=1)
    np.testing.assert_allclose(g.forward([x])[0], x / (2.0 + 0.5 / 4 * sq) ** 0.8, rtol=1e-12)
    _finite_differences(g, {"x": x}, "x")


# ---------------------------------------------------------------- Col2Im

FOLD_CASES = [((5, 6), (2, 3), {}), ((7, 6), (3, 2), {"strides": [2, 1]}),
              ((6, 7), (2, 2), {"dilations": [2, 3], "pads": [1, 2, 1, 2]}),
              ((8, 5), (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 2]})]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("image,block,attrs", FOLD_CASES, ids=[str(c) for c in FOLD_CASES])
def test_col2im_as_torch_fold(image, block, attrs, dtype):
    """Col2Im is F.fold (symmetric pads); its gradient F.unfold."""
    st, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0] * 4)[:2]
    count = [(image[d] + 2 * pads[d] - dil[d] * (block[d] - 1) - 1) // st[d] + 1
             for d in range(2)]
    cols = _x((2, 3 * block[0] * block[1], count[0] * count[1]), dtype)
    check_op("Col2Im", {"cols": cols},
             lambda x, *_: F.fold(x, image, block, dilation=dil, padding=pads, stride=st),
             attrs=attrs, consts={"image": np.array(image, np.int64),
                                  "block": np.array(block, np.int64)}, opset=18)


@pytest.mark.parametrize("image,block,attrs", [
    ((7,), (3,), {"strides": [2], "pads": [0, 2]}),
    ((4, 3, 5), (2, 2, 3), {"dilations": [1, 2, 1], "pads": [1, 0, 0, 0, 1, 1]}),
], ids=["1d", "3d"])
def test_col2im_1d_3d_as_onnx_reference(image, block, attrs):
    """Asymmetric pads and 1 or 3 spatial dims (torch folds 2): values as
    ONNX's reference, gradients by finite differences."""
    r = len(image)
    st, dil = attrs.get("strides", [1] * r), attrs.get("dilations", [1] * r)
    pads = attrs.get("pads", [0] * 2 * r)
    count = [(image[d] + pads[d] + pads[r + d] - dil[d] * (block[d] - 1) - 1) // st[d] + 1
             for d in range(r)]
    cols = _x((1, 2 * int(np.prod(block)), int(np.prod(count))))
    consts = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    g = _engine("Col2Im", {"cols": cols}, attrs, opset=18, consts=consts)
    np.testing.assert_allclose(g.forward([cols])[0],
                               _reference("Col2Im", {"cols": cols}, attrs, 18, consts),
                               rtol=1e-12, atol=1e-12)
    _finite_differences(g, {"cols": cols}, "cols")


def test_col2im_refusals_name_the_node():
    cols = _x((1, 4, 6))
    consts = {"image": np.array([3, 4], np.int64), "block": np.array([2, 2], np.int64)}
    with pytest.raises(ValueError, match=r"Col2Im node.*input is \(1, 3, 6\); \(N, C \* 4, 6\)"):
        _engine("Col2Im", {"cols": _x((1, 3, 6))}, {}, opset=18, consts=consts) \
            .forward([_x((1, 3, 6))])
    with pytest.raises(ValueError, match="Col2Im node.*pads has 2 values"):
        _engine("Col2Im", {"cols": cols}, {"pads": [1, 1]}, opset=18, consts=consts) \
            .forward([cols])


# ---------------------------------------------------------------- ConvTranspose output_shape

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_conv_transpose_output_shape_larger_than_natural(dtype):
    """output_shape one larger than the natural size (ONNX's pads of -1,
    split rounding down: after the output): torch's output_padding, values
    and gradients of x, w and the bias."""
    x, w, b = _x((2, 3, 3, 4), dtype), _x((3, 2, 3, 3), dtype, seed=1), _x((2,), dtype, 2)
    # natural size: 3 * 2 + 3 = 9 and 3 * 3 + 3 = 12
    check_op("ConvTranspose", {"x": x, "w": w, "b": b},
             lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(3, 3), output_padding=(1, 1)),
             attrs={"strides": [3, 3], "output_shape": [10, 13]}, opset=11)


def test_conv_transpose_output_shape_too_large_is_refused():
    x, w = _x((1, 3, 3, 3)), _x((3, 2, 3, 3))
    for attrs, match in [({"strides": [2, 2], "output_shape": [9, 8]}, r"output_shape\[0\] is 9, "
                          "2 more"),
                         ({"strides": [3, 3], "output_shape": [10, 9],
                           "auto_pad": "SAME_UPPER"}, r"output_shape\[0\] is 10, 1 more")]:
        with pytest.raises(NotImplementedError, match="ConvTranspose node.*" + match):
            _engine("ConvTranspose", {"x": x, "w": w}, attrs, opset=11).forward([x, w])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.int64])
def test_maxpool_of_integers_as_torch(dtype):
    """MaxPool of an integer tensor (forward): torch's max_pool2d on the
    same values as float64, and its Indices."""
    info = np.iinfo(dtype)
    x = np.random.default_rng(0).integers(max(info.min, -1000), min(info.max, 1000),
                                          (2, 3, 7, 6)).astype(dtype)
    model = make_model("MaxPool", {"x": x}, {"kernel_shape": [3, 2], "strides": [2, 2],
                                             "pads": [1, 0, 1, 1]}, n_outputs=2, opset=12)
    y, ind = aidge_interop.load_onnx(model).forward([x])
    padded = F.pad(torch.tensor(x, dtype=torch.float64), (0, 1, 1, 1), value=-np.inf)
    ref = F.max_pool2d(padded, (3, 2), (2, 2))
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, ref.numpy().astype(dtype))
    np.testing.assert_array_equal(x.ravel()[ind], y)
