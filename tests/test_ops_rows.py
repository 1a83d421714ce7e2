"""The 16-lane row kernels (csrc/kernels/rows.c, AVX-512) and their
references (ops/norm.c's row kernels, ops/reduce.c's row sums): float32
Softmax and LogSoftmax along a contiguous last axis, forward and backward,
and ReduceSum / ReduceMean over a last axis, on lengths around the vector
width (16) and the sums' blocks (256).

- With the 16-lane kernels on and off (``_C._set_avx512``): each against
  torch (op_harness's tolerances), and the two within a few float32 ulps of
  each other (the 16-lane sums run in float blocks, the references in
  double; their exponentials use FMAs).
- On: the same values, bit for bit, at 1, 2 and 3 threads; NaN, infinities
  and very negative rows as torch.

Where the CPU or the build has no AVX-512, "on" runs the references, and
the comparisons of the two paths skip.
"""
import numpy as np
import pytest
import torch

import aidge_interop
from aidge_interop import _C
from op_harness import check_op, make_model

LENGTHS = [1, 7, 16, 17, 33, 128, 255, 256, 257, 1000, 4099]


@pytest.fixture(params=[True, False], ids=["v16", "reference"])
def wide(request):
    """The 16-lane kernels on, then off (the references); on afterwards."""
    _C._set_avx512(request.param)
    yield request.param
    _C._set_avx512(True)


def _x(shape, seed=0, lo=-3.0, hi=3.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def _run(op_type, x, attrs, consts=None, threads=1):
    """forward and the input gradient (output gradient: standard normal)"""
    consts = consts or {}
    model = make_model(op_type, {"x": x}, attrs, consts)
    saved = aidge_interop.get_num_threads()
    aidge_interop.set_num_threads(threads)
    try:
        g = aidge_interop.load_onnx(model, param_kinds={k: "const" for k in consts})
        (y,) = g.forward([x], need_backward=True, input_grads=True)
        go = np.random.default_rng(3).standard_normal(y.shape).astype(np.float32)
        (dx,) = g.backward([go])
    finally:
        aidge_interop.set_num_threads(saved)
    return np.array(y), np.array(dx)


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_rows_against_torch(wide, op, L):
    fn = torch.softmax if op == "Softmax" else torch.log_softmax
    check_op(op, {"x": _x((37, L))}, lambda x: fn(x, -1), attrs={"axis": -1})


@pytest.mark.parametrize("shape", [(1,), (7,), (5, 17), (3, 4, 256), (6, 4099), (4096, 33)],
                         ids=str)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_sum_rows_against_torch(wide, op, shape, keepdims):
    fn = torch.sum if op == "ReduceSum" else torch.mean
    check_op(op, {"x": _x(shape)}, lambda x, a: fn(x, -1, keepdim=bool(keepdims)),
             attrs={"keepdims": keepdims}, consts={"axes": np.array([-1], np.int64)})


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "ReduceSum", "ReduceMean"])
def test_v16_within_a_few_ulp_of_the_reference(avx512, op, L):
    x = _x((29, L))
    reduce = op.startswith("Reduce")
    attrs = {"keepdims": 1} if reduce else {"axis": -1}
    consts = {"axes": np.array([1], np.int64)} if reduce else None
    y1, dx1 = _run(op, x, attrs, consts)
    _C._set_avx512(False)
    y0, dx0 = _run(op, x, attrs, consts)
    if reduce:  # float blocks of 16 terms a lane against double lanes
        atol = 1e-6 * np.abs(x).sum(1).max()
        np.testing.assert_allclose(y1, y0, rtol=0, atol=atol)
        assert np.array_equal(dx1, dx0)  # the backward is the same broadcast
    else:
        scale = 1 + np.abs(y0) if op == "LogSoftmax" else np.abs(y0)
        assert np.all(np.abs(y1 - y0) <= 1e-6 * scale + 1e-38)
        np.testing.assert_allclose(dx1, dx0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "ReduceSum", "ReduceMean"])
def test_v16_same_values_at_any_thread_count(op):
    x = _x((300, 1000))
    reduce = op.startswith("Reduce")
    attrs = {"keepdims": 0} if reduce else {"axis": -1}
    consts = {"axes": np.array([-1], np.int64)} if reduce else None
    runs = [_run(op, x, attrs, consts, threads=n) for n in (1, 2, 3)]
    for n, (y, dx) in zip((2, 3), runs[1:]):
        assert np.array_equal(y, runs[0][0]) and np.array_equal(dx, runs[0][1]), \
            f"{op} at {n} threads differs from 1 thread"


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "ReduceSum"])
def test_nan_infinities_and_very_negative_rows_as_torch(wide, op):
    x = _x((6, 40)) * 30
    x[1, 5] = np.nan
    x[2, 0], x[2, 39] = -np.inf, np.inf
    x[3] = -1e30
    x[4, :] = -np.inf  # softmax: NaN, as torch
    x[5, 17] = -np.inf
    attrs = {"keepdims": 0} if op == "ReduceSum" else {"axis": -1}
    consts = {"axes": np.array([-1], np.int64)} if op == "ReduceSum" else None
    y, _ = _run(op, x, attrs, consts)
    t = torch.tensor(x)
    ref = (t.sum(-1) if op == "ReduceSum" else
           torch.softmax(t, -1) if op == "Softmax" else torch.log_softmax(t, -1)).numpy()
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    assert np.array_equal(np.isinf(y), np.isinf(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(y[fin], ref[fin], rtol=1e-4, atol=1e-5 * np.abs(ref[fin]).max())
