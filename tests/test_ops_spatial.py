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
