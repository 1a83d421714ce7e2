"""The fast row kernels against their portable reference twins
(``_C._set_fast_kernels``): the same one-node graph run with the fast
kernels on and off gives the same outputs and gradients within float32's
tolerance (tests/op_harness.py's), on sizes that leave partial vectors,
blocks of rows and blocks of a long row; and the same values, bit for bit,
at 1, 2 and 3 engine threads.

- LayerNormalization backward (float32): one pass for the row sums and the
  column sums of dScale, dB in float blocks of rows, then dx; with the Mean
  and InvStdDev outputs (their gradients enter dx), without B, and with X a
  constant (no dx: the column sums alone).
- Pad forward of rank 2 and more (plane by plane): bit for bit, every mode
  and element size.
- Gelu (erf) forward in float32 (ai_gelu_erff, FMA polynomials).
- Sigmoid forward in float32 (ai_expf_fma).
- Clip backward, now branch free, against torch.
"""
import numpy as np
import pytest
import torch

import aidge_interop
from aidge_interop import _C
from op_harness import TOL, check_op, make_model


def _x(shape, seed=0, lo=-3, hi=3, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def _run(model, inputs, consts):
    """Outputs and input gradients of ``model`` (random output gradients)."""
    g = aidge_interop.load_onnx(model, param_kinds={k: "const" for k in consts})
    outs = g.forward(list(inputs.values()), need_backward=True, input_grads=True)
    gos = [np.random.default_rng(3).standard_normal(o.shape).astype(o.dtype) for o in outs]
    return [np.array(a) for a in list(outs) + list(g.backward(gos))]


def _forward(model, inputs, consts):
    """Outputs of ``model``, forward only."""
    g = aidge_interop.load_onnx(model, param_kinds={k: "const" for k in consts})
    return [np.array(a) for a in g.forward(list(inputs.values()))]


def _both(model, inputs, consts, run=_run):
    """(``run``'s results with the fast kernels, with their reference twins);
    the fast kernels are on again afterwards."""
    try:
        assert _C._set_fast_kernels(False) is False
        ref = run(model, inputs, consts)
    finally:
        assert _C._set_fast_kernels(True) is True
    return run(model, inputs, consts), ref


@pytest.fixture
def fast_and_reference():
    """fn(model, inputs, consts) -> (outputs and input gradients with the fast
    kernels, with their reference twins)."""
    return _both


def _assert_close(fast, ref, what):
    rtol, atol = TOL[np.dtype(np.float32)]
    assert len(fast) == len(ref)
    for i, (a, b) in enumerate(zip(fast, ref)):
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * scale,
                                   err_msg=f"{what}: result {i}, fast kernel against reference")


def _at_threads(model, inputs, consts, threads=(1, 2, 3)):
    saved = aidge_interop.get_num_threads()
    try:
        results = []
        for n in threads:
            aidge_interop.set_num_threads(n)
            results.append(_run(model, inputs, consts))
    finally:
        aidge_interop.set_num_threads(saved)
    for n, res in zip(threads[1:], results[1:]):
        for i, (a, b) in enumerate(zip(results[0], res)):
            assert np.array_equal(a, b), f"result {i} at {n} threads differs from 1 thread"


# ---------------------------------------------------------------- LayerNormalization

# H: under one vector, partial vectors, several LN_ROW_BLOCK blocks of a
# row; R: under and over the 16-row blocks of the column sums
LN_SHAPES = [(3, 1), (5, 7), (17, 8), (33, 33), (40, 128), (3, 1100), (2, 3, 5, 37)]


def _ln_model(shape, bias, outputs, x_const):
    ins = {"x": _x(shape), "s": _x(shape[-1:], 1)}
    if bias:
        ins["b"] = _x(shape[-1:], 2)
    consts = {"x": ins.pop("x")} if x_const else {}
    order = ["x", "s"] + (["b"] if bias else [])
    model = make_model("LayerNormalization", ins, {"axis": -1}, consts, n_outputs=outputs,
                       input_order=order)
    return model, ins, consts


@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("outputs", [1, 3])
def test_layernorm_backward_against_reference(fast_and_reference, shape, bias, outputs):
    model, ins, consts = _ln_model(shape, bias, outputs, x_const=False)
    fast, ref = fast_and_reference(model, ins, consts)
    _assert_close(fast, ref, f"LayerNormalization {shape}")


@pytest.mark.parametrize("shape", [(33, 37), (40, 128)], ids=str)
def test_layernorm_backward_column_sums_alone(fast_and_reference, shape):
    """X a constant: no dx, dScale and dB from the column sums alone."""
    model, ins, consts = _ln_model(shape, True, 1, x_const=True)
    fast, ref = fast_and_reference(model, ins, consts)
    assert len(fast) == 3  # y, dScale, dB
    _assert_close(fast, ref, f"LayerNormalization {shape}, X constant")


