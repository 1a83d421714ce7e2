"""The steady state of a wrapped module's backward with parameters in C
(`_C.autograd_backward`, module._steady_backward): each p.grad the engine's
buffer, no gradient hook, every parameter requiring grad, no padding rows,
past the first backward. Every other case runs AidgeModule._backward in
Python; these tests compare gradients with torch's own modules across
backwards, and check that each way out of the steady state behaves as the
Python path does (same values, same errors)."""
import copy
import warnings

import pytest
import torch

from aidge_interop import wrap
from aidge_interop.bridge import wrapping


class MulW(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16))

    def forward(self, x):
        return x * self.w


class AddSub(torch.nn.Module):  # two parameters, one of them read twice
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(3, 4))
        self.b = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.tanh(x + self.a) - self.b * self.a


MODULES = [
    (MulW, (16,)),
    (AddSub, (2, 3, 4)),
    (lambda: torch.nn.Linear(8, 5), (3, 8)),
    (lambda: torch.nn.Conv2d(2, 3, 3), (1, 2, 5, 5)),
]


def _pair(make, shape):
    torch.manual_seed(0)
    model = make()
    wrapped = wrap(copy.deepcopy(model), [shape])
    assert wrapped._params and wrapped._steady_backward is not None
    return model, wrapped


def _python_backwards(monkeypatch, wrapped):
    """The numbers (1, 2, ...) of the backwards that ran _backward in Python."""
    seen = []
    python = wrapped._backward

    def counted(grad_outputs):
        seen.append(wrapped._backwards[0] + 1)
        return python(grad_outputs)

    monkeypatch.setattr(wrapped, "_backward", counted)
    return seen


def _step(models, x, g):
    """One forward and backward of each model (gradients accumulate); the
    inputs' gradients."""
    grads = []
    for m in models:
        xg = x.clone().requires_grad_(True)
        m(xg).backward(g)
        grads.append(xg.grad)
    return grads


def _assert_params_close(model, wrapped):
    for (name, p), q in zip(model.named_parameters(), wrapped.parameters()):
        if p.grad is None:
            assert q.grad is None, name
        else:
            torch.testing.assert_close(q.grad, p.grad, msg=name)


@pytest.mark.filterwarnings("ignore:AidgeModule. 10 backward passes")
@pytest.mark.parametrize("make,shape", MODULES)
def test_accumulated_gradients_match_torch(make, shape, monkeypatch):
    model, wrapped = _pair(make, shape)
    python = _python_backwards(monkeypatch, wrapped)
    out = tuple(model(torch.randn(shape)).shape)
    for _ in range(12):  # no zero_grad: .grad accumulates, as torch's
        x, g = torch.randn(shape), torch.randn(out)
        gx, gx_wrapped = _step((model, wrapped), x, g)
        torch.testing.assert_close(gx_wrapped, gx)
        _assert_params_close(model, wrapped)
    # the first backward (p.grad None until then) and the idle warning's
    # count ran in Python, the others in C
    assert python == [1, wrapping._IDLE_BACKWARDS]
    assert wrapped._backwards[0] == 12
    for p, eg in wrapped._steady[0]:
        assert p.grad is eg


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none, monkeypatch):
    model, wrapped = _pair(lambda: torch.nn.Linear(8, 5), (3, 8))
    python = _python_backwards(monkeypatch, wrapped)
    for i in range(8):
        if i in (3, 5):
            model.zero_grad(set_to_none=set_to_none)
            wrapped.zero_grad(set_to_none=set_to_none)
        _step((model, wrapped), torch.randn(3, 8), torch.randn(3, 5))
        _assert_params_close(model, wrapped)
    # None gradients start from zero in Python; zeroed ones stay the buffer
    assert python == ([1, 4, 6] if set_to_none else [1])


