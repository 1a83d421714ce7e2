"""wrap(): an AidgeModule must behave like the torch model it came from —
outputs, gradients, parameters, buffers, modes, optimiser steps."""
import copy
import warnings

import pytest
import torch

from aidge_interop import SGD, wrap
from test_backward_params_fastpath import MulW


class Elementwise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16))
        self.b = torch.nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.tanh(x * self.w + self.b) * 2


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class TwoInTwoOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([1.5, -0.5, 2.0]))

    def forward(self, a, b):
        s = a * self.scale
        return s + b, torch.sigmoid(s) * b


def _compare_step(torch_model, wrapped, inputs):
    t_in = [x.clone().requires_grad_(True) for x in inputs]
    a_in = [x.clone().requires_grad_(True) for x in inputs]
    t_out, a_out = torch_model(*t_in), wrapped(*a_in)
    t_out = t_out if isinstance(t_out, tuple) else (t_out,)
    a_out = a_out if isinstance(a_out, tuple) else (a_out,)
    for t, a in zip(t_out, a_out):
        torch.testing.assert_close(a, t, rtol=1e-5, atol=1e-6)
    sum(o.square().sum() for o in t_out).backward()
    sum(o.square().sum() for o in a_out).backward()
    for t, a in zip(t_in, a_in):
        torch.testing.assert_close(a.grad, t.grad, rtol=1e-5, atol=1e-6)
    for (n, p), (m, q) in zip(torch_model.named_parameters(), wrapped.named_parameters()):
        assert n == m
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("cls,dims", [(Elementwise, [(3, 16)]), (MLP, [(3, 16)]),
                                      (TwoInTwoOut, [(4, 3), (4, 3)])])
def test_wrap_matches_torch(cls, dims):
    torch.manual_seed(0)
    model = cls()
    wrapped = wrap(model, dims)
    inputs = [torch.randn(d) for d in dims]
    _compare_step(model, wrapped, inputs)
    # another batch size re-plans transparently
    _compare_step(model, wrapped, [torch.randn((7,) + tuple(d[1:])) for d in dims])


