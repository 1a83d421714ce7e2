"""QLinearConv, QLinearMatMul and ONNX Runtime's QGemm on the int8 kernels (ops/qlinear.c,
"on the int8 kernels"), taken on the VNNI and AVX2 paths (``_C._set_quant_path(3)``
and ``(2)``; below them, and on CPUs without AVX2, the float path, their twin), bit for
bit against onnx.reference
(QGemm, which ONNX does not define, against NumPy), with zero points, uint8 and int8,
per-channel scales, padding (with x's zero point), groups and multipliers that are powers of
two (ties, rounded to even). The kernels' requantization with a zero point and ties to even
is checked on every path against the portable one by csrc/tests/test_qkernels.c."""
import numpy as np
import pytest
from onnx import helper, numpy_helper, TensorProto

import aidge_interop
from aidge_interop import _C
from test_qlinear import check_reference

BEST = _C._set_quant_path(3)
PATHS = sorted({0, min(BEST, 2), BEST})


@pytest.fixture(params=PATHS, ids=lambda p: f"path{p}")
def path(request):
    assert _C._set_quant_path(request.param) == request.param
    yield request.param
    _C._set_quant_path(3)


def _ints(rng, shape, dtype, lo=None, hi=None):
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def _scale(rng, n, ties):
    """n float32 scales; powers of two where ``ties`` (the multiplier then lands on ties)."""
    if ties:
        return (2.0 ** rng.integers(-7, -3, n)).astype(np.float32)
    return rng.uniform(0.002, 0.05, n).astype(np.float32)


CONVS = [  # (x (N, C, spatial...), w (M, C / group, kernel...), attributes)
    ((2, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 10, 7), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1]}),
    ((2, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 8, 5, 6), (4, 8, 1, 1), {}),  # pointwise
    ((1, 2, 11, 9), (3, 2, 5, 5), {"dilations": [2, 1], "pads": [2, 2, 2, 2]}),
    ((2, 3, 13), (4, 3, 3), {"pads": [2, 1], "strides": [2]}),  # 1-D
]


@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("xt", [np.uint8, np.int8], ids=["u8", "i8"])
@pytest.mark.parametrize("ties", [False, True], ids=["scales", "ties"])
def test_qlinear_conv(path, case, xt, ties):
    xs, ws, attrs = CONVS[case]
    rng = np.random.default_rng(case)
    m = ws[0]
    per = len(ws) == 4  # (onnx.reference takes per-channel scales of 2-D convs only)
    x = _ints(rng, xs, xt)
    w = _ints(rng, ws, np.int8)
    consts = {"xs": _scale(rng, 1, ties)[0], "xzp": _ints(rng, (), xt),
              "w": w, "wsc": _scale(rng, m if per else 1, ties).reshape(-1 if per else ()),
              "wzp": np.zeros(m if per else (), np.int8), "ys": np.float32(1.0 if ties else 0.4),
              "yzp": xt(_ints(rng, (), xt) | 1), "b": _ints(rng, (m,), np.int32, -3000, 3000)}
    check_reference("QLinearConv", {"x": x}, consts, attrs,
                    order=["x", "xs", "xzp", "w", "wsc", "wzp", "ys", "yzp", "b"])


def test_qlinear_conv_weights_past_int8(path):
    """uint8 weights whose zero point leaves w - wzp past int8 (the float path's), and uint8
    weights of zero point 128 (int8 less it: the kernels')."""
    rng = np.random.default_rng(7)
    x = _ints(rng, (1, 3, 6, 6), np.uint8)
    for wzp in (np.uint8(3), np.uint8(128)):
        consts = {"xs": np.float32(0.02), "xzp": np.uint8(100),
                  "w": _ints(rng, (4, 3, 3, 3), np.uint8), "wsc": np.float32(0.01),
                  "wzp": wzp, "ys": np.float32(0.3), "yzp": np.uint8(120)}
        check_reference("QLinearConv", {"x": x}, consts, {"pads": [1, 1, 1, 1]},
                        order=["x", "xs", "xzp", "w", "wsc", "wzp", "ys", "yzp"])


@pytest.mark.parametrize("at", [np.uint8, np.int8], ids=["u8", "i8"])
@pytest.mark.parametrize("ties", [False, True], ids=["scales", "ties"])
@pytest.mark.parametrize("a_shape", [(7, 33), (2, 5, 33), (33,)], ids=["2d", "3d", "1d"])
def test_qlinear_matmul(path, at, ties, a_shape):
    rng = np.random.default_rng(len(a_shape))
    n = 19
    consts = {"as": _scale(rng, 1, ties)[0], "azp": _ints(rng, (), at),
              "b": _ints(rng, (33, n), np.int8), "bs": _scale(rng, n, ties),
              "bzp": np.zeros(n, np.int8), "ys": np.float32(1.0 if ties else 0.3),
              "yzp": at(_ints(rng, (), at) | 1)}  # odd: a tie of the sum goes elsewhere
    check_reference("QLinearMatMul", {"a": _ints(rng, a_shape, at)}, consts,
                    order=["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"])


