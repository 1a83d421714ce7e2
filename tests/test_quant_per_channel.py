"""Per-channel weight scales in the int8 path: QConv / QGemm with one
multiplier and shift per output channel against an independent NumPy int64
computation, ``quantize(per_channel=True)``'s integer parameters, the C
export bit for bit, old per-tensor files, and a depthwise model where
per-channel scales are measurably better.

The reference computes, for output channel oc (int64, floor division):

    acc[oc] = bias[oc] + sum(x * w[oc])
    y[oc]   = clamp(floor((acc[oc] * multiplier[oc] + 2^(shift[oc]-1)) / 2^shift[oc]),
                    out_min, out_max)
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import aidge_interop
from aidge_interop.quant import compile_and_run, export_c, quantize

QDOMAIN = "aidge_interop.quant"
STRICT = "-std=c99 -O1 -Wall -Wextra -Werror -pedantic"


# -- the reference -------------------------------------------------------------------

def ref_requant(acc, mult, shift, lo, hi, axis=1):
    """Per-channel requantization of an int64 accumulator along `axis`."""
    shape = [1] * acc.ndim
    shape[axis] = -1
    m = np.broadcast_to(np.asarray(mult, np.int64), (acc.shape[axis],)).reshape(shape)
    s = np.broadcast_to(np.asarray(shift, np.int64), (acc.shape[axis],)).reshape(shape)
    v = acc.astype(np.int64) * m
    half = np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
    v = np.floor_divide(v + half, np.left_shift(np.int64(1), s))
    return np.clip(v, lo, hi).astype(np.int8)


def ref_conv_acc(x, w, b, stride, pad, group):
    """int64 2-D convolution: zero-padded input, one kernel tap at a time."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad), np.int64)
    xp[:, :, pad:pad + h, pad:pad + wd] = x
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    acc = np.zeros((n, m, oh, ow), np.int64)
    mg = m // group
    for oc in range(m):
        g = oc // mg
        for ky in range(kh):
            for kx in range(kw):
                tap = xp[:, g * cg:(g + 1) * cg, ky:ky + stride * oh:stride,
                         kx:kx + stride * ow:stride]
                acc[:, oc] += np.einsum("ncij,c->nij", tap, w[oc, :, ky, kx].astype(np.int64))
    if b is not None:
        acc += b.astype(np.int64)[None, :, None, None]
    return acc


