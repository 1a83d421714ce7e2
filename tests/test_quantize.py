"""Quantized graphs: the engine's integer operators (domain
``aidge_interop.quant``) against an independent NumPy reference, and
``aidge_interop.quantize`` on the example models.

The reference below is written from the integer semantics alone (int64
NumPy, floor division for every rounding), not from the C kernels:

    round_shift(v, s) = floor(v / 2^s + 1/2)          (half up, any sign)
    requant(acc)      = clamp(round_shift(acc * multiplier, shift), out_min, out_max)
    average pool      = floor(sum / count + 1/2)

Convolutions are computed on an explicitly zero-padded input, one kernel
tap at a time (a different loop order from the C kernels); max pools pad
with a sentinel below every int8 value, average pools count the valid
elements by pooling a padded array of ones.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from aidge_interop.examples import EXAMPLES
from aidge_interop.quant import QuantizedModel, accuracy, quantize

QDOMAIN = "aidge_interop.quant"


# -- the independent reference ----------------------------------------------------

def ref_round_shift(v, s):
    """floor(v / 2^s + 1/2); s an int or an array broadcasting against v."""
    v, s = np.asarray(v, dtype=np.int64), np.asarray(s, dtype=np.int64)
    half = np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
    return np.floor_divide(v + half, np.left_shift(np.int64(1), s))


def ref_requant(acc, multiplier=1, shift=0, lo=-128, hi=127):
    v = ref_round_shift(np.asarray(acc, np.int64) * np.int64(multiplier), shift)
    return np.clip(v, lo, hi).astype(np.int8)


def _to_2d(x, kernel, strides, dilations, pads):
    """1-D window ops as 2-D ones with a height of 1."""
    if x.ndim == 3:
        return (x[:, :, None, :], [1, kernel[0]], [1, strides[0]], [1, dilations[0]],
                [0, pads[0], 0, pads[1]], True)
    return x, list(kernel), list(strides), list(dilations), list(pads), False


def _out_size(size, k, s, d, pb, pe):
    return (size + pb + pe - d * (k - 1) - 1) // s + 1


def _taps(xp, k, s, d, oh, ow):
    """(ky, kx, the input under tap (ky, kx) of every output position)."""
    for ky in range(k[0]):
        for kx in range(k[1]):
            y0, x0 = ky * d[0], kx * d[1]
            yield ky, kx, xp[:, :, y0:y0 + s[0] * (oh - 1) + 1:s[0],
                             x0:x0 + s[1] * (ow - 1) + 1:s[1]]


def ref_conv_acc(x, w, b=None, strides=None, dilations=None, pads=None, group=1):
    """int64 accumulator of a grouped convolution, (N, C, [H,] W)."""
    nsp = x.ndim - 2
    strides = strides or [1] * nsp
    dilations = dilations or [1] * nsp
    pads = pads or [0] * (2 * nsp)
    x = np.asarray(x, np.int64)
    w = np.asarray(w, np.int64)
    x2, k, s, d, p, one_d = _to_2d(x, w.shape[2:], strides, dilations, pads)
    w2 = w[:, :, None, :] if one_d else w
    n, c, h, wd = x2.shape
    m = w2.shape[0]
    oh = _out_size(h, k[0], s[0], d[0], p[0], p[2])
    ow = _out_size(wd, k[1], s[1], d[1], p[1], p[3])
    xp = np.pad(x2, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    cg, mg = c // group, m // group
    acc = np.zeros((n, group, mg, oh, ow), np.int64)
    wg = w2.reshape(group, mg, cg, k[0], k[1])
    for ky, kx, patch in _taps(xp, k, s, d, oh, ow):
        acc += np.einsum("ngchw,gmc->ngmhw", patch.reshape(n, group, cg, oh, ow),
                         wg[:, :, :, ky, kx])
    acc = acc.reshape(n, m, oh, ow)
    if b is not None:
        acc += np.asarray(b, np.int64)[None, :, None, None]
    return acc[:, :, 0, :] if one_d else acc


def ref_gemm_acc(x, w, b=None):
    acc = np.asarray(x, np.int64) @ np.asarray(w, np.int64).T
    return acc if b is None else acc + np.asarray(b, np.int64)


def ref_add(a, b, ma, mb, shift, lo=-128, hi=127):
    v = np.asarray(a, np.int64) * ma + np.asarray(b, np.int64) * mb
    return np.clip(ref_round_shift(v, shift), lo, hi).astype(np.int8)


def ref_pool(x, kind, kernel, strides=None, dilations=None, pads=None, count_include_pad=0):
    nsp = x.ndim - 2
    strides = strides or [1] * nsp
    dilations = dilations or [1] * nsp
    pads = pads or [0] * (2 * nsp)
    x2, k, s, d, p, one_d = _to_2d(np.asarray(x, np.int64), kernel, strides, dilations, pads)
    n, c, h, wd = x2.shape
    oh = _out_size(h, k[0], s[0], d[0], p[0], p[2])
    ow = _out_size(wd, k[1], s[1], d[1], p[1], p[3])
    padw = ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3]))
    if kind == "max":
        xp = np.pad(x2, padw, constant_values=-(1 << 40))
        out = np.full((n, c, oh, ow), -(1 << 40), np.int64)
        for _, _, patch in _taps(xp, k, s, d, oh, ow):
            out = np.maximum(out, patch)
        assert (out > -(1 << 40)).all(), "a window without a valid element"
    else:
        total = np.zeros((n, c, oh, ow), np.int64)
        for _, _, patch in _taps(np.pad(x2, padw), k, s, d, oh, ow):
            total += patch
        if count_include_pad:
            count = np.int64(k[0] * k[1])
        else:
            count = np.zeros((1, 1, oh, ow), np.int64)
            for _, _, patch in _taps(np.pad(np.ones((1, 1, h, wd), np.int64), padw),
                                     k, s, d, oh, ow):
                count += patch
        out = np.floor_divide(2 * total + count, 2 * count)  # floor(sum/count + 1/2)
    out = out.astype(np.int8)
    return out[:, :, 0, :] if one_d else out


# -- one-node models ----------------------------------------------------------------

def one_node(op, x_list, inits=(), name="qnode", x_dtype=TensorProto.INT8, **attrs):
    """A model of one node of the quant domain: graph inputs x_list (arrays),
    initializers inits (name, array)."""
    ins = [helper.make_tensor_value_info(f"x{i}", x_dtype, list(x.shape))
           for i, x in enumerate(x_list)]
    init_protos = [numpy_helper.from_array(np.ascontiguousarray(a), n) for n, a in inits]
    node = helper.make_node(op, [f"x{i}" for i in range(len(x_list))] + [n for n, _ in inits],
                            ["y"], name=name, domain=QDOMAIN, **attrs)
    graph = helper.make_graph([node], "one_node", ins,
                              [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
                              init_protos)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                   helper.make_opsetid(QDOMAIN, 1)])


def run_engine(op, x_list, inits=(), **attrs):
    out = aidge_interop.load_onnx(one_node(op, x_list, inits, **attrs)).forward(list(x_list))
    assert len(out) == 1 and out[0].dtype == np.int8
    return out[0]


def rand_i8(rng, shape, lo=-128, hi=127):
    return rng.integers(lo, hi + 1, size=shape).astype(np.int8)


def pick_shift(acc, multiplier, target=100):
    """A shift that brings most of |acc * multiplier| into the int8 range, so
    that the clamp does not hide the arithmetic."""
    big = float(np.percentile(np.abs(acc.astype(np.float64) * multiplier), 90)) or 1.0
    return max(0, math.ceil(math.log2(big / target)))


def assert_informative(y, lo, hi):
    """The output is not (nearly) all clamped: the test checks arithmetic."""
    inside = np.mean((y > lo) & (y < hi))
    assert inside > 0.3, f"only {inside:.0%} of the outputs are inside ({lo}, {hi})"


# -- QConv ------------------------------------------------------------------------

CONV2D_CASES = {
    # id: (N, C, H, W, M, kernel, strides, dilations, pads, group, bias)
    "plain": (2, 3, 7, 6, 4, (3, 3), None, None, None, 1, False),
    "stride_asym_pads_dil_bias": (2, 3, 9, 8, 5, (3, 2), [2, 1], [1, 2], [1, 0, 2, 1], 1, True),
    "stride2_pads_bias": (1, 4, 8, 8, 3, (3, 3), [2, 2], None, [1, 1, 1, 1], 1, True),
    "grouped": (2, 4, 6, 5, 6, (3, 3), None, None, [1, 1, 1, 1], 2, True),
    "depthwise": (2, 5, 7, 7, 5, (3, 3), [1, 2], None, [1, 2, 1, 0], 5, True),
    "depthwise_nobias_dil": (1, 4, 9, 9, 4, (3, 3), None, [2, 2], [2, 2, 2, 2], 4, False),
    "pointwise": (2, 6, 5, 5, 7, (1, 1), [2, 2], None, None, 1, True),
}


@pytest.mark.parametrize("case", list(CONV2D_CASES), ids=list(CONV2D_CASES))
def test_qconv2d_matches_reference(case):
    n, c, h, w, m, k, strides, dil, pads, group, with_bias = CONV2D_CASES[case]
    rng = np.random.default_rng(list(CONV2D_CASES).index(case))
    x = rand_i8(rng, (n, c, h, w))
    wt = rand_i8(rng, (m, c // group, *k))
    b = rng.integers(-2**14, 2**14, size=m).astype(np.int32) if with_bias else None
    mult = int(rng.integers(1, 2**15))
    acc = ref_conv_acc(x, wt, b, strides, dil, pads, group)
    shift = pick_shift(acc, mult)
    attrs = dict(multiplier=mult, shift=shift, group=group)
    if strides:
        attrs["strides"] = strides
    if dil:
        attrs["dilations"] = dil
    if pads:
        attrs["pads"] = pads
    inits = [("w", wt)] + ([("b", b)] if with_bias else [])
    got = run_engine("QConv", [x], inits, **attrs)
    want = ref_requant(acc, mult, shift)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert_informative(want, -128, 127)


@pytest.mark.parametrize("group", [1, 3])
def test_qconv1d_matches_reference(group):
    rng = np.random.default_rng(10 + group)
    n, c, wd, m = 2, 3, 17, 6 if group == 1 else 3
    x = rand_i8(rng, (n, c, wd))
    wt = rand_i8(rng, (m, c // group, 4))
    b = rng.integers(-3000, 3000, size=m).astype(np.int32)
    strides, dil, pads = [2], [2], [3, 1]
    mult = int(rng.integers(1, 300))
    acc = ref_conv_acc(x, wt, b, strides, dil, pads, group)
    shift = pick_shift(acc, mult)
    got = run_engine("QConv", [x], [("w", wt), ("b", b)], multiplier=mult, shift=shift,
                     strides=strides, dilations=dil, pads=pads, group=group)
    want = ref_requant(acc, mult, shift)
    assert got.shape == want.shape == (n, m, (wd + 4 - 2 * 3 - 1) // 2 + 1)
    np.testing.assert_array_equal(got, want)
    assert_informative(want, -128, 127)


def test_qconv_fused_relu_clamp_and_shift0():
    rng = np.random.default_rng(3)
    x = rand_i8(rng, (2, 2, 5, 5), -4, 4)
    wt = rand_i8(rng, (3, 2, 2, 2), -3, 3)
    acc = ref_conv_acc(x, wt)
    # shift 0: the accumulator itself, clamped to [0, 20]
    got = run_engine("QConv", [x], [("w", wt)], out_min=0, out_max=20)
    want = ref_requant(acc, 1, 0, 0, 20)
    np.testing.assert_array_equal(got, want)
    assert got.min() == 0 and got.max() == 20 and ((got > 0) & (got < 20)).any()


# -- QGemm --------------------------------------------------------------------------

@pytest.mark.parametrize("with_bias", [True, False])
def test_qgemm_matches_reference(with_bias):
    rng = np.random.default_rng(20 + with_bias)
    x = rand_i8(rng, (5, 37))
    wt = rand_i8(rng, (11, 37))
    b = rng.integers(-2**16, 2**16, size=11).astype(np.int32) if with_bias else None
    mult = int(rng.integers(2**14, 2**15))
    acc = ref_gemm_acc(x, wt, b)
    shift = pick_shift(acc, mult)
    got = run_engine("QGemm", [x], [("w", wt)] + ([("b", b)] if with_bias else []),
                     multiplier=mult, shift=shift)
    want = ref_requant(acc, mult, shift)
    np.testing.assert_array_equal(got, want)
    assert_informative(want, -128, 127)


def test_qgemm_exact_ties():
    # acc = x . w with w = 1: the accumulator is x; shift 2 divides by 4
    x = np.array([[-10, -6, -2, 2, 6, 10, -9, 9, -7, 7]], np.int8).T  # (10, 1)
    wt = np.ones((1, 1), np.int8)
    got = run_engine("QGemm", [x], [("w", wt)], shift=2)[:, 0]
    # -2.5 -> -2, -1.5 -> -1, -0.5 -> 0, 0.5 -> 1, 1.5 -> 2, 2.5 -> 3, -2.25, 2.25, -1.75, 1.75
    np.testing.assert_array_equal(got, [-2, -1, 0, 1, 2, 3, -2, 2, -2, 2])
    np.testing.assert_array_equal(got, ref_requant(x[:, 0], 1, 2))


# -- QAdd -------------------------------------------------------------------------

@pytest.mark.parametrize("ma,mb,shift,lo,hi", [
    (1, 1, 0, -128, 127),          # saturating sum
    (3, 5, 2, -128, 127),          # multipliers, ties at shift 2
    (1, 2, 1, 0, 127),             # fused ReLU, the single-shift pattern
    (17000, 9000, 15, -100, 90),   # 15-bit fixed point, narrowed clamp
    (-7, 4, 3, -128, 127),         # a negative multiplier (accepted by the engine)
])
def test_qadd_matches_reference(ma, mb, shift, lo, hi):
    rng = np.random.default_rng(abs(ma * 31 + mb))
    a = rand_i8(rng, (2, 3, 4, 5))
    b = rand_i8(rng, (2, 3, 4, 5))
    got = run_engine("QAdd", [a, b], multiplier_a=ma, multiplier_b=mb, shift=shift,
                     out_min=lo, out_max=hi)
    want = ref_add(a, b, ma, mb, shift, lo, hi)
    np.testing.assert_array_equal(got, want)
    assert ((want > lo) & (want < hi)).mean() > 0.3


def test_qadd_ties_negative():
    a = np.array([-3, -1, 1, 3, -5, 5, -128, 127], np.int8)
    b = np.zeros_like(a)
    got = run_engine("QAdd", [a, b], multiplier_a=1, multiplier_b=1, shift=1)
    np.testing.assert_array_equal(got, [-1, 0, 1, 2, -2, 3, -64, 64])


# -- Requantize -----------------------------------------------------------------------

def test_requantize_shift0_is_identity_then_clamp():
    x = np.arange(-128, 128, dtype=np.int8)
    np.testing.assert_array_equal(run_engine("Requantize", [x]), x)
    got = run_engine("Requantize", [x], out_min=-5, out_max=9)
    np.testing.assert_array_equal(got, np.clip(x, -5, 9))


def test_requantize_ties_half_up_both_signs():
    x = np.array([-5, -3, -1, 1, 3, 5, -4, 4, -128, 127], np.int8)
    got = run_engine("Requantize", [x], shift=1)
    # -2.5 -> -2, -1.5 -> -1, -0.5 -> 0, 0.5 -> 1, 1.5 -> 2, 2.5 -> 3
    np.testing.assert_array_equal(got, [-2, -1, 0, 1, 2, 3, -2, 2, -64, 64])
    np.testing.assert_array_equal(got, ref_requant(x, 1, 1))


@pytest.mark.parametrize("seed", range(4))
def test_requantize_random_multiplier_shift(seed):
    rng = np.random.default_rng(100 + seed)
    x = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)
    mult = int(rng.integers(1, 2**20))
    shift = int(np.clip(math.ceil(math.log2(mult)) + int(rng.integers(-2, 3)), 0, 62))
    got = run_engine("Requantize", [x], multiplier=mult, shift=shift)
    np.testing.assert_array_equal(got, ref_requant(x, mult, shift))


def test_requantize_large_shift_and_multiplier():
    x = np.arange(-128, 128, dtype=np.int8)
    mult = 2**31 - 1
    for shift in (31, 38, 62):
        got = run_engine("Requantize", [x], multiplier=mult, shift=shift)
        # exact in Python ints: floor((v * mult + 2^(shift-1)) / 2^shift)
        want = np.array([(int(v) * mult + 2**(shift - 1)) // 2**shift for v in x])
        np.testing.assert_array_equal(got, np.clip(want, -128, 127))


# -- pools ----------------------------------------------------------------------------

POOL_CASES = {
    # id: (shape, kernel, strides, dilations, pads)
    "2x2s2": ((2, 3, 8, 8), [2, 2], [2, 2], None, None),
    "3x3s1_pads": ((1, 2, 7, 6), [3, 3], [1, 1], None, [1, 1, 1, 1]),
    "3x2_asym_pads_stride": ((2, 2, 9, 7), [3, 2], [2, 3], None, [2, 0, 1, 1]),
    "dilated": ((1, 3, 9, 9), [2, 3], [1, 2], [2, 2], [1, 2, 0, 2]),
    "global": ((2, 4, 5, 3), [5, 3], None, None, None),
    "1d": ((2, 3, 13), [3], [2], None, [1, 2]),
}


@pytest.mark.parametrize("case", list(POOL_CASES), ids=list(POOL_CASES))
def test_qmaxpool_matches_reference(case):
    shape, k, s, d, p = POOL_CASES[case]
    rng = np.random.default_rng(list(POOL_CASES).index(case))
    x = rand_i8(rng, shape, -128, -1)  # all negative: zero padding would show
    attrs = {"kernel_shape": k}
    attrs.update({n: v for n, v in (("strides", s), ("dilations", d), ("pads", p)) if v})
    got = run_engine("QMaxPool", [x], **attrs)
    want = ref_pool(x, "max", k, s, d, p)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("case", list(POOL_CASES), ids=list(POOL_CASES))
def test_qaveragepool_matches_reference(case, count_include_pad):
    shape, k, s, d, p = POOL_CASES[case]
    rng = np.random.default_rng(list(POOL_CASES).index(case) + 50)
    x = rand_i8(rng, shape)
    attrs = {"kernel_shape": k, "count_include_pad": count_include_pad}
    attrs.update({n: v for n, v in (("strides", s), ("dilations", d), ("pads", p)) if v})
    got = run_engine("QAveragePool", [x], **attrs)
    want = ref_pool(x, "avg", k, s, d, p, count_include_pad)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_qaveragepool_ties_and_padding_count():
    # 2x2 windows (stride 2) of sums 2, -2, -6, 6 (count 4): 0.5 -> 1, -0.5 -> 0,
    # -1.5 -> -1, 1.5 -> 2
    x = np.array([[1, 1, -1, -1],
                  [0, 0, 0, 0],
                  [-3, -3, 3, 3],
                  [0, 0, 0, 0]], np.int8).reshape(1, 1, 4, 4)
    got = run_engine("QAveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    np.testing.assert_array_equal(got.reshape(2, 2), [[1, 0], [-1, 2]])
    # a 1-D window of 3 over [pad, 9, 8]: 17 / 2 = 8.5 -> 9 without the pad,
    # 17 / 3 = 5.67 -> 6 with it
    x = np.array([9, 8, 100], np.int8).reshape(1, 1, 3)
    for cip, first in ((0, 9), (1, 6)):
        got = run_engine("QAveragePool", [x], kernel_shape=[3], pads=[1, 0],
                         count_include_pad=cip)
        assert int(got[0, 0, 0]) == first
        np.testing.assert_array_equal(got, ref_pool(x, "avg", [3], None, None, [1, 0], cip))


# -- nb_bits ------------------------------------------------------------------------

def test_nb_bits_4_default_range():
    rng = np.random.default_rng(44)
    x = rand_i8(rng, (6, 20), -8, 7)
    wt = rand_i8(rng, (9, 20), -7, 7)
    acc = ref_gemm_acc(x, wt)
    shift = 4
    got = run_engine("QGemm", [x], [("w", wt)], shift=shift, nb_bits=4)
    want = ref_requant(acc, 1, shift, -8, 7)
    np.testing.assert_array_equal(got, want)
    unclamped = ref_round_shift(acc, shift)
    assert (unclamped > 7).any() and (unclamped < -8).any()  # the 4-bit clamp matters
    assert_informative(want, -8, 7)
    # and with an explicit clamp inside it
    got = run_engine("Requantize", [np.arange(-8, 8, dtype=np.int8)], nb_bits=4,
                     out_min=-3, out_max=5)
    np.testing.assert_array_equal(got, np.clip(np.arange(-8, 8), -3, 5))


# -- bad attributes and inputs ---------------------------------------------------------

def _expect_error(exc, model, inputs, *words):
    with pytest.raises(exc) as info:
        aidge_interop.load_onnx(model).forward(inputs)
    msg = str(info.value)
    assert "bad_node" in msg, msg
    for w in words:
        assert w in msg, msg


X4 = np.zeros((1, 2, 4, 4), np.int8)
W4 = np.ones((3, 2, 1, 1), np.int8)


@pytest.mark.parametrize("attrs,words", [
    (dict(shift=70), ["shift"]),
    (dict(shift=-1), ["shift"]),
    (dict(multiplier=0), ["multiplier"]),
    (dict(out_min=10, out_max=2), ["out_max"]),
    (dict(out_min=-129), ["out_min"]),
    (dict(nb_bits=9), ["nb_bits"]),
    (dict(nb_bits=4, out_max=8), ["out_max"]),
    (dict(group=0), ["group"]),
    (dict(kernel_shape=[2, 2]), ["kernel_shape"]),
    (dict(pads=[0, 0]), ["pads"]),
    (dict(strides=[0, 1]), ["strides"]),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_qconv_bad_attribute(attrs, words):
    _expect_error(ValueError, one_node("QConv", [X4], [("w", W4)], name="bad_node", **attrs),
                  [X4], *words)


def test_qconv_float_input():
    x = X4.astype(np.float32)
    _expect_error(TypeError, one_node("QConv", [x], [("w", W4)], name="bad_node",
                                      x_dtype=TensorProto.FLOAT), [x], "float32", "int8")


def test_qconv_bad_weight_and_bias():
    w = np.ones((3, 3, 1, 1), np.int8)  # 3 input channels, the input has 2
    _expect_error(ValueError, one_node("QConv", [X4], [("w", w)], name="bad_node"), [X4],
                  "channels")
    _expect_error(TypeError, one_node("QConv", [X4], [("w", W4.astype(np.float32))],
                                      name="bad_node"), [X4], "weight")
    _expect_error(TypeError, one_node("QConv", [X4], [("w", W4), ("b", np.zeros(3, np.int8))],
                                      name="bad_node"), [X4], "bias")
    _expect_error(ValueError, one_node("QConv", [X4], [("w", W4), ("b", np.zeros(4, np.int32))],
                                       name="bad_node"), [X4], "bias")
    _expect_error(ValueError, one_node("QConv", [X4], [("w", W4)], name="bad_node", group=2),
                  [X4], "group")


def test_qgemm_accumulator_overflow_is_not_silent():
    x = np.full((1, 4), 127, np.int8)
    wt = np.full((1, 4), 127, np.int8)
    b = np.array([2**31 - 1], np.int32)
    model = one_node("QGemm", [x], [("w", wt), ("b", b)], name="bad_node", shift=24)
    try:
        got = aidge_interop.load_onnx(model).forward([x])[0]
    except (ValueError, OverflowError) as exc:
        assert "bad_node" in str(exc)
    else:
        np.testing.assert_array_equal(got, ref_requant(ref_gemm_acc(x, wt, b), 1, 24))


def test_bad_inputs_of_other_ops():
    x = np.zeros((2, 5), np.int8)
    _expect_error(ValueError, one_node("QGemm", [x], [("w", np.zeros((3, 4), np.int8))],
                                       name="bad_node"), [x])
    a, b = np.zeros((2, 3), np.int8), np.zeros((3, 2), np.int8)
    _expect_error(ValueError, one_node("QAdd", [a, b], name="bad_node"), [a, b], "shape")
    _expect_error(ValueError, one_node("QMaxPool", [X4], name="bad_node"), [X4], "kernel_shape")
    _expect_error(ValueError, one_node("QAveragePool", [X4], name="bad_node", kernel_shape=[2, 2],
                                       count_include_pad=2), [X4], "count_include_pad")
    _expect_error(ValueError, one_node("QMaxPool", [X4], name="bad_node", kernel_shape=[5, 5]),
                  [X4])
    xf = np.zeros(4, np.float32)
    _expect_error(TypeError, one_node("Requantize", [xf], name="bad_node",
                                      x_dtype=TensorProto.FLOAT), [xf], "int8")


# -- quantize() on the example models ---------------------------------------------------

class Mixed1d(torch.nn.Module):
    """A 1-D model that is none of the examples: Conv1d + BatchNorm, a Concat
    of two differently scaled branches (Requantize layers), a dilated
    depthwise Conv1d with a residual Add, padded AvgPool1d counting the pad,
    MaxPool1d, a Hardtanh that cannot be fused (Clip layer), Flatten, Linear."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.a = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.BatchNorm1d(4), nn.ReLU())
        self.b = nn.Conv1d(2, 4, 5, padding=2)
        self.dw = nn.Conv1d(8, 8, 3, padding=2, dilation=2, groups=8)
        self.avg = nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=True)
        self.mx = nn.MaxPool1d(2)
        self.fc = nn.Linear(8 * 4, 5)

    def forward(self, x):
        y = torch.cat([self.a(x), self.b(x)], 1)
        y = torch.relu(self.dw(y) + y)
        y = torch.nn.functional.hardtanh(self.mx(self.avg(y)), -1.0, 0.75)
        return self.fc(torch.flatten(y, 1))


