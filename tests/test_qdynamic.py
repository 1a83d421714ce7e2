"""ONNX Runtime's dynamic quantization on the int8 kernels (ops/qlinear.c, "MatMulInteger on
the int8 kernels", ConvInteger's, QLinearMatMul of two activations): MatMulInteger bit for bit
against NumPy's int64 product wrapped to int32 (onnx.reference broadcasts a per-row
a_zero_point along the columns, so NumPy of ONNX's definition) and onnx.reference, ConvInteger
against onnx.reference, on the kernels' paths the CPU has (``_C._set_quant_path``: 3 VNNI;
2 AVX2 for MatMulInteger and DynamicQuantizeLinear; below, the float path, their twin; the
kernels' int32 store on every path against plain C sums: csrc/tests/test_qkernels.c);
DynamicQuantizeLinear against onnx.reference; an MLP and a transformer encoder quantized by
onnxruntime.quantization.quantize_dynamic against ONNX Runtime and the engine's float path."""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import aidge_interop
from aidge_interop import _C
from test_qlinear import _model, check_reference
from test_qlinear_fast import CONVS, _ints

BEST = _C._set_quant_path(3)
PATHS = sorted({0, 1, 2, BEST} & set(range(BEST + 1)))


@pytest.fixture(params=PATHS, ids=lambda p: f"path{p}")
def path(request):
    assert _C._set_quant_path(request.param) == request.param
    yield request.param
    _C._set_quant_path(3)


def _mm_ref(a, b, azp, bzp):
    """ONNX's MatMulInteger: azp per tensor or per row of A, bzp per tensor or per column of
    B, in int64, wrapped to int32 as ONNX's int32 arithmetic."""
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if azp is not None:
        a64 = a64 - (azp.astype(np.int64)[:, None] if azp.ndim else np.int64(azp))
    if bzp is not None:
        b64 = b64 - bzp.astype(np.int64)
    return (a64 @ b64).astype(np.int32)


SHAPES = [((5, 37), (37, 19)), ((2, 7, 40), (40, 33)), ((70, 8), (8, 3)), ((3,), (3, 17)),
          ((2, 3, 6, 9), (3, 9, 11)), ((4, 6, 20), (4, 20, 6)), ((1, 1), (1, 1))]


@pytest.mark.parametrize("at", [np.uint8, np.int8], ids=["a_u8", "a_i8"])
@pytest.mark.parametrize("bt", [np.uint8, np.int8], ids=["b_u8", "b_i8"])
@pytest.mark.parametrize("zps", ["none", "tensor", "per", "wide"])
@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_matmul_integer(path, at, bt, zps, case):
    """Every operand type and zero-point layout; "wide": B's zero points far from its values,
    so that B - zp leaves int8 (the offset of the kernels' module comment)."""
    ash, bsh = SHAPES[case]
    rng = np.random.default_rng(case)
    a, b = _ints(rng, ash, at), _ints(rng, bsh, bt)
    M, N = (ash[-2] if len(ash) > 1 else 1), bsh[-1]
    consts = {}
    if zps == "tensor":
        consts = {"azp": _ints(rng, (), at), "bzp": _ints(rng, (), bt)}
    elif zps == "per" and len(ash) > 1:
        consts = {"azp": _ints(rng, (M,), at), "bzp": _ints(rng, (N,), bt)}
    elif zps == "wide":
        info = np.iinfo(bt)
        b = _ints(rng, bsh, bt, int(info.max) - 30, int(info.max))
        consts = {"azp": _ints(rng, (), at), "bzp": np.full(N, info.min, bt)}
        consts["bzp"][::2] = info.max - 15
    for b_const in (True, False):
        inputs = {"a": a} if b_const else {"a": a, "b": b}
        cs = dict(consts, b=b) if b_const else consts
        order = ["a", "b"] + (["azp", "bzp"] if consts else [])
        model = _model("MatMulInteger", inputs, cs, opset=10, order=order)
        g = aidge_interop.load_onnx(model, param_kinds={n: "const" for n in cs})
        want = _mm_ref(a, b, consts.get("azp"), consts.get("bzp"))
        for _ in range(2):  # (the second forward: B's pack kept when constant)
            (y,) = g.forward(list(inputs.values()))
            assert y.dtype == np.int32 and y.shape == want.shape
            np.testing.assert_array_equal(y, want)
        if "azp" not in consts or consts["azp"].ndim == 0:
            check_reference("MatMulInteger", inputs, cs, opset=10, order=order)