def one_node(op, x, inits, **attrs):
    ins = [helper.make_tensor_value_info("x", TensorProto.INT8, list(x.shape))]
    node = helper.make_node(op, ["x"] + [n for n, _ in inits], ["y"], name="qnode",
                            domain=QDOMAIN, **attrs)
    graph = helper.make_graph([node], "g", ins,
                              [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
                              [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                   helper.make_opsetid(QDOMAIN, 1)])


def run(op, x, inits, **attrs):
    return aidge_interop.load_onnx(one_node(op, x, inits, **attrs)).forward([x])[0]


def channel_params(rng, acc, axis=1):
    """Distinct multipliers and shifts per output channel: each shift brings
    most of its channel's |acc * multiplier| into the int8 range (channel 0:
    multiplier 1, shift 0, mostly clamped)."""
    m = acc.shape[axis]
    mult = rng.integers(1, 2 ** 15, m)
    mult[0] = 1
    big = np.percentile(np.abs(np.moveaxis(acc, axis, 0).reshape(m, -1)), 90, axis=1) * mult
    shift = np.maximum(np.ceil(np.log2(np.maximum(big, 1) / 100)), 0).astype(np.int64)
    shift[0] = 0
    assert len(set(shift[1:].tolist())) > 1  # the channels really differ
    return [int(v) for v in mult], [int(v) for v in shift]


# -- the engine's operators ---------------------------------------------------------

@pytest.mark.parametrize("group", [1, 2, 8], ids=["dense", "grouped", "depthwise"])
def test_qconv_per_channel_matches_int64_reference(group):
    rng = np.random.default_rng(group)
    x = rng.integers(-128, 128, (2, 8, 7, 6)).astype(np.int8)
    w = rng.integers(-127, 128, (8, 8 // group, 3, 3)).astype(np.int8)
    b = rng.integers(-5000, 5000, 8).astype(np.int32)
    acc = ref_conv_acc(x, w, b, 2, 1, group)
    mult, shift = channel_params(rng, acc)
    y = run("QConv", x, [("w", w), ("b", b)], multiplier=mult, shift=shift, out_min=-100,
            out_max=120, strides=[2, 2], pads=[1, 1, 1, 1], group=group)
    ref = ref_requant(acc, mult, shift, -100, 120)
    np.testing.assert_array_equal(y, ref)
    inside = np.mean((ref > -100) & (ref < 120), axis=(0, 2, 3))
    assert (inside[1:] > 0.3).all(), inside  # the shifts keep most values unclamped


@pytest.mark.parametrize("with_bias", [True, False])
def test_qgemm_per_channel_matches_int64_reference(with_bias):
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, (5, 40)).astype(np.int8)
    w = rng.integers(-127, 128, (6, 40)).astype(np.int8)
    b = rng.integers(-20000, 20000, 6).astype(np.int32)
    inits = [("w", w)] + ([("b", b)] if with_bias else [])
    acc = x.astype(np.int64) @ w.astype(np.int64).T + (b if with_bias else 0)
    mult, shift = channel_params(rng, acc)
    y = run("QGemm", x, inits, multiplier=mult, shift=shift)
    ref = ref_requant(acc, mult, shift, -128, 127)
    np.testing.assert_array_equal(y, ref)
    assert np.mean((ref[:, 1:] > -128) & (ref[:, 1:] < 127)) > 0.5


def test_one_list_and_one_int_combine():
    """A list of shifts with one multiplier (single-shift files), and the reverse."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (4, 16)).astype(np.int8)
    w = rng.integers(-127, 128, (3, 16)).astype(np.int8)
    acc = x.astype(np.int64) @ w.astype(np.int64).T
    y = run("QGemm", x, [("w", w)], multiplier=1, shift=[6, 8, 10])
    np.testing.assert_array_equal(y, ref_requant(acc, 1, [6, 8, 10], -128, 127))
    y = run("QGemm", x, [("w", w)], multiplier=[3, 5, 7], shift=11)
    np.testing.assert_array_equal(y, ref_requant(acc, [3, 5, 7], 11, -128, 127))


def test_scalar_attributes_still_load_and_run():
    """The per-tensor form (one int each) of files written before per-channel scales."""
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (1, 4, 5, 5)).astype(np.int8)
    w = rng.integers(-127, 128, (4, 1, 3, 3)).astype(np.int8)
    y = run("QConv", x, [("w", w)], multiplier=3, shift=9, group=4, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(y, ref_requant(ref_conv_acc(x, w, None, 1, 1, 4), 3, 9,
                                                 -128, 127))


@pytest.mark.parametrize("op,attrs,words", [
    ("QGemm", {"multiplier": [1, 2], "shift": 3}, "multiplier and shift have 2 values for 3"),
    ("QGemm", {"multiplier": [1, 2, 3], "shift": [1, 2]}, "multiplier has 3 values and shift 2"),
    ("QGemm", {"shift": [1, 70, 2]}, "shift[1] is 70"),
    ("QGemm", {"multiplier": [1, 0, 2]}, "multiplier[1] is 0"),
    ("Requantize", {"shift": [1, 2, 3]}, "shift must be one int"),
])
def test_bad_per_channel_attributes_name_the_node(op, attrs, words):
    x = np.zeros((2, 4), np.int8)
    inits = [("w", np.ones((3, 4), np.int8))] if op == "QGemm" else []
    with pytest.raises(Exception, match="qnode") as info:
        run(op, x, inits, **attrs)
    assert words in str(info.value)


# -- quantize(per_channel=True) ------------------------------------------------------

class DepthwiseNet(nn.Module):
    """Depthwise 3x3 (+BN, ReLU6) -> pointwise 1x1 -> global average -> Linear."""

    def __init__(self, c=8):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.bn = nn.BatchNorm2d(c)
        self.pw = nn.Conv2d(c, 2 * c, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * c, 5)

    def forward(self, x):
        x = nn.functional.relu6(self.bn(self.dw(x)))
        x = torch.relu(self.pw(x))
        return self.fc(torch.flatten(self.pool(x), 1))


@functools.lru_cache(maxsize=None)
def depthwise_case():
    """The model, calibration and test inputs. Half the depthwise channels
    have weights 64 times larger than the other half (high-gain channels
    that ReLU6 saturates, as in MobileNets): the clamp keeps one activation
    scale right for every channel, but one weight scale for the layer leaves
    the low-gain channels a few integer levels, where one scale per channel
    gives each its full range."""
    torch.manual_seed(0)
    model = DepthwiseNet().eval()
    gain = torch.tensor([1.0, 64.0] * 4)
    with torch.no_grad():
        model.dw.weight *= 3 * gain[:, None, None, None]
        model.dw.bias *= gain
        model.bn.running_mean.normal_(0.0, 0.05)
        model.bn.running_var.uniform_(0.8, 1.2)
    x = np.random.default_rng(0).standard_normal((160, 8, 6, 6)).astype(np.float32)
    with torch.no_grad():
        ref = model(torch.from_numpy(x[32:])).numpy()
    return model, x[:32], x[32:], ref


@functools.lru_cache(maxsize=None)
def depthwise_quantized(single_shift, per_channel):
    model, x_cal, _, _ = depthwise_case()
    return quantize(model, x_cal, single_shift=single_shift, per_channel=per_channel)


def depthwise_layer(q):
    return next(lay for lay in q.layers if lay.op == "Conv" and lay.attrs["group"] > 1)


@pytest.mark.parametrize("single_shift", [True, False], ids=["single_shift", "fixed_point"])
def test_per_channel_integer_parameters(single_shift):
    model, _, _, _ = depthwise_case()
    q = depthwise_quantized(single_shift, True)
    assert q.per_channel and "per_channel=True" in repr(q)
    for lay in (lay for lay in q.layers if lay.op in ("Conv", "Gemm")):
        m = lay.weight.shape[0]
        s_w = np.asarray(lay.weight_scale)
        assert s_w.shape == (m,) and lay.multiplier.shape == lay.shift.shape == (m,)
        # each channel's rescale is s_in * s_w[oc] / s_out
        ratio = lay.in_scales[0] * s_w / lay.out_scale
        np.testing.assert_allclose(lay.multiplier * 2.0 ** -lay.shift, ratio,
                                   rtol=0 if single_shift else 2 ** -13)
        wmax = np.abs(lay.weight.astype(np.int64)).reshape(m, -1).max(axis=1)
        if single_shift:  # power-of-two ratios, each channel's weights at least half the range
            assert np.all(np.log2(ratio) == np.round(np.log2(ratio))), lay.name
            assert (wmax >= 64).all(), (lay.name, wmax)
        else:
            assert (wmax == 127).all(), (lay.name, wmax)
        # the int32 bias at the per-channel scale s_in * s_w[oc]
        assert lay.bias is not None
    dw = depthwise_layer(q)
    row = next(r for r in q.summary().splitlines() if r.startswith(dw.name[:28]))
    assert f"{dw.shift.min()}..{dw.shift.max()}" in row  # the gains differ: so do the shifts
    bn = model.bn
    k = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().double().numpy()
    w = model.dw.weight.detach().double().numpy() * k[:, None, None, None]
    b = (model.dw.bias.detach().double().numpy() - bn.running_mean.detach().double().numpy()) \
        * k + bn.bias.detach().double().numpy()
    s_w = dw.weight_scale
    np.testing.assert_array_equal(dw.weight, np.clip(np.floor(w / s_w[:, None, None, None] + 0.5),
                                                     -127, 127))
    np.testing.assert_array_equal(dw.bias, np.floor(b / (dw.in_scales[0] * s_w) + 0.5))
    if not single_shift:
        np.testing.assert_allclose(s_w, np.abs(w).reshape(len(w), -1).max(1) / 127, rtol=1e-6)


def ref_run(q, xq):
    """The quantized model layer by layer with the reference above."""
    vals = dict(zip(q.input_names, xq))
    for lay in q.layers:
        x = vals[lay.inputs[0]]
        if lay.op == "Conv":
            a = lay.attrs
            assert set(a["strides"]) == {1} and len(set(a["pads"])) == 1
            acc = ref_conv_acc(x, lay.weight, lay.bias, 1, a["pads"][0], a["group"])
            y = ref_requant(acc, lay.multiplier, lay.shift, lay.lo, lay.hi)
        elif lay.op == "Gemm":
            acc = x.astype(np.int64) @ lay.weight.astype(np.int64).T + lay.bias
            y = ref_requant(acc, lay.multiplier, lay.shift, lay.lo, lay.hi)
        elif lay.op == "AveragePool":  # the global mean: floor(sum / count + 1/2)
            cnt = x.shape[2] * x.shape[3]
            y = np.floor_divide(2 * x.astype(np.int64).sum((2, 3), keepdims=True) + cnt,
                                2 * cnt).astype(np.int8)
        elif lay.op == "Reshape":
            y = x.reshape((-1, *lay.attrs["shape"][1:]))
        else:
            raise AssertionError(f"no reference for {lay.op}")
        vals[lay.output] = y
    return vals


@pytest.mark.parametrize("single_shift", [True, False], ids=["single_shift", "fixed_point"])
def test_per_channel_model_is_bit_exact(single_shift):
    _, _, x, _ = depthwise_case()
    q = depthwise_quantized(single_shift, True)
    xq = q.quantize_inputs(x[:8])
    ref = ref_run(q, xq)
    q.graph.keep_intermediates = True
    try:
        q.run(*xq)
        for lay in q.layers:
            np.testing.assert_array_equal(q.graph.intermediate(lay.output), ref[lay.output],
                                          err_msg=lay.name)
    finally:
        q.graph.keep_intermediates = False
    # the ONNX file holds lists, and reloads to the same graph
    node = next(n for n in q.onnx_model.graph.node if n.op_type == "QConv")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert isinstance(attrs["shift"], list) and len(attrs["shift"]) > 1
    again = aidge_interop.load_onnx(q.onnx_model.SerializeToString()).forward(xq)
    np.testing.assert_array_equal(again[0], ref[q.output_names[0]])


def test_per_tensor_files_still_load(tmp_path):
    """A model written with per_channel=False (one int per attribute, the
    format of earlier versions) loads from its file and runs as before."""
    q = depthwise_quantized(True, False)
    node = next(n for n in q.onnx_model.graph.node if n.op_type == "QConv")
    shift = next(a for a in node.attribute if a.name == "shift")
    assert shift.type == shift.INT
    path = tmp_path / "old.onnx"
    path.write_bytes(q.onnx_model.SerializeToString())
    _, _, x, _ = depthwise_case()
    xq = q.quantize_inputs(x[:8])
    out = aidge_interop.load_onnx(str(path)).forward(xq)[0]
    np.testing.assert_array_equal(out, ref_run(q, xq)[q.output_names[0]])


def layer_error(q, model, x, layer):
    """Relative RMS error of one layer's dequantized int8 output against the
    float model's value of the same name, on inputs x."""
    from aidge_interop import wrap
    from aidge_interop.graph import Graph

    wrapped = wrap(model, [(1, *x.shape[1:])]).eval()
    g = Graph(wrapped._graph, wrapped.onnx_model)
    g.keep_intermediates = True
    g.forward([x])
    ref = g.intermediate(layer.output)
    q.graph.keep_intermediates = True
    try:
        q.run(*q.quantize_inputs(x))
        got = q.graph.intermediate(layer.output) * layer.out_scale
    finally:
        q.graph.keep_intermediates = False
    return float(np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2)))


