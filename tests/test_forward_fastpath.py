"""AidgeModule's call in C (`_C.module_call`, bridge/wrapping.py): the
steady-state forward without grad runs no Python frame of the bridge; every
other call takes the Python path (`AidgeModule._call`) as before. Values
against torch's own modules; which path ran, seen through sys.setprofile
(the Python frames of the bridge that ran); the errors with the messages
the Python path gives."""
import itertools
import sys

import pytest
import torch

from aidge_interop import wrap
from aidge_interop.bridge import wrapping


def _frames(fn):
    """fn's result and the names of the bridge's Python functions it ran."""
    names = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == wrapping.__file__:
            names.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, names


def _fast(names):
    return not names & {"_call", "forward", "_run", "_graph_call"}


class TwoOutputs(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x), x * 2


class AddParam(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.other = torch.nn.Parameter(torch.randn(3, 5))

    def forward(self, x):
        return x + self.other


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.BatchNorm1d(8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _pair(model, shape, train=False):
    model.train(train)
    return model, wrap(model, [shape]).train(train)


@pytest.mark.parametrize("make,shape,train", [
    (_mlp, (4, 5), False),  # (in training, BatchNorm's counters: the Python path, below)
    (AddParam, (3, 5), False), (AddParam, (3, 5), True),
    (TwoOutputs, (2, 3), False), (TwoOutputs, (2, 3), True),
    (torch.nn.ReLU, (16,), False), (torch.nn.ReLU, (16,), True)])
def test_values_match_torch_on_the_c_path(make, shape, train):
    model, wrapped = _pair(make(), shape, train)
    x = torch.randn(shape)
    with torch.no_grad():
        wrapped(x)  # the first call builds the fused graph (Python)
        for _ in range(3):  # steady state
            out, names = _frames(lambda: wrapped(x))
            assert _fast(names), names
            torch.testing.assert_close(out, model(x))
    assert isinstance(out, tuple) == isinstance(model(x), tuple)


def test_inference_mode_and_fused_graph_mark():
    model, wrapped = _pair(_mlp(), (4, 5))
    x = torch.randn(4, 5)
    with torch.inference_mode():
        wrapped(x)
        out, names = _frames(lambda: wrapped(x))
    assert _fast(names)
    torch.testing.assert_close(out, model(x))
    assert wrapped.memory_stats()["last_graph"] == "inference"
    wrapped.train()
    model.train()
    with torch.no_grad():
        out, names = _frames(lambda: wrapped(x))  # BatchNorm's counters in training: Python
        torch.testing.assert_close(out, model(x))
    assert not _fast(names)
    assert wrapped.memory_stats()["last_graph"] == "main"
    for name in ("1.running_mean", "1.num_batches_tracked"):
        torch.testing.assert_close(wrapped.get_buffer(name), model.get_buffer(name))


def test_weight_writes_between_calls_are_seen():
    model, wrapped = _pair(_mlp(), (4, 5))
    x = torch.randn(4, 5)
    with torch.no_grad():
        wrapped(x)
        for step in range(3):  # each write bumps a version: the packed copy is redone
            for p, q in zip(model.parameters(), wrapped.parameters()):
                p.mul_(1.5)
                q.mul_(1.5)
            out, names = _frames(lambda: wrapped(x))
            assert _fast(names)
            torch.testing.assert_close(out, model(x))


def test_grad_mode_takes_the_python_path():
    model, wrapped = _pair(AddParam(), (3, 5), train=True)
    x = torch.randn(3, 5)
    out, names = _frames(lambda: wrapped(x))
    assert "_run" in names
    assert out.grad_fn is not None
    out.sum().backward()
    model(x).sum().backward()
    torch.testing.assert_close(wrapped.other.grad, model.other.grad)


def test_hooks_take_the_python_path():
    model, wrapped = _pair(torch.nn.ReLU(), (2, 3))
    x = torch.randn(2, 3)
    seen = []
    handles = [wrapped.register_forward_pre_hook(lambda m, a: (a[0] - 1,)),
               wrapped.register_forward_hook(lambda m, a, o: seen.append(o) or o * 2)]
    with torch.no_grad():
        out, names = _frames(lambda: wrapped(x))
    assert "_call" in names and len(seen) == 1
    torch.testing.assert_close(out, model(x - 1) * 2)
    for h in handles:
        h.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, a, o: seen.append(o))
    try:
        with torch.no_grad():
            _, names = _frames(lambda: wrapped(x))
        assert "_call" in names and len(seen) == 2
    finally:
        handle.remove()
    with torch.no_grad():
        out, names = _frames(lambda: wrapped(x))
    assert _fast(names)
    torch.testing.assert_close(out, model(x))


def test_keywords_and_replaced_forward_take_the_python_path():
    model, wrapped = _pair(torch.nn.ReLU(), (2, 3))
    x = torch.randn(2, 3)
    with torch.no_grad():
        out, names = _frames(lambda: wrapped(input=x))
        assert "_call" in names
        torch.testing.assert_close(out, model(x))
        wrapped.forward = lambda y: y + 100
        out, names = _frames(lambda: wrapped(x))
        assert "_call" in names
        torch.testing.assert_close(out, x + 100)


@pytest.mark.parametrize("make,shape,name", [
    (AddParam, (3, 5), "other"),  # one parameter
    (_mlp, (4, 5), "0.weight"),  # several (their reads without __torch_function__)
    (_mlp, (4, 5), "1.running_mean"),  # a buffer
])
def test_swapped_storage_is_relinked(make, shape, name):
    model, wrapped = _pair(make(), shape)
    x = torch.randn(shape)
    with torch.no_grad():
        wrapped(x)
        wrapped(x)
        mine, theirs = (dict(itertools.chain(m.named_parameters(), m.named_buffers()))[name]
                        for m in (wrapped, model))
        new = torch.randn(mine.shape)
        mine.data = new.clone()
        theirs.data = new.clone()
        out, names = _frames(lambda: wrapped(x))
        assert "_relink" in names
        torch.testing.assert_close(out, model(x))
        out, names = _frames(lambda: wrapped(x))  # relinked: the C path again
        assert _fast(names)
        torch.testing.assert_close(out, model(x))
        new = torch.randn(mine.shape)
        mine.set_(new.clone())  # another storage, in place
        theirs.copy_(new)
        out, names = _frames(lambda: wrapped(x))
        assert "_relink" in names
        torch.testing.assert_close(out, model(x))


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "negative_bit",
                                    "parameter"])
