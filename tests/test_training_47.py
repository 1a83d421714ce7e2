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


# ---------------------------------------------------------------- whole models

def _unseen_transformers():
    """(name, model, args, kwargs): transformer configurations other than
    the benchmark's, random weights, dropout 0: DistilBERT with a padding
    mask, a Llama-style decoder (RMSNorm, rotary positions, SiLU gate,
    grouped-query attention: 4 query heads, 2 key/value heads; eager attention:
    torch's TorchScript exporter does not convert scaled_dot_product_attention
    with enable_gqa)."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = torch.randint(0, 200, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    yield "distilbert", tf.DistilBertModel(tf.DistilBertConfig(
        vocab_size=200, dim=48, n_layers=2, n_heads=4, hidden_dim=96, dropout=0.0,
        attention_dropout=0.0, max_position_embeddings=64)), (), \
        {"input_ids": ids, "attention_mask": mask}
    yield "llama", tf.LlamaModel(tf.LlamaConfig(
        vocab_size=200, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager")), (), {"input_ids": ids}


def _train_steps(model, optimizer, args, kwargs, target, steps):
    """The main output and every parameter's gradient at each of `steps` SGD
    steps on the MSE against `target`."""
    seen = []
    for _ in range(steps):
        optimizer.zero_grad()
        out = model(*args, **kwargs)
        out = out if isinstance(out, torch.Tensor) else out[0]
        torch.nn.functional.mse_loss(out, target).backward()
        seen.append((out.detach().clone(),
                     [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        optimizer.step()
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", list(_unseen_transformers()), ids=lambda c: c[0])
def test_unseen_transformers_train_like_torch(case, dtype):
    """Three SGD steps (forward, MSE loss, backward, aidge_interop.SGD) of the
    wrapped model against torch.optim.SGD on the torch model: outputs and
    every parameter's gradient at each step, float64 within assert_close's
    defaults (rtol 1e-7), float32 (and Llama's float32 softmax) within the
    wrapped-step tolerances (op_harness.check_wrapped_step)."""
    import copy

    name, model, args, kwargs = case
    model = model.to(dtype).train()
    wrapped = aidge_interop.wrap(copy.deepcopy(model), args, kwargs=kwargs)
    ops = [n["op_type"] for n in wrapped._graph.nodes()]
    # Llama's eager attention computes its softmax in float32 (between two
    # Casts in float64: no float64 attention block, and float32 roundings)
    softmax32 = name == "llama" and dtype == torch.float64
    assert "FusedMatMul" in ops and ("FusedAttention" in ops or softmax32), name
    with torch.no_grad():
        out = model(*args, **kwargs)
        target = torch.randn_like(out if isinstance(out, torch.Tensor) else out[0])
    ours = _train_steps(wrapped, aidge_interop.SGD(wrapped, lr=0.05), args, kwargs, target, 3)
    ref = _train_steps(model, torch.optim.SGD(model.parameters(), lr=0.05), args, kwargs,
                       target, 3)
    exact = dtype == torch.float64 and not softmax32
    tol = {} if exact else {"rtol": 1e-5, "atol": 1e-5}
    gtol = {} if exact else {"rtol": 1e-4, "atol": 1e-5}
    names = [n for n, p in model.named_parameters()]
    for step, ((y_a, g_a), (y_t, g_t)) in enumerate(zip(ours, ref)):
        torch.testing.assert_close(y_a, y_t, **tol, msg=lambda m: f"step {step} output: {m}")
        assert len(g_a) == len(g_t) == len(names)
        for n, a, t in zip(names, g_a, g_t):
            torch.testing.assert_close(a, t, **gtol, msg=lambda m, n=n: f"step {step} {n}: {m}")


def test_pow_base_gradient_written_first_or_added():
    """Pow assigns its base's gradient on the first write (AI_OP_GRAD_ASSIGN(1)):
    an activation that is Pow's base and another node's input (both orders),
    Pow(h, h) (the exponent's gradient adds onto the base's), a broadcast
    base (its gradient a sum), in float64 against torch."""
    from onnx import TensorProto, helper, numpy_helper

    def node(op, ins, out):
        return helper.make_node(op, ins, [out], name=out)
    nodes = [node("Sigmoid", ["x"], "h"), node("Pow", ["h", "three"], "p"),
             node("Relu", ["h"], "r"), node("Add", ["p", "r"], "y1"),
             node("Sigmoid", ["x"], "h2"), node("Relu", ["h2"], "r2"),
             node("Pow", ["h2", "two"], "p2"), node("Sub", ["r2", "p2"], "y2"),
             node("Sigmoid", ["x"], "h3"), node("Pow", ["h3", "h3"], "y3"),
             node("ReduceMean", ["x", "ax"], "m"), node("Exp", ["m"], "b"),
             node("Pow", ["b", "x"], "y4")]
    inits = [numpy_helper.from_array(np.array(3.0), "three"),
             numpy_helper.from_array(np.array(2.0), "two"),
             numpy_helper.from_array(np.array([1], np.int64), "ax")]
    graph = helper.make_graph(nodes, "pow", [helper.make_tensor_value_info(
        "x", TensorProto.DOUBLE, [3, 4])], [helper.make_tensor_value_info(
            n, TensorProto.UNDEFINED, None) for n in ("y1", "y2", "y3", "y4")], inits)
    g = aidge_interop.load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 20)]))
    x = np.random.default_rng(0).standard_normal((3, 4))
    outs = g.forward([x], need_backward=True, input_grads=True)
    gos = [np.random.default_rng(i).standard_normal(o.shape) for i, o in enumerate(outs)]
    (dx,) = g.backward(gos)
    xt = torch.tensor(x, requires_grad=True)
    h = torch.sigmoid(xt)
    ys = [h.pow(3.0) + torch.relu(h), torch.relu(h) - h.pow(2.0), h.pow(h),
          torch.exp(xt.mean(1, keepdim=True)).pow(xt)]
    for o, t in zip(outs, ys):
        torch.testing.assert_close(torch.from_numpy(np.array(o)), t.detach())
    torch.autograd.backward(ys, [torch.from_numpy(go) for go in gos])
    torch.testing.assert_close(torch.from_numpy(np.array(dx)), xt.grad)
