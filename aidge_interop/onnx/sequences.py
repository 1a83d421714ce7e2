"""ONNX sequences at import: their static forms written as tensor operators.

The engine has tensors only. A sequence whose length and items are known
at import (the dynamo exporter's ``split``: ``SplitToSequence`` by sizes
from constants or static shapes, then ``SequenceAt`` of constant
positions) is a list of tensors the importer can follow by name:
``SplitToSequence`` becomes ``Split`` (+ ``Squeeze`` for ``keepdims=0``),
``SequenceAt`` an ``Identity`` of the item, ``ConcatFromSequence`` a
``Concat`` (of ``Unsqueeze``\\ d items for ``new_axis=1``),
``SequenceLength`` a constant; ``SequenceConstruct``, ``SequenceEmpty``,
``SequenceInsert``, ``SequenceErase`` and ``Identity`` only change the list.
A form that needs run-time values (a position or split computed by the
graph, a length along a dynamic dim, a sequence reaching a graph output or
another operator) is refused with the node at fault.
"""
from __future__ import annotations

import numpy as np

from .expand import CONCAT_MAX

__all__ = ["SEQUENCE_OPERATORS", "rewrite_sequences"]

SEQUENCE_OPERATORS = ("SplitToSequence", "SequenceAt", "ConcatFromSequence",
                      "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase",
                      "SequenceLength")


def _is_sequence_op(node) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in SEQUENCE_OPERATORS


def rewrite_sequences(proto, value_dims, where: str):
    """``proto`` with its top-level sequence operators written as tensor
    operators (a copy; ``proto`` itself when it has none).
    ``value_dims(proto)``: value name -> dims by ONNX shape inference (None
    where not static), asked only when a split's number of pieces depends
    on a shape."""
    import onnx

    for inp in proto.graph.input:
        if inp.type.HasField("sequence_type"):
            raise NotImplementedError(f"{where}: graph input '{inp.name}' is a sequence; the "
                                      "engine takes tensors")
    if not any(_is_sequence_op(n) for n in proto.graph.node):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 1)
    nodes = _Rewrite(out.graph, opset, lambda: value_dims(proto), where).run()
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    tensors = [v for v in out.graph.value_info if not v.type.HasField("sequence_type")]
    del out.graph.value_info[:]  # the sequences are gone
    out.graph.value_info.extend(tensors)
    return out