def test_layernorm_backward_offset_rows(fast_and_reference):
    """Rows far from 0 (mean 1000, spread 1): the rows' d = x - mean stays
    exact, as in the reference."""
    model, ins, consts = _ln_model((64, 96), True, 3, x_const=False)
    ins = {"x": _x((64, 96), lo=999, hi=1001), **{k: v for k, v in ins.items() if k != "x"}}
    fast, ref = fast_and_reference(model, ins, consts)
    _assert_close(fast, ref, "LayerNormalization, offset rows")


@pytest.mark.parametrize("shape", [(600, 128), (300, 1000), (4096, 33)], ids=str)
def test_layernorm_backward_threads(shape):
    model, ins, consts = _ln_model(shape, True, 1, x_const=False)
    _at_threads(model, ins, consts)


# ---------------------------------------------------------------- Pad

PAD_CASES = [
    # shape, pads (begins then ends)
    ((7, 33), [1, 2, 2, 1]),
    ((2, 3, 7, 33), [0, 0, 1, 2, 0, 0, 2, 1]),
    ((2, 3, 5, 200), [0, 1, 3, 5, 1, 0, 2, 130]),  # long rows (memcpy), pads past the axis
    ((2, 2, 3, 4, 5), [0, 1, 0, 2, 1, 1, 0, 1, 2, 2]),
    ((3, 6, 9), [0, -1, 2, 0, -2, -3]),  # negative pads crop
    ((4, 5), [0, 0, 0, 0]),
]


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.int64],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("shape,pads", PAD_CASES, ids=str)
def test_pad_forward_against_reference(shape, pads, mode, dtype):
    """The plane kernel gives the row kernel's values, bit for bit, for every
    element size and mode (the constant 7: rows and planes of it; reflect and
    wrap past the axis repeat, as numpy's)."""
    x = (_x(shape, lo=0, hi=100)).astype(dtype)
    consts = {"pads": np.array(pads, np.int64), "value": np.array(7, dtype)}
    model = make_model("Pad", {"x": x}, {"mode": mode}, consts)
    fast, ref = _both(model, {"x": x}, consts, run=_forward)
    np.testing.assert_array_equal(fast[0], ref[0])


# ---------------------------------------------------------------- Gelu

@pytest.mark.parametrize("n", [1, 7, 33, 1000, 70000])
def test_gelu_forward_against_reference(n):
    """Gelu (erf) in float32 by ai_gelu_erff against torch's formula with
    ai_erff: values over [-8, 8] (past the clamp at 5.54 either way), zeros,
    infinities and NaN."""
    x = _x((n,), lo=-8, hi=8)
    x[: min(n, 6)] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -6.0], np.float32)[: min(n, 6)]
    model = make_model("Gelu", {"x": x})
    fast, ref = _both(model, {"x": x}, {}, run=_forward)
    rtol, atol = TOL[np.dtype(np.float32)]
    np.testing.assert_allclose(fast[0], ref[0], rtol=rtol, atol=atol, equal_nan=True)


# ---------------------------------------------------------------- Clip

@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_clip_backward_branch_free_as_torch(dtype):
    """Clip's backward (a select, no branch per value): the gradient passes
    inside the bounds, at them (torch.clamp), not outside nor at NaN."""
    x = _x((1000,), lo=-2, hi=2, dtype=dtype)
    x[:5] = np.array([-1, 1, np.nan, -np.inf, np.inf], dtype)
    check_op("Clip", {"x": x}, lambda t, lo, hi: torch.clamp(t, lo, hi),
             consts={"lo": np.array(-1, dtype), "hi": np.array(1, dtype)})


# ---------------------------------------------------------------- Sigmoid

@pytest.mark.parametrize("n", [1, 7, 33, 70000])
def test_sigmoid_forward_against_reference(n):
    """Sigmoid in float32 with ai_expf_fma against ai_expf's kernel: values
    over [-100, 100] (exp's saturation either way), infinities and NaN."""
    x = _x((n,), lo=-100, hi=100)
    x[: min(n, 4)] = np.array([0.0, np.inf, -np.inf, np.nan], np.float32)[: min(n, 4)]
    model = make_model("Sigmoid", {"x": x})
    fast, ref = _both(model, {"x": x}, {}, run=_forward)
    rtol, atol = TOL[np.dtype(np.float32)]
    np.testing.assert_allclose(fast[0], ref[0], rtol=rtol, atol=atol, equal_nan=True)
    check_op("Sigmoid", {"x": x[4:] if n > 4 else x}, torch.sigmoid)