def mixed1d(seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Mixed1d()
        bn = model.a[1]
        with torch.no_grad():  # running statistics unlike the affine parameters
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0.0, 0.1)
            bn.running_mean.normal_(0.0, 0.1)
            bn.running_var.uniform_(0.5, 1.5)
    return model


MODELS = {name: (factory, shape) for name, (factory, shape, _) in EXAMPLES.items()}
MODELS["mixed1d"] = (mixed1d, (1, 2, 16))
N_SAMPLES = {"perceptron": 64, "lenet": 32, "ds_cnn": 10, "resnet8": 8, "mixed1d": 32}
CONFIGS = [(ss, clip) for ss in (True, False) for clip in ("max", "mse")]
# resnet8's float calibration is the slowest: one config per value of each option
MODEL_CONFIGS = [(name, ss, clip) for name in ("perceptron", "lenet", "ds_cnn", "mixed1d")
                 for ss, clip in CONFIGS] + [("resnet8", True, "max"), ("resnet8", False, "mse")]


@functools.lru_cache(maxsize=None)
def example(name):
    """(torch model, calibration inputs, torch outputs)."""
    factory, shape = MODELS[name]
    model = factory(seed=0).eval()
    x = np.random.default_rng(1234).standard_normal((N_SAMPLES[name], *shape[1:]))
    x = x.astype(np.float32)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    return model, x, ref


