"""The training step of transformer models (issue 47): the backward kernels
and paths it runs, against torch.

- Pow by a constant (GPT-2's tanh GELU: x^3): the base's gradient, bit for
  bit with torch for exponents 2 and 3 (products, in torch's order), within
  torch's rounding for the others.
- Gemm's C gradient with beta 1 (a Linear's bias, read straight from dY) and
  other betas.
"""
import numpy as np
import pytest
import torch

import aidge_interop
from op_harness import check_op, make_model

DTYPES = [np.float32, np.float64]
DT_IDS = lambda d: np.dtype(d).name  # noqa: E731


def _x(shape, dtype, seed=0, lo=-3, hi=3):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def _engine_step(op_type, inputs, attrs=None, consts=None, seed=3):
    """Outputs and input gradients of a one-node graph for a random output
    gradient (returned too)."""
    consts = consts or {}
    g = aidge_interop.load_onnx(make_model(op_type, inputs, attrs, consts),
                                param_kinds={k: "const" for k in consts})
    outs = g.forward(list(inputs.values()), need_backward=True, input_grads=True)
    gos = [np.random.default_rng(seed).standard_normal(o.shape).astype(o.dtype) for o in outs]
    return [np.array(o) for o in outs], [np.array(d) for d in g.backward(gos)], gos


# ---------------------------------------------------------------- Pow

@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5, -1.0, 0.0])
@pytest.mark.parametrize("shape", [(33, 1000), (7,), (2, 1, 5)], ids=str)
def test_pow_by_a_constant_backward_as_torch(shape, exponent, dtype):
    x = _x(shape, dtype, lo=0.1, hi=4) * np.where(np.arange(shape[-1]) % 2, 1, -1).astype(dtype)
    if exponent == 2.5:
        x = np.abs(x)
    _, (dx,), (go,) = _engine_step("Pow", {"x": x}, consts={"e": np.array(exponent, dtype)})
    xt = torch.from_numpy(x).requires_grad_()
    xt.pow(exponent).backward(torch.from_numpy(go))
    if exponent in (2.0, 3.0, 0.0):
        np.testing.assert_array_equal(dx, xt.grad.numpy())
    else:
        torch.testing.assert_close(torch.from_numpy(dx), xt.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_pow_by_a_tensor_backward(dtype):
    """An exponent that varies along the row (and its own gradient) stays on
    the general path."""
    a = _x((4, 6), dtype, lo=0.5, hi=2)
    b = np.tile(np.array([2, 3, 2.5, 1, 0, -1], dtype), (4, 1))
    check_op("Pow", {"a": a, "b": b}, torch.pow)


# ---------------------------------------------------------------- Gemm's C

@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("beta", [1.0, 0.5])
@pytest.mark.parametrize("c_shape", [(5,), (1, 5), (3, 5)], ids=str)
def test_gemm_c_gradient(c_shape, beta, dtype):
    a, b, c = _x((3, 4), dtype), _x((5, 4), dtype, seed=1), _x(c_shape, dtype, seed=2)
    check_op("Gemm", {"a": a, "b": b, "c": c},
             lambda a, b, c: a @ b.T + beta * c, attrs={"transB": 1, "beta": beta})


# ---------------------------------------------------------------- Attention's input gradients

def _sdpa_step(q, k, v, causal, go):
    """torch's output and the gradients of q, k, v (tensors that may be the
    same one)."""
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    y.backward(go)
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tokens", [9, 300], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("wiring", ["qqq", "qqv", "qkk"])
def test_attention_gradient_of_shared_inputs(wiring, tokens, causal, dtype):
    """Q, K and V one value (self-attention on one tensor) or two: its gradient
    sums all three slots' (the first slot writes, the others add after it);
    300 tokens: several row blocks, under is_causal each seeing fewer keys."""
    from onnx import TensorProto, helper

    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    names = sorted(set(wiring))
    shape = (2, 3, tokens, 8)
    rng = np.random.default_rng(0)
    xs = {n: rng.standard_normal(shape).astype(dtype) for n in names}
    node = helper.make_node("Attention", list(wiring), ["y"], is_causal=int(causal))
    graph = helper.make_graph([node], "att", [helper.make_tensor_value_info(n, elem, shape)
                                              for n in names],
                              [helper.make_tensor_value_info("y", elem, None)])
    g = aidge_interop.load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 23)]))
    (y,) = g.forward([xs[n] for n in names], need_backward=True, input_grads=True)
    go = rng.standard_normal(y.shape).astype(dtype)
    grads = g.backward([go])
    ts = {n: torch.from_numpy(xs[n]).requires_grad_() for n in names}
    ref = _sdpa_step(*(ts[c] for c in wiring), causal, torch.from_numpy(go))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else {}
    torch.testing.assert_close(torch.from_numpy(np.array(y)), ref.detach(), **tol)
    for n, d in zip(names, grads):
        torch.testing.assert_close(torch.from_numpy(np.array(d)), ts[n].grad, **tol,
                                   msg=lambda m, n=n: f"gradient of {n}: {m}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_adds_to_a_gradient_already_written(causal):
    """Q also read by a node after the attention (y = Attention(q, k, v) + q):
    that node's backward writes q's gradient first, the attention's adds."""
    from onnx import TensorProto, helper

    shape = (2, 2, 40, 8)
    rng = np.random.default_rng(1)
    xs = {n: rng.standard_normal(shape) for n in "qkv"}
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["a"], is_causal=int(causal)),
             helper.make_node("Add", ["a", "q"], ["y"])]
    graph = helper.make_graph(nodes, "att", [helper.make_tensor_value_info(
        n, TensorProto.DOUBLE, shape) for n in "qkv"],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    g = aidge_interop.load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 23)]))
    (y,) = g.forward([xs[n] for n in "qkv"], need_backward=True, input_grads=True)
    go = rng.standard_normal(y.shape)
    grads = g.backward([go])
    ts = {n: torch.from_numpy(xs[n]).requires_grad_() for n in "qkv"}
    (torch.nn.functional.scaled_dot_product_attention(ts["q"], ts["k"], ts["v"],
                                                      is_causal=causal) + ts["q"]).backward(
        torch.from_numpy(go))
    for n, d in zip("qkv", grads):
        torch.testing.assert_close(torch.from_numpy(np.array(d)), ts[n].grad)


# ---------------------------------------------------------------- a bias's gradient

@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("x_shape,b_shape", [((520, 1024), (1024,)), ((8, 65, 256), (256,)),
                                             ((3, 300, 7), (1, 7)), ((4, 5, 33), (5, 1))],
                         ids=str)
def test_bias_gradient_at_every_thread_count(x_shape, b_shape, dtype):
    """dB of x + b summed over the broadcast rows (columns split between
    threads when b is x's last axis): torch's values, and bit for bit the
    same at 1, 2 and 3 threads."""
    x, b = _x(x_shape, dtype), _x(b_shape, dtype, seed=1)
    saved = aidge_interop.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            aidge_interop.set_num_threads(n)
            results.append(_engine_step("Add", {"x": x, "b": b})[1][1])
    finally:
        aidge_interop.set_num_threads(saved)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    go = torch.from_numpy(_engine_step("Add", {"x": x, "b": b})[2][0])
    bt = torch.from_numpy(b).requires_grad_()
    (torch.from_numpy(x) + bt).backward(go)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else {}
    torch.testing.assert_close(torch.from_numpy(results[0]), bt.grad, **tol)
