"""The integer operators of quantized transformers (csrc/ops/quant_nonlinear.c,
portable kernels in csrc/portable/aidge_kernels.c): each against an
independent NumPy / Python-int implementation of the same integer algorithm
(bit for bit) and against the float function (within the bound derived in
docs/quantization.md); small torch models with each operator and the model
suite's ViT quantize, export to C and run there bit for bit as in the engine."""
from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from aidge_interop.onnx import load_onnx
from aidge_interop.quant import compile_and_run, export_c, quantize
from aidge_interop.quant.quantization import (
    QUANT_DOMAIN,
    _fixed_point,
    layernorm_constants,
    lookup_function,
    lookup_table,
    softmax_exp_table,
)

sys.path.insert(0, str(Path(__file__).parent))

STRICT = "-std=c99 -O1 -Wall -Wextra -Werror -pedantic"
needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no C compiler")


def op_graph(op, inputs, consts=(), **attrs):
    """One aidge_interop.quant node on int8 `inputs` (graph inputs) and
    `consts` (initializers), loaded by the engine."""
    names = [f"x{i}" for i in range(len(inputs))]
    inits = [numpy_helper.from_array(np.asarray(c), f"c{i}") for i, c in enumerate(consts)]
    node = helper.make_node(op, names + [t.name for t in inits], ["y"], domain=QUANT_DOMAIN,
                            **attrs)
    g = helper.make_graph(
        [node], "t", [helper.make_tensor_value_info(n, TensorProto.INT8, list(x.shape))
                      for n, x in zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20),
                                                helper.make_opsetid(QUANT_DOMAIN, 1)])
    return load_onnx(model)


def run_op(op, inputs, consts=(), **attrs):
    """op_graph's output on `inputs`."""
    return op_graph(op, inputs, consts, **attrs).forward(list(inputs))[0]


def round_shift(v, s):
    """floor(v / 2^s + 1/2) on Python ints (object arrays)."""
    return (v + (1 << (s - 1))) >> s if s else v


def int8(rng, shape, lo=-127):
    return rng.integers(lo, 128, shape).astype(np.int8)


# -- NumPy / Python-int references of the integer algorithms --------------------------

