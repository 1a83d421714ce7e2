"""The engine's fast int8 kernels (csrc/kernels/qgemm.c, qconv.c, qpool.c)
against the portable reference kernels (path 0, what C exports run) and the
independent NumPy int64 reference of test_quantize.py, on every path the CPU
has (1 plain C, 2 AVX2, 3 AVX-512 VNNI): random shapes, strides, pads,
dilations, groups (depthwise, pointwise, 1-D), random int8 data and
requantization, and extreme data (-128 and 127); and whole quantized models,
fast kernels on and off.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import aidge_interop
from aidge_interop import _C
from test_quantize import (one_node, quantized, example, rand_i8, ref_add, ref_conv_acc,
                           ref_gemm_acc, ref_pool, ref_requant)

BEST = _C._set_quant_path(3)
PATHS = [pytest.param(p, marks=pytest.mark.skipif(p > BEST, reason="the CPU lacks this path"))
         for p in (1, 2, 3)]


@pytest.fixture(autouse=True)
def _restore_path():
    yield
    _C._set_quant_path(3)
    aidge_interop.set_num_threads(1)


def run_paths(model, inputs, path):
    """The output with `path` and with the reference kernels (same graph)."""
    g = aidge_interop.load_onnx(model)
    assert _C._set_quant_path(path) == path
    got = g.forward(list(inputs))[0]
    again = g.forward(list(inputs))[0]  # the weight pack kept from the first forward
    assert _C._set_quant_path(0) == 0
    ref = g.forward(list(inputs))[0]
    np.testing.assert_array_equal(got, again)
    return got, ref


def rq_attrs(rng, acc, relu=False):
    """A requantization that keeps most outputs inside the clamp."""
    mult = int(rng.choice([1, int(rng.integers(1, 1 << 20)), (1 << 31) - 1]))
    big = float(np.percentile(np.abs(acc.astype(np.float64) * mult), 90)) or 1.0
    shift = min(62, max(0, int(np.ceil(np.log2(big / 100)))))
    lo, hi = (0, 127) if relu else (-128, 127)
    return dict(multiplier=mult, shift=shift, out_min=lo, out_max=hi)


def conv_case(rng, nsp, group, cg, mg, k, s, d, pads, n=2, size=None):
    c, m = group * cg, group * mg
    size = size or [int(rng.integers(max(1, d[i] * (k[i] - 1) + 1 - pads[i] - pads[nsp + i]),
                                     14)) for i in range(nsp)]
    x = rand_i8(rng, (n, c, *size))
    w = rand_i8(rng, (m, cg, *k))
    b = rng.integers(-(1 << 16), 1 << 16, size=m).astype(np.int32)
    return x, w, b, dict(strides=list(s), dilations=list(d), pads=list(pads), group=group)


def random_conv(rng):
    nsp = int(rng.integers(1, 3))
    kind = rng.choice(["dense", "depthwise", "pointwise", "grouped"])
    k = [int(rng.integers(1, 6)) for _ in range(nsp)]
    s = [int(rng.integers(1, 4)) for _ in range(nsp)]
    d = [int(rng.integers(1, 3)) for _ in range(nsp)]
    group, cg, mg = 1, int(rng.integers(1, 20)), int(rng.integers(1, 40))
    if kind == "depthwise":
        group, cg, mg = int(rng.integers(1, 20)), 1, 1
        s = [1] * nsp if rng.random() < 0.7 else s
    elif kind == "pointwise":
        k, s, d = [1] * nsp, [1] * nsp, [1] * nsp
    elif kind == "grouped":
        group, cg, mg = int(rng.integers(2, 5)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
    pads = [int(rng.integers(0, d[i % nsp] * (k[i % nsp] - 1) + 1)) for i in range(2 * nsp)]
    if kind == "pointwise":
        pads = [0] * (2 * nsp)
    return conv_case(rng, nsp, group, cg, mg, k, s, d, pads)


def check_conv(rng, path, x, w, b, attrs, relu=False):
    acc = ref_conv_acc(x, w, b, attrs["strides"], attrs["dilations"], attrs["pads"],
                       attrs["group"])
    rq = rq_attrs(rng, acc, relu)
    model = one_node("QConv", [x], [("w", w), ("b", b)], **attrs, **rq)
    got, ref = run_paths(model, [x], path)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(
        got, ref_requant(acc, rq["multiplier"], rq["shift"], rq["out_min"], rq["out_max"]))


@pytest.mark.parametrize("path", PATHS)
def test_qconv_random(path):
    rng = np.random.default_rng(100 + path)
    for _ in range(40):
        check_conv(rng, path, *random_conv(rng), relu=bool(rng.random() < 0.3))


# named shapes (n, group, c / group, m / group, kernel, strides, dilations, pads,
# input size): the example models' layers and the kernels' edges
CONV_CASES = {
    "lenet_conv1": (2, 1, 1, 6, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0), (32, 32)),
    "lenet_conv2": (2, 1, 6, 16, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0), (14, 14)),
    "shifted_col_stride": (2, 1, 3, 5, (4, 3), (1, 3), (2, 2), (2, 1, 0, 3), (11, 23)),
    "shifted_tall": (1, 1, 4, 6, (5, 1), (1, 2), (1, 1), (2, 0, 2, 0), (9, 70)),
    "shifted_grouped": (2, 3, 5, 4, (3, 5), (1, 1), (1, 2), (1, 4, 1, 4), (6, 17)),
    "ds_cnn_conv1": (2, 1, 1, 64, (10, 4), (2, 2), (1, 1), (4, 1, 5, 1), (49, 10)),
    "depthwise_3x3": (2, 64, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (25, 5)),
    "depthwise_dilated": (1, 7, 1, 1, (3, 2), (1, 1), (2, 3), (2, 0, 1, 3), (9, 11)),
    "depthwise_wide": (2, 6, 1, 1, (5, 7), (1, 1), (2, 1), (3, 2, 1, 6), (11, 20)),
    "depthwise_small_edge": (2, 4, 1, 1, (3, 6), (1, 1), (1, 1), (1, 2, 1, 3), (8, 16)),
    "depthwise_strided": (1, 5, 1, 1, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (9, 8)),
    "pointwise_64": (2, 1, 64, 64, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), (25, 5)),
    "resnet_3x3_s2": (2, 1, 16, 32, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (32, 32)),
    "many_chunks": (1, 1, 64, 9, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (40, 37)),
    "channel_multiplier": (1, 4, 1, 3, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (7, 6)),
    "conv1d": (3, 1, 5, 7, (3,), (1,), (2,), (2, 2), (30,)),
    "wide_stride3": (2, 1, 3, 5, (2, 5), (3, 3), (2, 1), (1, 2, 0, 3), (9, 60)),
    "wide_stride4": (2, 2, 2, 3, (3, 6), (1, 4), (1, 1), (1, 0, 1, 5), (7, 90)),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CONV_CASES)
def test_qconv_shapes(path, case):
    n, group, cg, mg, k, s, d, pads, size = CONV_CASES[case]
    rng = np.random.default_rng(len(case))
    check_conv(rng, path, *conv_case(rng, len(k), group, cg, mg, k, s, d, pads, n=n,
                                     size=list(size)))


def rand_edge(rng, shape):
    """Mostly -128 and 127 (u = x + 128 of 0 and 255): the products and the
    sums of pairs of products at their extremes (vpmaddubsw's int16 pair sums
    would saturate)."""
    return rng.choice(np.array([-128, 127, -127, 0], np.int8), size=shape, p=[.4, .4, .1, .1])


def edge_operands(rng, x, w):
    """x and w of random extremes, then each of x and w all -128 or all 127."""
    yield rand_edge(rng, x.shape), rand_edge(rng, w.shape)
    for xv in (-128, 127):
        for wv in (-128, 127):
            yield np.full_like(x, xv), np.full_like(w, wv)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", ["lenet_conv1", "lenet_conv2", "shifted_col_stride",
                                  "shifted_grouped", "ds_cnn_conv1", "depthwise_3x3",
                                  "depthwise_dilated", "depthwise_wide", "pointwise_64",
                                  "resnet_3x3_s2", "many_chunks", "conv1d", "wide_stride4"])
def test_qconv_extreme_values(path, case):
    n, group, cg, mg, k, s, d, pads, size = CONV_CASES[case]
    rng = np.random.default_rng(11)
    x, w, b, attrs = conv_case(rng, len(k), group, cg, mg, k, s, d, pads, n=n, size=list(size))
    for xe, we in edge_operands(rng, x, w):
        check_conv(rng, path, xe, we, b, attrs, relu=bool(rng.random() < 0.3))


@pytest.mark.parametrize("path", PATHS)
def test_qgemm_and_qadd_extreme_values(path):
    rng = np.random.default_rng(12)
    for n, k, m in [(16, 400, 120), (33, 7, 5), (70, 256, 37)]:
        x, w = rand_i8(rng, (n, k)), rand_i8(rng, (m, k))
        b = rng.integers(-(1 << 16), 1 << 16, size=m).astype(np.int32)
        for xe, we in edge_operands(rng, x, w):
            acc = ref_gemm_acc(xe, we, b)
            rq = rq_attrs(rng, acc)
            got, ref = run_paths(one_node("QGemm", [xe], [("w", we), ("b", b)], **rq), [xe], path)
            np.testing.assert_array_equal(got, ref)
            np.testing.assert_array_equal(got, ref_requant(acc, rq["multiplier"], rq["shift"],
                                                           rq["out_min"], rq["out_max"]))
    a, c = rand_edge(rng, (1001,)), rand_edge(rng, (1001,))
    for ma, mb, shift in [((1 << 31) - 1, -(1 << 31) + 1, 38), (-(1 << 31) + 1, -(1 << 31) + 1, 39),
                          (1, 1, 0), ((1 << 31) - 1, (1 << 31) - 1, 62)]:
        got, ref = run_paths(one_node("QAdd", [a, c], multiplier_a=ma, multiplier_b=mb,
                                      shift=shift), [a, c], path)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_add(a, c, ma, mb, shift))


@pytest.mark.parametrize("path", PATHS)
def test_qconv_two_threads(path):
    rng = np.random.default_rng(7)
    aidge_interop.set_num_threads(2)
    for _ in range(6):
        check_conv(rng, path, *conv_case(rng, 2, 1, 8, 12, (3, 3), (1, 1), (1, 1),
                                         (1, 1, 1, 1), n=5, size=[20, 21]))
        check_conv(rng, path, *conv_case(rng, 2, 16, 1, 1, (3, 3), (1, 1), (1, 1),
                                         (1, 1, 1, 1), n=3, size=[20, 21]))


@pytest.mark.parametrize("path", PATHS)
def test_qconv_weights_computed_each_call(path):
    """A weight that is a graph input, not a constant: packed at every forward."""
    rng = np.random.default_rng(3)
    x, w, b, attrs = conv_case(rng, 2, 1, 5, 6, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1))
    ins = [helper.make_tensor_value_info("x", TensorProto.INT8, list(x.shape)),
           helper.make_tensor_value_info("w", TensorProto.INT8, list(w.shape))]
    node = helper.make_node("QConv", ["x", "w"], ["y"], domain="aidge_interop.quant",
                            shift=8, **attrs)
    model = helper.make_model(
        helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(
            "y", TensorProto.INT8, None)]),
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("aidge_interop.quant",
                                                                        1)])
    g = aidge_interop.load_onnx(model)
    _C._set_quant_path(path)
    for _ in range(2):
        w = rand_i8(rng, w.shape)
        acc = ref_conv_acc(x, w, None, attrs["strides"], attrs["dilations"], attrs["pads"])
        np.testing.assert_array_equal(g.forward([x, w])[0], ref_requant(acc, 1, 8))


@pytest.mark.parametrize("path", PATHS)
def test_qgemm_random(path):
    rng = np.random.default_rng(200 + path)
    for n, k, m in [(1, 1, 1), (16, 400, 120), (16, 84, 10), (70, 33, 37), (129, 7, 5),
                    *[tuple(int(v) for v in rng.integers(1, (90, 300, 50))) for _ in range(8)]]:
        x, w = rand_i8(rng, (n, k)), rand_i8(rng, (m, k))
        b = rng.integers(-(1 << 16), 1 << 16, size=m).astype(np.int32)
        acc = ref_gemm_acc(x, w, b)
        rq = rq_attrs(rng, acc, relu=bool(rng.random() < 0.3))
        got, ref = run_paths(one_node("QGemm", [x], [("w", w), ("b", b)], **rq), [x], path)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_requant(acc, rq["multiplier"], rq["shift"],
                                                       rq["out_min"], rq["out_max"]))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kernel,size", [((2, 2), (28, 28)), ((2, 2), (13, 11)),
                                         ((2, 2), (5, 131)), ((25, 5), (25, 5)),
                                         ((8, 8), (8, 8)), ((3, 3), (40, 41))])
def test_qpools_model_shapes(path, kernel, size):
    """LeNet's 2x2 max pools (and an odd input, and rows of more than 32
    outputs), DS-CNN's and ResNet-8's global average pools, a wide row."""
    x = rand_i8(np.random.default_rng(5), (3, 4, *size))
    s = list(kernel) if kernel != (3, 3) else [1, 2]
    for kind, op in (("max", "QMaxPool"), ("avg", "QAveragePool")):
        got, ref = run_paths(one_node(op, [x], kernel_shape=list(kernel), strides=s), [x], path)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_pool(x, kind, list(kernel), s))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("multiplier", [1, 3, (1 << 31) - 1])
def test_requantization_extremes(path, multiplier):
    """Every shift (0, around 32, 62) with large accumulators of both signs
    (the int32 epilogue of multiplier 1, the int64 one otherwise)."""
    rng = np.random.default_rng(multiplier)
    x, w = rand_i8(rng, (20, 300)), rand_i8(rng, (9, 300))
    b = np.array([0, 1 << 30, -(1 << 30), 2_000_000_000 - 300 * 128 * 128,
                  -2_000_000_000 + 300 * 128 * 128, 5, -5, 1 << 20, -(1 << 20)], np.int32)
    acc = ref_gemm_acc(x, w, b)
    for shift in (0, 1, 2, 15, 30, 31, 32, 33, 40, 61, 62):
        rq = dict(multiplier=multiplier, shift=shift, out_min=-128, out_max=127)
        got, ref = run_paths(one_node("QGemm", [x], [("w", w), ("b", b)], **rq), [x], path)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_requant(acc, multiplier, shift))


@pytest.mark.parametrize("path", PATHS)
def test_qpools_random(path):
    rng = np.random.default_rng(300 + path)
    for _ in range(30):
        nsp = int(rng.integers(1, 3))
        k = [int(rng.integers(1, 5)) for _ in range(nsp)]
        s = [int(rng.integers(1, 4)) for _ in range(nsp)]
        d = [int(rng.integers(1, 3)) for _ in range(nsp)]
        pads = [int(rng.integers(0, (k[i % nsp] - 1) * d[i % nsp] + 1)) for i in range(2 * nsp)]
        size = [int(rng.integers(d[i] * (k[i] - 1) + 1, 15)) for i in range(nsp)]
        x = rand_i8(rng, (2, 3, *size))
        for kind, op in (("max", "QMaxPool"), ("avg", "QAveragePool")):
            cip = int(rng.integers(0, 2))
            attrs = dict(kernel_shape=k, strides=s, dilations=d, pads=pads)
            if kind == "avg":
                attrs["count_include_pad"] = cip
            try:
                want = ref_pool(x, kind, k, s, d, pads, cip)
            except AssertionError:  # a window of padding only: the engine refuses it
                continue
            got, ref = run_paths(one_node(op, [x], **attrs), [x], path)
            np.testing.assert_array_equal(got, ref)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("path", PATHS)
def test_qadd_requantize_random(path):
    rng = np.random.default_rng(400 + path)
    for n in (1, 7, 8, 9, 100, 70001):
        a, b = rand_i8(rng, (n,)), rand_i8(rng, (n,))
        ma, mb = (int(v) for v in rng.integers(-(1 << 31) + 1, 1 << 31, size=2))
        shift = int(rng.integers(25, 40))
        got, ref = run_paths(one_node("QAdd", [a, b], multiplier_a=ma, multiplier_b=mb,
                                      shift=shift), [a, b], path)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_add(a, b, ma, mb, shift))
        mult, shift = int(rng.integers(1, 1 << 31)), int(rng.integers(20, 36))
        got, ref = run_paths(one_node("Requantize", [a], multiplier=mult, shift=shift,
                                      out_min=-100, out_max=90), [a], path)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_requant(a, mult, shift, -100, 90))


@pytest.mark.parametrize("name", ["lenet", "ds_cnn", "resnet8"])
def test_models_fast_kernels_on_and_off(name):
    q = quantized(name, True, "max")
    _, x, _ = example(name)
    xq = q.quantize_inputs(x[:16])
    _C._set_quant_path(0)
    ref = q.run(*xq)
    for path in range(1, BEST + 1):
        for threads in (1, 2):
            aidge_interop.set_num_threads(threads)
            _C._set_quant_path(path)
            got = q.run(*xq)
            for g, r in zip(got, ref):
                np.testing.assert_array_equal(g, r, err_msg=f"path {path}, {threads} threads")
