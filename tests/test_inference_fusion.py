"""Fused inference: an AidgeModule in eval mode without backward runs a
second graph where each Conv/Gemm applies the BatchNorm after it and its
activation, on the module's own weights. Its
outputs must match torch's eval forward, and it must never be stale: every
way a parameter or buffer changes is followed by an eval forward compared
with the equally-changed torch model."""
import copy

import numpy as np
import pytest
import torch

from aidge_interop import SGD, wrap
from aidge_interop.examples import EXAMPLES
from models import anomaly_model, mobilenet_model

TOL = dict(rtol=1e-5, atol=1e-6)


class ConvBN(torch.nn.Module):
    """Conv -> BatchNorm -> ReLU -> Flatten -> Linear: the BatchNorm folds."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))


def _pair(seed=0, batch_counter=True):
    torch.manual_seed(seed)
    model = ConvBN()
    with torch.no_grad():  # statistics that matter in eval
        model.bn.running_mean.normal_(0, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(0.5, 1.5)
    if not batch_counter:  # no num_batches_tracked, whose add_ torch would see
        model.bn.num_batches_tracked = None
    wrapped = wrap(copy.deepcopy(model), [(3, 2, 6, 6)])
    return model.eval(), wrapped.eval()


def _eval(model, x):
    with torch.no_grad():
        return model(x)


def _assert_fused_matches(model, wrapped, x):
    out = _eval(wrapped, x)
    assert wrapped.memory_stats()["last_graph"] == "inference"
    torch.testing.assert_close(out, _eval(model, x), **TOL)


MODELS = {  # name: (factory of a seeded model, input shape)
    **{name: (lambda f=f: f(seed=1), shape) for name, (f, shape, _) in EXAMPLES.items()},
    "suite_anomaly": (anomaly_model.anomaly_autoencoder, (2, 640)),
    "suite_mobilenet": (mobilenet_model.mobilenet_v1, (2, 3, 96, 96)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_fused_eval_matches_torch(name):
    """Example and suite models: the eval forward matches torch's, on the
    fused graph exactly when the model has a BatchNorm to fold."""
    factory, shape = MODELS[name]
    model = factory().eval()
    wrapped = wrap(copy.deepcopy(model), [shape]).eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(_eval(wrapped, x), _eval(model, x), **TOL)
    stats = wrapped.memory_stats()
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert stats["last_graph"] == ("inference" if has_bn else "main")
    if has_bn:  # fewer nodes planned than in the main graph: BatchNorms folded
        _eval(wrapped.requires_grad_(False).train(), x)  # the main graph, no backward
        assert wrapped.memory_stats()["last_graph"] == "main"
        assert stats["inference"]["planned_nodes"] < wrapped.memory_stats()["planned_nodes"]
        # and the activation after a (folded) Conv/Gemm fused into it
        assert {n["op_type"] for n in wrapped._fused.nodes()} & {"FusedConv", "FusedGemm"}
    else:
        assert stats["inference"] is None


# the optimizer steps follow an eval-mode forward and backward (on the main
# graph), which change nothing themselves: only the step can invalidate

def _torch_sgd(model, wrapped, x):
    for m in (model, wrapped):
        torch.nn.functional.mse_loss(m(x), torch.ones(3, 3)).backward()
        torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9).step()


def _torch_fused_adam(model, wrapped, x):  # its step bumps no version counter
    for m in (model, wrapped):
        torch.nn.functional.mse_loss(m(x), torch.ones(3, 3)).backward()
        torch.optim.Adam(m.parameters(), lr=0.1, fused=True).step()


def _engine_sgd(model, wrapped, x, momentum=0.0):
    torch.nn.functional.mse_loss(model(x), torch.ones(3, 3)).backward()
    torch.optim.SGD(model.parameters(), lr=0.5, momentum=momentum).step()
    torch.nn.functional.mse_loss(wrapped(x), torch.ones(3, 3)).backward()
    assert wrapped.memory_stats()["last_graph"] == "main"
    SGD(wrapped, lr=0.5, momentum=momentum).step()


def _inplace(model, wrapped, x):
    with torch.no_grad():
        for m in (model, wrapped):
            m.conv.weight.mul_(-1.5)
            m.bn.running_var.add_(1.0)


def _data_copy(model, wrapped, x):
    new = torch.randn_like(model.conv.weight)
    for m in (model, wrapped):
        m.conv.weight.data.copy_(new)
        m.fc.bias.data -= 1.0


def _load_state_dict(model, wrapped, x):
    other = _pair(seed=7)[0]
    for m in (model, wrapped):
        m.load_state_dict(other.state_dict())


def _train_forward(model, wrapped, x):
    for m in (model, wrapped):  # BatchNorm running statistics move, no backward
        m.train()
        _eval(m, x * 3 + 1)
        m.eval()


def _numpy_write(model, wrapped, x):  # behind torch's back: no version counter moves
    for m in (model, wrapped):
        m.bn.bias.detach().numpy()[:] = 2.0
        m.bn.running_mean.numpy()[:1] = -1.0


CHANGES = {
    "torch_sgd": _torch_sgd,
    "torch_fused_adam": _torch_fused_adam,
    "engine_sgd": _engine_sgd,
    "engine_sgd_momentum": lambda m, w, x: _engine_sgd(m, w, x, momentum=0.9),
    "inplace_no_grad": _inplace,
    "data_copy": _data_copy,
    "load_state_dict": _load_state_dict,
    "train_forward_bn_stats": _train_forward,
    "numpy_write": _numpy_write,
}


@pytest.mark.parametrize("change", [*CHANGES, "train_forward_without_batch_counter"])
def test_fused_graph_is_never_stale(change):
    model, wrapped = _pair(batch_counter=change != "train_forward_without_batch_counter")
    x = torch.randn(3, 2, 6, 6, generator=torch.Generator().manual_seed(5))
    _assert_fused_matches(model, wrapped, x)  # the fused graph exists now
    fused = wrapped._fused
    before = _eval(model, x)
    CHANGES.get(change, _train_forward)(model, wrapped, x)
    after = _eval(model, x)
    assert not torch.allclose(before, after, **TOL)  # the change shows in the output
    _assert_fused_matches(model, wrapped, x)
    assert wrapped._fused is fused  # the same graph: it reads the values in place


def test_fused_graph_shares_the_weights():
    """No second copy: the fused graph's parameters and buffers are the
    module's memory."""
    model, wrapped = _pair()
    _assert_fused_matches(model, wrapped, torch.randn(3, 2, 6, 6))
    for name, t in [*wrapped.named_parameters(), *wrapped.named_buffers()]:
        if name.endswith("num_batches_tracked"):
            continue
        view = wrapped._fused.value(name).numpy()
        assert view.__array_interface__["data"][0] == t.data_ptr(), name


