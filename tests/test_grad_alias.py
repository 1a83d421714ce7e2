"""Gradients that are dy (plan.c, "gradients that are dy"): the gradient of
an input of Add (or of Sub's first) with the output's shape is the output's
gradient itself. An activation's gradient then shares the output gradient's
buffer where that is safe, and a graph input gets the caller's output
gradient, the same tensor object, as torch's autograd hands it to both
inputs of an addition. Values and gradients against torch, on graphs where
the sharing is safe and where it is not (residual connections, Add feeding
Add, broadcasting, a value read twice, late readers)."""
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import aidge_interop
from aidge_interop import Tensor, load_onnx


def _model(nodes, inputs, outputs):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def _node(op, ins, out):
    return helper.make_node(op, ins, [out], name=out)


TORCH = {"Tanh": torch.tanh, "Sigmoid": torch.sigmoid, "Exp": torch.exp, "Relu": torch.relu,
         "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul,
         "ReduceMean": lambda x: x.mean().reshape(1, 1)}  # (all axes, keepdims)


def _torch_run(nodes, inputs, outputs, xs):
    values = dict(zip([n for n, _ in inputs], xs))
    for op, ins, out in nodes:
        values[out] = TORCH[op](*[values[i] for i in ins])
    return [values[o] for o in outputs]


# name: (nodes as (op, inputs, output), graph inputs, graph outputs)
GRAPHS = {
    # residual: a's gradient comes from the Add and from the Sigmoid, which
    # adds into it after the Add's backward (a: the Add's first slot)
    "residual": ([("Tanh", ["x"], "a"), ("Sigmoid", ["a"], "b"), ("Add", ["a", "b"], "c"),
                  ("Tanh", ["c"], "y")], [("x", [3, 4])], ["y"]),
    # the same with the branch first: only one of a, b may share c's gradient
    "residual_swapped": ([("Tanh", ["x"], "a"), ("Sigmoid", ["a"], "b"),
                          ("Add", ["b", "a"], "c"), ("Tanh", ["c"], "y")], [("x", [3, 4])], ["y"]),
    # Add feeding Add: a chain of shared gradients, each input with other readers
    "add_chain": ([("Tanh", ["x"], "a"), ("Sigmoid", ["x"], "b"), ("Add", ["a", "b"], "c"),
                   ("Exp", ["a"], "d"), ("Add", ["c", "d"], "e"), ("Add", ["e", "b"], "f"),
                   ("Tanh", ["f"], "y")], [("x", [3, 4])], ["y"]),
    # broadcasting: b's gradient is a reduction of dy (never shared), a's is dy
    "broadcast": ([("Tanh", ["x"], "a"), ("ReduceMean", ["x"], "b"), ("Add", ["b", "a"], "c"),
                   ("Tanh", ["c"], "y")], [("x", [3, 4])], ["y"]),
    # Sub: the first input's gradient is dy, the second's -dy
    "sub": ([("Tanh", ["x"], "a"), ("Sigmoid", ["a"], "b"), ("Sub", ["a", "b"], "c"),
             ("Sub", ["b", "c"], "d"), ("Tanh", ["d"], "y")], [("x", [3, 4])], ["y"]),
    # a value in both slots: its gradient is 2 dy
    "twice": ([("Tanh", ["x"], "a"), ("Add", ["a", "a"], "c"), ("Tanh", ["c"], "y")],
              [("x", [3, 4])], ["y"]),
    # the Add is not a's last reader (the Mul reads it later): a's gradient
    # is written by the Mul's backward first
    "late_reader": ([("Tanh", ["x"], "a"), ("Sigmoid", ["x"], "b"), ("Add", ["a", "b"], "c"),
                     ("Mul", ["a", "c"], "d"), ("Tanh", ["d"], "y")], [("x", [3, 4])], ["y"]),
    # the Add's output is a graph output read by another node too
    "output_read": ([("Tanh", ["x"], "a"), ("Sigmoid", ["x"], "b"), ("Add", ["a", "b"], "c"),
                     ("Exp", ["c"], "y")], [("x", [3, 4])], ["c", "y"]),
    # the Add's input is a graph output
    "input_is_output": ([("Tanh", ["x"], "a"), ("Sigmoid", ["x"], "b"), ("Add", ["a", "b"], "c"),
                         ("Tanh", ["c"], "y")], [("x", [3, 4])], ["a", "y"]),
    # graph inputs straight into Add, Sub (their output a graph output nobody
    # reads: the inputs' gradients are the caller's output gradient)
    "inputs_add": ([("Add", ["x", "z"], "y")], [("x", [3, 4]), ("z", [3, 4])], ["y"]),
    "inputs_sub": ([("Sub", ["x", "z"], "y")], [("x", [3, 4]), ("z", [3, 4])], ["y"]),
    "inputs_broadcast": ([("Add", ["x", "z"], "y")], [("x", [3, 4]), ("z", [4])], ["y"]),
    "inputs_twice": ([("Add", ["x", "x"], "y")], [("x", [3, 4])], ["y"]),
    # x read by a second node: its gradient sums two paths
    "input_two_readers": ([("Add", ["x", "z"], "y"), ("Tanh", ["x"], "t")],
                          [("x", [3, 4]), ("z", [3, 4])], ["y", "t"]),
    # the Add's output also read by a node: its gradient is not the caller's alone
    "input_output_read": ([("Add", ["x", "z"], "y"), ("Exp", ["y"], "e")],
                          [("x", [3, 4]), ("z", [3, 4])], ["y", "e"]),
}