class FreshNorms(torch.nn.Module):
    """Two BatchNorms and two LayerNorms of one width, freshly initialised:
    their weights (ones), biases and running statistics have equal values."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 4, 3)
        self.bn2 = torch.nn.BatchNorm2d(4)
        self.ln1 = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        self.ln2 = torch.nn.LayerNorm(16)

    def forward(self, x):
        x = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))).flatten(1)
        return self.ln2(self.fc(torch.relu(self.ln1(x))))


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(8, 8)
        self.dec = torch.nn.Linear(8, 8)
        self.dec.weight = self.enc.weight

    def forward(self, x):
        return self.dec(torch.tanh(self.enc(x)))


@pytest.mark.parametrize("cls,dims", [(FreshNorms, [(2, 3, 6, 6)]), (Tied, [(3, 8)])])
def test_parameters_of_equal_values_stay_apart(cls, dims):
    """torch's ONNX export merges initializers of equal values for inference;
    wrap keeps one per parameter and buffer (tied weights stay one), and
    after SGD steps the layers have diverged exactly as in torch."""
    torch.manual_seed(0)
    model = cls().train()
    wrapped = wrap(copy.deepcopy(model), dims)
    assert list(wrapped.state_dict()) == list(model.state_dict())
    opt_t = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_a = SGD(wrapped, lr=0.1)
    for step in range(3):
        x = torch.randn(dims[0])
        for m, opt in ((model, opt_t), (wrapped, opt_a)):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    for (n, p), (m, q) in zip(model.state_dict().items(), wrapped.state_dict().items()):
        assert n == m
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=n)
    if cls is FreshNorms:
        assert not torch.equal(model.bn1.weight, model.bn2.weight)  # they did diverge


def test_parameters_are_zero_copy_views_with_torch_names():
    torch.manual_seed(0)
    model = MLP()
    wrapped = wrap(model, [(1, 16)])
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in model.named_parameters()]
    for (n, p), q in zip(model.named_parameters(), wrapped.parameters()):
        assert q.shape == p.shape and torch.equal(q, p)
    x = torch.randn(2, 16)
    before = wrapped(x)
    with torch.no_grad():
        wrapped.fc2.bias.add_(1.0)  # a write into .data is a write into the engine
    torch.testing.assert_close(wrapped(x), before + 1.0)
    wrapped.load_state_dict(model.state_dict())
    torch.testing.assert_close(wrapped(x), model(x))
    assert list(wrapped.state_dict()) == list(model.state_dict())


def test_grad_is_the_engine_buffer_and_set_to_none_works():
    torch.manual_seed(0)
    model = Elementwise()
    wrapped = wrap(model, [(2, 16)])
    x = torch.randn(2, 16)
    wrapped(x).sum().backward()
    g1 = wrapped.w.grad.clone()
    wrapped(x).sum().backward()  # accumulates like torch
    torch.testing.assert_close(wrapped.w.grad, 2 * g1)
    wrapped.zero_grad(set_to_none=True)
    assert wrapped.w.grad is None
    wrapped(x).sum().backward()
    torch.testing.assert_close(wrapped.w.grad, g1)


@pytest.mark.parametrize("kw", [dict(), dict(momentum=0.9), dict(momentum=0.9, nesterov=True),
                                dict(momentum=0.5, dampening=0.3, weight_decay=0.01),
                                dict(weight_decay=0.1, maximize=True)], ids=str)
def test_sgd_matches_torch_optim(kw):
    torch.manual_seed(0)
    model = MLP()
    wrapped = wrap(model, [(4, 16)])
    opt_t = torch.optim.SGD(model.parameters(), lr=0.05, **kw)
    opt_a = SGD(wrapped, lr=0.05, **kw)
    for step in range(5):
        x = torch.randn(4, 16)
        for m, opt in ((model, opt_t), (wrapped, opt_a)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), torch.ones(4, 4)).backward()
            opt.step()
        for (n, p), q in zip(model.named_parameters(), wrapped.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=f"step {step}: {n}")


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["plain", "momentum"])
@pytest.mark.parametrize("change", ["new_grad_tensor", "param_data_swapped", "grad_data_swapped",
                                    "grad_transposed_in_place", "frozen", "frozen_with_grad",
                                    "grad_dropped"])
def test_sgd_steady_state_cache_follows_changes(change, momentum):
    """SGD keeps its engine views across steps while every parameter has the
    same gradient tensor in the same memory (checked in one C call); any
    change between steps falls back to the full path: the same updates as
    torch.optim.SGD on plain tensors changed the same way."""
    torch.manual_seed(0)
    shapes = [(4, 4), (4,), (3, 4)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kw = dict(lr=0.1, weight_decay=0.01, momentum=momentum)
    opt_a, opt_t = SGD(ours, **kw), torch.optim.SGD(ref, **kw)
    for step in range(5):
        for params, opt in ((ours, opt_a), (ref, opt_t)):
            opt.zero_grad(set_to_none=False)
            for i, p in enumerate(params):
                if p.grad is not None or step == 0:
                    g = torch.full(p.shape, float(step + i + 1)) + torch.arange(p.numel()).view(
                        p.shape)
                    if p.grad is None:
                        p.grad = g
                    else:
                        p.grad.add_(g)
            if step == 2:  # between the cached steps, on both sides alike
                p, g = params[0], params[0].grad
                if change == "new_grad_tensor":
                    p.grad = g.clone() * 3
                elif change == "param_data_swapped":
                    p.data = p.detach().clone() + 1
                elif change == "grad_data_swapped":
                    g.data = g.detach().clone() * -2
                elif change == "grad_transposed_in_place":
                    g.t_()  # same memory, now read transposed
                elif change == "frozen":
                    p.requires_grad_(False)
                    p.grad = None
                elif change == "frozen_with_grad":  # torch's SGD still updates it
                    p.requires_grad_(False)
                elif change == "grad_dropped":
                    p.grad = None
            opt.step()
        for a, t in zip(ours, ref):
            torch.testing.assert_close(a.detach(), t.detach(), msg=f"{change}, step {step}")


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["plain", "momentum"])
def test_sgd_steady_state_with_parameters_without_gradients(momentum):
    """Parameters without a gradient (frozen, unused) stay in the steady
    state as None; one that gets a gradient later is updated from then on,
    like torch.optim.SGD."""
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(3)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kw = dict(lr=0.1, momentum=momentum)
    opt_a, opt_t = SGD(ours, **kw), torch.optim.SGD(ref, **kw)
    for step in range(5):
        for params, opt in ((ours, opt_a), (ref, opt_t)):
            opt.zero_grad(set_to_none=False)
            for i, p in enumerate(params):
                if i == 1 and step < 3:  # no gradient for the first three steps
                    continue
                g = torch.full(p.shape, float(step + 2 * i + 1))
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
            opt.step()
        for k, (a, t) in enumerate(zip(ours, ref)):
            torch.testing.assert_close(a.detach(), t.detach(), msg=f"step {step}, param {k}")


def test_sgd_zero_grad_zeroes_in_place_and_bumps_versions():
    torch.manual_seed(0)
    wrapped = wrap(MLP(), [(4, 16)])
    plain = torch.nn.Parameter(torch.randn(3, 4))
    opt = SGD(list(wrapped.parameters()) + [plain], lr=0.1)
    wrapped(torch.randn(4, 16)).sum().backward()
    plain.grad = torch.randn(4, 3).t()  # a non-contiguous gradient: zeroed by torch
    grads = [p.grad for p in opt.params]
    versions = [g._version for g in grads]
    assert all(bool(g.abs().sum() > 0) for g in grads)
    opt.zero_grad()
    for p, g, v in zip(opt.params, grads, versions):
        assert p.grad is g  # in place: an AidgeModule's grad stays the engine's buffer
        assert bool((g == 0).all()) and g._version > v
    wrapped(torch.randn(4, 16)).sum().backward()  # the engine accumulates into them again
    assert bool(wrapped.fc1.weight.grad.abs().sum() > 0)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in opt.params)


def test_no_grad_forward_and_eval_mode():
    torch.manual_seed(0)
    model = MLP()
    wrapped = wrap(model, [(1, 16)]).eval()
    with torch.no_grad():
        y = wrapped(torch.randn(3, 16))
    assert not y.requires_grad and not wrapped.training


def test_input_gradient_follows_requires_grad_from_call_to_call():
    # the memory plan is built at the first forward of a shape; it once kept
    # whether the input's gradient was computed, so an input that required
    # grad after calls with one that did not got no gradient (None)
    torch.manual_seed(0)
    model = MLP()
    wrapped = wrap(copy.deepcopy(model), [(3, 16)])
    x = torch.randn(3, 16)
    for requires in (False, True, False, True):
        xe, xt = x.clone().requires_grad_(requires), x.clone().requires_grad_(requires)
        wrapped(xe).sum().backward()
        model(xt).sum().backward()
        if requires:
            torch.testing.assert_close(xe.grad, xt.grad)
        else:
            assert xe.grad is None
    for pe, pt in zip(wrapped.parameters(), model.parameters()):
        torch.testing.assert_close(pe.grad, pt.grad)


def _grads_match(wrapped, model):
    for (n, p), (_, q) in zip(model.named_parameters(), wrapped.named_parameters()):
        if p.grad is None:
            assert q.grad is None, n
        else:
            torch.testing.assert_close(q.grad, p.grad, msg=n)


class _IdsAsFloat(torch.nn.Module):
    """Token ids given as floats (cast to int64: no gradient flows back), a float
    input through ReLU (connected: zeros where inactive) and one through a comparison."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, ids, x, m):
        tokens = ids.abs().long().clamp(0, 9)
        return self.emb(tokens).sum(1) * torch.relu(x) * (m > 0).float()


