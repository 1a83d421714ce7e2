"""Issue 47, the ViTs' training step outside the GEMMs.

- Gelu (erf) backward in float32 by ai_gelu_erf_gradf (FMA polynomials, the
  forward's fraction): against its reference twin (torch's formula with
  ai_erff and ai_expf, ``_C._set_fast_kernels(False)``), against torch, and
  bit for bit at 1, 2 and 3 threads; float64 (unchanged) against torch and
  against central finite differences.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aidge_interop
from aidge_interop import _C
from op_harness import TOL, check_op, make_model


def _x(shape, seed=0, lo=-3, hi=3, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def _run(model, inputs, threads=1):
    """Outputs and input gradients of a one-node ``model`` (fixed random
    output gradients) at ``threads`` engine threads."""
    saved = aidge_interop.get_num_threads()
    try:
        aidge_interop.set_num_threads(threads)
        g = aidge_interop.load_onnx(model)
        outs = g.forward(list(inputs.values()), need_backward=True, input_grads=True)
        gos = [np.random.default_rng(3).standard_normal(o.shape).astype(o.dtype) for o in outs]
        return [np.array(a) for a in list(outs) + list(g.backward(gos))]
    finally:
        aidge_interop.set_num_threads(saved)


def _reference(fn):
    """fn() with the reference twins of the fast kernels; on again after."""
    try:
        assert _C._set_fast_kernels(False) is False
        return fn()
    finally:
        assert _C._set_fast_kernels(True) is True


# ---------------------------------------------------------------- Gelu backward

def _gelu_inputs(n, dtype=np.float32):
    x = _x((n,), lo=-8, hi=8, dtype=dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -6.0, 6.0, -14.0, 14.0], dtype)
    x[: min(n, len(special))] = special[: min(n, len(special))]
    return {"x": x}


@pytest.mark.parametrize("n", [1, 7, 33, 1000, 70000])
def test_gelu_backward_against_reference_twin(n):
    """The fast gradient against torch's formula with ai_erff and ai_expf
    (the reference twin) within float32's tolerance: values over [-8, 8]
    (past the fraction's clamp at 5.54 and where exp(-x^2/2) underflows),
    zeros, infinities (NaN: -inf * 0, as torch) and NaN."""
    inputs = _gelu_inputs(n)
    model = make_model("Gelu", inputs)
    fast = _run(model, inputs)
    ref = _reference(lambda: _run(model, inputs))
    rtol, atol = TOL[np.dtype(np.float32)]
    for a, b in zip(fast, ref):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if n >= 5:  # +-inf and NaN in x
        assert np.isnan(fast[1][2:5]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [7, 1000, 70000])
def test_gelu_backward_against_torch(n, dtype):
    """Output and input gradient against torch's gelu (erf), float32 on the
    fast kernels, float64 on the double formula."""
    check_op("Gelu", {"x": _x((n,), lo=-8, hi=8, dtype=dtype)}, F.gelu)


def test_gelu_float64_gradient_against_finite_differences():
    """The engine's float64 gradient against central differences of its
    own forward (step 1e-6): within 1e-8."""
    x = _x((200,), lo=-6, hi=6, dtype=np.float64)
    model = make_model("Gelu", {"x": x})
    g = aidge_interop.load_onnx(model)
    g.forward([x], need_backward=True, input_grads=True)
    (dx,) = g.backward([np.ones_like(x)])
    h = 1e-6
    up, = aidge_interop.load_onnx(model).forward([x + h])
    down, = aidge_interop.load_onnx(model).forward([x - h])
    np.testing.assert_allclose(np.array(dx), (np.array(up) - np.array(down)) / (2 * h),
                               rtol=0, atol=1e-8)


def test_gelu_backward_same_bits_at_any_thread_count():
    """Split by element ranges: the same gradient bits at 1, 2 and 3 threads
    (first write and accumulation alike)."""
    inputs = _gelu_inputs(3 * 65536 + 17)
    model = make_model("Gelu", inputs)
    base = _run(model, inputs, 1)
    for t in (2, 3):
        for a, b in zip(base, _run(model, inputs, t)):
            np.testing.assert_array_equal(a, b)


def test_gelu_backward_accumulates():
    """A value read by Gelu and by another node: Gelu's gradient adds to what
    the other wrote (the accumulating loop), against torch."""
    x = _x((4, 1000), lo=-4, hi=4)

    class M(torch.nn.Module):
        def forward(self, t):
            return F.gelu(t) * 2 + t * t

    m = M()
    am = aidge_interop.wrap(M(), (torch.from_numpy(x),))
    xs = [torch.tensor(x, requires_grad=True) for _ in range(2)]
    g = torch.randn(4, 1000)
    m(xs[0]).backward(g)
    am(xs[1]).backward(g)
    rtol, atol = TOL[np.dtype(np.float32)]
    np.testing.assert_allclose(xs[1].grad.numpy(), xs[0].grad.numpy(), rtol=rtol, atol=atol)