def _run_both(name, grads_given=None, seed=0):
    nodes, inputs, outputs = GRAPHS[name]
    model = _model([_node(*n) for n in nodes], inputs, outputs)
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(s) for _, s in inputs]
    g = load_onnx(model)
    ys = g.forward(xs, need_backward=True, input_grads=True)
    gys = [rng.standard_normal(y.shape) for y in ys]
    if grads_given is not None:
        gys = [gy if given else None for gy, given in zip(gys, grads_given)]
    dxs = g.backward(gys)
    xts = [torch.tensor(x, requires_grad=True) for x in xs]
    yts = _torch_run(nodes, inputs, outputs, xts)
    pairs = [(y, gy) for y, gy in zip(yts, gys) if gy is not None]
    dts = torch.autograd.grad([y for y, _ in pairs], xts, [torch.tensor(gy) for _, gy in pairs],
                              allow_unused=True)
    for y, yt in zip(ys, yts):
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for dx, dt, x in zip(dxs, dts, xs):
        expected = np.zeros_like(x) if dt is None else dt.numpy()
        np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)
    return g, dxs, gys


@pytest.mark.parametrize("name", list(GRAPHS))
def test_gradients_match_torch(name):
    _run_both(name)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_second_backward_and_forward_same_values(name):
    """The shared buffers hold nothing stale from the last call."""
    g, first, _ = _run_both(name, seed=3)
    g2, second, _ = _run_both(name, seed=3)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    nodes, inputs, outputs = GRAPHS[name]
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s) for _, s in inputs]
    gys = None
    for _ in range(3):  # the same graph, calls in a row
        ys = g.forward(xs, need_backward=True, input_grads=True)
        gys = gys or [np.full(y.shape, 0.5) for y in ys]
        again = g.backward(gys)
    g2.forward(xs, need_backward=True, input_grads=True)
    for a, b in zip(again, g2.backward(gys)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["output_read", "input_output_read", "inputs_add"])
def test_missing_output_gradient(name):
    """An output without a gradient (None): zero, the caller's tensor absent."""
    _, _, outputs = GRAPHS[name]
    _run_both(name, grads_given=[False] + [True] * (len(outputs) - 1))


def _raw(name):
    nodes, inputs, outputs = GRAPHS[name]
    g = load_onnx(_model([_node(*n) for n in nodes], inputs, outputs))._g
    g.need_backward = True
    g.input_grads = True
    rng = np.random.default_rng(0)
    xs = [Tensor(rng.standard_normal(s)) for _, s in inputs]
    return g, g.forward(xs)[0]


def test_graph_inputs_get_the_callers_gradient():
    g, y = _raw("inputs_add")
    dy = Tensor(np.arange(12.0).reshape(3, 4))
    dx, dz = g.backward([dy])
    assert dx is dy and dz is dy
    g, y = _raw("inputs_sub")
    dx, dz = g.backward([dy])
    assert dx is dy and dz is not dy
    np.testing.assert_array_equal(dz.numpy(), -dy.numpy())
    g, y = _raw("inputs_broadcast")
    dx, dz = g.backward([dy])
    assert dx is dy and dz is not dy
    np.testing.assert_array_equal(dz.numpy(), dy.numpy().sum(0))


def test_numpy_api_returns_arrays_of_their_own():
    nodes, inputs, outputs = GRAPHS["inputs_add"]
    g = load_onnx(_model([_node(*n) for n in nodes], inputs, outputs))
    g.forward([np.ones((3, 4)), np.ones((3, 4))], need_backward=True, input_grads=True)
    gy = np.arange(12.0).reshape(3, 4)
    dx, dz = g.backward([gy])
    assert not np.shares_memory(dx, gy) and not np.shares_memory(dx, dz)
    np.testing.assert_array_equal(dx, gy)
    np.testing.assert_array_equal(dz, gy)


