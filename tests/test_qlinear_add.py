"""ONNX Runtime's QLinearAdd and QLinearGlobalAveragePool (csrc/ops/qlinear.c) on the int8
kernels (kernels/qpool.c: AVX-512, AVX2, plain C, ``_C._set_quant_path``) bit for bit their
float64 definition (NumPy, and the reference loop of path 0), within one quantum of ONNX
Runtime; the QDQ fusion of DequantizeLinear -> Add / GlobalAveragePool -> QuantizeLinear into
them (aidge_interop/onnx/qlinear.py) against the graph as written; residual CNNs quantized by
onnxruntime.quantization (QDQ and QOperator) against ONNX Runtime."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from aidge_interop import _C
from aidge_interop.onnx.qlinear import fuse_qdq

BEST = _C._set_quant_path(3)
PATHS = list(range(BEST + 1))  # 0 the reference loop, 1 plain, 2 AVX2, 3 AVX-512 (VNNI CPUs)
ONNX_T = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}
QTYPES = pytest.mark.parametrize("qt", [np.uint8, np.int8], ids=["u8", "i8"])


@pytest.fixture(params=PATHS, ids=lambda p: f"path{p}")
def path(request):
    assert _C._set_quant_path(request.param) == request.param
    yield request.param
    _C._set_quant_path(BEST)


def _model(nodes, inputs, consts, out_type, ms=True):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, ONNX_T[a.dtype], a.shape)
                     for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)] + (
        [helper.make_opsetid("com.microsoft", 1)] if ms else []))


def _ort(model, inputs):
    import onnxruntime as ort
    (y,) = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, inputs)
    return y


def _zp(rng, qt):
    info = np.iinfo(qt)
    return np.array(rng.integers(info.min, int(info.max) + 1), qt)


def _scales(rng, ties):
    """as, bs, cs (float32): random, or powers of two whose ratios put half the sums on ties"""
    if ties:
        return [np.float32(2.0 ** int(e)) for e in (rng.integers(-7, -4), rng.integers(-7, -4))] \
            + [np.float32(2.0 ** int(rng.integers(-6, -3)))]
    return [np.float32(rng.uniform(0.005, 0.05)) for _ in range(3)]


def add_definition(a, az, b, bz, s, cz, qt):
    """c = saturate(rint((as (a - az) + bs (b - bz)) / cs) + cz) in float64"""
    as_, bs, cs = (np.float64(v) for v in s)
    v = (as_ * (a.astype(np.float64) - float(az)) + bs * (b.astype(np.float64) - float(bz))) / cs
    info = np.iinfo(qt)
    return np.clip(np.rint(v) + float(cz), info.min, info.max).astype(qt), v


def _add_case(qt, ashape, bshape, seed, ties):
    rng = np.random.default_rng(seed)
    info = np.iinfo(qt)
    a = rng.integers(info.min, int(info.max) + 1, ashape).astype(qt)
    b = rng.integers(info.min, int(info.max) + 1, bshape).astype(qt)
    s = _scales(rng, ties)
    az, bz, cz = _zp(rng, qt), _zp(rng, qt), _zp(rng, qt)
    consts = {"as": s[0], "az": az, "bs": s[1], "bz": bz, "cs": s[2], "cz": cz}
    node = helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"],
                            domain="com.microsoft")
    model = _model([node], {"a": a, "b": b}, consts, ONNX_T[np.dtype(qt)])
    return model, a, b, (az, bz, s, cz)


# every pair of bytes (256 x 256), then broadcasts: one value, rows, columns
ADD_SHAPES = [((256, 1), (1, 256)), ((2, 3, 17, 19), (2, 3, 17, 19)), ((2, 3, 4, 5), (1,)),
              ((1,), (3, 70)), ((3, 1, 5), (4, 1)), ((2, 8, 1, 1), (2, 8, 5, 5)),
              ((4, 1, 33), (4, 6, 33))]


@QTYPES
@pytest.mark.parametrize("shapes", ADD_SHAPES, ids=str)
@pytest.mark.parametrize("ties", [False, True], ids=["scales", "ties"])
def test_qlinear_add_definition(path, qt, shapes, ties):
    """Every path bit for bit the float64 definition (ties rounded to even)."""
    model, a, b, (az, bz, s, cz) = _add_case(qt, *shapes, seed=len(str(shapes)), ties=ties)
    if shapes[0] == (256, 1):  # all pairs
        info = np.iinfo(qt)
        a = np.arange(info.min, int(info.max) + 1).astype(qt).reshape(256, 1)
        b = a.reshape(1, 256)
    (ours,) = aidge_interop.load_onnx(model).forward([a, b])
    want, _ = add_definition(a, az, b, bz, s, cz, qt)
    assert ours.dtype == want.dtype and ours.shape == want.shape
    np.testing.assert_array_equal(ours, want)


@QTYPES
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ties", [False, True], ids=["scales", "ties"])
def test_qlinear_add_against_onnxruntime(qt, seed, ties):
    """ONNX Runtime (MLAS: a fixed point of 22-bit multipliers of the scale ratios rounded to
    float32) within one quantum: on random scales at least 99% equal (it differs near ties);
    on scales that put values on exact ties k + 1/2 it rounds those its own way (not
    half to even), and differs there only."""
    shape = (2, 16, 31, 33)
    model, a, b, (az, bz, s, cz) = _add_case(qt, shape, shape, seed=seed, ties=ties)
    (ours,) = aidge_interop.load_onnx(model).forward([a, b])
    diff = np.abs(ours.astype(np.int64) - _ort(model, {"a": a, "b": b}).astype(np.int64))
    assert diff.max() <= 1, f"{np.sum(diff > 1)} outputs more than one quantum apart"
    if ties:
        _, v = add_definition(a, az, b, bz, s, cz, qt)
        assert np.all(v[diff > 0] - np.floor(v[diff > 0]) == 0.5)
    else:
        assert np.mean(diff == 0) >= 0.99, f"{np.mean(diff == 0):.4%} equal"


def _pool_case(qt, shape, last, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(qt)
    x = rng.integers(info.min, int(info.max) + 1, shape).astype(qt)
    xs, ys = np.float32(rng.uniform(0.01, 0.05)), np.float32(rng.uniform(0.005, 0.02))
    xz, yz = _zp(rng, qt), _zp(rng, qt)
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"],
                            domain="com.microsoft", channels_last=last)
    model = _model([node], {"x": x}, {"xs": xs, "xz": xz, "ys": ys, "yz": yz},
                   ONNX_T[np.dtype(qt)])
    return model, x, (xs, xz, ys, yz)


POOL_SHAPES = [(2, 5, 6, 7), (1, 3, 200), (3, 4, 9, 9), (2, 64, 8, 8), (1, 2, 3, 4, 5)]


@QTYPES
@pytest.mark.parametrize("shape", POOL_SHAPES, ids=str)
@pytest.mark.parametrize("last", [0, 1])
def test_qlinear_global_average_pool_definition(path, qt, shape, last):
    model, x, (xs, xz, ys, yz) = _pool_case(qt, shape, last, seed=len(shape) + last)
    (ours,) = aidge_interop.load_onnx(model).forward([x])
    axes = tuple(range(1, x.ndim - 1)) if last else tuple(range(2, x.ndim))
    count = int(np.prod([x.shape[d] for d in axes]))
    sums = x.astype(np.int64).sum(axis=axes, keepdims=True)
    m = np.float64(xs) / np.float64(ys) / count
    info = np.iinfo(qt)
    want = np.clip(np.rint((sums - float(xz) * count) * m) + float(yz), info.min,
                   info.max).astype(qt)
    assert ours.shape == want.shape
    np.testing.assert_array_equal(ours, want)


@QTYPES
@pytest.mark.parametrize("last", [0, 1])
def test_qlinear_global_average_pool_against_onnxruntime(qt, last):
    model, x, _ = _pool_case(qt, (4, 32, 9, 11), last, seed=3)
    (ours,) = aidge_interop.load_onnx(model).forward([x])
    diff = np.abs(ours.astype(np.int64) - _ort(model, {"x": x}).astype(np.int64))
    assert diff.max() <= 1 and np.mean(diff == 0) >= 0.99, (diff.max(), np.mean(diff == 0))


# ---------------------------------------------------------------- the QDQ fusion

def _qdq_add(qt, seed, ties, shape=(64, 1024)):
    rng = np.random.default_rng(seed)
    s = _scales(rng, ties)
    az, bz, cz = _zp(rng, qt), _zp(rng, qt), _zp(rng, qt)
    nodes = [helper.make_node("DequantizeLinear", ["a", "as", "az"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "cs", "cz"], ["y"])]
    info = np.iinfo(qt)
    a, b = (rng.integers(info.min, int(info.max) + 1, shape).astype(qt) for _ in range(2))
    consts = {"as": s[0], "az": az, "bs": s[1], "bz": bz, "cs": s[2], "cz": cz}
    return _model(nodes, {"a": a, "b": b}, consts, ONNX_T[np.dtype(qt)], ms=False), a, b, \
        (az, bz, s, cz)


@QTYPES
@pytest.mark.parametrize("ties", [False, True], ids=["scales", "ties"])
def test_qdq_add_fusion_against_the_graph_as_written(qt, ties):
    """DQ(a), DQ(b) -> Add -> Q fused into QLinearAdd (its float64 definition) against the
    graph as written (float32: each dequantized value, the sum and the quotient rounded to
    float32), 24 scale sets of 65536 sums each: equal but where the float32 value rounds onto
    or across a tie k + 1/2 that the float64 one does not reach, there one quantum apart
    (2 in 10^6 of random scales; none where the scales are powers of two, all exact)."""
    equal = total = 0
    for seed in range(24):
        model, a, b, (az, bz, s, cz) = _qdq_add(qt, seed, ties)
        assert [n.op_type for n in fuse_qdq(model).graph.node] == ["QLinearAdd"]
        (ours,) = aidge_interop.load_onnx(model).forward([a, b])
        (written,) = aidge_interop.load_onnx(model, integer_qdq=False).forward([a, b])
        diff = np.abs(ours.astype(np.int64) - written.astype(np.int64))
        assert diff.max() <= 1
        equal, total = equal + np.sum(diff == 0), total + diff.size
        _, v = add_definition(a, az, b, bz, s, cz, qt)
        to_tie = np.abs(np.abs(v - np.floor(v)) - 0.5)
        bound = 2.0 ** -21 * ((np.abs(a.astype(np.float64) - float(az)) * float(s[0]) +
                               np.abs(b.astype(np.float64) - float(bz)) * float(s[1])) /
                              float(s[2]) + 1)
        assert np.all(to_tie[diff > 0] <= bound[diff > 0]), f"seed {seed}: away from a tie"
    assert equal / total >= (1.0 if ties else 0.9999), f"{equal} of {total} equal"


@QTYPES
def test_qdq_global_average_pool_fusion_against_the_graph_as_written(qt):
    rng = np.random.default_rng(1)
    info = np.iinfo(qt)
    x = rng.integers(info.min, int(info.max) + 1, (16, 64, 7, 7)).astype(qt)
    consts = {"xs": np.float32(0.023), "xz": _zp(rng, qt), "ys": np.float32(0.0071),
              "yz": _zp(rng, qt)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["fx"]),
             helper.make_node("GlobalAveragePool", ["fx"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "ys", "yz"], ["y"])]
    model = _model(nodes, {"x": x}, consts, ONNX_T[np.dtype(qt)], ms=False)
    assert [n.op_type for n in fuse_qdq(model).graph.node] == ["QLinearGlobalAveragePool"]
    (ours,) = aidge_interop.load_onnx(model).forward([x])
    (written,) = aidge_interop.load_onnx(model, integer_qdq=False).forward([x])
    diff = np.abs(ours.astype(np.int64) - written.astype(np.int64))
    assert diff.max() <= 1 and np.mean(diff == 0) >= 0.999, (diff.max(), np.mean(diff == 0))


def test_qdq_fusion_leaves_other_patterns():
    """Not fused: per-axis scales, mixed 8-bit types, a sum that another node also reads."""
    qt = np.uint8
    model, a, b, _ = _qdq_add(qt, 0, False, shape=(4, 3))
    g = model.graph
    # a second reader of the Add's float output
    g.node.append(helper.make_node("Relu", ["s"], ["r"]))
    g.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    assert "QLinearAdd" not in [n.op_type for n in fuse_qdq(model).graph.node]
    model, *_ = _qdq_add(qt, 0, False, shape=(4, 3))
    for init in model.graph.initializer:  # b's zero point int8, its data uint8: not one type
        if init.name == "bz":
            init.CopyFrom(numpy_helper.from_array(np.array(3, np.int8), "bz"))
    assert "QLinearAdd" not in [n.op_type for n in fuse_qdq(model).graph.node]
    model, *_ = _qdq_add(qt, 0, False, shape=(4, 3))
    for init in model.graph.initializer:
        if init.name == "as":
            init.CopyFrom(numpy_helper.from_array(np.full(3, 0.02, np.float32), "as"))
    model.graph.node[0].attribute.append(helper.make_attribute("axis", 1))
    assert "QLinearAdd" not in [n.op_type for n in fuse_qdq(model).graph.node]


# ---------------------------------------------------------------- residual CNNs by ONNX Runtime

def _resnet(tmp_path):
    import torch
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.Conv2d(c, c, 3,
                                                                                    padding=1)
            self.bn = torch.nn.BatchNorm2d(c)

        def forward(self, x):
            return torch.relu(x + self.bn(self.c2(torch.relu(self.c1(x)))))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.b1, self.b2 = Block(16), Block(16)
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x):
            y = self.b2(self.b1(torch.relu(self.stem(x))))
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))

    net = Net().eval()
    with torch.no_grad():  # BatchNorm statistics away from the identity
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0)
    path = str(tmp_path / "resnet.onnx")
    torch.onnx.export(net, torch.zeros(1, 3, 16, 16), path, dynamo=False, opset_version=17,
                      input_names=["x"], dynamic_axes={"x": {0: "n"}})
    return path


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    return _resnet(tmp_path_factory.mktemp("qadd"))


def quantized_resnet(src, dst, fmt, per_channel, act):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([np.random.default_rng(i).standard_normal(
                (4, 3, 16, 16)).astype(np.float32) for i in range(4)])

        def get_next(self):
            x = next(self.batches, None)
            return None if x is None else {"x": x}
    quantize_static(src, dst, Reader(), quant_format=getattr(QuantFormat, fmt),
                    per_channel=per_channel, activation_type=getattr(QuantType, act),
                    weight_type=QuantType.QInt8)
    return dst


def in_quanta(proto, ours, ref):
    """|ours - ref| in quanta of the final DequantizeLinear"""
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    last = [n for n in proto.graph.node if n.output[0] == proto.graph.output[0].name][0]
    assert last.op_type == "DequantizeLinear"
    return np.rint(np.abs(ours.astype(np.float64) - ref) / float(inits[last.input[1]]))


RESNETS = [(f, pc, act) for f in ("QDQ", "QOperator") for pc in (False, True)
           for act in ("QUInt8", "QInt8")]


@pytest.mark.slow
@pytest.mark.parametrize("fmt,per_channel,act", RESNETS,
                         ids=[f"{f}-{'per_channel' if pc else 'per_tensor'}-{a}"
                              for f, pc, a in RESNETS])
def test_quantized_resnet_against_onnxruntime(resnet, tmp_path, fmt, per_channel, act):
    """Two residual blocks and a global pool quantized by onnxruntime.quantization: every
    Add and the pool run as QLinearAdd / QLinearGlobalAveragePool (QDQ: fused at import),
    bit for bit on every path, and within one quantum of ONNX Runtime (its fused QDQ groups
    at the default optimization level; the QLinearConv requantizations and QLinearAdd's
    fixed point round near-ties otherwise, module docs)."""
    import onnx
    import onnxruntime as ort
    path = quantized_resnet(resnet, str(tmp_path / "q.onnx"), fmt, per_channel, act)
    proto = onnx.load(path)
    ops = [n.op_type for n in fuse_qdq(proto).graph.node]
    assert ops.count("QLinearAdd") == 2 and ops.count("QLinearGlobalAveragePool") == 1
    assert "Add" not in ops and "GlobalAveragePool" not in ops
    g = aidge_interop.load_onnx(proto)
    x = np.random.default_rng(100).standard_normal((64, 3, 16, 16)).astype(np.float32)
    outs = {}
    for p in PATHS:
        _C._set_quant_path(p)
        (outs[p],) = g.forward([x])
    _C._set_quant_path(BEST)
    for p in PATHS[1:]:
        np.testing.assert_array_equal(outs[p], outs[0], err_msg=f"path {p}")
    (ref,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    quanta = in_quanta(proto, outs[BEST], ref)
    assert quanta.max() <= 1, f"{np.sum(quanta > 1)} outputs more than one quantum apart"
    assert np.mean(quanta == 0) >= 0.99, f"{np.mean(quanta == 0):.4%} equal"