def test_gradient_assigned_by_the_user(monkeypatch):
    model, wrapped = _pair(MulW, (16,))
    python = _python_backwards(monkeypatch, wrapped)
    for i in range(5):
        if i == 2:  # a tensor of the user's: backward adds to it
            mine = torch.ones(16)
            model.w.grad = mine.clone()
            wrapped.w.grad = mine
        _step((model, wrapped), torch.randn(16), torch.randn(16))
        _assert_params_close(model, wrapped)
    assert python == [1, 3, 4, 5]  # never the engine's buffer again
    assert wrapped.w.grad is mine


def test_parameter_frozen_after_wrap():
    model, wrapped = _pair(AddSub, (2, 3, 4))
    for i in range(6):
        if i == 3:
            model.a.requires_grad_(False)
            wrapped.a.requires_grad_(False)
        _step((model, wrapped), torch.randn(2, 3, 4), torch.randn(2, 3, 4))
        _assert_params_close(model, wrapped)
    # torch leaves the frozen gradient as it was; not the engine's buffer,
    # which the engine keeps adding to
    assert wrapped.a.grad is not wrapped._steady[0][0][1]
    wrapped.a.requires_grad_(True)
    model.a.requires_grad_(True)
    for _ in range(3):
        _step((model, wrapped), torch.randn(2, 3, 4), torch.randn(2, 3, 4))
        _assert_params_close(model, wrapped)


@pytest.mark.parametrize("kind", ["register_hook", "register_post_accumulate_grad_hook"])
def test_hook_added_after_the_first_backward(kind, monkeypatch):
    model, wrapped = _pair(lambda: torch.nn.Linear(8, 5), (3, 8))
    python = _python_backwards(monkeypatch, wrapped)
    for _ in range(3):
        _step((model, wrapped), torch.randn(3, 8), torch.randn(3, 5))
    handle = getattr(wrapped.bias, kind)(lambda *a: None)
    kept = [p.grad.clone() for p in wrapped.parameters()]
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(NotImplementedError,
                       match=r"AidgeModule\(Linear\): parameter 'bias' has a gradient hook"):
        wrapped(x).sum().backward()
    assert python == [1, 4]  # the Python path raised it, as before
    for p, k in zip(wrapped.parameters(), kept):  # nothing was added
        torch.testing.assert_close(p.grad, k, rtol=0, atol=0)
    handle.remove()  # an empty hook dict: the steady state again
    _step((model, wrapped), torch.randn(3, 8), torch.randn(3, 5))
    _step((model, wrapped), torch.randn(3, 8), torch.randn(3, 5))
    assert python == [1, 4]
    model.zero_grad()
    wrapped.zero_grad()
    _step((model, wrapped), torch.randn(3, 8), torch.randn(3, 5))
    _assert_params_close(model, wrapped)


def test_set_learning_rate(monkeypatch):
    model, wrapped = _pair(AddSub, (2, 3, 4))
    python = _python_backwards(monkeypatch, wrapped)
    for _ in range(3):
        _step((model, wrapped), torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    wrapped.set_learning_rate(0.1)
    assert wrapped._steady_backward is None
    for _ in range(3):  # each backward steps by its own gradient, .grad unchanged
        x, g = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
        kept = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        _step((model, wrapped), x, g)
        with torch.no_grad():
            for p, k in zip(model.parameters(), kept):
                p -= 0.1 * p.grad
                p.grad = k
        for p, q in zip(model.parameters(), wrapped.parameters()):
            torch.testing.assert_close(q, p)
        _assert_params_close(model, wrapped)
    wrapped.set_learning_rate(None)  # accumulating again
    assert python == [1, 4, 5, 6]
    for _ in range(3):  # into the clones set_learning_rate made: Python
        _step((model, wrapped), torch.randn(2, 3, 4), torch.randn(2, 3, 4))
        _assert_params_close(model, wrapped)
    assert python == [1, 4, 5, 6, 7, 8, 9]
    model.zero_grad(set_to_none=True)
    wrapped.zero_grad(set_to_none=True)
    for _ in range(3):  # the engine's buffers again, then C
        _step((model, wrapped), torch.randn(2, 3, 4), torch.randn(2, 3, 4))
        _assert_params_close(model, wrapped)
    assert python == [1, 4, 5, 6, 7, 8, 9, 10]


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, padding_idx=2)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, i):
        return self.lin(self.emb(i))


