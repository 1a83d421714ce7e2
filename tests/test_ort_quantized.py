"""Models quantized by ONNX Runtime (onnxruntime.quantization) run by the engine against
ONNX Runtime, the QDQ fusion (aidge_interop/onnx/qlinear.py) against the unfused graph, and
QuantizedModel.to_onnx_qdq run by ONNX Runtime (aidge_interop/quant/qdq.py)."""
import collections

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import aidge_interop

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
torch = pytest.importorskip("torch")

MS = "com.microsoft"


def _session(model, optimize=True):
    so = ort.SessionOptions()
    if not optimize:  # ONNX's definitions as written: no QDQ fusion, no lookup tables
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _ints(shape, dtype, seed=0):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, int(info.max) + 1, shape).astype(dtype)


# ---------------------------------------------------------------- contrib operators, one node

def _ms_model(op_type, inputs, consts, names, out_type, **attrs):
    node = helper.make_node(op_type, names, ["y"], domain=MS, **attrs)
    graph = helper.make_graph(
        [node], op_type.lower(),
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)])


def _unary(qt, op, names=("x", "xs", "xzp", "ys", "yzp"), **attrs):
    x = _ints((2, 6, 5, 4), qt)
    consts = {"xs": np.float32(0.043), "xzp": _ints((), qt, seed=2), "ys": np.float32(0.0071),
              "yzp": _ints((), qt, seed=3)}
    return _ms_model(op, {"x": x}, consts, list(names), helper.np_dtype_to_tensor_dtype(x.dtype),
                     **attrs), {"x": x}


CASES = {
    "QLinearSigmoid": lambda qt: _unary(qt, "QLinearSigmoid"),
    "QLinearLeakyRelu": lambda qt: _unary(qt, "QLinearLeakyRelu", alpha=0.2),
    "QLinearSoftmax": lambda qt: _unary(qt, "QLinearSoftmax", axis=-1, opset=13),
    "QLinearSoftmax-opset11-axis1": lambda qt: _unary(qt, "QLinearSoftmax", axis=1, opset=11),
    "QLinearAveragePool": lambda qt: _unary(qt, "QLinearAveragePool", kernel_shape=[2, 2],
                                            strides=[1, 2], pads=[1, 0, 0, 1]),
    "QLinearAveragePool-channels_last": lambda qt: _unary(
        qt, "QLinearAveragePool", kernel_shape=[3, 2], count_include_pad=1, pads=[1, 1, 1, 1],
        channels_last=1),
}


def _binary(qt, op):
    a, b = _ints((3, 4, 5), qt), _ints((4, 1), qt, seed=1)
    consts = {"as": np.float32(0.031), "azp": _ints((), qt, seed=2), "bs": np.float32(0.047),
              "bzp": _ints((), qt, seed=3), "cs": np.float32(0.05), "czp": _ints((), qt, seed=4)}
    return _ms_model(op, {"a": a, "b": b}, consts,
                     ["a", "as", "azp", "b", "bs", "bzp", "cs", "czp"],
                     helper.np_dtype_to_tensor_dtype(a.dtype)), {"a": a, "b": b}


def _concat(qt):
    a, b = _ints((2, 3, 4), qt), _ints((2, 5, 4), qt, seed=1)
    consts = {"ys": np.float32(0.05), "yzp": _ints((), qt, seed=4), "as": np.float32(0.031),
              "azp": _ints((), qt, seed=2), "bs": np.float32(0.05), "bzp": _ints((), qt, seed=4)}
    return _ms_model("QLinearConcat", {"a": a, "b": b}, consts,
                     ["ys", "yzp", "a", "as", "azp", "b", "bs", "bzp"],
                     helper.np_dtype_to_tensor_dtype(a.dtype), axis=1), {"a": a, "b": b}


CASES["QLinearMul"] = lambda qt: _binary(qt, "QLinearMul")
CASES["QLinearConcat"] = _concat


