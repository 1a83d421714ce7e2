"""Views in the memory plan (plan.c, "views"): Reshape, Flatten, Squeeze,
Unsqueeze and Identity copy nothing where their input and output live in the
arena; their output is the input's buffer under another shape, and in
backward the input's gradient is the output's buffer. Values and gradients
are checked against torch; that no copy runs is seen in the profile (the
node's kernel is not called) and in the arena's size."""
import copy

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from aidge_interop import load_onnx


def _model(nodes, inputs, outputs, inits=(), dtype=TensorProto.DOUBLE):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def _calls(graph, run):
    """{node name: (forward calls, backward calls)} while run() runs."""
    with aidge_interop.profile(graph) as prof:
        run()
    return {r["name"]: (r["fwd_calls"], r["bwd_calls"]) for r in prof.rows}


def _chain():
    """x -> Tanh -> Reshape -> Flatten -> Unsqueeze -> Squeeze -> Identity
    -> Mul w -> y, with the Tanh's output also read by a Sum after the
    views (so the views' input has two readers, the last not a view) and
    the Flatten's output read by an Exp after the chain (a view read late:
    its buffer must outlive the chain)."""
    w = np.linspace(-1.5, 2.0, 24).reshape(4, 6)
    nodes = [
        helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
        helper.make_node("Reshape", ["t", "s46"], ["r"], name="reshape"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten", axis=1),
        helper.make_node("Unsqueeze", ["f", "ax0"], ["u"], name="unsqueeze"),
        helper.make_node("Squeeze", ["u", "ax0"], ["q"], name="squeeze"),
        helper.make_node("Identity", ["q"], ["i"], name="identity"),
        helper.make_node("Mul", ["i", "w"], ["m"], name="mul"),
        helper.make_node("ReduceSum", ["t"], ["st"], name="sum_t", keepdims=1),
        helper.make_node("Exp", ["f"], ["e"], name="exp"),
        helper.make_node("Add", ["m", "e"], ["me"], name="add"),
        helper.make_node("Mul", ["me", "st"], ["y"], name="scale"),
    ]
    inits = [("w", w), ("s46", np.array([4, 6])), ("ax0", np.array([0]))]
    return _model(nodes, [("x", [2, 3, 4])], ["y"], inits), w


def _chain_torch(x, w):
    t = torch.tanh(x)
    f = t.reshape(4, 6)
    return (f * w + torch.exp(f)) * t.sum().reshape(1, 1, 1)


VIEWS = ("reshape", "flatten", "unsqueeze", "squeeze", "identity")


def test_chain_values_gradients_and_no_copy():
    model, w = _chain()
    g = load_onnx(model)
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    gy = np.random.default_rng(1).standard_normal((1, 4, 6))
    out = {}

    def run():
        out["y"] = g.forward([x], need_backward=True, input_grads=True)[0]
        out["dx"] = g.backward([gy])[0]
    calls = _calls(g, run)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    yt = _chain_torch(xt, wt)
    yt.backward(torch.tensor(gy))
    np.testing.assert_allclose(out["y"], yt.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(out["dx"], xt.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g.grads()["w"], wt.grad.numpy(), rtol=1e-12)
    # planned, never run: views forward and backward; but the Reshape and the
    # Unsqueeze are not the last readers of their inputs (the ReduceSum and
    # the Exp are), so their backwards add into gradients that those wrote
    # first: copies
    backward_copies = {"reshape", "unsqueeze"}
    for name in VIEWS:
        assert calls[name] == (0, int(name in backward_copies)), (name, calls[name])
    assert calls["tanh"] == (1, 1) and calls["mul"] == (1, 1)


def test_chain_repeated_calls_and_poison(monkeypatch):
    """Two training steps give the same gradients as a plan that keeps every
    value; with AIDGE_INTEROP_POISON_DEAD each buffer is filled with NaN when
    its last reader (views included) is done, so a view read after its
    buffer died would show."""
    model, _ = _chain()
    x = np.random.default_rng(2).standard_normal((2, 3, 4))
    gy = np.ones((1, 4, 6))
    results = []
    for poison in (False, True):
        if poison:
            monkeypatch.setenv("AIDGE_INTEROP_POISON_DEAD", "1")
        g = load_onnx(model)
        g.keep_intermediates = not poison
        for _ in range(2):
            y = g.forward([x], need_backward=True, input_grads=True)[0]
            dx = g.backward([gy])[0]
        results.append((y, dx, g.grads()["w"]))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    assert np.isfinite(results[1][1]).all()


def test_arena_holds_one_buffer_for_a_view():
    """Relu -> Reshape -> Tanh at inference: with the Reshape a copy, the
    Relu's and the Reshape's outputs are alive together (two buffers); as a
    view they are one."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "s"], ["v"], name="reshape"),
             helper.make_node("Tanh", ["v"], ["y"])]
    g = load_onnx(_model(nodes, [("x", [64, 64])], ["y"], [("s", np.array([32, 128]))]))
    x = np.random.default_rng(3).standard_normal((64, 64))
    calls = _calls(g, lambda: g.forward([x]))
    (y,) = g.forward([x])
    np.testing.assert_allclose(y, np.tanh(np.maximum(x, 0)).reshape(32, 128), rtol=1e-12)
    assert g.memory_stats()["arena_bytes"] == x.nbytes  # (a multiple of the alignment)
    assert calls["reshape"] == (0, 0)
    g.keep_intermediates = True
    g.forward([x])
    np.testing.assert_array_equal(g.intermediate("v"), np.maximum(x, 0).reshape(32, 128))


def test_graph_inputs_and_outputs_keep_their_copies():
    """A Reshape of a graph input (the caller's tensor, not in the arena) and
    a Reshape that gives a graph output (a tensor handed to the caller) copy;
    the output is the caller's own and survives the next call."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["rx"], name="of_input"),
             helper.make_node("Neg", ["rx"], ["n"]),
             helper.make_node("Reshape", ["n", "s2"], ["y"], name="to_output"),
             helper.make_node("Exp", ["n"], ["z"])]
    g = load_onnx(_model(nodes, [("x", [2, 6])], ["y", "z"],
                         [("s", np.array([3, 4])), ("s2", np.array([12]))]))
    x = np.arange(12.0).reshape(2, 6) / 10
    gy, gz = np.full(12, 2.0), np.ones((3, 4))
    out = {}

    def run():
        out["y"], out["z"] = g.forward([x], need_backward=True, input_grads=True)
        out["dx"] = g.backward([gy, gz])[0]
    calls = _calls(g, run)
    np.testing.assert_allclose(out["y"], -x.reshape(12), rtol=1e-15)
    np.testing.assert_allclose(out["z"], np.exp(-x).reshape(3, 4), rtol=1e-15)
    np.testing.assert_allclose(out["dx"], (-2.0 - np.exp(-x.reshape(3, 4))).reshape(2, 6),
                               rtol=1e-14)
    assert calls["of_input"] == (1, 1) and calls["to_output"] == (1, 1)
    kept = out["y"].copy()
    g.forward([x + 1])
    np.testing.assert_array_equal(out["y"], kept)


def test_reshape_read_before_another_reader_copies_its_gradient():
    """t is read by a Reshape and, later, by a Sin: the Reshape is not t's
    last reader, so its backward is not the first write of t's gradient
    (the Sin's is) and adds to it, as a copy; its forward is still a view."""
    nodes = [helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("Reshape", ["t", "s"], ["r"], name="reshape"),
             helper.make_node("Exp", ["r"], ["e"]),
             helper.make_node("Sin", ["t"], ["n"], name="sin"),
             helper.make_node("ReduceSum", ["e"], ["se"], keepdims=0),
             helper.make_node("ReduceSum", ["n"], ["sn"], keepdims=0),
             helper.make_node("Add", ["se", "sn"], ["y"])]
    g = load_onnx(_model(nodes, [("x", [3, 4])], ["y"], [("s", np.array([2, 6]))]))
    x = np.random.default_rng(4).standard_normal((3, 4))
    out = {}

    def run():
        out["y"] = g.forward([x], need_backward=True, input_grads=True)[0]
        out["dx"] = g.backward([np.array(1.5)])[0]
    calls = _calls(g, run)
    xt = torch.tensor(x, requires_grad=True)
    t = torch.tanh(xt)
    yt = torch.exp(t.reshape(2, 6)).sum() + torch.sin(t).sum()
    yt.backward(torch.tensor(1.5, dtype=torch.float64))
    np.testing.assert_allclose(out["y"], yt.item(), rtol=1e-13)
    np.testing.assert_allclose(out["dx"], xt.grad.numpy(), rtol=1e-13)
    assert calls["reshape"] == (0, 1)


def test_float16_views_are_exact():
    """Views move no bytes: float16 Relu -> Reshape -> Neg, forward and
    backward exact (every step is exact in float16)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "s"], ["v"], name="reshape"),
             helper.make_node("Neg", ["v"], ["y"])]
    g = load_onnx(_model(nodes, [("x", [4, 6])], ["y"], [("s", np.array([3, 8]))],
                         dtype=TensorProto.FLOAT16))
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float16)
    gy = np.random.default_rng(6).standard_normal((3, 8)).astype(np.float16)
    out = {}

    def run():
        out["y"] = g.forward([x], need_backward=True, input_grads=True)[0]
        out["dx"] = g.backward([gy])[0]
    calls = _calls(g, run)
    np.testing.assert_array_equal(out["y"], -np.maximum(x, 0).reshape(3, 8))
    np.testing.assert_array_equal(out["dx"], np.where(x > 0, -gy.reshape(4, 6), 0))
    assert calls["reshape"] == (0, 0)


class _Conv1D(torch.nn.Module):
    """GPT-2's projection: view to 2-D, addmm, view back."""

    def __init__(self, nx, nf):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(shape)


class _Block(torch.nn.Module):
    """Projections and heads split and merged with views and transposes."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = _Conv1D(d, 3 * d)
        self.proj = _Conv1D(d, d)
        self.fc = _Conv1D(d, 4 * d)
        self.out = _Conv1D(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        h = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return h + self.out(torch.nn.functional.gelu(self.fc(h))).flatten(1).unflatten(1, (t, d))


@pytest.mark.parametrize("train", [False, True])
def test_wrapped_block_with_view_chains(train):
    torch.manual_seed(0)
    net = _Block()
    x = torch.randn(3, 5, 16)
    am = aidge_interop.wrap(copy.deepcopy(net), [tuple(x.shape)])
    am.train(train)
    xa, xt = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with aidge_interop.profile(am) as prof:
        ya = am(xa)
        ya.backward(torch.ones_like(ya))
    yt = net(xt)
    yt.backward(torch.ones_like(yt))
    torch.testing.assert_close(ya, yt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xa.grad, xt.grad, rtol=1e-4, atol=1e-4)
    for (name, pa), pt in zip(am.named_parameters(), net.parameters()):
        torch.testing.assert_close(pa.grad, pt.grad, rtol=1e-4, atol=1e-4, msg=name)
    reshapes = [r for r in prof.rows if r["op_type"] in ("Reshape", "Flatten", "Squeeze",
                                                         "Unsqueeze")
                and r["graph"] == "main"]
    # (views all, but the Reshape of the graph input, the caller's tensor)
    assert len(reshapes) > 10 and sum(r["fwd_calls"] for r in reshapes) == 1


def test_gpt2_training_step_against_torch():
    """transformers' GPT-2 (random weights, a small config): Conv1D's
    Reshape -> Gemm -> Reshape and the heads' Reshape -> Transpose, values
    and gradients."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64,
                                  n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    net = transformers.GPT2Model(cfg).train()
    ids = torch.randint(0, 64, (2, 12))
    am = aidge_interop.wrap(copy.deepcopy(net), (), kwargs={"input_ids": ids})
    ya = am(input_ids=ids)[0]
    yt = net(input_ids=ids)[0]
    gy = torch.randn_like(yt)
    ya.backward(gy)
    yt.backward(gy)
    torch.testing.assert_close(ya, yt, rtol=1e-4, atol=1e-4)
    named = dict(net.named_parameters())
    for name, pa in am.named_parameters():
        torch.testing.assert_close(pa.grad, named[name].grad, rtol=1e-3, atol=1e-4, msg=name)