def test_add_initializer_share():
    """share=True: the graph reads the tensor's memory (a later write shows),
    and a tensor it would have to copy is refused, not silently copied."""
    from aidge_interop import Tensor, _C

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = _C.Graph()
    t = Tensor(a)
    g.add_initializer("w", t, "buffer", True)
    t.numpy()[0, 0] = 42.0
    assert g.value("w").numpy()[0, 0] == 42.0
    with pytest.raises(ValueError, match="'v'.*contiguous, writable"):
        g.add_initializer("v", Tensor(a.T), "buffer", True)


def test_unchanged_values_keep_the_fused_graph():
    model, wrapped = _pair()
    x = torch.randn(3, 2, 6, 6)
    _assert_fused_matches(model, wrapped, x)
    fused = wrapped._fused
    wrapped.train()  # switching modes and eval forwards change nothing
    wrapped.eval()
    _eval(wrapped, x)
    _ = list(wrapped.parameters()), wrapped.state_dict()
    _eval(wrapped, x)
    assert wrapped._fused is fused


def test_input_shape_changes_replan_the_fused_graph():
    model, wrapped = _pair()
    for batch in (3, 1, 8, 3):
        x = torch.randn(batch, 2, 6, 6)
        _assert_fused_matches(model, wrapped, x)


def test_backward_and_train_mode_use_the_main_graph():
    model, wrapped = _pair()
    x = torch.randn(3, 2, 6, 6)
    out = wrapped(x)  # eval, grad enabled, parameters require grad: backward possible
    assert wrapped.memory_stats()["last_graph"] == "main"
    out.sum().backward()
    model(x).sum().backward()
    torch.testing.assert_close(wrapped.conv.weight.grad, model.conv.weight.grad, **TOL)
    xi = x.clone().requires_grad_(True)  # no_grad wins over an input that requires grad
    with torch.no_grad():
        wrapped(xi)
    assert wrapped.memory_stats()["last_graph"] == "inference"
    wrapped.train()
    _eval(wrapped, x)
    assert wrapped.memory_stats()["last_graph"] == "main"


def test_frozen_parameters_run_fused_with_grad_enabled():
    model, wrapped = _pair()
    wrapped.requires_grad_(False)
    x = torch.randn(3, 2, 6, 6)
    out = wrapped(x)
    assert wrapped.memory_stats()["last_graph"] == "inference"
    torch.testing.assert_close(out, _eval(model, x), **TOL)