def softmax_ref(x, table, q, hi):
    x = x.astype(np.int64)
    e = table.astype(np.int64)[x.max(-1, keepdims=True) - x]
    s = e.sum(-1, keepdims=True)
    return np.minimum((2 * e * q + s) // (2 * s), hi)


def layernorm_ref(x, gamma, beta, eps, pre, lo, hi):
    d = x.shape[-1]
    out = []
    for row in x.reshape(-1, d).tolist():
        s = sum(row)
        c = [d * v - s for v in row]
        s2 = sum(v * v for v in c)
        z = [0] * d
        if s2:
            t = (s2 << 2 * pre) + eps
            k = (62 - t.bit_length()) // 2
            m = (1 << 61) // math.isqrt(t << 2 * k)
            z = [round_shift(v * m, 37 - pre - k) for v in c]
        out.append([min(max(round_shift(zi * int(g) + int(b), 40), lo), hi)
                    for zi, g, b in zip(z, gamma, beta)])
    return np.array(out).reshape(x.shape)


def matmul_ref(a, b, mult, shift, lo, hi):
    acc = np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(object)
    return np.clip(round_shift(acc * mult, shift), lo, hi).astype(np.int64), acc


# -- operators --------------------------------------------------------------------------

F = torch.nn.functional
TORCH_FN = {"Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf,
            "Gelu": lambda v: F.gelu(v), "GeluTanh": lambda v: F.gelu(v, approximate="tanh"),
            "Softplus": F.softplus, "HardSwish": F.hardswish,
            "HardSigmoid": lambda v: torch.clamp(0.3 * v + 0.4, 0, 1),
            "LeakyRelu": lambda v: F.leaky_relu(v, 0.2), "Elu": lambda v: F.elu(v, 0.7)}
PARAMS = {"HardSigmoid": (0.3, 0.4), "LeakyRelu": (0.2, None), "Elu": (0.7, None)}


@pytest.mark.parametrize("fn", sorted(TORCH_FN))
@pytest.mark.parametrize("s_in", [0.004, 0.03, 0.11])
def test_lookup_is_the_rounded_function(fn, s_in):
    rng = np.random.default_rng(1)
    v = torch.arange(-128, 128, dtype=torch.float64) * s_in
    f = TORCH_FN[fn](v).numpy()
    s_out = 1 / 127 if fn in ("Sigmoid", "Tanh", "Erf") else np.abs(f[1:]).max() / 127
    table = lookup_table(lookup_function(fn, *PARAMS.get(fn, ())), s_in, s_out, 127)
    # every int8 input: |y s_out - f(x s_in)| <= s_out / 2 where f is in range
    inside = np.abs(f) <= 127 * s_out
    assert np.all(np.abs(table[inside] * s_out - f[inside]) <= s_out / 2 * (1 + 1e-9))
    assert np.all(np.abs(table[~inside]) == 127)
    x = int8(rng, (3, 5, 7), lo=-128)
    np.testing.assert_array_equal(run_op("QLookup", [x], [table]), table[x.astype(int) + 128])


@pytest.mark.parametrize("d", [1, 17, 300])
@pytest.mark.parametrize("q", [127, 128])
def test_softmax_bit_exact_and_within_the_bound(d, q):
    rng = np.random.default_rng(d + q)
    for s_in in (0.002, 0.04, 0.3):
        x = int8(rng, (4, 3, d), lo=-128)
        x[0, 0] = 5  # a constant row: the uniform distribution
        table = softmax_exp_table(s_in)
        y = run_op("QSoftmax", [x], [table], q=q, out_max=127)
        ref = softmax_ref(x, table, q, 127)
        np.testing.assert_array_equal(y, ref)
        p = torch.softmax(torch.tensor(x, dtype=torch.float64) * s_in, -1).numpy()
        bound = 1 / (2 * q) + (d + 1) / 2 ** 31
        bound = np.where(y == 127, max(bound, 1 / q + (d + 1) / 2 ** 31), bound)  # 1.0 clamps
        assert np.all(np.abs(y / q - p) <= bound)


@pytest.mark.parametrize("d", [2, 7, 32, 768])
@pytest.mark.parametrize("eps", [1e-5, 1e-12, 0.5])
def test_layernorm_bit_exact_and_within_the_bound(d, eps):
    rng = np.random.default_rng(d)
    x = int8(rng, (5, 3, d), lo=-128)
    x[0, 0] = -7       # constant row: beta
    x[0, 1, :] = 0
    x[0, 1, 0] = 1     # one outlier: the largest |normalized| value
    s_in = 0.02
    gamma = rng.normal(1.0, 0.4, d)
    beta = rng.normal(0.0, 0.4, d)
    xf = torch.tensor(x, dtype=torch.float64) * s_in
    f = torch.nn.functional.layer_norm(xf, (d,), torch.tensor(gamma), torch.tensor(beta),
                                       eps).numpy()
    s_out = np.abs(f).max() / 127
    g, b, e, pre = layernorm_constants(gamma, beta, eps, s_in, s_out)
    y = run_op("QLayerNorm", [x], [g, b], eps=e, pre_shift=pre, out_min=-127, out_max=127)
    np.testing.assert_array_equal(y, layernorm_ref(x, g, b, e, pre, -127, 127))
    # |y s_out - LN(x s_in)| <= s_out (1/2 + 2^-8) when |gamma| sqrt(d) / s_out <= 2^15
    assert np.abs(gamma).max() * math.sqrt(d) / s_out <= 2 ** 15
    assert np.all(np.abs(y * s_out - f) <= s_out * (0.5 + 2 ** -8))


@pytest.mark.parametrize("ratio", [2.0 ** -9, 0.00123, 0.37])
def test_matmul_bit_exact_and_within_the_bound(ratio):
    rng = np.random.default_rng(3)
    a, b = int8(rng, (2, 3, 5, 40), lo=-128), int8(rng, (2, 3, 40, 4), lo=-128)
    for single in (True, False):
        if single and not math.log2(ratio).is_integer():
            continue
        mult, shift = _fixed_point(ratio, "test", single)
        y = run_op("QMatMul", [a, b], multiplier=mult, shift=shift, out_min=-127, out_max=127)
        ref, acc = matmul_ref(a, b, mult, shift, -127, 127)
        np.testing.assert_array_equal(y, ref)
        exact = acc.astype(np.float64) * ratio
        err = np.abs(acc.astype(np.float64)) * abs(mult * 2.0 ** -shift - ratio)
        inside = np.abs(exact) <= 127
        assert np.all(np.abs(y - exact)[inside] <= 0.5 + err[inside] + 1e-9)


def test_operators_refuse_bad_constants():
    x = np.zeros((2, 4), np.int8)
    with pytest.raises(ValueError, match="exp_table"):
        run_op("QSoftmax", [x], [np.ones(256, np.int32)])
    with pytest.raises(ValueError, match="table"):
        run_op("QLookup", [x], [np.zeros(10, np.int8)])
    with pytest.raises(ValueError, match="gamma"):
        run_op("QLayerNorm", [x], [np.zeros(3, np.int32), np.zeros(4, np.int64)])
    d = 16385  # sum c^2 could overflow int64
    with pytest.raises(ValueError, match="longer than 16384"):
        run_op("QLayerNorm", [np.zeros((1, d), np.int8)], [np.zeros(d, np.int32),
                                                            np.zeros(d, np.int64)])
    with pytest.raises(ValueError, match="same leading dims"):
        run_op("QMatMul", [np.zeros((2, 3, 4), np.int8), np.zeros((3, 4, 2), np.int8)])


# -- quantize + export --------------------------------------------------------------------

class Elementwise(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc, self.act = nn.Linear(12, 16), act

    def forward(self, x):
        return self.act(self.fc(x))


class Attention(nn.Module):
    """Scaled dot product attention with a class token, a LayerNorm and the
    class token's row out: every operator of a ViT block."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.norm, self.qkv, self.out = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, 3)
        self.heads = heads

    def forward(self, x):  # (N, T, d)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), -1)
        y = (a @ v).transpose(1, 2).reshape(n, t, d)
        return self.out(torch.sigmoid(y[:, 0]) + torch.tanh(y[:, 1]))


MODELS = {
    "sigmoid": (lambda: Elementwise(nn.Sigmoid()), (12,)),
    "tanh": (lambda: Elementwise(nn.Tanh()), (12,)),
    "gelu": (lambda: Elementwise(nn.GELU()), (12,)),
    "gelu_tanh": (lambda: Elementwise(nn.GELU(approximate="tanh")), (12,)),
    "hardswish": (lambda: Elementwise(nn.Hardswish()), (12,)),
    "elu": (lambda: Elementwise(nn.ELU(0.5)), (12,)),
    "softmax": (lambda: Elementwise(nn.Softmax(-1)), (12,)),
    "layernorm": (lambda: Elementwise(nn.LayerNorm(16)), (12,)),
    "attention": (Attention, (5, 16)),
    "tiny_vit": (lambda: __import__("test_architectures").TinyViT(), (3, 8, 8)),  # (seq, batch, d)
}


@needs_cc
@pytest.mark.parametrize("single_shift", [True, False], ids=["single_shift", "fixed_point"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_small_models_export_bit_exact(name, single_shift, tmp_path):
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    model = factory().eval()
    x = np.random.default_rng(0).standard_normal((32, *shape)).astype(np.float32)
    q = quantize(model, x, single_shift=single_shift)
    export_c(q, tmp_path / "out", inputs=[x[:1]], verbose=False)
    compile_and_run(tmp_path / "out", cflags=STRICT)  # every layer checked against the engine
    xq = q.quantize_inputs(x[:6])[0]
    np.testing.assert_array_equal(compile_and_run(tmp_path / "out", [xq])[0], q.run(xq)[0])
    # the int8 model follows the float one
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    rel = np.linalg.norm(q(x)[0] - ref) / np.linalg.norm(ref)
    assert rel < 0.1, rel


class _Logits(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(pixel_values=x).logits


@needs_cc
@pytest.mark.parametrize("single_shift", [True, False], ids=["single_shift", "fixed_point"])
def test_vit_exports_bit_exact(single_shift, tmp_path):
    from models.zoo import vit_cls

    model, _ = vit_cls(no_dropout=True)
    model = _Logits(model).eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 3, 32, 32)).astype(np.float32)
    q = quantize(model, x[:32], single_shift=single_shift)
    ops = {lay.op for lay in q.layers}
    assert {"LayerNorm", "Softmax", "MatMul", "Lookup", "Transpose", "Gather"} <= ops
    export_c(q, tmp_path / "vit", verbose=False)
    compile_and_run(tmp_path / "vit", cflags=STRICT)  # every layer checked against the engine
    xq = q.quantize_inputs(x[32:])[0]
    np.testing.assert_array_equal(compile_and_run(tmp_path / "vit", [xq])[0], q.run(xq)[0])


def test_float_export_refuses_the_int8_only_layers(tmp_path):
    from aidge_interop.quant import ExportError

    torch.manual_seed(0)
    x = np.zeros((1, 5, 16), np.float32)
    with pytest.raises(ExportError, match="int8 only"):
        export_c(Attention().eval(), tmp_path / "f32", inputs=[x], verbose=False)
    assert not (tmp_path / "f32").exists()
