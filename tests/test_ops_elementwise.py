"""Elementwise operators of the engine (unary.c, binary.c) against torch."""
import numpy as np
import pytest
import torch

from op_harness import check_op

DTYPES = [np.float32, np.float64]


def _x(shape, dtype, seed=0, lo=-3, hi=3):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


UNARY = {
    "Relu": (torch.relu, {}, None),
    "LeakyRelu": (lambda x: torch.nn.functional.leaky_relu(x, 0.2), {"alpha": 0.2}, None),
    "Sigmoid": (torch.sigmoid, {}, None),
    "Tanh": (torch.tanh, {}, None),
    "Gelu": (lambda x: torch.nn.functional.gelu(x), {}, None),
    "Gelu_tanh": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                  {"approximate": "tanh"}, "Gelu"),
    "Erf": (torch.erf, {}, None),
    "Exp": (torch.exp, {}, None),
    "Abs": (torch.abs, {}, None),
    "Neg": (torch.neg, {}, None),
    "Floor": (torch.floor, {}, None),
    "Ceil": (torch.ceil, {}, None),
    "Round": (torch.round, {}, None),
    "Identity": (lambda x: x * 1, {}, None),
    "Softplus": (torch.nn.functional.softplus, {}, None),
    "HardSwish": (torch.nn.functional.hardswish, {}, None),
    # torch's hardsigmoid is ONNX's with alpha 1/6 (as exported); the default 0.2
    # HardSigmoid: torch's alpha 1/6 is not a short decimal (checked in float32 below)
    "HardSigmoid": (lambda x: torch.clamp(0.25 * x + 0.5, 0, 1), {"alpha": 0.25, "beta": 0.5},
                    None),
    "HardSigmoid_default": (lambda x: torch.clamp(0.2 * x + 0.5, 0, 1), {}, "HardSigmoid"),
    "Elu": (lambda x: torch.nn.functional.elu(x, 0.7), {"alpha": 0.7}, None),
    "Elu_default": (torch.nn.functional.elu, {}, "Elu"),
    "Selu": (torch.nn.functional.selu, {}, None),
    # (alpha 2: torch's celu backward takes 1 / alpha in float32, 1.3 would show it)
    "Celu": (lambda x: torch.nn.functional.celu(x, 2.0), {"alpha": 2.0}, None),
    "Sin": (torch.sin, {}, None),
    "Cos": (torch.cos, {}, None),
    "Atan": (torch.atan, {}, None),
    "Tan": (torch.tan, {}, None),
    "Sinh": (torch.sinh, {}, None),
    "Cosh": (torch.cosh, {}, None),
    "Asinh": (torch.asinh, {}, None),
    "Softsign": (torch.nn.functional.softsign, {}, None),
    "Softsign_expr": (lambda x: x / (1 + torch.abs(x)), {}, "Softsign"),
    "Mish": (torch.nn.functional.mish, {}, None),
    "Mish_expr": (lambda x: x * torch.tanh(torch.nn.functional.softplus(x)), {}, "Mish"),
    "Swish": (torch.nn.functional.silu, {}, None),
    "Swish_alpha": (lambda x: x * torch.sigmoid(0.75 * x), {"alpha": 0.75}, "Swish"),
    "ThresholdedRelu": (lambda x: torch.where(x > 0.5, x, 0), {"alpha": 0.5}, None),
    "ThresholdedRelu_default": (lambda x: torch.where(x > 1, x, 0), {}, "ThresholdedRelu"),
    "Shrink": (lambda x: torch.where(x < -1.5, x + 0.25, torch.where(x > 1.5, x - 0.25, 0)),
               {"lambd": 1.5, "bias": 0.25}, None),
    "Shrink_hard": (torch.nn.functional.hardshrink, {}, "Shrink"),
    "Shrink_soft": (lambda x: torch.nn.functional.softshrink(x, 0.5), {"bias": 0.5}, "Shrink"),
    "Sign": (torch.sign, {}, None),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name, dtype):
    fn, attrs, op = UNARY[name]
    opset = 24 if (op or name) == "Swish" else 20  # Swish is new in opset 24
    check_op(op or name, {"x": _x((3, 4, 5), dtype)}, fn, attrs=attrs, opset=opset)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name,fn", [("Sqrt", torch.sqrt), ("Log", torch.log),
                                     ("Reciprocal", torch.reciprocal)])
