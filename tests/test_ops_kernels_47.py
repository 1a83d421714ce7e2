"""The kernels of issue 47 (transformer-scale operators) against torch, on odd
sizes (1, 7, 33, 1000 elements along the axis), axes first, middle, last and
negative, float32 and float64; and the same values, bit for bit, at 1, 2 and
3 engine threads (the split of the work never changes a sum's order).

- Softmax, LogSoftmax: the row kernels (the axis last: contiguous rows,
  8 lanes for the max and the double sums) and the strided ones (an inner
  axis after it), forward and backward.
- LayerNormalization: backward's rows in chunks that depend on the shape
  alone (each its own dScale, dB sums, added in order), forward and all
  gradients.
- ReduceSum, ReduceMean (keepdims or not), Transpose, Concat, Pad, Gelu:
  forward and backward.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aidge_interop
from op_harness import check_op, make_model

DTYPES = [np.float32, np.float64]
DT_IDS = lambda d: np.dtype(d).name  # noqa: E731
SIZES = [1, 7, 33, 1000]


def _x(shape, dtype, seed=0, lo=-3, hi=3):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def _at_threads(op_type, inputs, attrs=None, consts=None, threads=(1, 2, 3)):
    """Outputs and input gradients of a one-node graph at each engine thread
    count: all equal, bit for bit."""
    consts = consts or {}
    model = make_model(op_type, inputs, attrs, consts)
    saved = aidge_interop.get_num_threads()
    results = []
    try:
        for n in threads:
            aidge_interop.set_num_threads(n)
            g = aidge_interop.load_onnx(model, param_kinds={k: "const" for k in consts})
            outs = g.forward(list(inputs.values()), need_backward=True, input_grads=True)
            gos = [np.random.default_rng(3).standard_normal(o.shape).astype(o.dtype)
                   for o in outs]
            grads = g.backward(gos)
            results.append([np.array(a) for a in list(outs) + list(grads)])
    finally:
        aidge_interop.set_num_threads(saved)
    for n, res in zip(threads[1:], results[1:]):
        for i, (a, b) in enumerate(zip(results[0], res)):
            assert np.array_equal(a, b, equal_nan=True), \
                f"{op_type}: result {i} at {n} threads differs from 1 thread"


# ---------------------------------------------------------------- Softmax, LogSoftmax

SM_CASES = [((L,), -1) for L in SIZES] + [
    ((5, 33), 1), ((3, 1000), -1), ((2, 7, 33), -1), ((2, 7, 33), 1), ((33, 7, 2), 0),
    ((4, 1, 7), -2), ((64, 1000), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axis", SM_CASES, ids=str)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(op, shape, axis, dtype):
    fn = torch.softmax if op == "Softmax" else torch.log_softmax
    check_op(op, {"x": _x(shape, dtype)}, lambda x: fn(x, axis), attrs={"axis": axis})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_large_values_and_infinities(op):
    x = _x((6, 33), np.float32) * 30
    x[2] = -1e30
    if op == "Softmax":  # (LogSoftmax's -inf output would make the tolerance infinite)
        x[1, 4] = -np.inf
    fn = torch.softmax if op == "Softmax" else torch.log_softmax
    check_op(op, {"x": x}, lambda t: fn(t, -1), attrs={"axis": -1}, grad=False)


@pytest.mark.parametrize("shape,axis", [((300, 1000), -1), ((40, 33, 60), 1)], ids=str)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_threads(op, shape, axis):
    _at_threads(op, {"x": _x(shape, np.float32)}, {"axis": axis})


# ---------------------------------------------------------------- LayerNormalization

LN_CASES = [((3, H), -1) for H in SIZES] + [
    ((300, 1000), -1), ((4096, 33), -1), ((2, 7, 33), 1), ((5, 3, 7), -2), ((7, 33, 1), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axis", LN_CASES, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_layernorm(shape, axis, bias, dtype):
    norm = shape[axis:] if axis != -1 else shape[-1:]
    ins = {"x": _x(shape, dtype), "s": _x(norm, dtype, 1)}
    if bias:
        ins["b"] = _x(norm, dtype, 2)
    check_op("LayerNormalization", ins,
             lambda x, s, b=None: F.layer_norm(x, tuple(norm), s, b, 1e-5),
             attrs={"axis": axis})


@pytest.mark.parametrize("shape", [(300, 1000), (4096, 33), (2000, 7)], ids=str)
def test_layernorm_threads(shape):
    _at_threads("LayerNormalization",
                {"x": _x(shape, np.float32), "s": _x(shape[-1:], np.float32, 1),
                 "b": _x(shape[-1:], np.float32, 2)}, {"axis": -1})


# ---------------------------------------------------------------- reductions

RED_CASES = [((L,), [0]) for L in SIZES] + [
    ((7, 33), [0]), ((7, 33), [1]), ((7, 33), [-1]), ((3, 33, 7), [1]), ((3, 33, 7), [0, 2]),
    ((64, 33, 130), [1]), ((64, 33, 130), [-1]), ((1000, 7), [-2]), ((600, 1000), [0])]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axes", RED_CASES, ids=str)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_reduce(op, shape, axes, keepdims, dtype):
    fn = torch.sum if op == "ReduceSum" else torch.mean
    check_op(op, {"x": _x(shape, dtype)},
             lambda x, a: fn(x, tuple(axes), keepdim=bool(keepdims)),
             attrs={"keepdims": keepdims}, consts={"axes": np.array(axes, np.int64)})


@pytest.mark.parametrize("shape,axes", [((64, 64, 130), [1]), ((4096, 33), [-1]),
                                        ((600, 1000), [0]), ((5, 40, 999), [0, 1])], ids=str)
def test_reduce_threads(shape, axes):
    _at_threads("ReduceSum", {"x": _x(shape, np.float32)}, {"keepdims": 0},
                {"axes": np.array(axes, np.int64)})


# ---------------------------------------------------------------- Transpose, Concat, Pad, Gelu

@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,perm", [
    ((1000,), [0]), ((7, 33), [1, 0]), ((33, 1000), [1, 0]), ((3, 7, 33), [0, 2, 1]),
    ((3, 7, 33), [2, 0, 1]), ((2, 33, 7, 9), [0, 2, 1, 3])], ids=str)
def test_transpose(shape, perm, dtype):
    check_op("Transpose", {"x": _x(shape, dtype)}, lambda x: x.permute(*perm),
             attrs={"perm": perm})


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shapes,axis", [
    ([(1,), (7,)], 0), ([(7, 33), (7, 1)], 1), ([(7, 33), (1, 33), (3, 33)], -2),
    ([(2, 33, 7), (2, 1000, 7)], 1), ([(2, 3, 7), (2, 3, 33)], -1)], ids=str)
def test_concat(shapes, axis, dtype):
    ins = {f"x{i}": _x(s, dtype, i) for i, s in enumerate(shapes)}
    check_op("Concat", ins, lambda *xs: torch.cat(xs, axis), attrs={"axis": axis})


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("shape", [(2, 3, 7, 33), (1, 2, 33, 7)], ids=str)
def test_pad(shape, mode, dtype):
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    check_op("Pad", {"x": _x(shape, dtype)},
             lambda x, p: F.pad(x, (2, 1, 1, 2), mode={"edge": "replicate"}.get(mode, mode)),
             attrs={"mode": mode}, consts={"pads": np.array(pads, np.int64)})


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("n", SIZES + [33 * 1000])
def test_gelu(n, dtype):
    check_op("Gelu", {"x": _x((n,), dtype)}, F.gelu)


@pytest.mark.parametrize("op,shape,attrs", [
    ("Transpose", (64, 130, 33), {"perm": [0, 2, 1]}),
    ("Pad", (8, 32, 33, 34), {"mode": "reflect"}),
    ("Gelu", (64, 64, 33), {})], ids=str)
def test_movement_threads(op, shape, attrs):
    consts = {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)} if op == "Pad" else None
    _at_threads(op, {"x": _x(shape, np.float32)}, attrs, consts)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5, -1.0])
def test_pow_by_a_constant_as_torch(exponent, dtype):
    """Pow by a constant exponent: 2 and 3 are products (GPT-2's tanh GELU
    computes x^3; torch and ONNX Runtime multiply), equal to torch bit for
    bit; the others powf/pow, within torch's rounding."""
    x = _x((33, 1000), dtype, lo=0.1, hi=4) * np.where(np.arange(1000) % 2, 1, -1).astype(dtype)
    if exponent == 2.5:
        x = np.abs(x)
    model = make_model("Pow", {"x": x}, None, {"e": np.array(exponent, dtype)})
    (y,) = aidge_interop.load_onnx(model).forward([x])
    expected = torch.from_numpy(x).pow(exponent).numpy()
    if exponent in (2.0, 3.0):
        np.testing.assert_array_equal(y, expected)
    else:
        torch.testing.assert_close(torch.from_numpy(y), torch.from_numpy(expected))