@pytest.mark.parametrize("qt", [np.int8, np.uint8], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("case", CASES)
def test_contrib_operator_against_onnxruntime(case, qt):
    """Written as DequantizeLinear -> op -> QuantizeLinear, ONNX Runtime's lookup tables
    and integer exp approximations: at most one quantum apart."""
    model, inputs = CASES[case](qt)
    (ref,) = _session(model).run(None, inputs)
    (ours,) = aidge_interop.load_onnx(model).forward(list(inputs.values()))
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    diff = np.abs(ours.astype(np.int64) - ref.astype(np.int64))
    assert diff.max() <= 1, f"{np.sum(diff > 1)} of {diff.size} outputs more than one step off"


def test_matmul_integer_to_float_and_dynamic_quantize_matmul():
    rng = np.random.default_rng(0)
    a = _ints((3, 7), np.uint8)
    b = _ints((7, 5), np.int8, seed=1)
    consts = {"b": b, "as": np.float32(0.02), "bs": rng.uniform(0.01, 0.1, 5).astype(np.float32),
              "azp": np.uint8(120), "bzp": np.zeros(5, np.int8),
              "bias": rng.standard_normal(5).astype(np.float32)}
    model = _ms_model("MatMulIntegerToFloat", {"a": a}, consts,
                      ["a", "b", "as", "bs", "azp", "bzp", "bias"], TensorProto.FLOAT)
    (ref,) = _session(model).run(None, {"a": a})
    (ours,) = aidge_interop.load_onnx(model).forward([a])
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
    x = rng.standard_normal((3, 7)).astype(np.float32)
    del consts["as"], consts["azp"]
    model = _ms_model("DynamicQuantizeMatMul", {"x": x}, consts, ["x", "b", "bs", "bzp", "bias"],
                      TensorProto.FLOAT)
    (ref,) = _session(model).run(None, {"x": x})
    (ours,) = aidge_interop.load_onnx(model).forward([x])
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)


def test_contrib_operator_errors():
    model, inputs = CASES["QLinearConcat"](np.int8)
    del model.graph.node[0].input[-1]
    with pytest.raises(ValueError, match="QLinearConcat node .* per input; 7 inputs"):
        aidge_interop.load_onnx(model)


# ---------------------------------------------------------------- models quantized by ORT

class _ConvNet(torch.nn.Module):
    """Conv, depthwise conv, residual Add, average pool, Linear."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = torch.nn.Conv2d(8, 8, 1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(y + self.pw(torch.relu(self.dw(y))))
        return self.fc(torch.nn.functional.avg_pool2d(y, 2).flatten(1))


class _Mlp(torch.nn.Module):
    """Linear, Sigmoid, LeakyRelu, Concat, Softmax."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(12, 16), torch.nn.Linear(12, 16)
        self.c = torch.nn.Linear(32, 6)

    def forward(self, x):
        y = torch.cat([torch.sigmoid(self.a(x)),
                       torch.nn.functional.leaky_relu(self.b(x), 0.1)], 1)
        return torch.softmax(self.c(y), -1)