@functools.lru_cache(maxsize=None)
def quantized(name, single_shift, clipping, nb_bits=8, per_channel=False):
    """Per tensor unless asked (tests/test_quant_per_channel.py checks the
    per-channel parameters)."""
    model, x, _ = example(name)
    return quantize(model, x, nb_bits=nb_bits, single_shift=single_shift, clipping=clipping,
                    per_channel=per_channel)


def is_pow2(v: float) -> bool:
    return v > 0 and math.frexp(v)[0] == 0.5


def ref_run_layers(q: QuantizedModel, int_inputs):
    """The quantized model layer by layer with the NumPy reference ops;
    returns every value (name -> int8 array)."""
    vals = dict(zip(q.input_names, int_inputs))

    def per_channel(v, acc):  # per-channel multipliers and shifts along axis 1
        return np.reshape(v, (-1,) + (1,) * (acc.ndim - 2)) if np.ndim(v) else v

    for lay in q.layers:
        a = lay.attrs
        xs = [vals[i] for i in lay.inputs]
        if lay.op == "Conv":
            acc = ref_conv_acc(xs[0], lay.weight, lay.bias, a["strides"], a["dilations"],
                               a["pads"], a["group"])
            y = ref_requant(acc, per_channel(lay.multiplier, acc), per_channel(lay.shift, acc),
                            lay.lo, lay.hi)
        elif lay.op == "Gemm":
            y = ref_requant(ref_gemm_acc(xs[0], lay.weight, lay.bias), lay.multiplier,
                            lay.shift, lay.lo, lay.hi)
        elif lay.op == "Add":
            y = ref_add(xs[0], xs[1], lay.multipliers[0], lay.multipliers[1], lay.shift,
                        lay.lo, lay.hi)
        elif lay.op == "Requantize":
            y = ref_requant(xs[0], lay.multiplier, lay.shift, lay.lo, lay.hi)
        elif lay.op in ("MaxPool", "AveragePool"):
            y = ref_pool(xs[0], "max" if lay.op == "MaxPool" else "avg", a["kernel_shape"],
                         a["strides"], a["dilations"], a["pads"], a.get("count_include_pad", 0))
        elif lay.op == "Reshape":
            y = xs[0].reshape((-1, *a["shape"][1:]))
        elif lay.op == "Concat":
            y = np.concatenate(xs, axis=a["axis"])
        elif lay.op == "Clip":
            y = np.clip(xs[0], lay.lo, lay.hi).astype(np.int8)
        else:
            raise AssertionError(f"layer op {lay.op} has no reference")
        vals[lay.output] = y
    return vals