def test_unary_positive(name, fn, dtype):
    check_op(name, {"x": _x((4, 6), dtype, lo=0.2, hi=4)}, fn)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name,fn,lo,hi", [("Asin", torch.asin, -0.95, 0.95),
                                           ("Acos", torch.acos, -0.95, 0.95),
                                           ("Atanh", torch.atanh, -0.95, 0.95),
                                           ("Acosh", torch.acosh, 1.05, 4)])
def test_unary_in_domain(name, fn, lo, hi, dtype):
    check_op(name, {"x": _x((4, 6), dtype, lo=lo, hi=hi)}, fn)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_selecting_activations_at_their_thresholds(dtype):
    """ThresholdedRelu and Shrink at (and beside) their thresholds: x is kept
    strictly beyond them, with gradient 1; nothing passes at the threshold."""
    x = np.array([-2, -1, -0.5, 0, 0.5, 1, 2], dtype)
    check_op("ThresholdedRelu", {"x": x}, lambda x: torch.where(x > 1, x, 0))
    check_op("Shrink", {"x": x}, lambda x: torch.nn.functional.hardshrink(x, 1.0),
             attrs={"lambd": 1.0})
    check_op("Shrink", {"x": x}, lambda x: torch.nn.functional.softshrink(x, 1.0),
             attrs={"lambd": 1.0, "bias": 1.0})
    # thresholds no float holds: x equal to them (float32: both rounded) stays out
    x = np.array([-0.3, -0.1, 0.1, 0.3, 0.2], dtype)
    check_op("ThresholdedRelu", {"x": x}, lambda x: torch.where(x > 0.1, x, 0),
             attrs={"alpha": 0.1})
    check_op("Shrink", {"x": x}, lambda x: torch.nn.functional.softshrink(x, 0.3),
             attrs={"lambd": 0.3, "bias": 0.3})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_hard_activations_at_their_kinks(dtype):
    """torch's gradients where the pieces meet: HardSwish 0 at -3, 1 at 3;
    HardSigmoid 0 at both ends."""
    x = np.array([-4, -3, -2.5, 0, 2.5, 3, 4], dtype)
    check_op("HardSwish", {"x": x}, torch.nn.functional.hardswish)
    if dtype == np.float32:  # (float64: the attribute holds 0.16666667, not 1/6)
        check_op("HardSigmoid", {"x": x}, torch.nn.functional.hardsigmoid,
                 attrs={"alpha": 1 / 6, "beta": 0.5})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("sx,sw", [((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 5), (1,)),
                                   ((4, 6), (6,)), ((2, 3, 4), (2, 3, 4))], ids=str)
def test_prelu(sx, sw, dtype):
    x, w = _x(sx, dtype, 1), _x(sw, dtype, 2, lo=0, hi=0.5)
    x.reshape(-1)[:3] = 0  # the kink: torch passes w * dy at 0
    check_op("PRelu", {"x": x, "slope": w}, lambda x, w: torch.where(x > 0, x, w * x))
    if len(sw) < len(sx):  # torch's own prelu: one slope, or one per channel (axis 1)
        check_op("PRelu", {"x": x, "slope": w},
                 lambda x, w: torch.nn.functional.prelu(x, w.reshape(-1)))


def test_prelu_slope_must_broadcast_to_x():
    for sw in [(4, 3), (2, 2, 3)]:
        with pytest.raises(ValueError, match="PRelu.*(broadcast|slope)"):
            check_op("PRelu", {"x": _x((2, 3), np.float32), "slope": _x(sw, np.float32)},
                     lambda x, w: torch.where(x > 0, x, w * x))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_float(fmod, dtype):
    a, b = _x((3, 4), dtype, 1, lo=-5, hi=5), _x((4,), dtype, 2, lo=0.5, hi=2)
    b[::2] *= -1  # both signs of divisor
    fn = torch.fmod if fmod else torch.remainder
    check_op("Mod", {"a": a, "b": b}, fn, attrs={"fmod": fmod})


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_integers(fmod):
    a = np.array([-7, 7, -7, 7, 0, -9223372036854775808, 5], np.int64)
    b = np.array([3, -3, -3, 3, -2, -1, 5], np.int64)
    fn = torch.fmod if fmod else torch.remainder
    check_op("Mod", {"a": a, "b": b}, fn, attrs={"fmod": fmod}, grad=False)
    check_op("Mod", {"a": a[:4].astype(np.int32), "b": b[:4].astype(np.int32)}, fn,
             attrs={"fmod": fmod}, grad=False)


