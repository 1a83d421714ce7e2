"""ONNX's quantization operators (csrc/ops/qlinear.c) bit for bit against ONNX's reference
implementation (onnx.reference), and models quantized by ONNX Runtime against ONNX Runtime."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import aidge_interop
from op_harness import _NP_TO_ONNX


def _model(op_type, inputs, consts=None, attrs=None, opset=21, n_outputs=1, order=None):
    """A one-node model: ``inputs`` graph inputs, ``consts`` initializers; ``order``
    the node's input names ("" for an absent one)."""
    consts = consts or {}
    order = order or list(inputs) + list(consts)
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, order, outs, **(attrs or {}))
    g_in = [helper.make_tensor_value_info(n, _NP_TO_ONNX[a.dtype], list(a.shape))
            for n, a in inputs.items()]
    g_out = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()]
    graph = helper.make_graph([node], op_type.lower(), g_in, g_out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_reference(op_type, inputs, consts=None, attrs=None, opset=21, n_outputs=1,
                    order=None):
    """The engine's outputs equal onnx.reference's exactly (values, dtypes, shapes)."""
    model = _model(op_type, inputs, consts, attrs, opset, n_outputs, order)
    ref = ReferenceEvaluator(model).run(None, inputs)
    g = aidge_interop.load_onnx(model, param_kinds={n: "const" for n in consts or {}})
    ours = g.forward([inputs[n] for n in inputs])
    for i, (o, r) in enumerate(zip(ours, ref)):
        r = np.asarray(r)
        assert o.dtype == r.dtype and o.shape == r.shape, (i, o.dtype, r.dtype, o.shape, r.shape)
        np.testing.assert_array_equal(o, r, err_msg=f"{op_type} output {i}")
    return ours


def run_engine(op_type, inputs, consts=None, attrs=None, opset=21, order=None):
    """The engine's outputs alone (the error tests)."""
    model = _model(op_type, inputs, consts, attrs, opset, 1, order)
    g = aidge_interop.load_onnx(model, param_kinds={n: "const" for n in consts or {}})
    return g.forward([inputs[n] for n in inputs])


def _floats(shape, seed=0, lo=-4.0, hi=4.0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def _ints(shape, dtype, seed=0):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, int(info.max) + 1, shape).astype(dtype)


# ---------------------------------------------------------------- QuantizeLinear

QTYPES = [np.int8, np.uint8, np.int16]
qtypes = pytest.mark.parametrize("qt", QTYPES, ids=lambda t: np.dtype(t).name)


@qtypes
def test_quantize_ties_and_saturation(qt):
    # x / scale lands exactly on .5 (ties go to even) and far outside the range
    scale = np.float32(0.5)
    halves = np.arange(-10, 10, dtype=np.float32) * 0.5 + 0.25
    big = np.array([1e5, -1e5, 3e4, -3e4, 1e9, -1e9], np.float32)
    x = np.concatenate([halves, big])
    zp = np.array(12 if np.dtype(qt).kind == "u" else -2, qt)  # the ties stay in range
    (y,) = check_reference("QuantizeLinear", {"x": x}, {"s": scale, "zp": zp})
    assert np.all((y[:20].astype(int) - int(zp)) % 2 == 0)  # every tie went to even
    info = np.iinfo(qt)
    assert list(y[-6:]) == [info.max, info.min] * 3


# (int16 outputs and float64 inputs come with opset 21)
PER_TENSOR = [(qt, xt, opset) for qt in QTYPES for xt in (np.float32, np.float16, np.float64)
              for opset in (13, 19, 21, 25) if opset >= 21 or (qt != np.int16 and xt != np.float64)]


@pytest.mark.parametrize("qt,xt,opset", PER_TENSOR,
                         ids=[f"{np.dtype(q).name}-{np.dtype(x).name}-opset{o}"
                              for q, x, o in PER_TENSOR])
def test_quantize_per_tensor(qt, xt, opset):
    x = _floats((3, 5, 4), dtype=xt) * 40
    check_reference("QuantizeLinear", {"x": x}, {"s": np.array(0.37, xt),
                                                 "zp": np.array(1, qt)}, opset=opset)


def test_quantize_opset10():
    x = _floats((3, 5)) * 40
    check_reference("QuantizeLinear", {"x": x}, {"s": np.float32(0.37), "zp": np.uint8(128)},
                    opset=10)
    # (onnx.reference has no DequantizeLinear before opset 19: numpy of the definition)
    x = _ints((3, 5), np.int8)
    (y,) = run_engine("DequantizeLinear", {"x": x}, {"s": np.float32(0.37), "zp": np.int8(-3)},
                      opset=10)
    np.testing.assert_array_equal(y, (x.astype(np.float32) + 3) * np.float32(0.37))


def test_quantize_without_zero_point_and_output_dtype():
    x = _floats((4, 6)) * 100
    y = check_reference("QuantizeLinear", {"x": x}, {"s": np.float32(0.9)})
    assert y[0].dtype == np.uint8
    y = check_reference("QuantizeLinear", {"x": x}, {"s": np.float32(0.9)},
                        {"output_dtype": TensorProto.INT8})
    assert y[0].dtype == np.int8


def test_quantize_int32_input():
    x = np.array([-1000, -7, 0, 5, 9, 40000], np.int32)
    check_reference("QuantizeLinear", {"x": x}, {"s": np.float32(2.0), "zp": np.int8(1)})


@qtypes
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis(qt, axis):
    x = _floats((3, 4, 5)) * 30
    n = x.shape[axis]
    s = np.linspace(0.1, 0.7, n).astype(np.float32)
    zp = _ints((n,), qt, seed=3) // 4
    check_reference("QuantizeLinear", {"x": x}, {"s": s, "zp": zp}, {"axis": axis})


@pytest.mark.parametrize("axis,block", [(0, 2), (1, 3), (1, 4), (-1, 2)])
def test_quantize_blocked(axis, block):
    x = _floats((4, 7, 3)) * 30
    sshape = list(x.shape)
    sshape[axis] = -(-x.shape[axis] // block)
    s = _floats(sshape, seed=2, lo=0.1, hi=1.0)
    zp = _ints(sshape, np.int8, seed=4) // 8
    check_reference("QuantizeLinear", {"x": x}, {"s": s, "zp": zp},
                    {"axis": axis, "block_size": block})


def test_quantize_precision():
    x = _floats((50,)) * 10
    check_reference("QuantizeLinear", {"x": x}, {"s": np.float32(0.013), "zp": np.uint8(7)},
                    {"precision": TensorProto.FLOAT16}, opset=25)


def test_quantize_errors():
    x = _floats((3, 4))
    with pytest.raises(ValueError, match="one, or 4"):
        run_engine("QuantizeLinear", {"x": x}, {"s": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match="zero point's shape"):
        run_engine("QuantizeLinear", {"x": x}, {"s": np.ones(4, np.float32),
                                                     "zp": np.zeros(3, np.int8)})
    with pytest.raises(TypeError, match="output_dtype is int8 but the zero point is uint8"):
        run_engine("QuantizeLinear", {"x": x}, {"s": np.float32(1), "zp": np.uint8(0)},
                        {"output_dtype": TensorProto.INT8})
    with pytest.raises(ValueError, match=r"ceil\(4 / block_size 2\)"):
        run_engine("QuantizeLinear", {"x": x}, {"s": np.ones((3, 3), np.float32)},
                        {"axis": 1, "block_size": 2})


def test_quantize_refuses_a_gradient():
    x = _floats((2, 3))
    g = aidge_interop.load_onnx(_model("QuantizeLinear", {"x": x}, {"s": np.float32(0.1)}))
    g.forward([x], need_backward=True, input_grads=True)
    with pytest.raises(NotImplementedError, match="QuantizeLinear is not differentiable"):
        g.backward([None])


# ---------------------------------------------------------------- DequantizeLinear

@pytest.mark.parametrize("qt", QTYPES + [np.int32], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("st", [np.float32, np.float16, np.float64], ids=lambda t: np.dtype(t).name)
def test_dequantize_per_tensor(qt, st):
    x = _ints((3, 4, 5), qt)
    if qt == np.int32:
        x //= 1024  # the reference rounds x to float32 first: exact up to 2^24
    check_reference("DequantizeLinear", {"x": x}, {"s": np.array(0.0371, st),
                                                   "zp": _ints((), qt, seed=1) // 4})


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_dequantize_per_axis_and_blocked(axis):
    x = _ints((4, 6, 5), np.uint8)
    n = x.shape[axis]
    check_reference("DequantizeLinear", {"x": x}, {"s": _floats((n,), lo=0.01, hi=0.5),
                                                   "zp": _ints((n,), np.uint8, seed=2)},
                    {"axis": axis})
    sshape = list(x.shape)
    sshape[axis] = -(-n // 4)
    check_reference("DequantizeLinear", {"x": x}, {"s": _floats(sshape, lo=0.01, hi=0.5),
                                                   "zp": _ints(sshape, np.uint8, seed=2)},
                    {"axis": axis, "block_size": 4})


def test_dequantize_output_dtype_and_no_zero_point():
    x = _ints((5, 3), np.int8)
    check_reference("DequantizeLinear", {"x": x}, {"s": np.float32(0.25)})
    y = check_reference("DequantizeLinear", {"x": x}, {"s": np.float32(0.3)},
                        {"output_dtype": TensorProto.FLOAT16}, opset=23)
    assert y[0].dtype == np.float16


def test_dequantize_scale_gradient():
    # d/ds of sum(dy * (x - zp) s) = sum over the scale's elements of (x - zp) dy
    x = _ints((3, 4), np.int8)
    s = np.array([0.5, 0.25, 2.0, 1.0], np.float32)
    zp = np.array([1, -2, 0, 3], np.int8)
    model = _model("DequantizeLinear", {"x": x}, {"s": s, "zp": zp}, {"axis": 1})
    g = aidge_interop.load_onnx(model, param_kinds={"s": "param", "zp": "const"})
    g.zero_grad()
    g.forward([x], need_backward=True)
    dy = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    g.backward([dy])
    expected = ((x.astype(np.float64) - zp) * dy).sum(axis=0)
    np.testing.assert_allclose(g.grads()["s"], expected, rtol=1e-6)


# ---------------------------------------------------------------- DynamicQuantizeLinear

@pytest.mark.parametrize("lo,hi", [(-3, 5), (1, 4), (-6, -2), (0, 0)], ids=str)
def test_dynamic_quantize(lo, hi):
    x = _floats((6, 7), lo=lo, hi=hi) if lo != hi else np.zeros((2, 3), np.float32)
    check_reference("DynamicQuantizeLinear", {"x": x}, n_outputs=3, opset=11)


# ---------------------------------------------------------------- MatMulInteger, QLinearMatMul

@pytest.mark.parametrize("at,bt", [(np.uint8, np.int8), (np.int8, np.int8),
                                   (np.uint8, np.uint8)], ids=str)
@pytest.mark.parametrize("ashape,bshape", [((4, 5), (5, 3)), ((2, 4, 5), (5, 3)),
                                           ((2, 1, 4, 5), (3, 5, 2)), ((5,), (5, 3)),
                                           ((4, 5), (5,)), ((4, 0), (0, 3))], ids=str)
def test_matmul_integer(at, bt, ashape, bshape):
    a, b = _ints(ashape, at), _ints(bshape, bt, seed=1)
    check_reference("MatMulInteger", {"a": a, "b": b},
                    {"azp": _ints((), at, seed=2), "bzp": _ints((), bt, seed=3)}, opset=10)
    check_reference("MatMulInteger", {"a": a, "b": b}, opset=10)


def test_matmul_integer_per_row_and_column_zero_points():
    # ONNX: a_zero_point per row of A, b_zero_point per column of B (the reference broadcasts
    # a 1-D a_zero_point along the columns instead; numpy of the definition here)
    a, b = _ints((2, 4, 5), np.uint8), _ints((5, 3), np.int8, seed=1)
    azp, bzp = _ints((4,), np.uint8, seed=2), _ints((3,), np.int8, seed=3)
    g = aidge_interop.load_onnx(_model("MatMulInteger", {"a": a, "b": b},
                                       {"azp": azp, "bzp": bzp}, opset=10))
    (y,) = g.forward([a, b])
    ref = (a.astype(np.int32) - azp[:, None].astype(np.int32)) @ (b.astype(np.int32) - bzp)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ref)


def _qmm_inputs(qt, st, seed=0):
    a, b = _ints((3, 4, 6), qt, seed), _ints((6, 5), qt, seed + 1)
    return a, b, {"as": np.array(0.02, st), "azp": _ints((), qt, seed + 2),
                  "bs": np.array(0.011, st), "bzp": _ints((), qt, seed + 3),
                  "ys": np.array(0.7, st), "yzp": _ints((), qt, seed + 4)}


@pytest.mark.parametrize("qt", [np.int8, np.uint8], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("st", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_qlinear_matmul(qt, st):
    a, b, c = _qmm_inputs(qt, st)
    order = ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"]
    check_reference("QLinearMatMul", {"a": a, "b": b}, c, order=order)
    # per-column scales and zero points of B
    c["bs"] = np.linspace(0.005, 0.02, 5).astype(st)
    c["bzp"] = _ints((5,), qt, seed=9)
    check_reference("QLinearMatMul", {"a": a, "b": b}, c, order=order)


def test_qlinear_matmul_ties():
    # acc * (as bs / ys) + yzp exactly on .5: half to even
    a = np.array([[1, 3, 5, 7, 9, 11, -1, -3]], np.int8).T  # (8, 1)
    b = np.ones((1, 1), np.int8)
    c = {"as": np.float32(0.5), "azp": np.int8(0), "bs": np.float32(1.0), "bzp": np.int8(0),
         "ys": np.float32(1.0), "yzp": np.int8(0)}
    (y,) = check_reference("QLinearMatMul", {"a": a, "b": b}, c,
                           order=["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"])
    np.testing.assert_array_equal(y[:, 0], [0, 2, 2, 4, 4, 6, 0, -2])


# ---------------------------------------------------------------- ConvInteger, QLinearConv

CONVS = [
    dict(x=(1, 3, 7, 7), w=(4, 3, 3, 3), attrs={}),
    dict(x=(2, 4, 8, 6), w=(6, 2, 3, 2), attrs={"group": 2, "strides": [2, 1],
                                                "pads": [1, 0, 2, 1]}),
    dict(x=(1, 2, 9, 9), w=(3, 2, 2, 3), attrs={"dilations": [2, 1], "auto_pad": "SAME_UPPER"}),
    dict(x=(1, 4, 6, 6), w=(4, 1, 3, 3), attrs={"group": 4, "pads": [1, 1, 1, 1]}),
]
convs = pytest.mark.parametrize("case", CONVS, ids=lambda c: str(c["attrs"]))


@convs
@pytest.mark.parametrize("xt,wt", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)],
                         ids=str)
def test_conv_integer(case, xt, wt):
    x, w = _ints(case["x"], xt), _ints(case["w"], wt, seed=1)
    check_reference("ConvInteger", {"x": x, "w": w},
                    {"xzp": _ints((), xt, seed=2), "wzp": _ints((), wt, seed=3)},
                    case["attrs"], opset=10)
    # per output channel weight zero points
    check_reference("ConvInteger", {"x": x, "w": w},
                    {"xzp": _ints((), xt, seed=2), "wzp": _ints(case["w"][:1], wt, seed=3)},
                    case["attrs"], opset=10)


def test_conv_integer_1d():
    x, w = _ints((2, 3, 11), np.uint8), _ints((2, 3, 4), np.int8, seed=1)
    g = aidge_interop.load_onnx(_model("ConvInteger", {"x": x, "w": w}, {"xzp": np.uint8(9)},
                                       {"strides": [2]}, opset=10))
    (y,) = g.forward([x, w])
    xi = x.astype(np.int64) - 9
    ref = np.array([[[sum(int(xi[n, c, 2 * o + k]) * int(w[m, c, k])
                          for c in range(3) for k in range(4)) for o in range(4)]
                     for m in range(2)] for n in range(2)])
    np.testing.assert_array_equal(y, ref)


def _qconv_consts(case, qt, per_channel, seed=0):
    m = case["w"][0]
    c = {"xs": np.float32(0.031), "xzp": _ints((), qt, seed),
         "ws": (np.linspace(0.002, 0.01, m).astype(np.float32) if per_channel
                else np.float32(0.004)),
         "wzp": np.zeros(m if per_channel else (), qt),
         "ys": np.float32(0.09), "yzp": _ints((), qt, seed + 1),
         "b": np.random.default_rng(seed).integers(-2000, 2000, m).astype(np.int32)}
    return c


@convs
@pytest.mark.parametrize("qt", [np.int8, np.uint8], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_qlinear_conv(case, qt, per_channel):
    x, w = _ints(case["x"], qt), _ints(case["w"], np.int8 if qt == np.int8 else np.uint8, 1)
    c = _qconv_consts(case, qt, per_channel)
    c["wzp"] = c["wzp"].astype(w.dtype)
    check_reference("QLinearConv", {"x": x, "w": w}, c, case["attrs"], opset=10,
                    order=["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "b"])
    del c["b"]
    check_reference("QLinearConv", {"x": x, "w": w}, c, case["attrs"], opset=10,
                    order=["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"])


def test_qlinear_errors():
    x, w = _ints((1, 3, 5, 5), np.uint8), _ints((4, 3, 3, 3), np.uint8)
    c = _qconv_consts(CONVS[0], np.uint8, False)
    c["ws"] = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="weight's scale has 3 values; a scalar or one value "
                                         "per output channel"):
        run_engine("QLinearConv", {"x": x, "w": w}, c, opset=10,
                        order=["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "b"])
    with pytest.raises(TypeError, match="B is float32; int8 or uint8 expected"):
        run_engine("MatMulInteger", {"a": x[0, 0], "b": np.ones((5, 2), np.float32)},
                        opset=10)


# ---------------------------------------------------------------- MaxPool on int8 / uint8

@pytest.mark.parametrize("qt", [np.int8, np.uint8], ids=lambda t: np.dtype(t).name)
def test_maxpool_8bit(qt):
    x = _ints((2, 3, 7, 6), qt)
    check_reference("MaxPool", {"x": x}, attrs={"kernel_shape": [3, 2], "strides": [2, 1],
                                                "pads": [1, 0, 1, 1]}, opset=12)


# ---------------------------------------------------------------- QGemm (com.microsoft)

QGEMMS = [(np.uint8, np.uint8, False, False, None, True, 1.0, False),
          (np.uint8, np.int8, True, False, (5,), True, 1.0, True),
          (np.int8, np.int8, False, True, (3, 5), True, 0.5, False),
          (np.int8, np.int8, True, True, (3, 1), False, 1.0, True),
          (np.uint8, np.int8, False, False, (), False, 2.0, False)]


@pytest.mark.parametrize("at,bt,ta,tb,c_shape,quantized,alpha,per_column", QGEMMS, ids=str)
def test_qgemm_against_onnxruntime(at, bt, ta, tb, c_shape, quantized, alpha, per_column):
    """ONNX Runtime's com.microsoft QGemm: the engine computes what ONNX Runtime computes."""
    import onnxruntime as ort
    M, K, N = 3, 7, 5
    a = _ints((K, M) if ta else (M, K), at)
    b = _ints((N, K) if tb else (K, N), bt, seed=1)
    consts = {"as": np.float32(0.023), "azp": _ints((), at, seed=2),
              "b": b, "bs": (np.linspace(0.004, 0.02, N).astype(np.float32) if per_column
                             else np.float32(0.011)),
              "bzp": _ints((N,) if per_column else (), bt, seed=3) // 2}
    names = ["a", "as", "azp", "b", "bs", "bzp"]
    if c_shape is not None:
        consts["c"] = np.random.default_rng(4).integers(-3000, 3000, c_shape).astype(np.int32)
    names.append("c" if c_shape is not None else "")
    if quantized:
        consts.update({"ys": np.float32(0.2), "yzp": _ints((), at, seed=5)})
        names += ["ys", "yzp"]
    node = helper.make_node("QGemm", names, ["y"], domain="com.microsoft", alpha=alpha,
                            transA=int(ta), transB=int(tb))
    graph = helper.make_graph(
        [node], "qgemm", [helper.make_tensor_value_info("a", _NP_TO_ONNX[a.dtype], a.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8 if at == np.uint8 and quantized
                                       else TensorProto.INT8 if quantized
                                       else TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    (ref,) = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"a": a})
    (ours,) = aidge_interop.load_onnx(model).forward([a])
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    np.testing.assert_array_equal(ours, ref)


def _ms_model(op_type, inputs, consts, names, out_type, **attrs):
    """A one-node com.microsoft model, graph inputs then initializers."""
    node = helper.make_node(op_type, names, ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node], op_type.lower(),
        [helper.make_tensor_value_info(n, _NP_TO_ONNX[a.dtype], a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _against_onnxruntime(model, inputs):
    """The engine's output and ONNX Runtime's, in integer steps apart."""
    import onnxruntime as ort
    (ref,) = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, inputs)
    (ours,) = aidge_interop.load_onnx(model).forward(list(inputs.values()))
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    return np.abs(ours.astype(np.int64) - ref.astype(np.int64))


@pytest.mark.parametrize("qt", [np.int8, np.uint8], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("ashape,bshape", [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1,)),
                                           ((3, 1, 5), (4, 1))], ids=str)
def test_qlinear_add_against_onnxruntime(qt, ashape, bshape):
    """ONNX Runtime's float32 (fused multiply-add on AVX2) against the engine's float64: at
    most one step apart."""
    a, b = _ints(ashape, qt), _ints(bshape, qt, seed=1)
    consts = {"as": np.float32(0.031), "azp": _ints((), qt, seed=2), "bs": np.float32(0.047),
              "bzp": _ints((), qt, seed=3), "cs": np.float32(0.05), "czp": _ints((), qt, seed=4)}
    model = _ms_model("QLinearAdd", {"a": a, "b": b}, consts,
                      ["a", "as", "azp", "b", "bs", "bzp", "cs", "czp"], _NP_TO_ONNX[a.dtype])
    assert _against_onnxruntime(model, {"a": a, "b": b}).max() <= 1


@pytest.mark.parametrize("qt", [np.int8, np.uint8], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool_against_onnxruntime(qt, channels_last):
    x = _ints((2, 5, 6, 7), qt)
    consts = {"xs": np.float32(0.031), "xzp": _ints((), qt, seed=2), "ys": np.float32(0.011),
              "yzp": _ints((), qt, seed=3)}
    model = _ms_model("QLinearGlobalAveragePool", {"x": x}, consts,
                      ["x", "xs", "xzp", "ys", "yzp"], _NP_TO_ONNX[x.dtype],
                      channels_last=channels_last)
    assert _against_onnxruntime(model, {"x": x}).max() <= 1


# ---------------------------------------------------------------- models quantized by ONNX Runtime

def _torch_models():
    import torch
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(16 * 3 * 3, 10))
    mlp = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

    class Residual(torch.nn.Module):  # QOperator: QLinearAdd, QLinearGlobalAveragePool
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.bn, self.fc = torch.nn.BatchNorm2d(8), torch.nn.Linear(8, 10)

        def forward(self, x):
            y = torch.relu(self.c1(x))
            y = torch.relu(y + self.bn(self.c2(y)))
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))
    return {"cnn": (cnn.eval(), (3, 16, 16)), "mlp": (mlp.eval(), (20,)),
            "residual": (Residual().eval(), (3, 16, 16))}


def _batches(shape, n, seed):
    return [np.random.default_rng(seed + i).standard_normal((4, *shape)).astype(np.float32)
            for i in range(n)]


@pytest.fixture(scope="module")
def float_models(tmp_path_factory):
    import torch
    d = tmp_path_factory.mktemp("ort_quant")
    paths = {}
    for name, (m, shape) in _torch_models().items():
        paths[name] = (str(d / f"{name}.onnx"), shape)
        torch.onnx.export(m, torch.zeros(1, *shape), paths[name][0], dynamo=False,
                          opset_version=17, input_names=["x"], dynamic_axes={"x": {0: "n"}})
    return d, paths


QUANTIZED = [(m, f, pc, act) for m in ("cnn", "mlp", "residual") for f in ("QDQ", "QOperator")
             for pc in (False, True) for act in ("QUInt8", "QInt8")] + \
    [(m, "dynamic", False, None) for m in ("cnn", "mlp", "residual")]


@pytest.mark.slow
@pytest.mark.parametrize("model,fmt,per_channel,act", QUANTIZED,
                         ids=[f"{m}-{f}-{'per_channel' if pc else 'per_tensor'}-{a}"
                              for m, f, pc, a in QUANTIZED])
def test_onnxruntime_quantized_models(float_models, model, fmt, per_channel, act):
    """A model quantized by onnxruntime.quantization, run by ONNX Runtime and the engine: a
    dequantized output at most one quantum apart, a float one (dynamic) within float32
    rounding (the residual model's GlobalAveragePool and Add sum in another order).

    One quantum: in the QDQ format the engine runs QuantizeLinear(Conv(...)) as written,
    its float32 Conv summing in another order than ONNX Runtime's (which fuses the QDQ
    pairs into QLinearConv, or without optimizations runs its own float Conv); a sum that
    lands within a float32 rounding of a tie (x / scale = 96.5 against 96.50001) then
    rounds to the other integer, and the difference can reach the output."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)
    d, paths = float_models
    src, shape = paths[model]
    path = str(d / f"{model}_{fmt}_{per_channel}_{act}.onnx")
    if fmt == "dynamic":
        quantize_dynamic(src, path)
    else:
        class Reader(CalibrationDataReader):
            def __init__(self):
                self.batches = iter(_batches(shape, 8, seed=0))

            def get_next(self):
                x = next(self.batches, None)
                return None if x is None else {"x": x}
        quantize_static(src, path, Reader(), quant_format=getattr(QuantFormat, fmt),
                        per_channel=per_channel, activation_type=getattr(QuantType, act),
                        weight_type=QuantType.QInt8)
    proto = onnx.load(path)
    g = aidge_interop.load_onnx(proto)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    # the quantum of a dequantized output: the scale of the DequantizeLinear that gives it
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    last = [n for n in proto.graph.node if n.output[0] == proto.graph.output[0].name][0]
    quantum = float(inits[last.input[1]]) if last.op_type == "DequantizeLinear" else None
    x = np.concatenate(_batches(shape, 16, seed=100))
    (ref,) = session.run(None, {"x": x})
    (ours,) = g.forward([x])
    diff = np.abs(ours.astype(np.float64) - ref)
    if quantum is None:  # a float output (dynamic): float32 operators after the last integer one
        scale = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5 * scale)
        return
    quanta = np.rint(diff / quantum)  # both are (integer - zero point) * scale in float32
    assert quanta.max() <= 1, (
        f"{np.sum(quanta > 1)} of {diff.size} outputs more than one quantum ({quantum}) "
        f"from ONNX Runtime's; greatest difference {quanta.max()} quanta")


# ---------------------------------------------------------------- the small types

SMALL = {"uint16": TensorProto.UINT16, "int4": TensorProto.INT4, "uint4": TensorProto.UINT4,
         "int2": TensorProto.INT2, "uint2": TensorProto.UINT2,
         "float8e4m3fn": TensorProto.FLOAT8E4M3FN, "float8e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ,
         "float8e5m2": TensorProto.FLOAT8E5M2, "float8e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ,
         "float4e2m1": TensorProto.FLOAT4E2M1}


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("name", SMALL)
def test_quantize_then_dequantize_small_types_against_onnx_reference(name, saturate):
    """QuantizeLinear to the 16-, 4- and 2-bit integers and the 8- and 4-bit
    floats (values past the range: saturation, ties), then DequantizeLinear
    back, per axis; both against onnx.reference, bit for bit."""
    code = SMALL[name]
    x = np.concatenate([_floats([2, 30], seed=3, lo=-40, hi=40),
                        np.array([[0.5, 1.5, -2.5, 1e6, -1e6, 0.25] * 5] * 2, np.float32)], 1)
    scale = np.array([0.5, 2.0], np.float32)
    zp = numpy_helper.to_array(helper.make_tensor("zp", code, [2], [1, 0] if "int" in name
                                                  else [0, 0]))
    attrs = {"axis": 0}
    if "float" in name:
        attrs["saturate"] = saturate
    elif saturate == 0:
        pytest.skip("saturate concerns the float outputs only")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=0)]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("q", code, None),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = aidge_interop.load_onnx(model, param_kinds={"s": "const", "zp": "const"}).forward([x])
    assert got[0].dtype == want[0].dtype
    np.testing.assert_array_equal(got[0].view(np.uint8) if got[0].itemsize == 1 else got[0],
                                  want[0].view(np.uint8) if want[0].itemsize == 1 else want[0])
    np.testing.assert_array_equal(got[1], want[1])