@pytest.mark.parametrize("xt", [np.uint8, np.int8], ids=["x_u8", "x_i8"])
@pytest.mark.parametrize("wt", [np.uint8, np.int8], ids=["w_u8", "w_i8"])
@pytest.mark.parametrize("zps", ["none", "tensor", "per", "wide"])
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv_integer(path, xt, wt, zps, case):
    """Dense, grouped, depthwise, pointwise, dilated, 1-D; padding with x's zero point. On
    the int8 kernels where w - w_zp fits int8 (else, "wide" and most uint8 weights with a
    zero point, the float path), compared with onnx.reference either way."""
    xs, ws, attrs = CONVS[case]
    rng = np.random.default_rng(case)
    x, w = _ints(rng, xs, xt), _ints(rng, ws, wt)
    m = ws[0]
    consts = {"w": w}
    if zps == "tensor":
        consts.update(xzp=_ints(rng, (), xt), wzp=_ints(rng, (), wt))
        if wt == np.uint8:  # (values within 127 of the zero point: the int8 kernels)
            consts["wzp"] = np.uint8(128)
    elif zps == "per" and len(ws) == 4:  # (onnx.reference: per-channel of 2-D convs only)
        consts.update(xzp=_ints(rng, (), xt), wzp=_ints(rng, (m,), wt, -20, 20)
                      if wt == np.int8 else _ints(rng, (m,), wt, 120, 135))
        consts["w"] = (w.astype(np.int64) // 2 + (0 if wt == np.int8 else 64)).astype(wt)
    elif zps == "wide":
        consts.update(xzp=_ints(rng, (), xt), wzp=np.array(np.iinfo(wt).max, wt))
    order = ["x", "w"] + (["xzp", "wzp"] if len(consts) > 1 else [])
    for w_const in (True, False):
        inputs = {"x": x} if w_const else {"x": x, "w": consts["w"]}
        cs = consts if w_const else {k: v for k, v in consts.items() if k != "w"}
        model = _model("ConvInteger", inputs, cs, attrs=attrs, opset=10, order=order)
        (want,) = ReferenceEvaluator(model).run(None, inputs)
        g = aidge_interop.load_onnx(model, param_kinds={n: "const" for n in cs})
        for _ in range(2):  # (the second forward: the kept pack where constant)
            (y,) = g.forward(list(inputs.values()))
            assert y.dtype == np.int32 and y.shape == want.shape
            np.testing.assert_array_equal(y, want)


def test_matmul_integer_wraps_as_int32(path):
    """Sums past int32 wrap, as ONNX's int32 product (the kernels' arithmetic wraps)."""
    k = 70000
    a = np.full((2, k), 255, np.uint8)
    b = np.full((k, 3), -128, np.int8)
    b[:, 1] = 127
    (y,) = check_reference("MatMulInteger", {"a": a}, {"b": b}, opset=10)
    np.testing.assert_array_equal(y, _mm_ref(a, b, None, None))


@pytest.mark.parametrize("qt", [np.uint8, np.int8], ids=["u8", "i8"])
@pytest.mark.parametrize("shapes", [((2, 3, 5, 16), (2, 3, 16, 5)), ((4, 7, 9), (1, 9, 6)),
                                    ((6, 8), (2, 8, 7))], ids=str)
def test_qlinear_matmul_of_two_activations(path, qt, shapes):
    """QLinearMatMul with a batched B (attention's Q K^T, not a constant): B packed per
    matrix at run time."""
    rng = np.random.default_rng(len(shapes[0]))
    a, b = _ints(rng, shapes[0], qt), _ints(rng, shapes[1], qt, -60, 60)
    if qt == np.uint8:
        b = _ints(rng, shapes[1], qt, 70, 190)
    c = {"as": np.float32(0.02), "azp": _ints(rng, (), qt), "bs": np.float32(0.013),
         "bzp": np.array(128 if qt == np.uint8 else 3, qt), "ys": np.float32(0.9),
         "yzp": _ints(rng, (), qt)}
    check_reference("QLinearMatMul", {"a": a, "b": b}, c,
                    order=["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"])


@pytest.mark.parametrize("shape", [(1,), (7, 33), (3, 128, 64), (1000,)], ids=str)
@pytest.mark.parametrize("kind", ["normal", "positive", "negative", "zeros", "special"])
def test_dynamic_quantize_linear(path, shape, kind):
    """On the AVX2 path and up in vectors, below in a C loop: both equal the reference."""
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    if kind == "positive":
        x = np.abs(x)
    elif kind == "negative":
        x = -np.abs(x)
    elif kind == "zeros":
        x = np.zeros(shape, np.float32)
    elif kind == "special":  # ties of x / scale, extremes at the ends
        x = np.round(x * 2) / 2
        x.flat[0], x.flat[-1] = 255.0, -127.5
    check_reference("DynamicQuantizeLinear", {"x": x}, n_outputs=3, opset=11)


def test_cast_int32_to_float32():
    """The Cast after MatMulInteger (its own loop, tensor.c): NumPy's rounding to nearest,
    past 2^24 too."""
    rng = np.random.default_rng(0)
    x = rng.integers(-2**31, 2**31, 1000, dtype=np.int64).astype(np.int32)
    x[:6] = [2**24 + 1, 2**24 + 3, -2**31, 2**31 - 1, 0, -(2**25) - 3]
    (y,) = check_reference("Cast", {"x": x}, attrs={"to": 1})
    np.testing.assert_array_equal(y, x.astype(np.float32))


# ---------------------------------------------------------------- models quantized by ORT

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.ReLU(),
                                       torch.nn.Linear(96, 64), torch.nn.GELU(),
                                       torch.nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


def _encoder():
    layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


MODELS = {"mlp": (_Mlp, (48,)), "transformer": (_encoder, (10, 32))}


@pytest.fixture(scope="module")
def dynamic_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("qdynamic")
    torch.manual_seed(0)
    paths = {}
    for name, (make, shape) in MODELS.items():
        fp = str(d / f"{name}.onnx")
        torch.onnx.export(make().eval(), torch.zeros(2, *shape), fp, dynamo=False,
                          opset_version=17, input_names=["x"], dynamic_axes={"x": {0: "n"}})
        for per_channel in (False, True):
            q = str(d / f"{name}_{per_channel}.onnx")
            quantization.quantize_dynamic(fp, q, per_channel=per_channel)
            paths[name, per_channel] = q
    return paths


@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("model", MODELS)
def test_dynamic_model(dynamic_models, model, per_channel):
    """The integer operators are exact on every path (the int8 kernels give the float path's
    integers: the outputs are equal bit for bit); against ONNX Runtime (no graph
    optimizations: ONNX's operators as written) within float32 rounding (the float operators,
    Softmax, LayerNorm, the scale products, sum in another order)."""
    import onnx

    path = dynamic_models[model, per_channel]
    proto = onnx.load(path)
    ops = {n.op_type for n in proto.graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops, ops
    x = np.random.default_rng(5).standard_normal((4, *MODELS[model][1])).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (ref,) = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    g = aidge_interop.load_onnx(proto)
    (fast,) = g.forward([x])
    assert _C._set_quant_path(0) == 0
    try:
        (slow,) = g.forward([x])
    finally:
        _C._set_quant_path(3)
    np.testing.assert_array_equal(fast, slow)
    close = np.abs(fast - ref) <= 1e-5 * max(1.0, float(np.abs(ref).max()))
    assert close.all(), f"{np.sum(~close)} of {close.size} outputs apart"