def ref_quantize_input(x, scale, qmax):
    return np.clip(np.floor(np.asarray(x, np.float64) / scale + 0.5), -qmax, qmax).astype(np.int8)


@pytest.mark.parametrize("name,single_shift,clipping", MODEL_CONFIGS)
def test_quantize_example_accuracy(name, single_shift, clipping):
    _, x, ref = example(name)
    q = quantized(name, single_shift, clipping)
    out = q(x)
    assert len(out) == 1 and out[0].shape == ref.shape and out[0].dtype == np.float32
    y = out[0]
    span = float(ref.max() - ref.min())
    err = float(np.abs(y - ref).max()) / span
    # measured 0.006 .. 0.018 of the output range on these models
    assert err < 0.06, f"max |error| is {err:.3f} of the output range"
    agree = float(np.mean(y.argmax(axis=1) == ref.argmax(axis=1)))
    assert agree >= 0.9, f"argmax agreement {agree:.2f}"


@pytest.mark.parametrize("name,single_shift,clipping", MODEL_CONFIGS)
def test_quantize_example_integer_parameters(name, single_shift, clipping):
    q = quantized(name, single_shift, clipping)
    qmax = q.qmax
    assert qmax == 127
    assert q.input_scales == [q.scales[n] for n in q.input_names]
    assert all(s > 0 and math.isfinite(s) for s in q.scales.values())
    if single_shift:
        bad = {n: s for n, s in q.scales.items() if not is_pow2(s)}
        assert not bad, f"scales that are not powers of two: {bad}"
    computing = [lay for lay in q.layers if lay.op in ("Conv", "Gemm")]
    assert computing
    for lay in computing:
        where = f"{lay.op} '{lay.name}'"
        assert lay.weight.dtype == np.int8, where
        wmax = int(np.abs(lay.weight.astype(np.int64)).max())
        assert lay.weight.min() >= -qmax and wmax <= qmax, where
        if lay.bias is not None:
            assert lay.bias.dtype == np.int32, where
        # the rescale multiplier * 2^-shift is s_in * s_w / s_out
        ratio = lay.in_scales[0] * lay.weight_scale / lay.out_scale
        assert lay.multiplier * 2.0 ** -lay.shift == pytest.approx(ratio, rel=2 ** -13), where
        assert 0 <= lay.shift <= 62, where
        if single_shift:
            assert lay.multiplier & (lay.multiplier - 1) == 0, (where, lay.multiplier)
            assert lay.multiplier * 2.0 ** -lay.shift == ratio, where
            # compensated weights: s_w in [max|w|/qmax, 2 max|w|/qmax), so the
            # largest weight takes at least half of the range
            assert wmax >= (qmax + 1) // 2, (where, wmax)
        else:
            assert wmax == qmax, (where, wmax)  # s_w = max|w| / qmax
            if 0 < lay.shift < 62:
                assert 2**14 <= lay.multiplier <= 2**15, (where, lay.multiplier)
    for lay in q.layers:
        if lay.op in ("Conv", "Gemm", "Add", "Requantize", "Clip"):
            assert -qmax <= lay.lo <= lay.hi <= qmax, lay.name
        if lay.op == "Add" and single_shift:
            assert all(m & (m - 1) == 0 for m in lay.multipliers), lay.multipliers
        if lay.op == "Requantize" and single_shift:
            assert lay.multiplier & (lay.multiplier - 1) == 0, lay.multiplier
            assert lay.multiplier * 2.0 ** -lay.shift == lay.in_scales[0] / lay.out_scale


