"""An ONNX backend (``onnx.backend.base.Backend``) running on the engine, so
that ONNX's own backend node tests run against it::

    from aidge_interop import backend
    outputs = backend.run_model(model, [x])
    rep = backend.prepare(model); rep.run([x])
"""
from __future__ import annotations

import numpy as np
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from .functions import expand_functions
from .importer import load_onnx, supported_operators

__all__ = ["AidgeBackend", "AidgeBackendRep", "prepare", "run_model", "run_node",
           "supports_device", "is_compatible"]


class AidgeBackendRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns the outputs as NumPy arrays."""

    def __init__(self, graph):
        self.graph = graph

    def run(self, inputs, **kwargs):
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        return self.graph.forward(list(inputs))


class AidgeBackend(Backend):
    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        """Whether the engine has every operator of the graph's top level,
        or ONNX defines it by a function whose body's it has."""
        ops = supported_operators()
        opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
        opsets.setdefault("ai.onnx", 1)
        try:
            model, _ = expand_functions(model, opsets, lambda d, op: op in ops, "is_compatible")
        except (NotImplementedError, ValueError):  # a body uses an operator the engine lacks
            return False
        return cls.supports_device(device) and all(
            n.op_type in ops or n.op_type == "Constant" for n in model.graph.node)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> AidgeBackendRep:
        if not cls.supports_device(device):
            raise NotImplementedError(f"aidge_interop runs on the CPU, not on {device}")
        return AidgeBackendRep(load_onnx(model))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """Runs one node on the given inputs (NumPy arrays, in node input order)."""
        names = [n for n in node.input if n]
        if len(names) != len(inputs):
            raise ValueError(f"run_node: node has {len(names)} inputs, got {len(inputs)}")
        g_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype),
                                                  np.asarray(x).shape)
                    for n, x in zip(names, inputs)]
        g_outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        opset = kwargs.get("opset_version")
        model = helper.make_model(
            helper.make_graph([node], "run_node", g_inputs, g_outputs),
            opset_imports=[helper.make_opsetid("", opset)] if opset else None)
        return cls.run_model(model, [np.asarray(x) for x in inputs], device)


prepare = AidgeBackend.prepare
run_model = AidgeBackend.run_model
run_node = AidgeBackend.run_node
supports_device = AidgeBackend.supports_device
is_compatible = AidgeBackend.is_compatible