class _Attention(torch.nn.Module):
    """MatMul by weights and between activations, Softmax, Mul, LayerNorm."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(8, 8) for _ in range(3))
        self.ln = torch.nn.LayerNorm(8)

    def forward(self, x):
        h = self.ln(x)
        a = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) * 0.35, -1)
        return h + a @ self.v(h)


MODELS = {"convnet": (_ConvNet, (3, 8, 8)), "mlp": (_Mlp, (12,)), "attention": (_Attention, (5, 8))}


def _batches(shape, n, seed):
    return [np.random.default_rng(seed + i).standard_normal((4, *shape)).astype(np.float32)
            for i in range(n)]


@pytest.fixture(scope="module")
def float_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("ort_quantized")
    torch.manual_seed(0)
    paths = {}
    for name, (cls, shape) in MODELS.items():
        paths[name] = str(d / f"{name}.onnx")
        torch.onnx.export(cls().eval(), torch.zeros(1, *shape), paths[name], dynamo=False,
                          opset_version=17, input_names=["x"], dynamic_axes={"x": {0: "n"}})
    return d, paths


def _quantize(float_models, model, fmt, per_channel, act):
    d, paths = float_models
    shape = MODELS[model][1]
    path = str(d / f"{model}_{fmt}_{per_channel}_{act}.onnx")
    if fmt == "dynamic":
        quantization.quantize_dynamic(paths[model], path)
        return path

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.batches = iter(_batches(shape, 4, seed=0))

        def get_next(self):
            x = next(self.batches, None)
            return None if x is None else {"x": x}
    quantization.quantize_static(
        paths[model], path, Reader(), quant_format=getattr(quantization.QuantFormat, fmt),
        per_channel=per_channel, activation_type=getattr(quantization.QuantType, act),
        weight_type=quantization.QuantType.QInt8)
    return path


def _quanta(proto, ours, ref):
    """|ours - ref| in output quanta (the scale of the DequantizeLinear giving the output)."""
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    last = [n for n in proto.graph.node if n.output[0] == proto.graph.output[0].name][0]
    assert last.op_type == "DequantizeLinear"
    return np.rint(np.abs(ours.astype(np.float64) - ref) / float(inits[last.input[1]]))


STATIC = [(m, f, pc, act) for m in MODELS for f in ("QDQ", "QOperator") for pc in (False, True)
          for act in ("QUInt8", "QInt8")]


@pytest.mark.parametrize("model,fmt,per_channel,act", STATIC,
                         ids=[f"{m}-{f}-{'per_channel' if pc else 'per_tensor'}-{a}"
                              for m, f, pc, a in STATIC])
def test_static_quantization_against_onnxruntime(float_models, model, fmt, per_channel, act):
    """QOperator: against ONNX Runtime as it runs by default (its lookup tables and integer
    kernels). QDQ: against ONNX Runtime running the definitions (no optimization), as
    written (integer_qdq=False) and fused (integer_qdq=True: exact int32 sums, one
    requantization). At most one quantum apart: a float32 value within a rounding of a
    tie of a QuantizeLinear can go either way (a Conv or AveragePool summing in another
    order; an AveragePool of 2x2 lands on ties often)."""
    import onnx

    path = _quantize(float_models, model, fmt, per_channel, act)
    proto = onnx.load(path)
    x = np.concatenate(_batches(MODELS[model][1], 8, seed=100))
    (ref,) = _session(path, optimize=fmt == "QOperator").run(None, {"x": x})
    for integer_qdq in ((True,) if fmt == "QOperator" else (False, True)):
        (ours,) = aidge_interop.load_onnx(proto, integer_qdq=integer_qdq).forward([x])
        quanta = _quanta(proto, ours, ref)
        assert quanta.max() <= 1, (integer_qdq, f"{np.sum(quanta > 1)} of {quanta.size}")


@pytest.mark.parametrize("model", MODELS)
def test_dynamic_quantization_against_onnxruntime(float_models, model):
    """DynamicQuantizeLinear, MatMulInteger, ConvInteger: float outputs, within float32
    rounding (float operators after the integer ones sum in another order)."""
    path = _quantize(float_models, model, "dynamic", False, None)
    x = np.concatenate(_batches(MODELS[model][1], 8, seed=100))
    (ref,) = _session(path).run(None, {"x": x})
    (ours,) = aidge_interop.load_onnx(path).forward([x])
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(ref).max()))


def test_qdq_fusion_writes_integer_operators(float_models):
    """Every Conv, Gemm and MatMul by a weight of ORT's QDQ models becomes an integer
    operator; the MatMuls of two activations stay float."""
    import onnx
    from aidge_interop.onnx.qlinear import fuse_qdq

    want = {"convnet": {"QLinearConv": 3, "QGemm": 1},
            "mlp": {"QGemm": 3}, "attention": {"QLinearMatMul": 3, "MatMul": 2}}
    for model, counts in want.items():
        proto = onnx.load(_quantize(float_models, model, "QDQ", True, "QUInt8"))
        ops = collections.Counter(n.op_type for n in fuse_qdq(proto).graph.node)
        assert {k: ops[k] for k in counts} == counts, (model, ops)
        assert not ops["Conv"] and not ops["Gemm"]


# ---------------------------------------------------------------- QuantizedModel -> QDQ

class QuantizeLinear(OpRun):
    """onnx.reference's QuantizeLinear replaced (by class name) by one rounding half up, as
    the engine's integer requantization."""
    op_domain = ""

    def _run(self, x, scale, zp=None, axis=None, block_size=None, output_dtype=None,
             precision=None, saturate=None):
        q = np.floor(x.astype(np.float64) / np.float64(scale) + 0.5) + (zp if zp is not None
                                                                          else 0)
        return (np.clip(q, -128, 127).astype(np.int8),)