def test_mixed1d_layer_kinds():
    """The 1-D model reaches every layer kind (so its bit-exact test covers them)."""
    ops = {lay.op for lay in quantized("mixed1d", False, "max").layers}
    assert ops == {"Conv", "Requantize", "Concat", "Add", "AveragePool", "MaxPool", "Clip",
                   "Reshape", "Gemm"}, ops
    convs = [lay for lay in quantized("mixed1d", False, "max").layers if lay.op == "Conv"]
    assert all(lay.weight.ndim == 3 for lay in convs)
    assert any(lay.attrs["group"] == 8 and lay.attrs["dilations"] == [2] for lay in convs)
    pool = next(lay for lay in quantized("mixed1d", False, "max").layers
                if lay.op == "AveragePool")
    assert pool.attrs["count_include_pad"] == 1 and pool.attrs["pads"] == [1, 1]


@pytest.mark.parametrize("name,single_shift,clipping,per_channel", [
    *((*c, False) for c in MODEL_CONFIGS),
    *((name, ss, "max", True) for name in ("lenet", "ds_cnn", "mixed1d") for ss in (True, False))])
def test_quantize_example_bit_exact(name, single_shift, clipping, per_channel):
    """The engine's integer graph equals the NumPy reference, layer by layer."""
    _, x, _ = example(name)
    q = quantized(name, single_shift, clipping, per_channel=per_channel)
    xq = q.quantize_inputs(x)
    assert len(xq) == len(q.input_scales) == 1
    assert xq[0].dtype == np.int8
    np.testing.assert_array_equal(xq[0], ref_quantize_input(x, q.input_scales[0], q.qmax))
    ref_vals = ref_run_layers(q, xq)
    q.graph.keep_intermediates = True
    try:
        outs = q.run(*xq)
        for lay in q.layers:
            got = q.graph.intermediate(lay.output)
            np.testing.assert_array_equal(got, ref_vals[lay.output],
                                          err_msg=f"layer {lay.name} ({lay.op})")
    finally:
        q.graph.keep_intermediates = False
    assert len(outs) == len(q.output_names)
    for o, n in zip(outs, q.output_names):
        assert o.dtype == np.int8
        np.testing.assert_array_equal(o, ref_vals[n])
    # on a few samples (the kernels are plain loops): run() is the engine
    # graph's forward, __call__ = dequantize(run(quantize(x))), and the ONNX
    # model reloads to the same graph
    few = [a[:3] for a in xq]
    np.testing.assert_array_equal(q.graph.forward(few)[0], outs[0][:3])
    deq = q.dequantize_outputs(outs)
    assert deq[0].dtype == np.float32
    np.testing.assert_allclose(deq[0], outs[0].astype(np.float64) * q.output_scales[0],
                               rtol=1e-6, atol=0)
    np.testing.assert_array_equal(q(x[:3])[0], deq[0][:3])
    again = aidge_interop.load_onnx(q.onnx_model).forward(few)
    np.testing.assert_array_equal(again[0], outs[0][:3])