def test_input_gradient_is_none_where_no_gradient_flows_like_torch():
    torch.manual_seed(0)
    model = _IdsAsFloat()
    engine = wrap(model, [(2, 3), (2, 4), (2, 4)])
    ids = torch.tensor([[1.0, 2, 3], [4, 5, 6]])
    x = -torch.rand(2, 4)  # all inactive: a zero gradient, not None
    m = torch.randn(2, 4)
    grads = []
    for module in (model, engine):
        inputs = [t.clone().requires_grad_() for t in (ids, x, m)]
        module(*inputs).sum().backward()
        grads.append([t.grad for t in inputs])
    (t_ids, t_x, t_m), (e_ids, e_x, e_m) = grads
    assert t_ids is None and e_ids is None
    assert t_m is None and e_m is None
    torch.testing.assert_close(e_x, t_x)
    assert torch.count_nonzero(e_x) == 0


def test_parameter_frozen_after_wrap_keeps_its_gradient_like_torch():
    # a frozen parameter's gradient is left alone by backward; it was the
    # engine's buffer, which the engine still adds to (torch.optim would
    # then have moved the frozen layer)
    torch.manual_seed(0)
    model = MLP()
    wrapped = wrap(copy.deepcopy(model), [(3, 16)])
    x = torch.randn(3, 16)
    opt_t = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_e = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    for m in (model, wrapped):
        m(x).square().sum().backward()
    for m in (model, wrapped):
        m.fc1.requires_grad_(False)
        m(x).square().sum().backward()  # fc1's gradients stay, fc2's accumulate
    _grads_match(wrapped, model)
    frozen = wrapped.fc1.weight.detach().clone()
    for opt, m in ((opt_t, model), (opt_e, wrapped)):
        for _ in range(2):
            opt.zero_grad()  # (set_to_none: fc1's gradient is None from here)
            m(x).square().sum().backward()
            opt.step()
    _grads_match(wrapped, model)
    assert wrapped.fc1.weight.grad is None
    torch.testing.assert_close(wrapped.fc1.weight, frozen, rtol=0, atol=0)
    for m in (model, wrapped):  # unfrozen again: a fresh gradient
        m.fc1.requires_grad_(True)
        m(x).square().sum().backward()
    _grads_match(wrapped, model)
    for (n, p), (_, q) in zip(model.named_parameters(), wrapped.named_parameters()):
        torch.testing.assert_close(q, p, msg=n)