class _Rewrite:
    def __init__(self, graph, opset, dims, where):
        self.graph, self.opset, self.dims, self.where = graph, opset, dims, where
        self.seqs: dict[str, list[str]] = {}  # sequence value -> its items' names
        self.nodes = []
        self.taken = {v for n in graph.node for v in list(n.input) + list(n.output)}
        self.taken |= {v.name for v in list(graph.input) + list(graph.initializer)}
        self.constants = {i.name: i for i in graph.initializer}
        self.shapes = None  # self.dims(), once asked
        self.count = 0

    # -- what the rewrite reads ---------------------------------------------
    def run(self):
        for i, node in enumerate(self.graph.node):
            self.prefix = node.name or f"{node.op_type}_{i}"  # as the importer names it
            self.node_where = f"{self.where}: {node.op_type} node '{self.prefix}'"
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.constants[node.output[0]] = node
            if _is_sequence_op(node):
                getattr(self, node.op_type)(node)
            elif any(x in self.seqs for x in node.input):
                if node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
                    raise NotImplementedError(
                        f"{self.node_where} takes a sequence; the engine runs sequences only "
                        "as lists of tensors known at import (split, item, concat)")
                self.seqs[node.output[0]] = self.seqs[node.input[0]]
            else:
                self.nodes.append(node)
        for o in self.graph.output:
            if o.name in self.seqs:
                raise NotImplementedError(f"{self.where}: graph output '{o.name}' is a "
                                          "sequence; the engine returns tensors (return a "
                                          "tuple of tensors)")
        return self.nodes

    def constant(self, node, k, what):
        """Input ``k`` of ``node`` as an int64 array (None if absent)."""
        import onnx
        from onnx import numpy_helper

        if len(node.input) <= k or not node.input[k]:
            return None
        name = node.input[k]
        source = self.constants.get(name)
        if isinstance(source, onnx.NodeProto):
            attr = next((a for a in source.attribute if a.name in ("value", "value_int",
                                                                   "value_ints")), None)
            source = None if attr is None else onnx.helper.get_attribute_value(attr)
        if source is None:
            raise NotImplementedError(
                f"{self.node_where}: its {what} ('{name}') is computed by the graph; the "
                "engine runs sequences only with positions and splits known at import")
        array = numpy_helper.to_array(source) if isinstance(source, onnx.TensorProto) \
            else np.asarray(source)
        return array.astype(np.int64)

    def items(self, node):
        """The items of the sequence ``node`` takes (its input 0)."""
        name = node.input[0]
        if name not in self.seqs:
            raise NotImplementedError(f"{self.node_where}: sequence '{name}' is not one the "
                                      "importer built (a graph input or a subgraph's)")
        return self.seqs[name]

    def position(self, node, k, n, default, high):
        """The item position input ``k`` gives (``default`` without it),
        made non-negative, within [0, n + high - 1]."""
        pos = self.constant(node, k, "position")
        pos = default if pos is None else int(pos.reshape(-1)[0])
        if pos is None:
            raise ValueError(f"{self.node_where}: it has no position (input {k})")
        if not -n <= pos < n + high:
            raise ValueError(f"{self.node_where}: position {pos} is out of range for a "
                             f"sequence of {n}")
        return pos + n if pos < 0 else pos

    # -- what it writes -----------------------------------------------------
    def name(self, what):
        while True:
            self.count += 1
            name = f"{self.prefix}/{what}_{self.count}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def emit(self, op_type, inputs, outputs=None, **attrs):
        import onnx

        outputs = outputs or [self.name(op_type)]
        self.nodes.append(onnx.helper.make_node(op_type, list(inputs), list(outputs),
                                                name=self.name(op_type + "_node"), **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def const(self, values, scalar=False):
        from onnx import numpy_helper

        array = np.asarray(values, dtype=np.int64)
        return self.emit("Constant", [], value=numpy_helper.from_array(
            array.reshape(()) if scalar else array.reshape(-1)))

    def axes_op(self, op_type, x, axis):
        """Squeeze or Unsqueeze of one axis (an input from opset 13)."""
        if self.opset >= 13:
            return self.emit(op_type, [x, self.const([axis])])
        return self.emit(op_type, [x], axes=[axis])

    def split(self, x, sizes, axis):
        """``x`` split into pieces of ``sizes`` along ``axis``, at most
        CONCAT_MAX outputs per Split node (the engine's limit)."""
        if len(sizes) == 1:
            return [self.emit("Identity", [x])]
        groups = [sizes[i:i + CONCAT_MAX] for i in range(0, len(sizes), CONCAT_MAX)]
        if len(groups) > 1:
            return [p for part, g in zip(self.split(x, [sum(g) for g in groups], axis), groups)
                    for p in self.split(part, g, axis)]
        outs = [self.name("item") for _ in sizes]
        if self.opset >= 13:
            self.emit("Split", [x, self.const(sizes)], outs, axis=axis)
        else:
            self.emit("Split", [x], outs, axis=axis, split=list(sizes))
        return outs

    def concat(self, xs, axis, out):
        """``xs`` concatenated into ``out``, as a tree of Concats of at most
        CONCAT_MAX inputs."""
        while len(xs) > CONCAT_MAX:
            xs = [xs[i] if len(xs[i:i + CONCAT_MAX]) == 1 else
                  self.emit("Concat", xs[i:i + CONCAT_MAX], axis=axis)
                  for i in range(0, len(xs), CONCAT_MAX)]
        self.emit("Concat", xs, [out], axis=axis)

    # -- the operators --------------------------------------------------------
    def SplitToSequence(self, node):
        attrs = {a.name: a.i for a in node.attribute}
        axis, keepdims = attrs.get("axis", 0), attrs.get("keepdims", 1)
        split = self.constant(node, 1, "split")
        if split is not None and split.ndim == 1:
            sizes = [int(s) for s in split]
        else:
            if self.shapes is None:
                self.shapes = self.dims()
            x_dims = self.shapes.get(node.input[0])
            length = x_dims[axis] if x_dims and -len(x_dims) <= axis < len(x_dims) else None
            if length is None:
                raise NotImplementedError(
                    f"{self.node_where}: the number of pieces depends on the length of "
                    f"'{node.input[0]}' along axis {axis}, which is not static (shape "
                    f"{x_dims}); the engine needs it at import")
            step = 1 if split is None else int(split)
            if step < 1:
                raise ValueError(f"{self.node_where}: split {step} is not positive")
            sizes = [min(step, length - i) for i in range(0, length, step)]
        if not sizes:
            raise NotImplementedError(f"{self.node_where}: an empty split; the engine has no "
                                      "empty sequence to take items from")
        items = self.split(node.input[0], sizes, axis)
        if split is None and not keepdims:
            items = [self.axes_op("Squeeze", x, axis) for x in items]
        self.seqs[node.output[0]] = items

    def SequenceAt(self, node):
        items = self.items(node)
        self.emit("Identity", [items[self.position(node, 1, len(items), None, 0)]],
                  [node.output[0]])

    def ConcatFromSequence(self, node):
        attrs = {a.name: a.i for a in node.attribute}
        items = self.items(node)
        if not items:
            raise ValueError(f"{self.node_where}: the sequence is empty")
        axis = attrs["axis"]
        if attrs.get("new_axis", 0):
            items = [self.axes_op("Unsqueeze", x, axis) for x in items]
        self.concat(items, axis, node.output[0])

    def SequenceConstruct(self, node):
        self.seqs[node.output[0]] = list(node.input)

    def SequenceEmpty(self, node):
        self.seqs[node.output[0]] = []

    def SequenceInsert(self, node):
        items = list(self.items(node))
        items.insert(self.position(node, 2, len(items), len(items), 1), node.input[1])
        self.seqs[node.output[0]] = items

    def SequenceErase(self, node):
        items = list(self.items(node))
        if not items:
            raise ValueError(f"{self.node_where}: the sequence is empty")
        del items[self.position(node, 1, len(items), -1, 0)]
        self.seqs[node.output[0]] = items

    def SequenceLength(self, node):
        from onnx import numpy_helper

        self.emit("Constant", [], [node.output[0]],
                  value=numpy_helper.from_array(np.array(len(self.items(node)), np.int64)))