def test_mod_integer_by_zero_is_an_error():
    with pytest.raises(ValueError, match="Mod.*modulo by zero"):
        check_op("Mod", {"a": np.array([3], np.int64), "b": np.array([0], np.int64)},
                 torch.remainder, grad=False)


def test_relu_gradient_at_zero_is_zero():
    x = np.array([-1.0, 0.0, 2.0])
    check_op("Relu", {"x": x}, torch.relu)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_clip_bounds_inclusive(dtype):
    x = np.array([-2, -1, -0.5, 0, 0.5, 1, 2], dtype)
    check_op("Clip", {"x": x}, lambda x, lo, hi: torch.clamp(x, lo, hi),
             consts={"lo": np.array(-1, dtype), "hi": np.array(1, dtype)})


SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((5,), ()),
          ((1,), (2, 3)), ((2, 3, 1, 5), (1, 3, 4, 1)),
          # 2-D iterations (the row loop): a row, a column, a row and a column
          ((7, 13), (13,)), ((7, 13), (7, 1)), ((1, 13), (7, 1)), ((7, 1), (13,))]
BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
          "Max": torch.maximum, "Min": torch.minimum}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("sa,sb", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_broadcast(name, sa, sb, dtype):
    a, b = _x(sa, dtype, 1), _x(sb, dtype, 2)
    if name == "Div":
        b = np.where(np.abs(b) < 0.3, 0.7, b).astype(dtype)
    check_op(name, {"a": a, "b": b}, BINARY[name])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_pow(dtype):
    a, b = _x((3, 4), dtype, 1, 0.5, 2), _x((4,), dtype, 2, -1, 2)
    check_op("Pow", {"a": a, "b": b}, torch.pow)


def test_same_value_used_twice():
    # Mul(x, x): both gradient contributions accumulate into one buffer
    from op_harness import make_model
    import aidge_interop

    x = _x((3, 3), np.float64)
    g = aidge_interop.load_onnx(make_model("Mul", {"x": x}, input_order=["x", "x"]))
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    np.testing.assert_allclose(y, x * x)
    (gx,) = g.backward([np.ones_like(x)])
    np.testing.assert_allclose(gx, 2 * x)


@pytest.mark.parametrize("name,fn", [("Equal", torch.eq), ("Less", torch.lt),
                                     ("Greater", torch.gt), ("LessOrEqual", torch.le),
                                     ("GreaterOrEqual", torch.ge)])
def test_compare(name, fn):
    a = np.array([[1, 2, 3], [4, 5, 6], [np.nan, 2, np.inf]], np.float32)
    b = np.array([2, np.nan, 7], np.float32)  # NaN compares false, also for <= and >=
    check_op(name, {"a": a, "b": b}, fn, grad=False)
    check_op(name, {"a": a.astype(np.float64), "b": b.astype(np.float64)}, fn, grad=False)
    ai, bi = np.nan_to_num(a, posinf=9).astype(np.int64), np.nan_to_num(b).astype(np.int64)
    for dtype in (np.int64, np.int32, np.int8, np.uint8):
        check_op(name, {"a": (ai - 3).astype(dtype), "b": bi.astype(dtype)}, fn, grad=False)


@pytest.mark.parametrize("name,fn", [("And", torch.logical_and), ("Or", torch.logical_or),
                                     ("Xor", torch.logical_xor)])
def test_logical_binary(name, fn):
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, (3, 4)).astype(bool), rng.integers(0, 2, (4,)).astype(bool)
    check_op(name, {"a": a, "b": b}, fn, grad=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_isnan_isinf_not(dtype):
    x = np.array([0.5, np.nan, np.inf, -np.inf, -2.0, 0.0], dtype)
    check_op("IsNaN", {"x": x}, torch.isnan, grad=False)
    check_op("IsInf", {"x": x}, torch.isinf, grad=False)
    check_op("IsInf", {"x": x}, torch.isposinf, attrs={"detect_negative": 0}, grad=False)
    check_op("IsInf", {"x": x}, torch.isneginf, attrs={"detect_positive": 0}, grad=False)
    check_op("Not", {"x": x > 0}, torch.logical_not, grad=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_where(dtype):
    c = np.random.default_rng(0).integers(0, 2, (3, 1, 4)).astype(bool)
    a, b = _x((2, 4), dtype, 1), _x((3, 2, 1), dtype, 2)
    check_op("Where", {"a": a, "b": b}, lambda a, b, c: torch.where(c, a, b),
             consts={"c": c}, input_order=["c", "a", "b"])


def test_integer_arithmetic_for_shapes():
    a = np.array([6, -7, 8], np.int64)
    b = np.array([4, 2, -3], np.int64)
    for name, fn in [("Add", torch.add), ("Mul", torch.mul), ("Sub", torch.sub),
                     ("Div", lambda a, b: torch.div(a, b, rounding_mode="trunc"))]:
        check_op(name, {"a": a, "b": b}, fn, grad=False)


def test_cast():
    x = np.array([-1.7, 0.2, 2.9], np.float32)
    check_op("Cast", {"x": x}, lambda x: x.to(torch.int64), attrs={"to": 7}, grad=False)
    check_op("Cast", {"x": x}, lambda x: x.double(), attrs={"to": 11})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_variadic_min_max_sum(dtype):
    a, b, c = _x((3, 4), dtype, 1), _x((4,), dtype, 2), _x((3, 1), dtype, 3)
    three = {"a": a, "b": b, "c": c}
    check_op("Max", three, lambda a, b, c: torch.maximum(torch.maximum(a, b), c))
    check_op("Min", three, lambda a, b, c: torch.minimum(torch.minimum(a, b), c))
    check_op("Sum", three, lambda a, b, c: a + b + c)
    check_op("Max", {"a": a}, lambda a: a * 1)
    check_op("Sum", {"a": a, "b": b}, torch.add)
    check_op("Mean", three, lambda a, b, c: (a + b + c) / 3)
    check_op("Mean", {"a": a, "b": b}, lambda a, b: torch.mean(torch.stack(
        torch.broadcast_tensors(a, b)), 0))
    check_op("Mean", {"a": a}, lambda a: a * 1)


def test_mean_of_integers_is_refused():
    ints = np.array([1, 2], np.int64)
    with pytest.raises(TypeError, match="Mean.*int64"):
        check_op("Mean", {"a": ints, "b": ints}, lambda a, b: (a + b) // 2, grad=False)


INT_DTYPES = [np.int8, np.uint8, np.int16, np.int32, np.int64]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_bitwise(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    a = rng.integers(info.min, info.max, (3, 4), endpoint=True).astype(dtype)
    b = rng.integers(info.min, info.max, (4,), endpoint=True).astype(dtype)
    for op, fn in [("BitwiseAnd", torch.bitwise_and), ("BitwiseOr", torch.bitwise_or),
                   ("BitwiseXor", torch.bitwise_xor)]:
        check_op(op, {"a": a, "b": b}, fn, grad=False)
    check_op("BitwiseNot", {"a": a}, torch.bitwise_not, grad=False)
    bits = 8 * np.dtype(dtype).itemsize
    shift = rng.integers(0, bits, (3, 4)).astype(dtype)
    check_op("BitShift", {"a": a, "s": shift}, torch.bitwise_left_shift, grad=False,
             attrs={"direction": "LEFT"})
    check_op("BitShift", {"a": a, "s": shift}, torch.bitwise_right_shift, grad=False,
             attrs={"direction": "RIGHT"})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_bit_shift_out_of_range_against_onnx_reference(direction, dtype):
    """A shift < 0 or >= the width gives the sign fill alone (ONNX's rule)."""
    from onnx.reference import ReferenceEvaluator
    from op_harness import make_model
    import aidge_interop

    info = np.iinfo(dtype)
    bits = 8 * np.dtype(dtype).itemsize
    a = np.array([info.min, -5 if info.min else 5, 0, 7, info.max, 1], dtype)
    s = np.array([bits, bits + 1, -1 if info.min else 0, bits - 1, 0, info.max], dtype)
    model = make_model("BitShift", {"a": a, "s": s}, {"direction": direction}, opset=28)
    (ours,) = aidge_interop.load_onnx(model).forward([a, s])
    (ref,) = ReferenceEvaluator(model).run(None, {"a": a, "s": s})
    np.testing.assert_array_equal(ours, ref)


def test_bitwise_errors_name_the_node():
    f = np.array([1.0], np.float32)
    with pytest.raises(TypeError, match="BitwiseAnd.*float32"):
        check_op("BitwiseAnd", {"a": f, "b": f}, torch.bitwise_and, grad=False)
    with pytest.raises(TypeError, match="BitwiseNot.*float32"):
        check_op("BitwiseNot", {"a": f}, torch.bitwise_not, grad=False)
    i = np.array([1], np.int32)
    with pytest.raises(ValueError, match="BitShift.*direction='UP'"):
        check_op("BitShift", {"a": i, "b": i}, torch.bitwise_left_shift, grad=False,
                 attrs={"direction": "UP"})


def test_variadic_max_splits_ties_evenly():
    a = np.array([1.0, 2.0, 3.0])
    from op_harness import make_model
    import aidge_interop

    g = aidge_interop.load_onnx(make_model("Max", {"a": a, "b": a.copy(), "c": a - 1}))
    g.forward([a, a, a - 1], need_backward=True, input_grads=True)
    ga, gb, gc = g.backward([np.ones(3)])
    np.testing.assert_allclose(ga, [0.5, 0.5, 0.5])
    np.testing.assert_allclose(gb, [0.5, 0.5, 0.5])
    np.testing.assert_allclose(gc, [0.0, 0.0, 0.0])


def test_cast_like_and_size():
    x = np.array([[-1.7, 0.2, 2.9]], np.float32)
    like = np.zeros(2, np.float64)
    check_op("CastLike", {"x": x}, lambda x, t: x.double(), consts={"t": like})
    check_op("Size", {"x": x}, lambda x: torch.tensor(x.numel()), grad=False)


def test_integer_extremes_are_exact():
    """Abs/Neg at INT64_MIN wrap like torch (no undefined behaviour); Clip on
    int64 is exact beyond 2**53."""
    big = np.array([np.iinfo(np.int64).min, -(2**53) - 1, 2**53 + 1, np.iinfo(np.int64).max],
                   np.int64)
    check_op("Abs", {"x": big}, torch.abs, grad=False)
    check_op("Neg", {"x": big}, torch.neg, grad=False)
    check_op("Clip", {"x": big}, lambda x, lo: torch.clamp(x, min=lo), grad=False,
             consts={"lo": np.array(-(2**53) - 1, np.int64)})
    small = np.array([-128, -3, 5, 127], np.int8)
    check_op("Clip", {"x": small}, lambda x, lo, hi: torch.clamp(x, lo, hi), grad=False,
             consts={"lo": np.array(-4, np.int8), "hi": np.array(6, np.int8)})


def _float32_grid():
    """Every 2003rd float32 in [-20, 20] (5.5e5 values of each sign, the
    tiny ones included), the boundaries, and the special values."""
    pos = np.arange(0, np.float32(20).view(np.int32), 2003, dtype=np.int32).view(np.float32)
    return np.concatenate([pos, -pos, np.float32([0.625, -0.625, 9.0, 9.1, 1e30, -1e30,
                                                  np.inf, -np.inf, np.nan])])


@pytest.mark.parametrize("name,ref,ulps,atol", [
    ("Tanh", np.tanh, 4, 0),
    ("Sigmoid", lambda x: 1 / (1 + np.exp(-x)), 4, 0),
    ("Exp", np.exp, 2, 0),
    # 0.5 x (1 + tanh(u)) as x / (1 + exp(-2u)): no cancellation, even in float64.
    # In the far negative tail (result < 1e-6) u's own float32 rounding, times
    # exp's condition number 2|u|, leaves more ulps of a tiny result: there the
    # bound is absolute, 2^-24 (torch's float32 path returns 0 there).
    ("Gelu_tanh", lambda x: x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
     8, 2.0**-24),
])
def test_float32_kernels_are_accurate_to_a_few_ulp(name, ref, ulps, atol):
    """The float32 paths (vectorised exp/tanh of kernels/fastmath.h) against
    the float64 function, in units in the last place of the float32 result
    (denormal results: absolute 2^-126), or within `atol`; special values
    exactly as numpy."""
    import aidge_interop as ai
    from op_harness import make_model

    fn, attrs, op = UNARY[name]
    x = _float32_grid()
    graph = ai.load_onnx(make_model(op or name, {"x": x}, attrs))._g
    y = graph.forward([ai.Tensor(x)])[0].numpy().astype(np.float64)
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(y[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    w32 = want[finite].astype(np.float32)
    ulp = np.maximum(np.spacing(np.abs(w32)).astype(np.float64), 2.0**-126)
    diff = np.abs(y[finite] - want[finite])
    err = np.where(diff <= atol, 0, diff / ulp)
    worst = int(np.argmax(err))
    assert err[worst] <= ulps, (f"{name}: {err[worst]:.1f} ulp at x={x[finite][worst]!r} "
                                f"(got {y[finite][worst]!r}, want {want[finite][worst]!r})")