def test_quantize_perceptron_weight_and_bias_rounding():
    """Weights and biases of a model without BatchNorm, from its torch parameters."""
    model, x, _ = example("perceptron")
    for single_shift in (True, False):
        q = quantized("perceptron", single_shift, "max")
        gemms = [lay for lay in q.layers if lay.op == "Gemm"]
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert len(gemms) == len(linears) == 2
        assert gemms[0].lo == 0 and gemms[1].lo == -127  # ReLU fused into the first
        for lay, lin in zip(gemms, linears):
            w = lin.weight.detach().double().numpy()
            b = lin.bias.detach().double().numpy()
            s_w, s_in = lay.weight_scale, lay.in_scales[0]
            assert np.abs(w).max() / 127 <= s_w * (1 + 1e-12)
            if single_shift:
                assert s_w < 2 * np.abs(w).max() / 127
            np.testing.assert_array_equal(
                lay.weight, np.clip(np.floor(w / s_w + 0.5), -127, 127).astype(np.int8))
            np.testing.assert_array_equal(lay.bias, np.floor(b / (s_in * s_w) + 0.5))
    # the first input scale covers the calibration maximum
    q = quantized("perceptron", True, "max")
    amax = float(np.abs(x).max())
    s = q.input_scales[0]
    assert s * 127 >= amax and s * 127 / 2 < amax