def test_padding_rows_run_in_python(monkeypatch):
    torch.manual_seed(0)
    model = Embed()
    i = torch.tensor([[1, 2, 3], [2, 2, 9]])
    wrapped = wrap(copy.deepcopy(model), [i])
    assert wrapped._padding_rows and wrapped._steady_backward is None
    python = _python_backwards(monkeypatch, wrapped)
    for _ in range(4):
        g = torch.randn(2, 3, 3)
        model(i).backward(g)
        wrapped(i).backward(g)
        _assert_params_close(model, wrapped)
    assert python == [1, 2, 3, 4]
    assert not wrapped.emb.weight.grad[2].any()


def test_idle_warning_still_comes(monkeypatch):
    model, wrapped = _pair(MulW, (16,))
    x = torch.randn(16, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(wrapping._IDLE_BACKWARDS):
            wrapped(x).sum().backward()
    assert [str(w.message) for w in caught if "no step changed" in str(w.message)]


def test_negative_bit_gradient_and_older_forward():
    model, wrapped = _pair(MulW, (16,))
    for _ in range(3):
        _step((model, wrapped), torch.randn(16), torch.randn(16))
    g = torch._neg_view(torch.randn(16))  # the converter's path, in Python
    _step((model, wrapped), torch.randn(16), g)
    _assert_params_close(model, wrapped)
    x = torch.randn(16, requires_grad=True)
    old = wrapped(x)
    wrapped(x)
    with pytest.raises(RuntimeError, match="backward of an older forward"):
        old.sum().backward()


def test_malformed_steady_state_is_named():
    _, wrapped = _pair(MulW, (16,))
    x = torch.randn(16, requires_grad=True)
    wrapped(x).sum().backward()
    wrapped._steady_backward = ([], 1)
    with pytest.raises(TypeError, match="_steady_backward must be None or"):
        wrapped(x).sum().backward()


class Products(torch.nn.Module):
    """Mul, Div, Mod (fmod) and PRelu whose outputs only later nodes read."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 4))
        self.prelu = torch.nn.PReLU(3)

    def forward(self, x):
        a = x * self.w
        b = a / (self.w * self.w + 1)
        c = torch.fmod(b, 0.7) + self.prelu(a)  # (PReLU over dim 1)
        return torch.tanh(c)


def test_products_backward_reads_no_output(monkeypatch):
    """Mul, Div, Mod and PRelu declare AI_OP_BWD_NO_Y (binary.c): their
    outputs die before backward, filled with NaN (AIDGE_INTEROP_POISON_DEAD),
    and the gradients are still torch's."""
    torch.manual_seed(0)
    model = Products()
    x = torch.randn(2, 3, 4)
    g = torch.randn(2, 3, 4)
    want = _step((model,), x, g)[0]
    monkeypatch.setenv("AIDGE_INTEROP_POISON_DEAD", "1")
    wrapped = wrap(copy.deepcopy(model), [tuple(x.shape)])
    torch.testing.assert_close(_step((wrapped,), x, g)[0], want)
    _assert_params_close(model, wrapped)


def test_mul_output_changed_in_place():
    """A wrapped Mul saves no output (its backward reads none): changing the
    output in place is allowed and harmless, as for torch's own mul."""
    model, wrapped = _pair(MulW, (16,))
    x, g = torch.randn(16), torch.randn(16)
    grads = []
    for m in (model, wrapped):
        xg = x.clone().requires_grad_(True)
        out = m(xg)
        with torch.no_grad():
            out.mul_(3)
        out.backward(g)
        grads.append(xg.grad)
    torch.testing.assert_close(grads[1], grads[0])
    _assert_params_close(model, wrapped)