def test_opt_out():
    torch.manual_seed(0)
    model = ConvBN().eval()
    x = torch.randn(3, 2, 6, 6)
    wrapped = wrap(copy.deepcopy(model), [(3, 2, 6, 6)], fuse_inference=False).eval()
    assert wrapped.fuse_inference is False
    torch.testing.assert_close(_eval(wrapped, x), _eval(model, x), **TOL)
    stats = wrapped.memory_stats()
    assert stats["inference"] is None and stats["last_graph"] == "main"
    wrapped.fuse_inference = True  # and back on, per module
    _assert_fused_matches(model, wrapped, x)
    wrapped.fuse_inference = False
    _eval(wrapped, x)
    assert wrapped.memory_stats()["last_graph"] == "main"
    assert wrapped._fused is False


@pytest.mark.parametrize("model", [
    torch.nn.Linear(16, 16),
    torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 16))])
def test_nothing_to_fuse_keeps_one_graph(model):
    model.eval()
    wrapped = wrap(copy.deepcopy(model), [(1, 16)]).eval()
    x = torch.randn(5, 16)
    torch.testing.assert_close(_eval(wrapped, x), _eval(model, x), **TOL)
    stats = wrapped.memory_stats()
    assert stats["inference"] is None and stats["last_graph"] == "main"
    assert wrapped._fused is False  # decided once: never built again
    with torch.no_grad():
        for m in (model, wrapped):
            next(m.parameters()).mul_(2)
    torch.testing.assert_close(_eval(wrapped, x), _eval(model, x), **TOL)
    assert wrapped._fused is False


def test_fused_outputs_do_not_alias_the_main_graph():
    """An eval output stays valid across a train-mode forward of the main graph
    only as long as the engine keeps it: here the two graphs are separate, so
    the fused output is not overwritten by the main graph."""
    model, wrapped = _pair()
    x = torch.randn(3, 2, 6, 6)
    fused_out = _eval(wrapped, x)
    kept = fused_out.clone()
    wrapped.requires_grad_(False).train()
    _eval(wrapped, x + 1)
    assert np.array_equal(fused_out.numpy(), kept.numpy())


def test_a_graph_that_cannot_be_fused_warns_and_runs_the_main_graph(monkeypatch):
    from aidge_interop import recipes

    def broken(graph):
        raise ValueError("recipe failed on purpose")

    monkeypatch.setitem(recipes.RECIPES, "batchnorm_epilogue", broken)
    model, wrapped = _pair()
    x = torch.randn(3, 2, 6, 6)
    with pytest.warns(RuntimeWarning, match="ConvBN.*recipe failed on purpose"):
        out = _eval(wrapped, x)
    torch.testing.assert_close(out, _eval(model, x), **TOL)
    assert wrapped.memory_stats()["last_graph"] == "main"
    assert wrapped._fused is False  # not tried again


@pytest.mark.parametrize("conv,shape", [
    (lambda: torch.nn.Conv1d(4, 8, 3, stride=2), (1, 4, 3)),       # one output position
    (lambda: torch.nn.Conv1d(4, 4, 5, 2, 1, dilation=2), (3, 4, 8)),
    (lambda: torch.nn.Conv2d(4, 4, 3), (3, 4, 3, 3)),
    (lambda: torch.nn.Conv2d(16, 16, (3, 2)), (1, 16, 3, 3)),      # 2 positions
    (lambda: torch.nn.Conv2d(4, 8, 1), (3, 4, 1, 1)),
    (lambda: torch.nn.Conv2d(8, 8, 3, 2, 1, groups=8), (2, 8, 2, 2)),
])
@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_epilogue_on_tiny_outputs(conv, shape, relu):
    """Outputs smaller than the BatchNorm factors (a few positions per
    image, small batches): the conv's workspace must not overlap the factors
    the epilogue reads (it did: results were wrong by O(1))."""
    torch.manual_seed(3)
    c = conv()
    bn = (torch.nn.BatchNorm1d if len(shape) == 3 else torch.nn.BatchNorm2d)(c.out_channels)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(-2, 2)
    model = torch.nn.Sequential(c, bn, *([torch.nn.ReLU()] if relu else [])).eval()
    x = torch.randn(shape)
    am = wrap(copy.deepcopy(model), [shape]).eval()
    with torch.no_grad():
        np.testing.assert_allclose(am(x).numpy(), model(x).numpy(), **TOL)
    assert am._fused, "the fused inference graph did not run"