@pytest.mark.parametrize("single_shift", [True, False])
def test_quantize_mse_clips_no_wider_than_max(single_shift):
    """"mse" picks each clip among candidates up to the calibrated maximum:
    no scale is coarser than the "max" one, and some are finer."""
    for name in ("lenet", "ds_cnn"):
        s_max = quantized(name, single_shift, "max").scales
        s_mse = quantized(name, single_shift, "mse").scales
        assert sorted(s_max) == sorted(s_mse)
        coarser = {k: (s_mse[k], s_max[k]) for k in s_max if s_mse[k] > s_max[k] * (1 + 1e-9)}
        assert not coarser, coarser
        assert any(s_mse[k] < s_max[k] * (1 - 1e-9) for k in s_max), name


def test_quantize_inputs_rounding_and_saturation():
    q = quantized("perceptron", True, "max")
    s = q.input_scales[0]
    assert is_pow2(s)
    ticks = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.49, 0.49, 1e6, -1e6, 126.5, -127.5])
    x = np.tile((ticks * s).astype(np.float32), (1, 2))[:, :16]
    got = q.quantize_inputs(x)[0]
    want = [-2, -1, 0, 1, 2, 3, 0, 0, 127, -127, 127, -127]  # half up; +-qmax saturation
    np.testing.assert_array_equal(got[0, :12], want)
    assert got.dtype == np.int8


def test_quantize_4_bits():
    model, x, ref = example("lenet")
    q = quantized("lenet", True, "max", nb_bits=4)
    assert q.qmax == 7
    for lay in q.layers:
        if lay.weight is not None:
            assert np.abs(lay.weight.astype(int)).max() <= 7, lay.name
        if lay.op in ("Conv", "Gemm", "Add", "Clip"):
            assert -7 <= lay.lo <= lay.hi <= 7, lay.name
    xq = q.quantize_inputs(x)
    assert np.abs(xq[0].astype(int)).max() <= 7
    ref_vals = ref_run_layers(q, xq)
    out = q.run(*xq)[0]
    np.testing.assert_array_equal(out, ref_vals[q.output_names[0]])
    assert np.abs(out.astype(int)).max() <= 7
    # coarse, but still the float model
    y = q(x)[0]
    err = float(np.abs(y - ref).max()) / float(ref.max() - ref.min())
    assert err < 0.5, err


# -- quantize() errors --------------------------------------------------------------------

