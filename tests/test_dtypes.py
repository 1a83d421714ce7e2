"""The engine's dtypes beyond float32/64, int8-64, uint8 and bool: uint16/32/64,
the float8 formats, float4 E2M1 and the 4- and 2-bit integers.

Cast and CastLike against ONNX's reference implementation (onnx.reference,
which converts with ml_dtypes) for every pair of types, with the edge cases
(rounding ties, saturation, NaN, infinities, -0); BitCast against the
reference; unsigned arithmetic against NumPy (wrap-around, values past 2^63);
NumPy (ml_dtypes) and torch conversions without a copy.
"""
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import aidge_interop
from aidge_interop import tensor_converter as tc
from aidge_interop.onnx import load_onnx

OPSET = 25  # Cast with saturate and round_mode; every type here

# ONNX type -> NumPy (ml_dtypes) dtype; bfloat16 is another branch's
TYPES = {
    "FLOAT": np.float32, "DOUBLE": np.float64, "FLOAT16": np.float16,
    "INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "UINT16": np.uint16,
    "INT32": np.int32, "UINT32": np.uint32, "INT64": np.int64, "UINT64": np.uint64,
    "BOOL": np.bool_,
    "FLOAT8E4M3FN": ml_dtypes.float8_e4m3fn, "FLOAT8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
    "FLOAT8E5M2": ml_dtypes.float8_e5m2, "FLOAT8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
    "FLOAT8E8M0": ml_dtypes.float8_e8m0fnu,
    "INT4": ml_dtypes.int4, "UINT4": ml_dtypes.uint4, "INT2": ml_dtypes.int2,
    "UINT2": ml_dtypes.uint2, "FLOAT4E2M1": ml_dtypes.float4_e2m1fn,
}
FLOAT8 = ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"]
FLOATS = {"FLOAT", "DOUBLE", "FLOAT16", *FLOAT8, "FLOAT8E8M0", "FLOAT4E2M1"}
SUB_BYTE = {"INT4", "UINT4", "INT2", "UINT2"}

# the edge cases: ties of every format, the largest finite values and just
# past them, subnormals, signed zeros, NaN, infinities, integer limits
EDGES = np.array([
    0.0, -0.0, 0.5, 1.5, 2.5, -2.5, 3.0, -5.0, 7.9, 8.0, -8.9, -9.0, 15.9, 16.0, 100.7, -100.7,
    127.0, 128.0, 255.0, 256.0, 448.0, 464.0, 465.0, -465.0, 480.0, 240.0, 248.0, 57344.0,
    61439.0, 61440.0, 65504.0, 1e6, -1e6, 2.0**-10, 3 * 2.0**-11, 2.0**-17, 1e-7, -1e-7,
    0.47892547, 0.7229038, 3e9, -3e9, 2.0**63, 1e19, 2.0**127 * 1.5, 2.0**-127,
    np.nan, -np.nan, np.inf, -np.inf,
], dtype=np.float64)