@pytest.mark.parametrize("single_shift", [True, False], ids=["single_shift", "fixed_point"])
def test_per_channel_beats_per_tensor_on_spread_depthwise_weights(single_shift):
    """On DepthwiseNet (see depthwise_case), per-channel scales keep every
    channel's weights at full resolution, where one scale per layer rounds
    the low-gain channels' weights to a few levels: the per-channel model
    is much closer to the float model, and agrees with its top-1 at least
    as often."""
    _, _, x, ref = depthwise_case()
    res = {}
    for pc in (False, True):
        q = depthwise_quantized(single_shift, pc)
        levels = np.abs(depthwise_layer(q).weight.astype(np.int64)).reshape(8, -1).max(1)
        out = q(x)[0]
        err = float(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref ** 2)))
        res[pc] = (levels, err, float(np.mean(out.argmax(1) == ref.argmax(1))),
                   layer_error(q, depthwise_case()[0], x, depthwise_layer(q)))
    (lv_t, err_t, agree_t, dw_t), (lv_c, err_c, agree_c, dw_c) = res[False], res[True]
    assert lv_t[0::2].max() <= 4 and lv_c.min() >= 64  # per tensor starves low gains
    # measured: depthwise output error 0.138 -> 0.037 (single shift), 0.078 -> 0.034
    # (fixed point); model output 0.090 -> 0.026, 0.025 -> 0.019
    assert dw_c < dw_t / 2, (dw_c, dw_t)
    assert err_c < err_t, (err_c, err_t)
    assert agree_c >= agree_t, (agree_c, agree_t)


