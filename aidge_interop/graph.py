"""The engine's graph, as loaded by :func:`aidge_interop.load_onnx`.

A thin wrapper over ``_C.Graph``: every call below is one C call.
"""
from __future__ import annotations

import numpy as np

from . import _C
from ._C import Tensor

__all__ = ["Graph"]


def _as_tensor(x, where):
    if isinstance(x, Tensor):
        return x
    if x is None:  # (an empty optional: load_onnx takes optional inputs as present)
        raise TypeError(f"{where}: None is not a tensor (an optional graph input must be "
                        "present)")
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        from .tensor_converter import torch_tensor_to_aidge

        return torch_tensor_to_aidge(x)
    try:
        return Tensor(np.asarray(x))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def _replan_input(t: Tensor) -> np.ndarray:
    """Zeros of t's shape and dtype; small integer inputs (shapes, axes: read
    at plan time) keep their values."""
    if t.dtype.startswith("int") and t.numel <= 64:
        return np.array(t.numpy(), copy=True)
    return np.zeros(t.shape, dtype=t.dtype)


class Graph:
    """A computation graph of the engine.

    ``forward(inputs)`` and ``backward(grad_outputs)`` take NumPy arrays,
    torch tensors or engine Tensors (one per graph input / output) and return
    NumPy arrays. Set ``training`` for BatchNorm batch statistics and
    Dropout, ``keep_intermediates`` to inspect every value after a forward.
    """

    def __init__(self, cgraph: _C.Graph, proto=None):
        self._g = cgraph
        self.proto = proto  # the ONNX model it was loaded from (recipes do not change it)
        self.history = []  # reports of the recipes applied (aidge_interop.recipes)
        self._last_inputs = None  # what the last forward was planned for

    # -- running ---------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return self._g.input_names

    @property
    def output_names(self) -> list[str]:
        return self._g.output_names

    training = property(lambda self: self._g.training,
                        lambda self, v: setattr(self._g, "training", bool(v)))
    keep_intermediates = property(lambda self: self._g.keep_intermediates,
                                  lambda self, v: setattr(self._g, "keep_intermediates", bool(v)))

    def _inputs(self, inputs):
        if isinstance(inputs, dict):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise ValueError(f"forward: missing inputs {missing}")
            inputs = [inputs[n] for n in self.input_names]
        elif not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"forward: the graph takes {len(self.input_names)} inputs "
                f"({', '.join(self.input_names)}), got {len(inputs)}"
            )
        return [_as_tensor(x, f"input '{n}'") for x, n in zip(inputs, self.input_names)]

    def forward(self, inputs, *, need_backward: bool = False, input_grads: bool = False):
        """Runs the graph; returns the outputs as NumPy arrays."""
        self._g.need_backward = bool(need_backward or input_grads)
        self._g.input_grads = bool(input_grads)
        tensors = self._inputs(inputs)
        outs = self._g.forward(tensors)
        self._last_inputs = [_replan_input(t) for t in tensors]
        return [o.numpy() for o in outs]

    __call__ = forward

    def backward(self, grad_outputs):
        """Backward from output gradients (None = zero); returns input gradients.

        Needs a forward with ``need_backward=True``. Parameter gradients
        accumulate (see :meth:`grads`, :meth:`zero_grad`).
        """
        if not isinstance(grad_outputs, (list, tuple)):
            grad_outputs = [grad_outputs]
        gs = [None if g is None else _as_tensor(g, "grad_output") for g in grad_outputs]
        # an input whose gradient is an output's unchanged (Add) gets the
        # caller's tensor from the engine: here an array of its own
        return [None if g is None else g.numpy().copy() if any(g is x for x in gs)
                else g.numpy() for g in self._g.backward(gs)]

    def _after_edit(self, report) -> None:
        """After a recipe: keeps its report and, when the graph ran before,
        plans it again for the last input shapes (one eval forward on zeros:
        no state changes), so that nodes() has shapes."""
        self.history.append(report)
        if self._last_inputs is None:
            return
        g = self._g  # an eval forward: no BatchNorm statistics updated, no Dropout drawn
        saved = g.training, g.need_backward, g.input_grads
        g.training = g.need_backward = g.input_grads = False
        try:
            g.forward([Tensor(x) for x in self._last_inputs])
        except Exception as exc:
            raise RuntimeError(f"{report.recipe}: the rewritten graph does not run on the "
                               f"last input shapes: {exc}") from exc
        finally:
            g.training, g.need_backward, g.input_grads = saved

    def visualize(self, path=None, title: str | None = None, comparison=None):
        """A picture of the graph: every node with its op type, name and
        output shape, parameters folded into their node, fused and quantized
        nodes marked, the recipes applied listed. ``comparison``: a result of
        :func:`aidge_interop.locate`, a :class:`~aidge_interop.testing.ModelTester`
        that ran, or a mapping value name -> error, to colour nodes by error.

        With ``path`` (``.svg``, or ``.html`` with the SVG inline) writes it
        there and returns the path; without, returns the picture (a
        :class:`~aidge_interop.visualize.Picture`, SVG text that a notebook
        shows inline). See :mod:`aidge_interop.visualize`."""
        from .visualize import Picture, visualize

        if path is None:
            return Picture(self, title=title, comparison=comparison)
        return visualize(self, path, title=title, comparison=comparison)

    def _repr_svg_(self):
        """Jupyter shows the graph inline: the picture of :meth:`visualize`."""
        from .visualize import render

        return render(self)[0]

    def zero_grad(self):
        self._g.zero_grad()

    # -- inspection ------------------------------------------------------
    def _values(self, kind):
        return [v["name"] for v in self._g.values() if v["kind"] == kind]

    def parameters(self) -> dict[str, np.ndarray]:
        """Trainable parameters: name -> NumPy view of the engine's memory."""
        return {n: self._g.value(n).numpy() for n in self._values("param")}

    def buffers(self) -> dict[str, np.ndarray]:
        """Non-trainable state (BatchNorm running statistics)."""
        return {n: self._g.value(n).numpy() for n in self._values("buffer")}

    def grads(self) -> dict[str, np.ndarray]:
        """Parameter gradients: name -> NumPy view of the engine's memory."""
        return {n: self._g.grad(n).numpy() for n in self._values("param")}

    def nodes(self) -> list[dict]:
        """Every node: name, op_type, domain, opset, attrs, inputs and outputs
        with their (dtype, shape) after the last planning (None before)."""
        meta = {v["name"]: v["meta"] for v in self._g.values()}
        out = []
        for n in self._g.nodes():
            n = dict(n)
            n["input_shapes"] = [meta.get(i) and meta[i][1] for i in n["inputs"]]
            n["output_shapes"] = [meta.get(o) and meta[o][1] for o in n["outputs"]]
            out.append(n)
        return out

    def intermediate(self, name: str) -> np.ndarray:
        """A copy of any value after the last forward (set ``keep_intermediates``
        before forward to keep values whose buffers would be reused)."""
        return self._g.intermediate(name).numpy()

    def memory_stats(self) -> dict:
        """Bytes of the current memory plan (``peak_bytes`` = activations,
        gradients, saved state and workspace)."""
        return self._g.memory_stats()

    def summary(self) -> str:
        """One line: the nodes by op type, the inputs (with the dims the model
        declares), the outputs, and the parameters."""
        ops = {}
        for n in self._g.nodes():
            ops[n["op_type"]] = ops.get(n["op_type"], 0) + 1
        declared = {}
        if self.proto is not None:
            for v in self.proto.graph.input:
                dims = v.type.tensor_type.shape.dim
                declared[v.name] = "x".join(str(d.dim_value) if d.HasField("dim_value")
                                            else d.dim_param or "?" for d in dims)
        ins = ", ".join(f"'{n}'" + (f" {declared[n]}" if declared.get(n) else "")
                        for n in self.input_names)
        params = self.parameters()
        return (f"{sum(ops.values())} nodes ({', '.join(f'{k} {c}' for k, c in ops.items())}); "
                f"inputs {ins}; outputs {', '.join(map(repr, self.output_names))}; "
                f"{sum(p.size for p in params.values())} parameters in {len(params)} tensors")

    def __repr__(self):
        return (f"Graph({len(self._g.nodes())} nodes, inputs={self.input_names}, "
                f"outputs={self.output_names})")
