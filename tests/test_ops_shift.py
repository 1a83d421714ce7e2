"""ShiftGELU and ShiftMax (domain "aidge", csrc/ops/shift.c) against the torch
reference modules of tests/operators/shift_reference.py.

The engine evaluates the formulas in double for float32 tensors too (every
intermediate is then an exact integer, as on integer hardware) and rounds the
result once. Its float32 results are therefore compared with the reference
run in float64 on the same values (``x.double()``), at float32 tolerance; the
reference run in float32 rounds 2^31 - 1 and the formula's large integers and
moves some floors by one step (see test_float32_reference_moves_floors).
Gradients are the straight-through ones: checked against torch autograd on
the reference, and against central finite differences of the formula with
its floors frozen at the evaluation point.
"""
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import aidge_interop
from op_harness import check_op, make_model
from operators import shift_reference
from operators.shift_reference import ShiftGELU, ShiftMax

DTYPES = [np.float32, np.float64]
OPS = {"ShiftGELU": ShiftGELU, "ShiftMax": ShiftMax}
SHAPES = [(2, 5), (3, 4, 17), (2, 3, 8, 8)]
SCALES = [1e-3, 0.5, 1.0, 3.0, 100.0, 1e4]


def reference(op):
    """The reference module evaluated in float64, cast back to x's dtype."""
    module = OPS[op]()
    return lambda x: module(x.double()).to(x.dtype)


def check(op, x, **kw):
    return check_op(op, {"x": x}, reference(op), domain="aidge", **kw)


