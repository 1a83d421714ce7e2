"""An ONNX backend (``onnx.backend.base.Backend``) running on the engine, so
that ONNX's own backend node tests run against it::

    from aidge_interop import backend
    outputs = backend.run_model(model, [x])
    rep = backend.prepare(model); rep.run([x])
"""
from __future__ import annotations

import numpy as np
from onnx import ModelProto, helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from .functions import expand_functions
from .importer import load_onnx, supported_operators
from .sequences import item_name

__all__ = ["AidgeBackend", "AidgeBackendRep", "prepare", "run_model", "run_node",
           "supports_device", "is_compatible"]


def _is_sequence(value_info) -> bool:
    """A sequence, or an optional one (present: the engine runs optionals
    known at import)."""
    t = value_info.type
    return t.HasField("sequence_type") or (t.HasField("optional_type") and
                                           t.optional_type.elem_type.HasField("sequence_type"))


class AidgeBackendRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns the outputs as NumPy arrays
    (a list of them for a sequence output).

    A model with sequence inputs or outputs is imported when it runs, for
    the lengths of the lists it is given and the values of its small integer
    inputs (a split, a position: the engine runs sequences of a form known
    at import), once per set of them."""

    def __init__(self, model):
        self.model = model
        self.sequences = False
        if isinstance(model, ModelProto):  # (a path or bytes: imported as it is)
            inits = {i.name for i in model.graph.initializer}
            self.inputs = [i for i in model.graph.input if i.name not in inits]
            self.sequences = any(map(_is_sequence, self.inputs + list(model.graph.output)))
        self.graph = None if self.sequences else load_onnx(model)
        self._graphs = {}

    def run(self, inputs, **kwargs):
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        inputs = list(inputs)
        if not self.sequences:
            return self.graph.forward(inputs)
        if len(inputs) != len(self.inputs):
            raise ValueError(f"run: the model has {len(self.inputs)} inputs, got {len(inputs)}")
        lengths = {i.name: len(x) for i, x in zip(self.inputs, inputs) if _is_sequence(i)}
        known = {i.name: np.asarray(x) for i, x in zip(self.inputs, inputs)
                 if not _is_sequence(i) and np.asarray(x).dtype.kind in "iub"
                 and np.asarray(x).size <= 64}
        key = (tuple(sorted(lengths.items())),
               tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(known.items())))
        if key not in self._graphs:
            model = ModelProto()
            model.CopyFrom(self.model)
            model.graph.initializer.extend(numpy_helper.from_array(v, k)
                                           for k, v in known.items())
            self._graphs[key] = load_onnx(model, sequence_lengths=lengths,
                                          param_kinds=dict.fromkeys(known, "const"))
        flat = [y for i, x in zip(self.inputs, inputs) if i.name not in known
                for y in (x if _is_sequence(i) else [x])]
        outs = dict(zip(self._graphs[key].output_names, self._graphs[key].forward(flat)))
        result = []
        for o in self.model.graph.output:
            if not _is_sequence(o):
                result.append(outs[o.name])
                continue
            items, i = [], 0
            while item_name(o.name, i) in outs:
                items.append(outs[item_name(o.name, i)])
                i += 1
            result.append(items)
        return result


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
        return AidgeBackendRep(model)

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