def cast_model(src, dst, saturate=None, round_mode=None, like=False):
    attrs = {}
    if saturate is not None:
        attrs["saturate"] = saturate
    if round_mode is not None:
        attrs["round_mode"] = round_mode
    s, d = getattr(TensorProto, src), getattr(TensorProto, dst)
    inputs = [helper.make_tensor_value_info("x", s, None)]
    if like:
        inputs.append(helper.make_tensor_value_info("like", d, None))
        node = helper.make_node("CastLike", ["x", "like"], ["y"], **attrs)
    else:
        node = helper.make_node("Cast", ["x"], ["y"], to=d, **attrs)
    graph = helper.make_graph([node], "cast", inputs, [helper.make_tensor_value_info("y", d, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def source_values(src):
    """EDGES in the source type, converted by the reference (the inputs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ReferenceEvaluator(cast_model("DOUBLE", src)).run(None, {"x": EDGES})[0]
    return out


def defined(src, dst, x):
    """The elements whose cast ONNX defines: a float into a (non sub-byte)
    integer is undefined out of range (NumPy and the engine differ there)."""
    if src not in FLOATS or dst in FLOATS or dst in SUB_BYTE or dst == "BOOL":
        return np.ones(x.shape, bool)
    v = np.trunc(x.astype(np.float64))
    info = np.iinfo(TYPES[dst])
    with np.errstate(invalid="ignore"):
        return np.isfinite(v) & (v >= info.min) & (v < float(info.max) + 1)


def as_f64(a):
    return np.asarray(a).astype(np.float64)


def run_both(model, feeds):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ReferenceEvaluator(model).run(None, feeds)[0]
    ours = load_onnx(model).forward([feeds[k] for k in feeds])[0]
    return ours, ref


@pytest.mark.parametrize("dst", list(TYPES))
@pytest.mark.parametrize("src", list(TYPES))
def test_cast_every_pair_against_reference(src, dst):
    x = source_values(src)
    ours, ref = run_both(cast_model(src, dst), {"x": x})
    if src == dst:  # the identity (the reference re-rounds E8M0's 2^-127 up)
        np.testing.assert_array_equal(ours.view(np.uint8), x.view(np.uint8))
        return
    assert ours.dtype == ref.dtype
    keep = defined(src, dst, x)
    np.testing.assert_array_equal(as_f64(ours)[keep], as_f64(ref)[keep])


@pytest.mark.parametrize("dst", FLOAT8)
@pytest.mark.parametrize("src", ["FLOAT", "DOUBLE", "FLOAT16", "INT32", "UINT64"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_float8_saturate(src, dst, saturate):
    """saturate=1 clamps to the largest finite value, 0 gives inf or NaN by
    the format's table (the reference's values, NaN's sign aside)."""
    x = source_values(src)
    ours, ref = run_both(cast_model(src, dst, saturate=saturate), {"x": x})
    np.testing.assert_array_equal(as_f64(ours), as_f64(ref))


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src", ["FLOAT", "DOUBLE"])
def test_cast_to_e8m0_round_mode(src, saturate, round_mode):
    x = np.abs(source_values(src))  # negative values are unspecified
    model = cast_model(src, "FLOAT8E8M0", saturate=saturate, round_mode=round_mode)
    ours, ref = run_both(model, {"x": x})
    np.testing.assert_array_equal(np.asarray(ours).view(np.uint8), np.asarray(ref).view(np.uint8))


@pytest.mark.parametrize("src,dst", [("FLOAT", "FLOAT8E4M3FN"), ("FLOAT8E5M2", "INT4"),
                                     ("UINT64", "FLOAT"), ("INT4", "UINT2")])
def test_castlike_against_reference(src, dst):
    x = source_values(src)
    like = np.zeros(2, TYPES[dst])
    ours, ref = run_both(cast_model(src, dst, saturate=0 if dst in FLOAT8 else None, like=True),
                         {"x": x, "like": like})
    assert ours.dtype == ref.dtype
    keep = defined(src, dst, x)
    np.testing.assert_array_equal(as_f64(ours)[keep], as_f64(ref)[keep])


# ---------------------------------------------------------------- BitCast

@pytest.mark.parametrize("src,dst", [("FLOAT", "INT32"), ("DOUBLE", "UINT64"),
                                     ("UINT16", "FLOAT16"), ("INT8", "FLOAT8E4M3FN"),
                                     ("FLOAT8E5M2FNUZ", "UINT8"), ("INT4", "UINT4"),
                                     ("UINT2", "INT2"), ("BOOL", "UINT8")])
def test_bitcast_against_numpy(src, dst):
    x = source_values(src)
    node = helper.make_node("BitCast", ["x"], ["y"], to=getattr(TensorProto, dst))
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", getattr(TensorProto, src), None)],
                              [helper.make_tensor_value_info("y", getattr(TensorProto, dst), None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    ours = load_onnx(model).forward([x])[0]
    assert ours.dtype == np.dtype(TYPES[dst])
    if src in SUB_BYTE:  # the low bits of each byte
        mask = 0xF if "4" in src else 0x3
        np.testing.assert_array_equal(ours.view(np.uint8) & mask, x.view(np.uint8) & mask)
    else:
        np.testing.assert_array_equal(ours.view(np.uint8), x.view(np.uint8))


def test_bitcast_of_another_width_is_an_error():
    node = helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT64)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    with pytest.raises(TypeError, match="BitCast node .*float32 \\(32 bits\\) to int64"):
        load_onnx(model).forward([np.zeros(2, np.float32)])


# ---------------------------------------------------------------- unsigned arithmetic

def binary_model(op, dt, out_dt=None, **attrs):
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    node = helper.make_node(op, ["a", "b"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", t, None),
                                            helper.make_tensor_value_info("b", t, None)],
                              [helper.make_tensor_value_info("y", out_dt or t, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def unsigned_operands(dt):
    info = np.iinfo(dt)
    a = np.array([0, 1, 7, info.max, info.max - 1, info.max // 2 + 3, 200, 12345 % info.max], dt)
    b = np.array([3, info.max, 2, 2, info.max, info.max // 2 + 1, 7, 1], dt)
    return a, b


NUMPY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.floor_divide,
         "Mod": np.mod, "Min": np.minimum, "Max": np.maximum, "BitwiseAnd": np.bitwise_and,
         "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}


@pytest.mark.parametrize("dt", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("op", list(NUMPY))
def test_unsigned_arithmetic_against_numpy(op, dt):
    a, b = unsigned_operands(dt)
    y = load_onnx(binary_model(op, dt)).forward([a, b])[0]
    assert y.dtype == dt
    np.testing.assert_array_equal(y, NUMPY[op](a, b))


@pytest.mark.parametrize("dt", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("op,ref", [("Less", np.less), ("Greater", np.greater),
                                    ("Equal", np.equal), ("LessOrEqual", np.less_equal),
                                    ("GreaterOrEqual", np.greater_equal)])
def test_unsigned_comparison_against_numpy(op, ref, dt):
    a, b = unsigned_operands(dt)
    y = load_onnx(binary_model(op, dt, TensorProto.BOOL)).forward([a, b])[0]
    np.testing.assert_array_equal(y, ref(a, b))


@pytest.mark.parametrize("dt", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_unsigned_bitshift_against_numpy(dt, direction):
    bits = 8 * np.dtype(dt).itemsize
    a = np.array([1, np.iinfo(dt).max, np.iinfo(dt).max // 2 + 1, 5, 6], dt)
    b = np.array([1, 3, bits - 1, 0, 2], dt)
    y = load_onnx(binary_model("BitShift", dt, direction=direction)).forward([a, b])[0]
    np.testing.assert_array_equal(y, np.left_shift(a, b) if direction == "LEFT"
                                  else np.right_shift(a, b))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_uint64_past_int64(op):
    x = np.array([[1, 2**63 + 5, 2**63, 7]], np.uint64)
    node = helper.make_node(op, ["x"], ["y"], axis=1, keepdims=0)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.UINT64, None)],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    y = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    ref = np.argmax(x, axis=1) if op == "ArgMax" else np.argmin(x, axis=1)
    np.testing.assert_array_equal(y.forward([x])[0], ref)


def unary_model(op, dt, n_in=1, opset=18, **attrs):
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    names = ["x", "a", "b"][:n_in]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, None)
                                            for n in names],
                              [helper.make_tensor_value_info("y", t, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


def int_values(dt):
    info = np.iinfo(dt)
    return np.array([[info.min, info.max, 3, info.max - 2], [1, info.min + 1, 7, 2]], dt)


@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize("op,ref", [
    ("ReduceSum", lambda x: np.add.reduce(x, axis=1, dtype=x.dtype)),
    ("ReduceProd", lambda x: np.multiply.reduce(x, axis=1, dtype=x.dtype)),
    ("ReduceMax", lambda x: np.max(x, axis=1)), ("ReduceMin", lambda x: np.min(x, axis=1))])
def test_integer_reductions_against_numpy(op, ref, dt):
    x = int_values(dt)
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", t, None)],
                              [helper.make_tensor_value_info("y", t, None)], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    y = load_onnx(model).forward([x])[0]
    assert y.dtype == dt
    np.testing.assert_array_equal(y, ref(x))


@pytest.mark.parametrize("op,ref,dt", [("Abs", np.abs, dt) for dt in INTS] +
                         [("Neg", np.negative, dt) for dt in (np.int8, np.int16, np.int32,
                                                              np.int64)])
def test_integer_abs_neg_against_numpy(op, ref, dt):
    x = int_values(dt)
    with np.errstate(over="ignore"):
        expected = ref(x)
    np.testing.assert_array_equal(load_onnx(unary_model(op, dt)).forward([x])[0], expected)


@pytest.mark.parametrize("dt", INTS)
def test_integer_clip_against_numpy(dt):
    x = int_values(dt)
    lo, hi = np.array(2, dt), np.array(np.iinfo(dt).max - 1, dt)
    y = load_onnx(unary_model("Clip", dt, n_in=3)).forward([x, lo, hi])[0]
    np.testing.assert_array_equal(y, np.clip(x, lo, hi))


@pytest.mark.parametrize("name", ["UINT16", "UINT64", "INT8", "FLOAT16"])
def test_eye_like_of_every_dtype(name):
    node = helper.make_node("EyeLike", ["x"], ["y"], k=1, dtype=getattr(TensorProto, name))
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", getattr(TensorProto, name),
                                                             None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    y = load_onnx(model).forward([np.zeros((3, 4), np.float32)])[0]
    np.testing.assert_array_equal(y, np.eye(3, 4, k=1, dtype=TYPES[name]))
    assert y.dtype == TYPES[name]


def test_storage_dtype_in_arithmetic_is_an_error():
    model = binary_model("Add", ml_dtypes.float8_e4m3fn)
    x = np.ones(2, ml_dtypes.float8_e4m3fn)
    with pytest.raises(NotImplementedError,
                       match="Add node .*input 0 is float8_e4m3fn.*does not compute on"):
        load_onnx(model).forward([x, x])


# ---------------------------------------------------------------- NumPy and torch

ML = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
      "int4", "uint4", "int2", "uint2", "float4_e2m1fn"]


@pytest.mark.parametrize("name", ML + ["uint16", "uint32", "uint64"])
def test_numpy_round_trip_without_copy(name):
    dt = getattr(ml_dtypes, name, None) or getattr(np, name)
    vals = [1, 2, 1, 0.5, 1, 0.25] if "float" in name else [1, 0, 1, 1, 0, 1]
    a = np.array(vals, np.float32).astype(dt)[::2]  # strided
    t = aidge_interop.Tensor(a)
    assert t.dtype == name
    b = t.numpy()
    assert b.dtype == a.dtype and np.shares_memory(a, b)
    np.testing.assert_array_equal(as_f64(b), as_f64(a))
    assert np.asarray(t).dtype == a.dtype
    np.testing.assert_array_equal(as_f64(t.astype("float64").numpy()), as_f64(a))


TORCH = ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
         "float8_e5m2fnuz", "float8_e8m0fnu"]


@pytest.mark.parametrize("name", TORCH)
def test_torch_round_trip_without_copy(name):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(getattr(torch, name))[:, 1:]
    a = tc.torch_tensor_to_aidge(x, copy=False)
    assert a.dtype == name
    assert tc.torch_dtype(name) == x.dtype
    y = tc.aidge_tensor_to_torch(a, copy=False)
    assert y.dtype == x.dtype and y.data_ptr() == x.data_ptr() and y.stride() == x.stride()
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))
    # the engine reads the values torch means
    np.testing.assert_array_equal(a.astype("float64").numpy(),
                                  x.to(torch.float64).numpy())


def test_sub_byte_types_have_no_torch_form():
    t = aidge_interop.Tensor(np.zeros(3, ml_dtypes.int4))
    with pytest.raises(TypeError, match="aidge_tensor_to_torch.*int4"):
        tc.aidge_tensor_to_torch(t)
    with pytest.raises(TypeError, match="int4"):
        tc.torch_dtype("int4")


@pytest.mark.parametrize("to", ["FLOAT8E4M3FN", "FLOAT8E5M2FNUZ", "FLOAT8E8M0", "FLOAT4E2M1",
                                "INT4"])
def test_backward_through_a_cast_to_a_storage_type(to):
    """A graph output of an 8- or 4-bit type: backward runs (it crashed: the
    Cast gave a gradient to x from the output's 8-bit gradient) and no
    gradient reaches x, as none flows through those types."""
    from onnx import TensorProto, helper

    node = helper.make_node("Cast", ["x"], ["y"], to=getattr(TensorProto, to))
    graph = helper.make_graph([node], "cast", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info("y", 0, None)])
    g = aidge_interop.load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 23)]))
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    (dx,) = g.backward([None])
    assert dx is None or not np.any(dx)
