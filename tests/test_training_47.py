"""The training step of transformer models (issue 47): the backward kernels
and paths it runs, against torch.

- Pow by a constant (GPT-2's tanh GELU: x^3): the base's gradient, bit for
  bit with torch for exponents 2 and 3 (products, in torch's order), within
  torch's rounding for the others.
- Gemm's C gradient with beta 1 (a Linear's bias, read straight from dY) and
  other betas.
"""
import numpy as np
import pytest
import torch

import aidge_interop
from op_harness import check_op, make_model

DTYPES = [np.float32, np.float64]
DT_IDS = lambda d: np.dtype(d).name  # noqa: E731


def _x(shape, dtype, seed=0, lo=-3, hi=3):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def _engine_step(op_type, inputs, attrs=None, consts=None, seed=3):
    """Outputs and input gradients of a one-node graph for a random output
    gradient (returned too)."""
    consts = consts or {}
    g = aidge_interop.load_onnx(make_model(op_type, inputs, attrs, consts),
                                param_kinds={k: "const" for k in consts})
    outs = g.forward(list(inputs.values()), need_backward=True, input_grads=True)
    gos = [np.random.default_rng(seed).standard_normal(o.shape).astype(o.dtype) for o in outs]
    return [np.array(o) for o in outs], [np.array(d) for d in g.backward(gos)], gos


# ---------------------------------------------------------------- Pow

@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5, -1.0, 0.0])
@pytest.mark.parametrize("shape", [(33, 1000), (7,), (2, 1, 5)], ids=str)
def test_pow_by_a_constant_backward_as_torch(shape, exponent, dtype):
    x = _x(shape, dtype, lo=0.1, hi=4) * np.where(np.arange(shape[-1]) % 2, 1, -1).astype(dtype)
    if exponent == 2.5:
        x = np.abs(x)
    _, (dx,), (go,) = _engine_step("Pow", {"x": x}, consts={"e": np.array(exponent, dtype)})
    xt = torch.from_numpy(x).requires_grad_()
    xt.pow(exponent).backward(torch.from_numpy(go))
    if exponent in (2.0, 3.0, 0.0):
        np.testing.assert_array_equal(dx, xt.grad.numpy())
    else:
        torch.testing.assert_close(torch.from_numpy(dx), xt.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_pow_by_a_tensor_backward(dtype):
    """An exponent that varies along the row (and its own gradient) stays on
    the general path."""
    a = _x((4, 6), dtype, lo=0.5, hi=2)
    b = np.tile(np.array([2, 3, 2.5, 1, 0, -1], dtype), (4, 1))
    check_op("Pow", {"a": a, "b": b}, torch.pow)


# ---------------------------------------------------------------- Gemm's C

@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("beta", [1.0, 0.5])
@pytest.mark.parametrize("c_shape", [(5,), (1, 5), (3, 5)], ids=str)
def test_gemm_c_gradient(c_shape, beta, dtype):
    a, b, c = _x((3, 4), dtype), _x((5, 4), dtype, seed=1), _x(c_shape, dtype, seed=2)
    check_op("Gemm", {"a": a, "b": b, "c": c},
             lambda a, b, c: a @ b.T + beta * c, attrs={"transB": 1, "beta": beta})
