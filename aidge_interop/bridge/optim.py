"""``SGD``: torch.optim.SGD semantics, one C call per step for all parameters."""
from __future__ import annotations

import torch

from .. import _C
from ..tensor_converter import torch_tensor_to_aidge

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


class _Steady:
    """SGD's cached state between calls: every parameter's gradient (or None)
    and data pointers (``ptrs``: p's and its gradient's, 0 where None), the
    indices, parameters and gradients that are updated, their engine views,
    and their momentum buffers once all exist (else None)."""

    __slots__ = ("grads", "ptrs", "idx", "updated", "zeroed", "pvs", "gvs", "bufs")


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
                    p.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
                raise TypeError(f"SGD: parameter {i} must be a float32, float64, float16 or "
                                f"bfloat16 CPU tensor")
        if lr < 0:
            raise ValueError(f"SGD: invalid learning rate {lr}")
        if momentum < 0 or weight_decay < 0:
            raise ValueError("SGD: momentum and weight_decay must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum requires a momentum and zero dampening")
        self.defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                             weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        self._buffers = [None] * len(self.params)  # momentum buffers (engine Tensors)
        # engine views of each parameter and its gradient, kept across steps:
        # a view keeps its torch memory alive, so a data pointer seen again
        # is the same memory (an AidgeModule's p.grad is the engine's buffer)
        self._views = [None] * len(self.params)
        # the steady state of a training loop (_Steady): every parameter has
        # the gradient tensor (or None) of the last call, checked by one C
        # call (_C.grads_unchanged) instead of the views' keys one by one
        self._steady = None

    def step(self):
        """One update of every parameter that has a gradient, as
        ``torch.optim.SGD`` does: also one that no longer requires grad but
        kept its ``.grad``."""
        # (no torch.no_grad(): no torch operation runs here, the update is C's;
        # the context costs a third of a small model's step)
        d = self.defaults
        st = self._steady_state()
        if d["momentum"] == 0:  # plain SGD (no buffers): one list, kept lean
            if st is not None:
                ps, gs, updated = st.pvs, st.gvs, st.updated
            else:
                ps, gs, updated = [], [], []
                for i, p in enumerate(self.params):
                    if p.grad is not None:
                        pv, gv = self._view(i, p)
                        ps.append(pv)
                        gs.append(gv)
                        updated.append(p)
            if ps:
                _C.sgd_step(ps, gs, None, d["lr"], 0.0, d["dampening"], d["weight_decay"],
                            d["nesterov"], d["maximize"], False)
                _increment_version(updated)
            return
        if st is not None and st.bufs is not None:  # every buffer exists: one call
            if st.pvs:
                _C.sgd_step(st.pvs, st.gvs, st.bufs, d["lr"], d["momentum"], d["dampening"],
                            d["weight_decay"], d["nesterov"], d["maximize"], True)
                _increment_version(st.updated)
            return
        updated = []
        groups = {False: ([], [], []), True: ([], [], [])}  # by "momentum buffer exists"
        for i, p in enumerate(self.params):
            if p.grad is None:
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
        if st is not None:  # the buffers of its parameters exist now
            st.bufs = [self._buffers[i] for i in st.idx]

    def _steady_state(self):
        """The _Steady of the last call while every parameter has the same
        gradient tensor (or None) in the same memory; else a new one when
        every parameter with a gradient requires grad and has it contiguous
        (None when one does not: the full paths then)."""
        st = self._steady
        if st is not None and _C.grads_unchanged(self.params, st.grads, st.ptrs):
            return st
        self._steady = None
        grads = [p.grad for p in self.params]
        idx = [i for i, g in enumerate(grads) if g is not None]
        if not all(grads[i].is_contiguous() for i in idx):
            return None
        st = self._steady = _Steady()
        st.grads, st.idx = grads, idx
        st.ptrs = [0] * (2 * len(grads))
        for i in idx:
            st.ptrs[2 * i], st.ptrs[2 * i + 1] = self.params[i].data_ptr(), grads[i].data_ptr()
        views = [self._view(i, self.params[i]) for i in idx]
        st.updated = [self.params[i] for i in idx]
        st.zeroed = [grads[i] for i in idx]
        st.pvs, st.gvs = [v[0] for v in views], [v[1] for v in views]
        bufs = [self._buffers[i] for i in idx]
        st.bufs = bufs if all(b is not None for b in bufs) else None
        return st

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
            self._steady = None  # (its references would keep the old gradients alive)
        st = None if set_to_none else self._steady_state()
        if st is not None:
            if st.gvs:
                _C.zero_tensors(st.gvs)
                _increment_version(st.zeroed)
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
