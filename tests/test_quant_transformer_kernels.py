"""The fast kernels of the quantized transformer operators (csrc/kernels/qrows.c:
QLookup, QSoftmax, QLayerNorm, QMatMul) against their portable reference
twins (path 0, what C exports run) bit for bit, on every path the CPU has
(1 plain C, 2 AVX2, 3 AVX-512 VNNI), at 1 and 2 engine threads; the
reference against the NumPy / Python-int algorithms of
test_quant_nonlinear.py; and the model suite's ViT quantized, fast kernels
on and off."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import aidge_interop
from aidge_interop import _C
from aidge_interop.onnx import load_onnx
from aidge_interop.quant import quantize
from aidge_interop.quant.quantization import (QUANT_DOMAIN, _fixed_point, layernorm_constants,
                                              softmax_exp_table)
from test_quant_kernels import PATHS, _restore_path  # noqa: F401 (an autouse fixture)
from test_quant_nonlinear import _Logits, layernorm_ref, matmul_ref, op_graph, softmax_ref



def fast_and_reference(path, threads, op, inputs, consts=(), **attrs):
    """The node's output on `path` at `threads` threads and on the reference
    kernels (one thread), the same graph."""
    g = op_graph(op, inputs, consts, **attrs)
    aidge_interop.set_num_threads(threads)
    assert _C._set_quant_path(path) == path
    got = g.forward(list(inputs))[0]
    aidge_interop.set_num_threads(1)
    assert _C._set_quant_path(0) == 0
    ref = g.forward(list(inputs))[0]
    return got, ref


def int8(rng, shape, lo=-128):
    return rng.integers(lo, 128, shape).astype(np.int8)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("path", PATHS)
def test_lookup(path, threads):
    rng = np.random.default_rng(path)
    table = int8(rng, 256)
    for shape in [(1,), (63,), (3, 5, 67), (4, 300000)]:  # the last one split over threads
        x = int8(rng, shape)
        got, ref = fast_and_reference(path, threads, "QLookup", [x], [table])
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(ref, table[x.astype(int) + 128])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("d", [1, 5, 16, 17, 33, 197, 1000, 2000])
def test_softmax(path, threads, d):
    rng = np.random.default_rng(d)
    rows = max(8, 70000 // d)  # > 2 grains: split over threads
    for s_in, q, hi in [(0.002, 127, 127), (0.04, 128, 127), (0.3, 127, 100), (1.5, 128, 127)]:
        x = int8(rng, (rows, d))
        x[0] = 5          # a constant row
        x[1] = -128
        x[2, ::2] = 127   # ties of the maximum
        table = softmax_exp_table(s_in)
        got, ref = fast_and_reference(path, threads, "QSoftmax", [x], [table], q=q,
                                      out_max=hi)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(ref[:50], softmax_ref(x[:50], table, q, hi))


@pytest.mark.parametrize("path", PATHS)
def test_softmax_long_rows(path):
    """Rows whose exp sums pass 2^44 (d > 2^14): the fast kernels hand them
    to the reference."""
    rng = np.random.default_rng(0)
    x = int8(rng, (3, 20000), lo=120)
    x[0] = 3
    table = softmax_exp_table(0.001)
    got, ref = fast_and_reference(path, 1, "QSoftmax", [x], [table], q=128, out_max=127)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(ref, softmax_ref(x, table, 128, 127))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("d", [1, 2, 7, 32, 33, 768])
def test_layernorm(path, threads, d):
    rng = np.random.default_rng(d)
    rows = max(6, 70000 // d)
    x = int8(rng, (rows, d))
    x[0] = -7        # constant row: beta
    x[1] = 0
    x[1, 0] = 1      # one outlier
    x[2] = 127
    x[3, ::2] = -128
    for s_in, eps in [(0.02, 1e-5), (0.3, 1e-12), (0.001, 0.5)]:
        gamma = rng.normal(1.0, 0.4, d)
        beta = rng.normal(0.0, 0.4, d)
        xf = torch.tensor(x[:64], dtype=torch.float64) * s_in
        f = torch.nn.functional.layer_norm(xf, (d,), torch.tensor(gamma), torch.tensor(beta),
                                           eps).numpy()
        s_out = max(np.abs(f).max(), 1e-3) / 127
        g, b, e, pre = layernorm_constants(gamma, beta, eps, s_in, s_out)
        got, ref = fast_and_reference(path, threads, "QLayerNorm", [x], [g, b], eps=e,
                                      pre_shift=pre, out_min=-127, out_max=120)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(ref[:40], layernorm_ref(x[:40], g, b, e, pre, -127, 120))


MATMUL_SHAPES = [((1, 1, 1), (1, 1)), ((1, 17, 8), (8, 17)), ((2, 3, 17, 17), (17, 8)),
                 ((5, 7, 13), (13, 70)), ((2, 65, 64), (64, 33)), ((64, 4, 3), (3, 5)),
                 ((1, 1, 300), (300, 2))]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=str)
def test_matmul(path, threads, shape):
    (*lead, m, k), (_, n) = shape
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = int8(rng, (*lead, m, k)), int8(rng, (*lead, k, n))
    for ratio, single, even, lo in [(2.0 ** -9, True, 0, -127), (0.00123, False, 0, -128),
                                    (0.37, False, 1, -128), (1.0, True, 1, 0),
                                    (2.0 ** -14, True, 1, -127)]:
        mult, shift = _fixed_point(ratio, "test", single)
        got, ref = fast_and_reference(path, threads, "QMatMul", [a, b], multiplier=mult,
                                      shift=shift, out_min=lo, out_max=127, half_even=even)
        np.testing.assert_array_equal(got, ref)
        if not even:
            np.testing.assert_array_equal(ref, matmul_ref(a, b, mult, shift, lo, 127)[0])


@pytest.fixture(scope="module")
def quantized_vit():
    from models.zoo import vit_cls

    model, _ = vit_cls(no_dropout=True)
    model = _Logits(model).eval()
    x = np.random.default_rng(0).standard_normal((48, 3, 32, 32)).astype(np.float32)
    return quantize(model, x[:32]), x[32:]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("path", PATHS)
def test_vit_fast_equals_reference(quantized_vit, path, threads):
    q, x = quantized_vit
    assert {"LayerNorm", "Softmax", "MatMul", "Lookup"} <= {lay.op for lay in q.layers}
    xq = q.quantize_inputs(x)
    assert _C._set_quant_path(0) == 0
    ref = q.run(*xq)[0]
    aidge_interop.set_num_threads(threads)
    assert _C._set_quant_path(path) == path
    np.testing.assert_array_equal(q.run(*xq)[0], ref)


def test_softmax_checks_a_table_that_is_an_input():
    """An exp_table computed at run time is checked at each forward (a
    negative entry could make a row's sum zero: a division by zero)."""
    x = np.zeros((2, 4), np.int8)
    node = helper.make_node("QSoftmax", ["x", "e"], ["y"], domain=QUANT_DOMAIN)
    g = helper.make_graph([node], "t", [
        helper.make_tensor_value_info("x", TensorProto.INT8, [2, 4]),
        helper.make_tensor_value_info("e", TensorProto.INT32, [256])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)])
    model = load_onnx(helper.make_model(g, opset_imports=[
        helper.make_opsetid("", 20), helper.make_opsetid(QUANT_DOMAIN, 1)]))
    table = softmax_exp_table(0.05)
    np.testing.assert_array_equal(model.forward([x, table])[0], softmax_ref(x, table, 127, 127))
    bad = table.copy()
    bad[1:] = -(1 << 28)
    with pytest.raises(ValueError, match="exp_table"):
        model.forward([x, bad])