# -- the C export ---------------------------------------------------------------------

@pytest.mark.parametrize("single_shift", [True, False], ids=["single_shift", "fixed_point"])
def test_per_channel_export_is_bit_exact(single_shift, tmp_path):
    _, _, x, _ = depthwise_case()
    q = depthwise_quantized(single_shift, True)
    result = export_c(q, tmp_path / "out", inputs=[x[:1]], verbose=False)
    header = next((tmp_path / "out" / "layers").glob(f"L{q.layers.index(depthwise_layer(q)):02d}_*.h"))
    assert "_rq[8] = {" in header.read_text()
    # ROM: int8 weights, int32 biases and 16 bytes of rescale per output channel
    assert result.rom_bytes == sum(lay.weight.size + 4 * lay.bias.size + 16 * len(lay.weight)
                                   for lay in q.layers if lay.weight is not None)
    out = compile_and_run(tmp_path / "out", cflags=STRICT)  # checks every layer
    np.testing.assert_array_equal(out[0], q.run(*q.quantize_inputs(x[:1]))[0])
    xq = q.quantize_inputs(x[:16])[0]
    np.testing.assert_array_equal(compile_and_run(tmp_path / "out", [xq])[0], q.run(xq)[0])


def test_graph_badge_shows_the_range_of_shifts():
    from aidge_interop.visualize import quant_badge

    assert quant_badge({"nb_bits": 8, "shift": (5, 9, 7)}) == "int8 >>5..9"
    assert quant_badge({"nb_bits": 8, "shift": [6, 6]}) == "int8 >>6"
    assert quant_badge({"nb_bits": 8, "shift": 7}) == "int8 >>7"
