"""Recipe fuse_gelu (csrc/recipes.c): the tanh GELU that a model writes out
element by element, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
(transformers' ``gelu_new``, GPT-2's activation), as one Gelu node with
``approximate="tanh"``, in the graph of eval forwards (``wrap``'s fused
inference graph).

Not bit for bit: one function in other float32 operations. The bound: the
rewritten and the unrewritten graph are each within 4 units in the last
place of |x| (4 * 2^-24 |x|) of the formula in float64 (measured: 2.2 and
1.7 on x in [-12, 12]). Every case it leaves alone keeps the graph's own
nodes, and training graphs are never rewritten.
"""
import copy
import math

import pytest
import torch

import aidge_interop
from aidge_interop import recipes, wrap

C = math.sqrt(2.0 / math.pi)
ULP = 2.0 ** -24


def _exact(x):
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(C * (x + 0.044715 * x ** 3)))


FORMS = {  # how models and exporters write it
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(C * (x + 0.044715 * torch.pow(x, 3.0)))),
    "cube_products": lambda x: x * 0.5 * (1.0 + torch.tanh((x + x * (x * x) * 0.044715) * C)),
    "cube_left": lambda x: 0.5 * x * (torch.tanh(C * (0.044715 * (x * x * x) + x)) + 1.0),
    "half_last": lambda x: x * (1.0 + torch.tanh(C * (x + 0.044715 * x ** 3))) * 0.5,
    "half_inner": lambda x: x * ((1.0 + torch.tanh(C * (x + 0.044715 * x ** 3))) * 0.5),
}


class _Act(torch.nn.Module):
    def __init__(self, form):
        super().__init__()
        self.form = form

    def forward(self, x):
        return FORMS[self.form](x)


class _Mlp(torch.nn.Module):
    """Linear -> GELU -> Linear, as in a transformer block."""

    def __init__(self, form, d=16):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.act, self.proj = torch.nn.Linear(d, 4 * d), _Act(form), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


def _op_types(graph):
    return [n["op_type"] for n in graph.nodes()]


def _eval(am, x):
    with torch.no_grad():
        return am(x)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_fuse_gelu_forms(form):
    x = torch.linspace(-12, 12, 4001).reshape(1, -1)
    am = wrap(_Act(form), (x,)).eval()
    y = _eval(am, x)
    ops = _op_types(am._fused)
    assert ops.count("Gelu") == 1 and "Tanh" not in ops, ops
    am.fuse_inference = False
    y_unfused = _eval(am, x)
    assert "Tanh" in _op_types(am._graph)
    bound = 4 * ULP * x.double().abs()
    for out in (y, y_unfused):
        err = (out.double() - _exact(x)).abs()
        assert bool((err <= bound).all()), f"{err.max().item()} beyond 4 ulp of |x|"


def test_fuse_gelu_in_a_model():
    """Linear -> GELU -> Linear on (batch, tokens, d): the fused eval forward
    against torch (float32 tolerance) and the unrewritten graph."""
    torch.manual_seed(1)
    x = torch.randn(2, 5, 16) * 3
    model = _Mlp("gelu_new").eval()
    am = wrap(copy.deepcopy(model), (x,)).eval()
    y = _eval(am, x)
    assert "Gelu" in _op_types(am._fused)
    with torch.no_grad():
        ref = model(x)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    am.fuse_inference = False
    torch.testing.assert_close(y, _eval(am, x), rtol=1e-5, atol=1e-5)


class _Shared(torch.nn.Module):
    """tanh's output also a model output: the chain is not the GELU's alone."""

    def forward(self, x):
        t = torch.tanh(C * (x + 0.044715 * torch.pow(x, 3.0)))
        return 0.5 * x * (1.0 + t), t


class _OtherConstant(torch.nn.Module):
    """0.045 where the GELU has 0.044715: another function."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(C * (x + 0.045 * torch.pow(x, 3.0))))


@pytest.mark.parametrize("module", [_Shared, _OtherConstant])
def test_fuse_gelu_leaves_others(module):
    x = torch.randn(3, 7)
    am = wrap(module(), (x,)).eval()
    y = _eval(am, x)
    assert am._fused is False  # nothing fused: the one graph runs
    with torch.no_grad():
        ref = module()(x)
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)


def test_fuse_gelu_not_in_training():
    """The training graph keeps the written-out GELU: backward as torch's."""
    torch.manual_seed(2)
    x = torch.randn(2, 5, 16)
    model = _Mlp("gelu_new")
    am = wrap(copy.deepcopy(model), (x,))
    am(x).square().sum().backward()
    model(x).square().sum().backward()
    assert "Gelu" not in _op_types(am._graph)
    for (name, p), q in zip(am.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_fuse_gelu_recipe_report(tmp_path):
    x = torch.randn(4, 9)
    path = tmp_path / "gelu.onnx"
    torch.onnx.export(_Act("gelu_new"), (x,), str(path), dynamo=False, opset_version=17)
    graph = aidge_interop.load_onnx(str(path))
    before = graph.forward(x.numpy())
    report = recipes.fuse_gelu(graph)
    assert len(report) == 1 and "approximate 'tanh'" in report[0], str(report)
    assert [n["op_type"] for n in graph._g.nodes()] == ["Gelu"]
    after = graph.forward(x.numpy())
    b = torch.as_tensor(before if not isinstance(before, (list, tuple)) else before[0])
    a = torch.as_tensor(after if not isinstance(after, (list, tuple)) else after[0])
    assert bool(((a.double() - _exact(x)).abs() <= 4 * ULP * x.double().abs()).all())
    assert bool(((b.double() - _exact(x)).abs() <= 4 * ULP * x.double().abs()).all())