def _x(shape, dtype, scale, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def _engine(op, x, gy):
    g = aidge_interop.load_onnx(make_model(op, {"x": x}, domain="aidge"))
    (y,) = g.forward([x], input_grads=True)
    (dx,) = g.backward([gy])
    return y, dx


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("scale", SCALES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_against_reference(op, shape, scale, dtype):
    check(op, _x(shape, dtype, scale, seed=len(shape)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(6,), (4, 1), (1, 9)], ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_edge_shapes(op, shape, dtype):
    check(op, _x(shape, dtype, 2.0))


@pytest.mark.parametrize("shape", [(2, 0, 3), (3, 0)], ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_empty_input(op, shape):
    """No elements (torch.max cannot reduce them; the engine returns empty)."""
    x = np.zeros(shape, np.float32)
    y, dx = _engine(op, x, x)
    assert y.shape == shape and dx.shape == shape


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(OPS))
def test_all_zero_input(op, dtype):
    """S == 0: GELU(0) = 0 / the uniform softmax, zero gradient."""
    x = np.zeros((3, 4, 5), dtype)
    (y,) = check(op, x)
    np.testing.assert_array_equal(y, 0.0 if op == "ShiftGELU" else np.full_like(x, 0.2))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(OPS))
def test_rows_far_below_the_maximum(op, dtype):
    """Large magnitudes with rows far below the tensor's maximum: x0 = -1,
    ShiftGELU's exp_shift(-m) reaches 2^197 and clamps the sum at 2^31 - 1."""
    x = np.random.default_rng(3).uniform(-127, -80, (4, 11)).astype(dtype)
    x[0, 3] = 127
    check(op, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(OPS))
def test_ties(op, dtype):
    """Tied row maxima (the gradient goes to the first, like torch.max(dim))
    and t1 == N * x0 in exp_shift (torch.maximum halves the gradient): with
    S = 0.5, x0 = -2 and p - max(p) = -21 gives t1 = -21 - 11 + 2 = -30."""
    x = np.array([[63.5, 53.0, 63.5, 1.0, -3.0],
                  [2.0, 7.0, 7.0, 7.0, -1.0],
                  [-5.0, -5.0, -5.0, -5.0, -5.0]], dtype)
    check(op, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_shiftmax_outputs_are_exact(dtype):
    """ShiftMax outputs are multiples of 1/128: float32 holds the float64
    reference exactly."""
    x = _x((3, 4, 17), dtype, 1.5)
    y, _ = _engine("ShiftMax", x, np.ones_like(x))
    ref = ShiftMax()(torch.tensor(x, dtype=torch.float64)).numpy()
    np.testing.assert_array_equal(y, ref.astype(dtype))
    np.testing.assert_array_equal(y * 128, np.floor(y * 128))


def test_float32_reference_moves_floors():
    """Why float32 is compared with the float64 reference: in float32, torch
    rounds 2^31 - 1 to 2^31, so where e == exp_shift(-m) the sigmoid is
    floor(e * 2^30 / 2^24) = 64 instead of floor(e * (2^30 - 1) / 2^24) = 63."""
    x = np.array([[-127.0, -127.0, 100.0]], np.float32)
    x32 = torch.tensor(x)
    y32 = ShiftGELU()(x32).numpy()
    y64 = ShiftGELU()(x32.double()).numpy()
    y, _ = _engine("ShiftGELU", x, np.ones_like(x))
    np.testing.assert_allclose(y32[0, :2] - y64[0, :2], -127 / 128, rtol=1e-6)  # p * S / 128
    np.testing.assert_allclose(y, y64.astype(np.float32), rtol=1e-6)


class _FrozenFloors:
    """Stands in for the reference's floor_ste and per_tensor_scale: while
    recording, floors are floors and their offsets floor(v) - v are kept;
    while replaying, the k-th floor returns v + the k-th offset and the
    scale stays the recorded one. Near the recorded point the replayed
    formula is smooth and its derivative is the straight-through gradient."""

    def __init__(self, scale_fn):
        self.scale_fn, self.scale = scale_fn, None
        self.offsets, self.replay, self.k = [], False, 0

    def floor_ste(self, v):
        if not self.replay:
            self.offsets.append(torch.floor(v) - v)
            return torch.floor(v)
        self.k += 1
        return v + self.offsets[self.k - 1]

    def per_tensor_scale(self, x):
        if self.scale is None:
            self.scale = self.scale_fn(x)
        return self.scale


@pytest.mark.parametrize("shape", [(2, 5), (3, 7)], ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_gradient_finite_differences(op, shape, monkeypatch):
    x = _x(shape, np.float64, 2.0, seed=11)
    gy = np.random.default_rng(12).standard_normal(shape)
    _, dx = _engine(op, x, gy)

    frozen = _FrozenFloors(shift_reference.per_tensor_scale)
    monkeypatch.setattr(shift_reference, "floor_ste", frozen.floor_ste)
    monkeypatch.setattr(shift_reference, "per_tensor_scale", frozen.per_tensor_scale)
    module = OPS[op]()

    def loss(v):
        frozen.k = 0
        return float((module(torch.tensor(v)) * torch.tensor(gy)).sum())

    at_x = loss(x)  # records
    frozen.replay = True
    assert loss(x) == pytest.approx(at_x, rel=1e-12)
    h = 1e-6
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        fd[i] = (loss(xp) - loss(xm)) / (2 * h)
    np.testing.assert_allclose(dx, fd, rtol=1e-6, atol=1e-8 * np.abs(fd).max())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gradients_accumulate(dtype):
    """x feeds both operators: its gradient is the sum of both backwards."""
    x = _x((3, 6), dtype, 4.0)
    node_g = helper.make_node("ShiftGELU", ["x"], ["g"], domain="aidge")
    node_m = helper.make_node("ShiftMax", ["x"], ["m"], domain="aidge")
    ty = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    graph = helper.make_graph(
        [node_g, node_m], "both", [helper.make_tensor_value_info("x", ty, list(x.shape))],
        [helper.make_tensor_value_info(n, ty, None) for n in ("g", "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("aidge", 1)])
    g = aidge_interop.load_onnx(model)
    g.forward([x], input_grads=True)
    rng = np.random.default_rng(5)
    gys = [rng.standard_normal(x.shape).astype(dtype) for _ in range(2)]
    (dx,) = g.backward(gys)

    t = torch.tensor(x, requires_grad=True)
    ys = [reference("ShiftGELU")(t), reference("ShiftMax")(t)]
    (ref,) = torch.autograd.grad(ys, [t], [torch.tensor(gy) for gy in gys])
    rtol, atol = (1e-4, 1e-5) if dtype == np.float32 else (1e-10, 1e-12)
    np.testing.assert_allclose(dx, ref.numpy(), rtol=rtol, atol=atol * np.abs(ref.numpy()).max())


@pytest.mark.parametrize("op", list(OPS))
def test_rejects_integer_and_scalar_inputs(op):
    with pytest.raises(Exception, match="float32 or float64"):
        g = aidge_interop.load_onnx(make_model(op, {"x": np.ones((2, 3), np.int64)},
                                               domain="aidge"))
        g.forward([np.ones((2, 3), np.int64)])
    with pytest.raises(Exception, match="rank >= 1"):
        g = aidge_interop.load_onnx(make_model(op, {"x": np.ones((), np.float32)},
                                               domain="aidge"))
        g.forward([np.ones((), np.float32)])
