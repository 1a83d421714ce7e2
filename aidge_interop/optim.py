"""``SGD``: torch.optim.SGD semantics, one C call per step for all parameters."""
from __future__ import annotations

import torch

from . import _C
from .tensor_converter import torch_tensor_to_aidge

__all__ = ["SGD"]

# the update writes the parameters' memory in C: tell torch, like its own
# in-place ops do (autograd's checks, AidgeModule's fused inference graph).
# torch.autograd.graph.increment_version is a Python wrapper around
# torch._C._increment_version, which takes a list (where it does not: the wrapper)
_increment_version = torch.autograd.graph.increment_version
try:
    torch._C._increment_version([torch.empty(0)])
    _increment_version = torch._C._increment_version
except (AttributeError, TypeError):
    pass


class SGD:
    """Stochastic gradient descent computed by the engine.

    ``SGD(params_or_module, lr, momentum=0, dampening=0, weight_decay=0,
    nesterov=False, maximize=False)`` — the same arguments and update as
    ``torch.optim.SGD``. Works on any torch parameters (an AidgeModule's are
    the engine's own memory): the update runs in C, in place, GIL released,
    and bumps the updated parameters' version counters like a torch in-place
    op.
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("SGD: got an empty parameter list")
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor) or p.device.type != "cpu" or \
                    p.dtype not in (torch.float32, torch.float64):
                raise TypeError(f"SGD: parameter {i} must be a float32/float64 CPU tensor")
        if lr < 0:
            raise ValueError(f"SGD: invalid learning rate {lr}")
        if momentum < 0 or weight_decay < 0:
            raise ValueError("SGD: momentum and weight_decay must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum requires a momentum and zero dampening")
        self.defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                             weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        self._buffers = [None] * len(self.params)  # momentum buffers (engine Tensors)
        self._all_started = False
        # engine views of each parameter and its gradient, kept across steps:
        # a view keeps its torch memory alive, so a data pointer seen again
        # is the same memory (an AidgeModule's p.grad is the engine's buffer)
        self._views = [None] * len(self.params)
        # the steady state of a training loop, where every parameter has its
        # gradient tensor of the last step: (params, grads, their data
        # pointers, param views, grad views), checked by one C call
        # (_C.grads_unchanged) instead of the views' keys one by one
        self._fast = None

    def step(self):
        """One update of every parameter that has a gradient."""
        # (no torch.no_grad(): no torch operation runs here, the update is C's;
        # the context costs a third of a small model's step)
        d = self.defaults
        if d["momentum"] == 0:  # plain SGD (no buffers): one list, kept lean
            fast = self._fast_views()
            if fast is not None:
                ps, gs, updated = fast[3], fast[4], fast[0]
            else:
                ps, gs, updated = [], [], []
                for i, p in enumerate(self.params):
                    if p.grad is not None and p.requires_grad:
                        pv, gv = self._view(i, p)
                        ps.append(pv)
                        gs.append(gv)
                        updated.append(p)
            if ps:
                _C.sgd_step(ps, gs, None, d["lr"], 0.0, d["dampening"], d["weight_decay"],
                            d["nesterov"], d["maximize"], False)
                _increment_version(updated)
            return
        fast = self._fast_views()
        if fast is not None and self._all_started:  # every buffer exists: one call
            _C.sgd_step(fast[3], fast[4], self._buffers, d["lr"], d["momentum"],
                        d["dampening"], d["weight_decay"], d["nesterov"], d["maximize"], True)
            _increment_version(fast[0])
            return
        updated = []
        groups = {False: ([], [], []), True: ([], [], [])}  # by "momentum buffer exists"
        for i, p in enumerate(self.params):
            if p.grad is None or not p.requires_grad:
                continue
            started = self._buffers[i] is not None
            if not started:
                self._buffers[i] = _C.zeros(tuple(p.shape), str(p.dtype).removeprefix("torch."))
            ps, gs, bs = groups[started]
            updated.append(p)
            pv, gv = self._view(i, p)
            ps.append(pv)
            gs.append(gv)
            bs.append(self._buffers[i])
        for started, (ps, gs, bs) in groups.items():
            if ps:
                _C.sgd_step(ps, gs, bs, d["lr"],
                            d["momentum"], d["dampening"], d["weight_decay"], d["nesterov"],
                            d["maximize"], started)
        _increment_version(updated)
        self._all_started = all(b is not None for b in self._buffers)

    def _fast_views(self):
        """The cached ``(params, grads, pointers, param views, grad views)``
        while every parameter requires grad and has the same contiguous
        gradient tensor, in the same memory, as when it was cached; else
        rebuilt when that holds now (None when it does not)."""
        fast = self._fast
        if fast is not None and _C.grads_unchanged(fast[0], fast[1], fast[2]):
            return fast
        self._fast = None
        grads = [p.grad for p in self.params]
        if any(g is None or not g.is_contiguous() for g in grads) or \
                not all(p.requires_grad for p in self.params):
            return None
        views = [self._view(i, p) for i, p in enumerate(self.params)]
        ptrs = [ptr for p, g in zip(self.params, grads) for ptr in (p.data_ptr(), g.data_ptr())]
        self._fast = (self.params, grads, ptrs, [v[0] for v in views],
                      [v[1] for v in views])
        return self._fast

    def _view(self, i, p):
        g = p.grad
        key = (p.data_ptr(), g.data_ptr(), g.is_contiguous())
        cached = self._views[i]
        if cached is not None and cached[0] == key and key[2]:
            return cached[1]
        views = (torch_tensor_to_aidge(p), torch_tensor_to_aidge(g.contiguous()))
        self._views[i] = (key, views)
        return views

    def zero_grad(self, set_to_none: bool = False):
        """Zeroes gradients in place (keeps an AidgeModule's p.grad the engine's
        buffer); ``set_to_none=True`` drops them like torch."""
        # contiguous gradients are zeroed by the engine (their cached views),
        # not by torch: torch's zero_ on a large gradient runs an OpenMP
        # region, whose threads then spin on the cores the engine's next
        # call needs (a ResNet-8 training step on 2 threads: 22.5 -> 19.1 ms)
        if set_to_none:
            self._fast = None  # (its references would keep the old gradients alive)
        fast = None if set_to_none else self._fast_views()
        if fast is not None:
            _C.zero_tensors(fast[4])
            _increment_version(fast[1])
            return
        views, zeroed = [], []
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            if set_to_none:
                p.grad = None
            elif g.is_contiguous():
                views.append(self._view(i, p)[1])
                zeroed.append(g)
            else:
                g.zero_()
        if views:
            _C.zero_tensors(views)
            _increment_version(zeroed)