def _float_model(op_node, name="g"):
    """x (N, 4) -> Gemm -> op_node: an ONNX float model."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(3, np.float32), "b")
    gemm = helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="the_gemm", transB=1)
    g = helper.make_graph([gemm, op_node], name,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op,attrs", [("Softmax", {"axis": 0}), ("Exp", {})])
def test_quantize_unsupported_op(op, attrs):
    node = helper.make_node(op, ["h"], ["y"], name=f"my_{op.lower()}_node", **attrs)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    with pytest.raises(NotImplementedError) as info:
        quantize(_float_model(node), x)
    assert f"my_{op.lower()}_node" in str(info.value)
    assert op in str(info.value)


def test_quantize_unsupported_torch_softmax():  # over the batch axis, not the last one
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(dim=0))
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    with pytest.raises(NotImplementedError, match="Softmax"):
        quantize(model, x)


def test_quantize_bad_arguments():
    model, x, _ = example("perceptron")
    with pytest.raises(ValueError, match="nb_bits"):
        quantize(model, x, nb_bits=9)
    with pytest.raises(ValueError, match="nb_bits"):
        quantize(model, x, nb_bits=1)
    with pytest.raises(ValueError, match="clipping"):
        quantize(model, x, clipping="foo")
    graph = quantized("perceptron", True, "max").graph  # an engine Graph (int8, one input)
    with pytest.raises(ValueError, match="2 arrays"):
        quantize(graph, [x, x])
    with pytest.raises(ValueError, match="2 arrays"):
        quantize(_float_model(helper.make_node("Relu", ["h"], ["y"], name="r")),
                 [x[:, :4], x[:, :4]])
    with pytest.raises(TypeError, match="int"):
        quantize(model, (x * 10).astype(np.int32))
    with pytest.raises(TypeError, match="int8"):
        quantize(model, np.zeros_like(x, dtype=np.int8))


def test_calibration_set_as_a_list_of_samples():
    """A list of per-sample arrays or tensors (batch axis of 1 or none)
    calibrates like the stacked array: the same scales, weights and outputs."""
    model, x, _ = example("lenet")
    wrapped = aidge_interop.wrap(model, [(1, *x.shape[1:])]).eval()
    stacked = quantize(wrapped, x, batch_size=5)
    for samples in ([x[i:i + 1] for i in range(len(x))], [torch.from_numpy(s) for s in x],
                    [aidge_interop.Tensor(np.ascontiguousarray(s)) for s in x]):
        q = quantize(wrapped, samples, batch_size=5)
        assert q.scales == stacked.scales
        for a, b in zip(q.layers, stacked.layers):
            assert (a.weight is None and b.weight is None) or np.array_equal(a.weight, b.weight)
        xq = stacked.quantize_inputs(x)[0]
        np.testing.assert_array_equal(q.run(xq)[0], stacked.run(xq)[0])
    with pytest.raises(ValueError, match="forward takes 1 inputs, got 3 arrays.*wrap"):
        quantize(model, [x[:1], x[1:2], x[2:3]])  # a torch module: its input rank is unknown


# -- accuracy() ------------------------------------------------------------------------------

def test_accuracy_known_answer():
    """Identity 2 -> 2 Linear: the prediction is the larger coordinate; the
    labels agree with it on 3 samples of 4, so the accuracy is exactly 0.75."""
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
        lin.bias.zero_()
    rng = np.random.default_rng(7)
    n = 200
    x = rng.uniform(-1, 1, size=(n, 2)).astype(np.float32)
    gap = np.where(x[:, 0] >= x[:, 1], 1.0, -1.0).astype(np.float32) * 0.25
    x[:, 0] += gap  # the coordinates differ by more than 0.25: no quantization tie
    x = x / np.abs(x).max()
    pred = x.argmax(axis=1)
    labels = pred.copy()
    labels[3::4] = 1 - labels[3::4]
    assert accuracy(lin, x, labels) == 0.75
    q = quantize(lin, x)
    assert q.accuracy(x, labels) == 0.75
    assert accuracy(q, x, labels) == 0.75
    assert accuracy(q, x, pred, batch_size=7) == 1.0  # batches that split the set
    assert accuracy(lin, x, 1 - pred) == 0.0
    with pytest.raises(ValueError, match="labels"):
        accuracy(q, x, labels[:-1])


def test_quantize_wrong_number_of_arrays_torch_module():
    model, x, _ = example("perceptron")
    with pytest.raises(ValueError, match="2 arrays"):
        quantize(model, [x, x])


def _clamped_linear(fn):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return fn(self.lin(x))
    return M().eval()


def test_quantize_torch_clamp():
    model = _clamped_linear(lambda y: torch.clamp(y, -1.0, 0.75))
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    q = quantize(model, x)
    assert [lay.op for lay in q.layers] == ["Gemm"]
    s = q.output_scales[0]
    assert (q.layers[0].lo, q.layers[0].hi) == (max(-127, round(-1.0 / s)),
                                                min(127, math.floor(0.75 / s + 0.5)))


def test_quantize_default_initialised_batchnorm():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1),
                                    torch.nn.BatchNorm2d(4)).eval()
    x = np.random.default_rng(0).standard_normal((8, 2, 6, 6)).astype(np.float32)
    q = quantize(model, x)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    assert np.abs(q(x)[0] - ref).max() < 0.06 * (ref.max() - ref.min())


def test_pool_window_over_padding_only_is_refused():
    # W=1, kernel 2 with dilation 3 and pads (2, 1): the first window sees only padding
    x = np.zeros((1, 1, 1), np.int8)
    for op in ("QMaxPool", "QAveragePool"):
        model = one_node(op, [x], name="bad_node", kernel_shape=[2], dilations=[3],
                         pads=[2, 1])
        _expect_error(ValueError, model, [x], "padding")