def test_qlinear_matmul_rounds_the_sum_with_the_zero_point(path):
    """onnx.reference rounds acc * mult + y_zp: with an odd zero point a tie goes to the
    even sum (4.5 -> 4), not to the even product plus the zero point (rint(1.5) + 3 = 5,
    ONNX Runtime's order; docs/quantization.md)."""
    a = np.array([[1], [3], [5], [7]], np.int8)
    consts = {"as": np.float32(0.5), "azp": np.int8(0), "b": np.array([[1]], np.int8),
              "bs": np.float32(1.0), "bzp": np.int8(0), "ys": np.float32(1.0),
              "yzp": np.int8(3)}
    (y,) = check_reference("QLinearMatMul", {"a": a}, consts,
                           order=["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"])
    assert y.ravel().tolist() == [4, 4, 6, 6]


def _qgemm(trans_b, bias_shape, at, ties, rng):
    k, n = 21, 13
    b = _ints(rng, (n, k) if trans_b else (k, n), np.int8)
    inits = {"as": _scale(rng, 1, ties)[0], "azp": _ints(rng, (), at), "b": b,
             "bs": _scale(rng, n, ties), "bzp": np.zeros(n, np.int8),
             "c": _ints(rng, bias_shape, np.int32, -2000, 2000),
             "ys": np.float32(0.5 if ties else 0.2), "yzp": _ints(rng, (), at)}
    node = helper.make_node("QGemm", ["a", "as", "azp", "b", "bs", "bzp", "c", "ys", "yzp"],
                            ["y"], domain="com.microsoft", transB=int(trans_b), alpha=0.75)
    graph = helper.make_graph(
        [node], "qgemm", [helper.make_tensor_value_info("a", helper.np_dtype_to_tensor_dtype(
            np.dtype(at)), [9, k])],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("bias_shape", [(13,), (), (9, 13)], ids=["col", "one", "full"])
@pytest.mark.parametrize("at", [np.uint8, np.int8], ids=["u8", "i8"])
@pytest.mark.parametrize("ties", [False, True], ids=["scales", "ties"])
def test_qgemm_against_the_float_path(path, trans_b, bias_shape, at, ties):
    """QGemm: y = saturate(rint(acc alpha as bs / ys + yzp)), acc = (A - azp)(B - bzp) + C;
    the float path (also checked here against NumPy) is the kernels' twin."""
    rng = np.random.default_rng(3)
    model = _qgemm(trans_b, bias_shape, at, ties, rng)
    a = _ints(rng, (9, 21), at)
    (ours,) = aidge_interop.load_onnx(model).forward([a])
    v = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    bm = v["b"].T if trans_b else v["b"]
    acc = (a.astype(np.int64) - v["azp"]) @ (bm.astype(np.int64) - v["bzp"]) + v["c"]
    mult = (np.float32(0.75) * v["as"] * v["bs"]) / v["ys"]  # float32, as ONNX Runtime
    info = np.iinfo(at)
    want = np.clip(np.rint(acc * mult.astype(np.float64) + v["yzp"]), info.min, info.max)
    np.testing.assert_array_equal(ours, want.astype(at))


def test_qlinear_conv_follows_its_scales(path):
    """The float scales are parameters of a loaded graph (the integers are constants): the
    operands kept from one forward are made again when a scale changes."""
    from onnx.reference import ReferenceEvaluator
    from test_qlinear import _model

    rng = np.random.default_rng(11)
    x = _ints(rng, (2, 3, 7, 7), np.uint8)
    consts = {"xs": np.float32(0.02), "xzp": np.uint8(90), "w": _ints(rng, (4, 3, 3, 3), np.int8),
              "wsc": np.full(4, 0.01, np.float32), "wzp": np.zeros(4, np.int8),
              "ys": np.float32(0.25), "yzp": np.uint8(128)}
    order = ["x", "xs", "xzp", "w", "wsc", "wzp", "ys", "yzp"]
    model = _model("QLinearConv", {"x": x}, consts, {"pads": [1, 1, 1, 1]}, order=order)
    g = aidge_interop.load_onnx(model)
    assert "ys" in g.parameters()
    for ys in (0.25, 0.0625, 0.25):
        g.parameters()["ys"][...] = ys
        consts["ys"] = np.float32(ys)
        ref = ReferenceEvaluator(_model("QLinearConv", {"x": x}, consts, {"pads": [1, 1, 1, 1]},
                                        order=order)).run(None, {"x": x})[0]
        np.testing.assert_array_equal(g.forward([x])[0], ref)