class _QNet(torch.nn.Module):
    """Every layer the quantizer takes: Conv (+ReLU), residual Add, MaxPool, Concat (with a
    requantized input), AveragePool, Flatten, Linear."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(8, 4, 1)
        self.fc = torch.nn.Linear(12 * 4 * 4, 10)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.max_pool2d(torch.relu(y + self.c2(y)), 2)
        z = torch.nn.functional.avg_pool2d(torch.cat([y, self.c3(y)], 1), 2)
        return self.fc(z.flatten(1))


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("single_shift", [True, False])
def test_to_onnx_qdq(tmp_path, single_shift, per_channel):
    """The QDQ export computes the integer model: with QuantizeLinear rounding half up
    (onnx.reference with that one operator replaced) it equals the engine's int8 model bit
    for bit; ONNX Runtime runs it as ONNX defines it (equal to onnx.reference), and so does
    the engine; the engine's int8 model and ONNX Runtime then differ by the ties that half to
    even sends down (measured, docs/quantization.md)."""
    torch.manual_seed(0)
    net = _QNet().eval()
    cal = np.random.default_rng(0).standard_normal((32, 3, 16, 16)).astype(np.float32)
    x = np.random.default_rng(1).standard_normal((16, 3, 16, 16)).astype(np.float32)
    qm = aidge_interop.quantize(net, [cal], single_shift=single_shift, per_channel=per_channel)
    assert np.ndim(qm.layers[0].multiplier) == int(per_channel)
    path = tmp_path / "q.onnx"
    model = qm.to_onnx_qdq(path)
    assert path.exists()
    feed = {qm.input_names[0]: x}
    (ours,) = qm(x)
    (half_up,) = ReferenceEvaluator(model, new_ops=[QuantizeLinear]).run(None, feed)
    np.testing.assert_array_equal(ours, half_up)
    (ref,) = ReferenceEvaluator(model).run(None, feed)
    (by_ort,) = _session(str(path)).run(None, feed)
    np.testing.assert_array_equal(by_ort, ref)
    (engine_qdq,) = aidge_interop.load_onnx(model).forward([x])
    np.testing.assert_array_equal(engine_qdq, by_ort)


def test_to_onnx_qdq_refuses_a_layer_without_qdq_form():
    """A transformer layer (here a Sigmoid's lookup table) has no QDQ form: a clear error
    naming the layer, not a wrong model."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Sigmoid()).eval()
    cal = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    qm = aidge_interop.quantize(net, [cal])
    with pytest.raises(NotImplementedError, match=r"layer '.*' \(\w+\) has no QDQ form"):
        qm.to_onnx_qdq()


# ---------------------------------------------------------------- float32 and float64 products

@pytest.mark.parametrize("k,edge", [(1024, 126), (256, 126), (1024, 0)])
def test_integer_products_exact_in_float32_or_float64(k, edge):
    """MatMulInteger and ConvInteger run on the float32 kernels where every partial sum
    stays below 2^24 and on the float64 ones otherwise: 255 * 127 * 1024 plus an odd
    change is past float32's integers (the float64 path), 256 taps are within (float32);
    both exact against onnx.reference."""
    from test_qlinear import check_reference

    a = np.full((3, k), 255, np.uint8)
    b = np.full((k, 5), 127, np.int8)
    b[0, 0], a[1, 3] = edge, 254
    (y,) = check_reference("MatMulInteger", {"a": a}, {"b": b, "azp": np.uint8(0),
                                                        "bzp": np.int8(0)})
    assert y[0, 0] == 255 * (127 * (k - 1) + edge)
    x = a.reshape(3, k // 16, 4, 4)
    w = np.ascontiguousarray(b.T.reshape(5, k // 16, 4, 4))
    check_reference("ConvInteger", {"x": x}, {"w": w, "xzp": np.uint8(0), "wzp": np.int8(0)})


def test_compare_int8_rows(tmp_path):
    """``aidge-interop compare --int8``: the engine's int8 model and ONNX Runtime on its QDQ
    export, timed and compared with the float reference."""
    import json

    from aidge_interop.compare.cli import main

    report = tmp_path / "r.json"
    assert main(["compare", "lenet", "--int8", "--backends", "torch", "--repeat", "1",
                 "--warmup", "0", "--json", str(report)]) == 0
    rows = {e["name"]: e for e in json.loads(report.read_text())["engines"]}
    for name in ("aidge_interop int8", "onnxruntime int8 (QDQ)"):
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name]["error"]["cosine"] > 0.999  # int8 of LeNet's float outputs


class _LeNet(torch.nn.Module):
    """LeNet-5 with 2x2 average pools (ties on a quarter of their outputs)."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(1, 6, 5), torch.nn.Conv2d(6, 16, 5)
        self.f1, self.f2 = torch.nn.Linear(16 * 4 * 4, 84), torch.nn.Linear(84, 10)

    def forward(self, x):
        y = torch.nn.functional.avg_pool2d(torch.relu(self.c1(x)), 2)
        y = torch.nn.functional.avg_pool2d(torch.relu(self.c2(y)), 2)
        return self.f2(torch.relu(self.f1(y.flatten(1))))


QDQ_NETS = {"lenet": (_LeNet, (1, 28, 28)), "residual": (_QNet, (3, 16, 16))}


def _half_even(name, single_shift, per_channel):
    torch.manual_seed(0)
    cls, shape = QDQ_NETS[name]
    cal = np.random.default_rng(0).standard_normal((32, *shape)).astype(np.float32)
    x = np.random.default_rng(1).standard_normal((64, *shape)).astype(np.float32)
    qm = aidge_interop.quantize(cls().eval(), [cal], single_shift=single_shift,
                                per_channel=per_channel, rounding="half_even")
    return qm, x


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("name", QDQ_NETS)
def test_to_onnx_qdq_rounding_half_even_equals_onnxruntime(name, per_channel):
    """quantize(rounding="half_even") with power-of-two scales (single_shift): every float
    operation of the QDQ export is exact (8-bit products of power-of-two scales, sums below
    2^24, divisions by powers of two), so its QuantizeLinear rounds the integer model's
    exact values, to even as the engine: ONNX Runtime, optimized (its QLinearConv, fused
    QDQ) or not, gives the engine's int8 outputs exactly; so do onnx.reference and the
    QDQ model on the engine."""
    qm, x = _half_even(name, True, per_channel)
    model = qm.to_onnx_qdq()
    feed = {qm.input_names[0]: x}
    (ours,) = qm(x)
    for optimize in (True, False):
        (by_ort,) = _session(model, optimize).run(None, feed)
        np.testing.assert_array_equal(by_ort, ours, err_msg=f"optimize={optimize}")
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, feed)[0], ours)
    np.testing.assert_array_equal(aidge_interop.load_onnx(model).forward([x])[0], ours)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("name", QDQ_NETS)
def test_to_onnx_qdq_half_even_fixed_point_within_float32(name, per_channel):
    """With 15-bit multipliers (single_shift=False) the export's scales are float32
    roundings of m s_out / (2^shift s_x): ONNX Runtime's products then differ from the
    integer ones by a float32 rounding, and a value that close to a tie may round the
    other way (then carried by the next layers): measured 99.8-100% of the outputs equal,
    all within one quantum (docs/quantization.md)."""
    qm, x = _half_even(name, False, per_channel)
    feed = {qm.input_names[0]: x}
    (ours,) = qm(x)
    (by_ort,) = _session(qm.to_onnx_qdq()).run(None, feed)
    quanta = np.rint(np.abs(ours.astype(np.float64) - by_ort) / qm.output_scales[0])
    assert np.mean(quanta == 0) >= 0.99 and quanta.max() <= 1, (np.mean(quanta == 0),
                                                                  quanta.max())
