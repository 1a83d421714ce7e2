"""ONNX sequences at import: their static forms written as tensor operators.

The engine has tensors only. A sequence whose length and items are known
at import (the dynamo exporter's ``split``: ``SplitToSequence`` by sizes
from constants or static shapes, then ``SequenceAt`` of constant
positions) is a list of tensors the importer can follow by name:
``SplitToSequence`` becomes ``Split`` (+ ``Squeeze`` for ``keepdims=0``),
``SequenceAt`` an ``Identity`` of the item, ``ConcatFromSequence`` a
``Concat`` (of ``Unsqueeze``\\ d items for ``new_axis=1``),
``SequenceLength`` a constant; ``SequenceConstruct``, ``SequenceEmpty``,
``SequenceInsert``, ``SequenceErase`` and ``Identity`` only change the list;
``SequenceMap`` is unrolled, its body written once per item. A sequence
graph input of a length given at import (``sequence_lengths``, as the ONNX
backend gives it from the list it is called with) is a list of tensor
inputs ``name[0]``, ``name[1]``, ...; with ``sequence_lengths`` given, a
sequence graph output is a list of tensor outputs named the same way. A
form that needs run-time values (a position or split computed by the
graph, a length along a dynamic dim, a sequence reaching another operator)
is refused with the node at fault.
"""
from __future__ import annotations

import numpy as np

from .expand import CONCAT_MAX

__all__ = ["SEQUENCE_OPERATORS", "rewrite_sequences"]

# the most items a sequence, or iterations an unrolled Loop, may have: each
# is written out as nodes at import
MAX_ITEMS = 4096

SEQUENCE_OPERATORS = ("SplitToSequence", "SequenceAt", "ConcatFromSequence",
                      "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase",
                      "SequenceLength", "SequenceMap")


def _is_sequence_op(node) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in SEQUENCE_OPERATORS


def _holds_sequences(graph) -> bool:
    """Whether ``graph`` or a subgraph of its nodes has a sequence."""
    return any(v.type.HasField("sequence_type") for v in list(graph.input) + list(graph.output)) \
        or any(_is_sequence_op(n) or any(_holds_sequences(a.g) for a in n.attribute if a.g.node)
               for n in graph.node)


def item_name(sequence: str, i: int) -> str:
    """The tensor input or output that item ``i`` of a sequence graph
    input or output becomes."""
    return f"{sequence}[{i}]"