def test_parameter_frozen_at_wrap_then_unfrozen_is_refused():
    torch.manual_seed(0)
    model = MLP()
    model.fc1.weight.requires_grad_(False)
    wrapped = wrap(model, [(3, 16)])
    x = torch.randn(3, 16)
    wrapped(x).sum().backward()
    assert wrapped.fc1.weight.grad is None and wrapped.fc1.bias.grad is not None
    wrapped.fc1.weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"parameter 'fc1\.weight'.*wrap"):
        wrapped(x)
    with torch.no_grad():  # no gradient asked for: runs
        wrapped(x)


class LinearBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def test_new_values_given_by_replacing_tensors_reach_the_engine():
    # p.data = t and module.name = t replace torch's tensor; the engine reads
    # its own memory, so these copy t into it (else: old values, silently)
    torch.manual_seed(0)
    model = LinearBN()
    wrapped = wrap(copy.deepcopy(model), [(8, 16)])
    x = torch.randn(8, 16)
    w, b, mean = torch.randn(32, 16), torch.randn(4), torch.randn(32)
    for m in (model, wrapped):
        m.fc1.weight.data = w.clone()
        m.fc2.bias = torch.nn.Parameter(b.clone())
        m.fc2.weight = torch.nn.Parameter(m.fc2.weight.detach() * 2, requires_grad=False)
        m.bn.running_mean = mean.clone()
    for mode in ("train", "eval"):
        for m in (model, wrapped):
            getattr(m, mode)()
        torch.testing.assert_close(wrapped(x), model(x), msg=mode)
    for m in (model, wrapped):
        m.train()(x).square().sum().backward()
    assert wrapped.fc2.weight.grad is None and not wrapped.fc2.weight.requires_grad
    _grads_match(wrapped, model)
    for (n, t), (_, e) in zip(model.state_dict().items(), wrapped.state_dict().items()):
        torch.testing.assert_close(e, t, msg=n)


