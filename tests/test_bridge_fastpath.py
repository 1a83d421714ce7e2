"""The torch bridge's backward in C (`_C.autograd_backward`, bridge/wrapping.py):
its checks (saved outputs, older forward) and, for a module without
parameters, the engine call through DLPack. Gradients against torch's own
modules; the errors with the messages the Python path had."""
import pytest
import torch

from aidge_interop import _C, wrap
from aidge_interop.bridge import wrapping


class TwoOutputs(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x), torch.sigmoid(x) * 2


class PlusOne(torch.nn.Module):
    def forward(self, x):
        return x + 1  # x's gradient is the output's, unchanged


MODULES = [
    (torch.nn.ReLU, (16,)),
    (torch.nn.Tanh, (2, 8)),  # backward reads its output
    (lambda: torch.nn.Softmax(dim=-1), (3, 5)),
    (lambda: torch.nn.MaxPool2d(2), (1, 2, 4, 4)),
    (PlusOne, (4, 3)),
]


def _grads(model, x, g):
    xg = x.clone().requires_grad_(True)
    model(xg).backward(g)
    return xg.grad


@pytest.mark.parametrize("make,shape", MODULES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "negative_bit"])
def test_gradients_match_torch(make, shape, layout):
    torch.manual_seed(0)
    model = make()
    wrapped = wrap(model, [shape])
    assert not wrapped._params  # the C path's engine call
    x = torch.randn(shape)
    out = tuple(model(x).shape)
    g = torch.randn(out)
    if layout == "transposed":  # a strided gradient
        g = torch.randn(tuple(reversed(out))).permute(*reversed(range(len(out))))
    elif layout == "negative_bit":  # a lazy negation, which DLPack's export ignores
        g = torch._neg_view(g)
        assert g.is_neg()
    want = _grads(model, x, g)
    for _ in range(3):  # steady state too (the engine reuses its buffers)
        torch.testing.assert_close(_grads(wrapped, x, g), want)


def test_gradient_that_is_the_output_gradient_is_the_callers_tensor():
    wrapped = wrap(PlusOne(), [(4, 3)])
    x = torch.randn(4, 3, requires_grad=True)
    seen = []
    x.register_hook(seen.append)
    g = torch.randn(4, 3)
    wrapped(x).backward(g)
    assert seen[0] is g  # as torch's autograd hands it on
    torch.testing.assert_close(x.grad, g, rtol=0, atol=0)


def test_an_unused_output_gets_none():
    torch.manual_seed(0)
    model = TwoOutputs()
    wrapped = wrap(model, [(2, 8)])
    x = torch.randn(2, 8)
    for use in (0, 1):
        grads = []
        for m in (model, wrapped):
            xg = x.clone().requires_grad_(True)
            (m(xg)[use] * 3).sum().backward()
            grads.append(xg.grad)
        torch.testing.assert_close(grads[1], grads[0])


def test_in_place_change_of_a_read_output_is_refused():
    wrapped = wrap(torch.nn.Tanh(), [(2, 8)])
    y = wrapped(torch.randn(2, 8, requires_grad=True))
    assert wrapped._graph.backward_reads_outputs and not wrapped._params
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_second_backward_of_a_freed_graph_is_refused():
    wrapped = wrap(torch.nn.Tanh(), [(2, 8)])
    y = wrapped(torch.randn(2, 8, requires_grad=True))
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()


@pytest.mark.parametrize("make", [torch.nn.ReLU, lambda: torch.nn.Linear(16, 4)])
def test_backward_of_an_older_forward_is_refused(make):
    wrapped = wrap(make(), [(2, 16)])
    x = torch.randn(2, 16, requires_grad=True)
    y1 = wrapped(x)
    wrapped(x)
    with pytest.raises(RuntimeError, match="AidgeModule: backward of an older forward"):
        y1.sum().backward()


def test_with_parameters_the_rest_is_pythons():
    # the checks pass: None, and the Python backward accumulates the parameters'
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    wrapped = wrap(model, [(2, 16)])
    x = torch.randn(2, 16)
    for m in (model, wrapped):
        m(x).sum().backward()
    torch.testing.assert_close(wrapped.weight.grad, model.weight.grad)
    torch.testing.assert_close(wrapped.bias.grad, model.bias.grad)


def test_bad_arguments():
    with pytest.raises(TypeError, match="takes a ctx, a tuple and a bridge"):
        _C.autograd_backward(None, [], wrapping._BRIDGE)

    class Ctx:
        call = (torch.nn.Module(), "not a graph", [0], 0, False)

    with pytest.raises(TypeError, match=r"ctx.call must be \(module, Graph"):
        _C.autograd_backward(Ctx(), (), wrapping._BRIDGE)