def rewrite_sequences(proto, value_dims, where: str, sequence_lengths=None):
    """``proto`` with its top-level sequence operators written as tensor
    operators (a copy; ``proto`` itself when it has none).
    ``value_dims(proto)``: value name -> dims by ONNX shape inference (None
    where not static), asked only when a split's number of pieces depends
    on a shape. ``sequence_lengths``: sequence graph input -> its length;
    given (even empty), sequence graph outputs become their items."""
    import onnx

    seq_inputs = [i for i in proto.graph.input if i.type.HasField("sequence_type")]
    for inp in seq_inputs:
        if inp.name not in (sequence_lengths or {}):
            raise NotImplementedError(f"{where}: graph input '{inp.name}' is a sequence; the "
                                      "engine takes tensors (or a sequence of a length given "
                                      "at import: sequence_lengths)")
    if not _holds_sequences(proto.graph):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 1)
    rewrite = _Rewrite(out.graph, opset, lambda: value_dims(proto), where)
    inputs = []
    for inp in out.graph.input:
        if not inp.type.HasField("sequence_type"):
            inputs.append(inp)
            continue
        elem = inp.type.sequence_type.elem_type
        if not elem.HasField("tensor_type"):
            raise NotImplementedError(f"{where}: graph input '{inp.name}' is a sequence of "
                                      "sequences or optionals; the engine takes tensors")
        items = [item_name(inp.name, i) for i in range(int(sequence_lengths[inp.name]))]
        rewrite.taken |= set(items)
        rewrite.seqs[inp.name] = items
        for name in items:
            item = onnx.ValueInfoProto(name=name)
            item.type.CopyFrom(elem)
            inputs.append(item)
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    nodes = rewrite.run(sequence_outputs=sequence_lengths is not None)
    outputs = []
    for o in out.graph.output:
        if o.name not in rewrite.seqs:
            outputs.append(o)
            continue
        for i, x in enumerate(rewrite.seqs[o.name]):
            name = item_name(o.name, i)
            if name in rewrite.taken:
                raise ValueError(f"{where}: graph output '{o.name}' is a sequence and its "
                                 f"item name '{name}' is taken by another value")
            rewrite.emit("Identity", [x], [name])
            outputs.append(onnx.helper.make_empty_tensor_value_info(name))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    del out.graph.output[:]
    out.graph.output.extend(outputs)
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
    def run(self, sequence_outputs=False):
        for i, node in enumerate(self.graph.node):
            self.visit(node, node.name or f"{node.op_type}_{i}")  # as the importer names it
        for o in self.graph.output:
            if o.name in self.seqs and not sequence_outputs:
                raise NotImplementedError(f"{self.where}: graph output '{o.name}' is a "
                                          "sequence; the engine returns tensors (return a "
                                          "tuple of tensors)")
        return self.nodes

    def visit(self, node, prefix):
        self.prefix = prefix
        self.node_where = f"{self.where}: {node.op_type} node '{self.prefix}'"
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            self.constants[node.output[0]] = node
        if node.op_type == "Identity" and node.input[0] in self.constants:
            self.constants[node.output[0]] = self.constants[node.input[0]]
        if _is_sequence_op(node) or (node.op_type in ("Loop", "If") and
                                     self.touches_sequences(node)):
            getattr(self, node.op_type)(node)
        elif any(x in self.seqs for x in node.input):
            if node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
                raise NotImplementedError(
                    f"{self.node_where} takes a sequence; the engine runs sequences only "
                    "as lists of tensors known at import (split, item, concat)")
            self.seqs[node.output[0]] = self.seqs[node.input[0]]
        else:
            self.nodes.append(node)

    def touches_sequences(self, node) -> bool:
        """Whether ``node`` takes a sequence or its subgraphs hold one."""
        return any(x in self.seqs for x in node.input) or \
            any(_holds_sequences(a.g) for a in node.attribute if a.g.node)

    def inline(self, graph, rename, label):
        """The nodes of subgraph ``graph`` written here, its inputs bound by
        ``rename`` (its input -> a value here), its values renamed under
        ``label``; returns ``rename`` with every value of ``graph``."""
        import onnx
        from onnx import numpy_helper

        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in graph.node for a in n.attribute):
            raise NotImplementedError(f"{self.node_where}: a subgraph inside its subgraph")
        where, prefix = self.node_where, self.prefix
        for init in graph.initializer:
            rename[init.name] = self.emit("Constant", [], value=numpy_helper.from_array(
                numpy_helper.to_array(init)))
        for k, bn in enumerate(graph.node):
            self.prefix = prefix
            new = onnx.NodeProto()
            new.CopyFrom(bn)
            new.input[:] = [rename.get(x, x) for x in bn.input]
            for j, y in enumerate(bn.output):
                if y:
                    rename[y] = new.output[j] = self.name(f"{label}/{y}")
            self.visit(new, f"{prefix}/{label}/{bn.name or f'{bn.op_type}_{k}'}")
        self.prefix, self.node_where = prefix, where
        return rename

    def bind(self, out, value):
        """Graph value ``out`` becomes ``value`` (a sequence or a tensor)."""
        if value in self.seqs:
            self.seqs[out] = self.seqs[value]
        else:
            self.emit("Identity", [value], [out])

    def graph_attr(self, node, name):
        """The subgraph attribute ``name`` of ``node``."""
        import onnx

        for a in node.attribute:
            if a.name == name and a.type == onnx.AttributeProto.GRAPH:
                return a.g
        raise ValueError(f"{self.node_where}: it has no graph attribute '{name}'")

    def known(self, node, k) -> bool:
        """Whether input ``k`` of ``node`` is a constant here."""
        return len(node.input) > k and node.input[k] in self.constants

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
        name = self.emit("Constant", [], value=numpy_helper.from_array(
            array.reshape(()) if scalar else array.reshape(-1)))
        self.constants[name] = self.nodes[-1]
        return name

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
            if -(-length // step) > MAX_ITEMS:
                raise NotImplementedError(
                    f"{self.node_where}: {-(-length // step)} pieces; the engine writes a "
                    f"sequence's items out at import, at most {MAX_ITEMS}")
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
        self.constants[node.output[0]] = self.nodes[-1]

    def SequenceMap(self, node):
        """The body once per item: its sequence inputs take the item, its
        other inputs the tensor; its outputs are the items of the outputs."""
        body = self.graph_attr(node, "body")
        if len(body.input) != len(node.input) or len(body.output) != len(node.output):
            raise ValueError(f"{self.node_where}: its body has {len(body.input)} inputs and "
                             f"{len(body.output)} outputs for the node's {len(node.input)} "
                             f"and {len(node.output)}")
        lengths = {len(self.seqs[x]) for x in node.input if x in self.seqs}
        if len(lengths) != 1 or node.input[0] not in self.seqs:
            raise ValueError(f"{self.node_where}: its first input must be a sequence and its "
                             f"sequences of one length (lengths {sorted(lengths)})")
        outs = [[] for _ in node.output]
        for i in range(lengths.pop()):
            rename = self.inline(body, {b.name: (self.seqs[x][i] if x in self.seqs else x)
                                        for b, x in zip(body.input, node.input)}, f"iter{i}")
            for k, b in enumerate(body.output):
                outs[k].append(rename.get(b.name, b.name))
        for o, items in zip(node.output, outs):
            self.seqs[o] = items

    def Loop(self, node):
        """A Loop over sequences, unrolled: its trip count must be known at
        import and its condition stay true."""
        body = self.graph_attr(node, "body")
        if not any(x in self.seqs for x in node.input) and not self.known(node, 0):
            self.nodes.append(node)  # (its body's sequences are refused by name at import)
            return
        trips = self.constant(node, 0, "trip count")
        cond = self.constant(node, 1, "condition")
        if trips is None or (cond is not None and not cond.reshape(-1)[0]):
            raise NotImplementedError(f"{self.node_where}: a Loop over sequences runs only "
                                      "with a trip count known at import")
        n_state = len(node.input) - 2
        state = list(node.input[2:])
        if int(trips.reshape(-1)[0]) > MAX_ITEMS:
            raise NotImplementedError(f"{self.node_where}: {int(trips.reshape(-1)[0])} "
                                      "iterations; a Loop over sequences is unrolled at "
                                      f"import, at most {MAX_ITEMS}")
        scans = [[] for _ in body.output[1 + n_state:]]
        true = self.emit("Constant", [], value=_scalar(True))
        self.constants[true] = self.nodes[-1]
        for i in range(int(trips.reshape(-1)[0])):
            rename = {body.input[0].name: self.const(i, scalar=True), body.input[1].name: true}
            rename.update((b.name, v) for b, v in zip(body.input[2:], state))
            rename = self.inline(body, rename, f"iter{i}")
            if rename.get(body.output[0].name) not in (true, body.input[1].name) and \
                    self.constants.get(rename.get(body.output[0].name)) is not \
                    self.constants[true]:
                raise NotImplementedError(f"{self.node_where}: a Loop over sequences whose "
                                          "condition the body computes")
            state = [rename.get(o.name, o.name) for o in body.output[1:1 + n_state]]
            for k, o in enumerate(body.output[1 + n_state:]):
                scans[k].append(self.axes_op("Unsqueeze", rename.get(o.name, o.name), 0))
        for out, value in zip(node.output, state):
            self.bind(out, value)
        for out, items in zip(node.output[n_state:], scans):
            if not items:
                raise NotImplementedError(f"{self.node_where}: a scan output of no iterations")
            self.concat(items, 0, out)

    def If(self, node):
        """An If over sequences: its condition must be known at import."""
        if not self.known(node, 0):
            self.nodes.append(node)  # (its branches' sequences are refused by name at import)
            return
        cond = self.constant(node, 0, "condition")
        if cond is None:
            raise NotImplementedError(f"{self.node_where}: an If over sequences runs only "
                                      "with a condition known at import")
        branch = "then_branch" if cond.reshape(-1)[0] else "else_branch"
        graph = self.graph_attr(node, branch)
        rename = self.inline(graph, {}, branch)
        for out, o in zip(node.output, graph.output):
            self.bind(out, rename.get(o.name, o.name))


def _scalar(value):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value))