def test_inputs_of_other_layouts(layout):
    model, wrapped = _pair(torch.nn.Tanh(), (4, 6))
    base = torch.randn(6, 4)
    x = {"transposed": lambda: base.t(),
         "sliced": lambda: torch.randn(4, 12)[:, ::2],
         "expanded": lambda: torch.randn(4, 1).expand(4, 6),
         "negative_bit": lambda: torch._neg_view(base.t()),
         "parameter": lambda: torch.nn.Parameter(base.t().contiguous())}[layout]()
    with torch.no_grad():
        out, names = _frames(lambda: wrapped(x))
    if layout in ("negative_bit", "parameter"):  # not for the C path
        assert "_call" in names
    torch.testing.assert_close(out, model(x))


def test_other_signature_is_exported():
    model, wrapped = _pair(TwoOutputs(), (2, 3))
    x = torch.randn(2, 7)  # dim 1 contradicts the graph's: a ValueError, then a new export
    with torch.no_grad():
        out, names = _frames(lambda: wrapped(x))
        assert "_forward_call" in names
        torch.testing.assert_close(out, model(x))
        out = wrapped(torch.randn(5, 3))  # a new batch size: the same graph
        assert out[0].shape == (5, 3)


def _message(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("bad", ["float64", "int64", "complex", "meta", "shape", "count",
                                 "not_a_tensor"])
def test_errors_have_the_python_paths_messages(bad):
    torch.manual_seed(0)
    _, wrapped = _pair(torch.nn.Linear(3, 4), (2, 3))
    x = {"float64": lambda: torch.randn(2, 3, dtype=torch.float64),
         "int64": lambda: torch.ones(2, 3, dtype=torch.int64),
         "complex": lambda: torch.randn(2, 3, dtype=torch.complex64),
         "meta": lambda: torch.empty(2, 3, device="meta"),
         "shape": lambda: torch.randn(2, 5),
         "count": lambda: torch.randn(2, 3),
         "not_a_tensor": lambda: 3.0}[bad]()
    args = (x, x) if bad == "count" else (x,)
    with torch.no_grad():
        wrapped(torch.randn(2, 3))
        fast = _message(lambda: wrapped(*args))
        wrapped(torch.randn(2, 3))
        python = _message(lambda: wrapping.AidgeModule._call(wrapped, *args))
    assert fast == python


def test_descriptor_arguments_are_checked():
    from aidge_interop import _C

    with pytest.raises(TypeError, match="module_call"):
        _C.module_call(wrapping.AidgeModule)