def test_replacing_an_engine_tensor_by_another_shape_or_dtype_is_refused():
    torch.manual_seed(0)
    model = LinearBN().eval()
    wrapped = wrap(copy.deepcopy(model), [(8, 16)]).eval()
    x = torch.randn(8, 16)
    before, ptr = wrapped.fc1.weight.detach().clone(), wrapped.fc1.weight.data_ptr()
    with pytest.raises(RuntimeError, match=r"'fc1\.weight'.*float64"):
        wrapped.fc1.weight = torch.nn.Parameter(torch.zeros(32, 16, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"'bn\.running_var'.*NoneType"):
        wrapped.bn.running_var = None
    with pytest.raises(RuntimeError, match=r"'fc1\.bias'.*cannot be deleted"):
        del wrapped.fc1.bias
    with pytest.raises(RuntimeError, match=r"submodule 'fc2'.*wrap the model again"):
        wrapped.fc2 = torch.nn.Linear(32, 4)
    torch.testing.assert_close(wrapped.fc1.weight, before, rtol=0, atol=0)
    # p.data = t is seen at the next forward
    wrapped.fc1.weight.data = torch.zeros(16, 16)
    with pytest.raises(RuntimeError, match=r"'fc1\.weight'.*\(32, 16\).*\(16, 16\)"):
        wrapped(x)
    wrapped.fc1.weight.data = before.clone()  # a shape that fits: the engine's memory again
    torch.testing.assert_close(wrapped(x), model(x))
    assert wrapped.fc1.weight.data_ptr() == ptr


@pytest.mark.parametrize("register", ["register_hook", "register_post_accumulate_grad_hook"])
def test_parameter_gradient_hooks_are_refused_not_skipped(register):
    # the engine writes parameter gradients itself: a hook on one would never
    # run (torch runs it); backward says so
    wrapped = wrap(MLP(), [(3, 16)])
    handle = getattr(wrapped.fc2.bias, register)(lambda t: None)
    with pytest.raises(NotImplementedError, match=r"'fc2\.bias' has a gradient hook"):
        wrapped(torch.randn(3, 16)).sum().backward()
    handle.remove()
    wrapped(torch.randn(3, 16)).sum().backward()
    assert wrapped.fc2.bias.grad is not None


def test_hooks_run_as_on_a_torch_module():
    """AidgeModule.__call__ skips nn.Module's hook machinery only while no
    hook is registered: module and global hooks, input and output gradient
    hooks run as they do on the torch model, and stop once removed."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    wrapped = wrap(copy.deepcopy(model), [(2, 4)])
    x = torch.randn(2, 4)
    with torch.no_grad():
        plain = model(x)
        hooked = torch.nn.functional.linear(2 * x, model.weight, model.bias) + 1
    handles, grads = [], {}
    for name, m in (("torch", model), ("engine", wrapped)):
        handles += [m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,)),
                    m.register_forward_hook(lambda mod, args, out: out + 1),
                    m.register_full_backward_hook(
                        lambda mod, gin, gout, name=name: grads.__setitem__(name, gout[0]))]
    xs = {name: x.clone().requires_grad_() for name in ("torch", "engine")}
    want, got = model(xs["torch"]), wrapped(xs["engine"])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got.detach(), hooked)
    (got * got).sum().backward()
    (want * want).sum().backward()
    torch.testing.assert_close(grads["engine"], grads["torch"])
    torch.testing.assert_close(xs["engine"].grad, xs["torch"].grad)

    seen = []
    g = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: seen.append(type(mod).__name__))
    try:
        with torch.no_grad():
            wrapped(x)
    finally:
        g.remove()
    assert seen == ["AidgeModule"]
    for h in handles:
        h.remove()
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), plain)
        wrapped(x)
    assert seen == ["AidgeModule"]


def test_backward_of_an_older_forward_is_refused():
    wrapped = wrap(Elementwise(), [(2, 16)])
    y1 = wrapped(torch.randn(2, 16))
    wrapped(torch.randn(2, 16))
    with pytest.raises(RuntimeError, match="older forward"):
        y1.sum().backward()


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + self.fc(x)


def test_in_place_change_of_an_output_backward_reads_is_refused():
    # Tanh's backward reads its output: here the output the module returns
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh())
    wrapped = wrap(model, [(2, 16)])
    y = wrapped(torch.randn(2, 16))
    assert wrapped._graph.backward_reads_outputs
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("model_cls", [MLP, Residual])
def test_in_place_change_of_an_output_backward_does_not_read_is_allowed(model_cls):
    # as for torch's own operators: the output is not what backward reads,
    # so the gradients are those of the changed graph, as in torch
    torch.manual_seed(0)
    model = model_cls()
    wrapped = wrap(copy.deepcopy(model), [(2, 16)])
    x = torch.randn(2, 16)
    results = []
    for m in (model, wrapped):
        y = m(x)
        y.mul_(3).add_(1)
        (y * y).sum().backward()
        results.append((y.detach(), [p.grad.clone() for p in m.parameters()]))
    assert not wrapped._graph.backward_reads_outputs
    torch.testing.assert_close(results[1][0], results[0][0])
    for g_engine, g_torch in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(g_engine, g_torch)


class Square(torch.nn.Module):
    def forward(self, x):
        return x * x


class Shift(torch.nn.Module):
    def forward(self, x):
        return x + 1.5


@pytest.mark.parametrize("model_cls", [MulW, Square, lambda: torch.nn.Linear(16, 8)])
@pytest.mark.parametrize("steady", [False, True], ids=["first", "steady"])
def test_in_place_change_of_an_input_backward_reads_is_refused(model_cls, steady):
    # the engine views the caller's input: the backward that reads it (the
    # weight's gradient of x * w or Linear, x * x's) would compute from the
    # changed values; refused as torch refuses it for its own operators,
    # after the first backward (Python) and in the steady state (C) alike
    torch.manual_seed(0)
    model = model_cls()
    wrapped = wrap(copy.deepcopy(model), [(2, 16)])
    for _ in range(3 if steady else 1):
        wrapped(torch.randn(2, 16, requires_grad=True)).sum().backward()
    assert wrapped._graph.backward_reads_inputs
    for m in (model, wrapped):
        x2 = torch.randn(2, 16, requires_grad=True) * 1  # not a leaf: changed in place below
        y = m(x2)
        with torch.no_grad():
            x2.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_in_place_change_of_an_input_backward_does_not_read_is_allowed():
    torch.manual_seed(0)
    model = Shift()
    wrapped = wrap(Shift(), [(2, 16)])
    x0 = torch.randn(2, 16)
    grads = []
    for m in (model, wrapped):
        x = x0.clone().requires_grad_(True)
        x2 = x * 1
        y = m(x2)
        with torch.no_grad():
            x2.add_(1)
        (y * y).sum().backward()
        grads.append(x.grad)
    assert not wrapped._graph.backward_reads_inputs
    torch.testing.assert_close(grads[1], grads[0])


def test_bad_arguments():
    wrapped = wrap(Elementwise(), [(2, 16)])
    with pytest.raises(TypeError, match="Elementwise.forward: too many positional arguments"):
        wrapped(torch.randn(2, 16), torch.randn(2, 16))
    with pytest.raises(TypeError, match="expects float32, got float64"):
        wrapped(torch.randn(2, 16, dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="cannot be moved or cast"):
        wrapped.double()
    with pytest.raises(TypeError, match="input_dims"):
        wrap(Elementwise(), 16)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        wrap(lambda x: x, [(1,)])


def test_model_torch_cannot_export_chains_torch_error():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).real  # no ONNX export for fft in the TorchScript exporter

    with pytest.raises(RuntimeError, match="could not export Bad") as info:
        wrap(Bad(), [(4,)])
    assert info.value.__cause__ is not None


def test_unused_parameter_is_named():
    class Unused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Parameter(torch.ones(3))
            self.spare = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.used

    # as in torch: it stays a parameter, the engine never changes it, its grad stays None
    model = Unused()
    with pytest.warns(UserWarning, match=r"parameter\(s\) \['spare'\] are not in the "):
        engine = wrap(model, [(3,)])
    params = dict(engine.named_parameters())
    assert list(params) == ["used", "spare"]
    x = torch.randn(2, 3)
    for m in (model, engine):
        (m(x) * 2).sum().backward()
    assert params["spare"].grad is None and model.spare.grad is None
    torch.testing.assert_close(params["used"].grad, model.used.grad)
    SGD(engine, lr=0.1).step()
    torch.testing.assert_close(params["spare"], model.spare)


def test_strided_and_expanded_inputs():
    torch.manual_seed(0)
    model = MLP()
    wrapped = wrap(model, [(1, 16)])
    for x in (torch.randn(16, 5).t(), torch.randn(1, 16).expand(4, 16),
              torch.randn(6, 32)[::2, ::2], torch._neg_view(torch.randn(3, 16))):
        torch.testing.assert_close(wrapped(x), model(x))


@pytest.mark.parametrize("layout", ["neg_view", "expanded", "transposed"])
def test_backward_takes_any_grad_output_layout(layout):
    # the fast path (torch's DLPack export, in C) cannot take a lazy negation
    # or an overlapping layout: those go through the converter, same values
    torch.manual_seed(0)
    model = MLP()
    wrapped = wrap(copy.deepcopy(model), [(1, 16)])
    x = torch.randn(4, 16)
    g = {"neg_view": torch._neg_view(torch.randn(4, 4)),
         "expanded": torch.randn(1, 4).expand(4, 4),
         "transposed": torch.randn(4, 4).t()}[layout]
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    for m, xi in zip((wrapped, model), xs):
        m(xi).backward(g)
    torch.testing.assert_close(xs[0].grad, xs[1].grad)
    for (_, p), (_, q) in zip(wrapped.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("layout", ["plain", "neg_view", "expanded", "transposed"])
def test_parameter_free_autograd_takes_any_layout(layout):
    # a model without parameters: its autograd Function calls the graph
    # itself (the fast path inline); inputs and grad outputs the fast path
    # cannot take go through the converter, with the same values
    torch.manual_seed(0)
    model = torch.nn.Tanh()
    wrapped = wrap(copy.deepcopy(model), [(4, 4)])
    make = {"plain": lambda t: t,
            "neg_view": torch._neg_view,
            "expanded": lambda t: t[:1].expand(4, 4),
            "transposed": lambda t: t.t()}[layout]
    base, g = torch.randn(4, 4), make(torch.randn(4, 4))
    xs = [base.clone().requires_grad_(True) for _ in range(2)]
    outs = [m(make(xi)) for m, xi in zip((wrapped, model), xs)]
    torch.testing.assert_close(outs[0], outs[1])
    for out in outs:
        out.backward(g)
    torch.testing.assert_close(xs[0].grad, xs[1].grad)


def test_graph_bridge_arguments():
    from aidge_interop.bridge.wrapping import _BRIDGE

    wrapped = wrap(MLP(), [(1, 16)])
    g = wrapped._graph
    x = torch.randn(2, 16)
    out = g.forward([x], _BRIDGE)
    assert isinstance(out[0], torch.Tensor)
    torch.testing.assert_close(out[0], wrapped(x))
    # an overlapping layout is not viewed: None, nothing run, the caller's slow path
    assert g.forward([torch.randn(1, 16).expand(2, 16)], _BRIDGE) is None
    with pytest.raises(TypeError, match="bridge"):
        g.forward([x], (len,))
    with pytest.raises(TypeError, match="1 or 2 arguments"):
        g.forward()


def test_functorch_transform_is_refused_not_wrong():
    # the engine's autograd bridge has no functorch rule: torch.func must refuse it
    # (the fast apply path falls back to Function.apply under a transform)
    wrapped = wrap(MLP(), [(1, 16)])
    x = torch.randn(2, 16)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda t: wrapped(t).sum())(x)


def test_batchnorm_counters_count_like_torch():
    """num_batches_tracked: +1 per training forward of each BatchNorm (views
    of one tensor, counted in one call), not in eval; state_dict round trips."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 1),
                                torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    with torch.no_grad():  # distinct values: the exporter merges equal initializers
        for bn in (model[1], model[4]):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    model[1].num_batches_tracked.fill_(7)
    wrapped = wrap(copy.deepcopy(model), [(2, 2, 6, 6)])
    x = torch.randn(2, 2, 6, 6)
    for _ in range(3):
        wrapped(x)
        model(x)
    with torch.no_grad():
        wrapped.eval()(x)
    counts = {k: v for k, v in wrapped.state_dict().items() if k.endswith("num_batches_tracked")}
    want = {k: v for k, v in model.state_dict().items() if k.endswith("num_batches_tracked")}
    assert counts.keys() == want.keys() and all(torch.equal(counts[k], want[k]) for k in want)
    assert counts["1.num_batches_tracked"].item() == 10
    model[4].num_batches_tracked.fill_(42)
    wrapped.load_state_dict(model.state_dict())
    assert dict(wrapped.named_buffers())["4.num_batches_tracked"].item() == 42
    assert dict(wrapped.named_buffers())["1.num_batches_tracked"].item() == 10


def test_dropout_is_named_in_a_warning_and_runs_as_the_identity():
    """The exported graph is the inference graph: no Dropout node, so the
    wrapped module's train() output is the eval output; wrap says so."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5),
                                torch.nn.ReLU(), torch.nn.Dropout(0.0), torch.nn.Linear(16, 2))
    with pytest.warns(UserWarning, match=r"1 dropout layer\(s\) with p > 0 \('1'\)"):
        wrapped = wrap(model, [(4, 8)])
    x = torch.randn(4, 8)
    wrapped.train()
    model.eval()
    torch.testing.assert_close(wrapped(x), model(x), rtol=1e-6, atol=1e-6)
    quiet = torch.nn.Sequential(torch.nn.Linear(8, 2), torch.nn.Dropout(0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrap(quiet, [(4, 8)])