def test_graph_inputs_with_a_strided_gradient_get_their_own():
    g, y = _raw("inputs_add")
    wide = Tensor(np.arange(24.0).reshape(3, 8))
    strided = Tensor(np.arange(24.0).reshape(3, 8)[:, ::2])
    dx, dz = g.backward([strided])
    assert dx is not strided and dz is not strided
    np.testing.assert_array_equal(dx.numpy(), wide.numpy()[:, ::2])
    np.testing.assert_array_equal(dz.numpy(), wide.numpy()[:, ::2])


@pytest.mark.parametrize("name, passed", [("inputs_twice", [False]),
                                          ("input_two_readers", [False, True]),
                                          ("input_output_read", [False, False])])
def test_graph_inputs_that_sum_gradients_get_their_own(name, passed):
    """x + x, x read by a second node, or the sum read by a node: the
    gradient sums paths (z alone, read once into an output nobody reads,
    still gets the caller's)."""
    g, y = _raw(name)
    dys = [Tensor(np.ones(y.shape))] + [None] * (len(GRAPHS[name][2]) - 1)
    assert [dx is dys[0] for dx in g.backward(dys)] == passed


class AddModule(torch.nn.Module):
    def forward(self, a, b):
        return a + b


class ResidualModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x, z):
        h = torch.tanh(x + z)  # graph inputs into an Add read later: no pass
        return h + torch.sigmoid(self.fc(h)) - torch.relu(h)


@pytest.mark.parametrize("steps", [1, 3])
def test_wrapped_add_accumulates_like_torch(steps):
    """The same gradient tensor to both inputs: torch's accumulation into
    .grad must not let one input's gradient change the other's, nor the
    caller's output gradient."""
    wrapped = aidge_interop.wrap(AddModule(), [(4, 6), (4, 6)])
    rng = np.random.default_rng(0)
    a0, b0 = (torch.tensor(rng.standard_normal((4, 6)), dtype=torch.float32) for _ in range(2))
    g = torch.tensor(rng.standard_normal((4, 6)), dtype=torch.float32)
    g_before = g.clone()
    pairs = []
    for fn in (wrapped, AddModule()):
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        for _ in range(steps):
            out = fn(a, b)
            out.backward(g)
        pairs.append((a.grad, b.grad))
    (ea, eb), (ta, tb) = pairs
    torch.testing.assert_close(ea, ta, rtol=0, atol=0)
    torch.testing.assert_close(eb, tb, rtol=0, atol=0)
    torch.testing.assert_close(g, g_before, rtol=0, atol=0)
    assert ea.data_ptr() != eb.data_ptr()


def test_wrapped_add_retain_graph_and_grad():
    wrapped = aidge_interop.wrap(AddModule(), [(3, 5), (3, 5)])
    a = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(3, 5, requires_grad=True)
    g = torch.randn(3, 5)
    out = wrapped(a, b)
    da, db = torch.autograd.grad(out, (a, b), g, retain_graph=True)
    torch.testing.assert_close(da, g, rtol=0, atol=0)
    torch.testing.assert_close(db, g, rtol=0, atol=0)
    out.backward(g)
    out.backward(2 * g)
    torch.testing.assert_close(a.grad, 3 * g, rtol=0, atol=0)
    torch.testing.assert_close(b.grad, 3 * g, rtol=0, atol=0)
    a.grad.add_(1)  # in place on one: the other is its own tensor
    torch.testing.assert_close(b.grad, 3 * g, rtol=0, atol=0)
    # a loss downstream (non-contiguous and expanded output gradients)
    a.grad = b.grad = None
    wrapped(a, b).t().sum().backward()
    torch.testing.assert_close(a.grad, torch.ones(3, 5), rtol=0, atol=0)
    torch.testing.assert_close(b.grad, torch.ones(3, 5), rtol=0, atol=0)
    a.grad.mul_(3)
    torch.testing.assert_close(b.grad, torch.ones(3, 5), rtol=0, atol=0)


def test_wrapped_residual_matches_torch():
    torch.manual_seed(0)
    model = ResidualModule().double()
    wrapped = aidge_interop.wrap(model, [(5, 6), (5, 6)])
    x = torch.randn(5, 6, dtype=torch.float64)
    z = torch.randn(5, 6, dtype=torch.float64)
    g = torch.randn(5, 6, dtype=torch.float64)
    grads = []
    for fn in (wrapped, model):
        fn.zero_grad()
        xs = [x.clone().requires_grad_(), z.clone().requires_grad_()]
        for _ in range(2):
            fn(*xs).backward(g)
        grads.append([t.grad for t in xs] + [p.grad.clone() for p in fn.parameters()])
    for e, t in zip(*grads):
        torch.testing.assert_close(e, t, rtol=1e-12, atol=1e-12)
