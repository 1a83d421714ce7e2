"""ONNX optionals at import: the engine has tensors only, so an optional
must be known at import to be present or empty.

An optional graph input of a tensor or sequence type is a tensor or
sequence input (present: an empty one is refused when the graph runs, as
any input that is not a tensor; sequences: ``sequences.py``); ``Optional(x)`` is ``x``, ``Optional()`` (no input) an empty
optional; ``OptionalHasElement`` becomes a constant (true for a present
value, false for an empty optional or no input); ``OptionalGetElement``
an ``Identity`` of a present value, refused by name on an empty one. An
empty optional read by another operator is that operator's absent input.
Inside a subgraph they are refused as operators the engine lacks.
"""
from __future__ import annotations

__all__ = ["OPTIONAL_OPERATORS", "rewrite_optionals"]

OPTIONAL_OPERATORS = ("Optional", "OptionalHasElement", "OptionalGetElement")


def _is_optional_op(node) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in OPTIONAL_OPERATORS


def rewrite_optionals(proto, where: str):
    """``proto`` with its optional graph inputs as tensors and its top-level
    optional operators written as the engine's (a copy; ``proto`` itself
    when it has neither)."""
    import onnx
    from onnx import helper

    graph = proto.graph
    optional_inputs = [i for i in graph.input if i.type.HasField("optional_type")]
    if not optional_inputs and not any(_is_optional_op(n) for n in graph.node):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    for inp in graph.input:
        if inp.type.HasField("optional_type"):
            elem = inp.type.optional_type.elem_type
            if not elem.HasField("tensor_type") and not elem.HasField("sequence_type"):
                raise NotImplementedError(
                    f"{where}: graph input '{inp.name}' is an optional "
                    f"{(elem.WhichOneof('value') or 'untyped').replace('_type', '')}; the engine "
                    "takes tensors")
            inp.type.CopyFrom(elem)
    empty = set()  # values known to be empty optionals
    nodes = []
    for i, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{i}"
        node_where = f"{where}: {node.op_type} node '{name}'"
        x = node.input[0] if node.input else ""
        if not _is_optional_op(node):
            if any(n in empty for n in node.input):
                node = onnx.NodeProto.FromString(node.SerializeToString())
                node.input[:] = ["" if n in empty else n for n in node.input]
            nodes.append(node)
        elif node.op_type == "Optional":
            if x and x not in empty:
                nodes.append(helper.make_node("Identity", [x], [node.output[0]], name=name))
            else:
                empty.add(node.output[0])
        elif node.op_type == "OptionalHasElement":
            present = bool(x) and x not in empty
            nodes.append(helper.make_node(
                "Constant", [], [node.output[0]], name=name,
                value=helper.make_tensor("value", onnx.TensorProto.BOOL, [], [present])))
        else:  # OptionalGetElement
            if not x or x in empty:
                raise ValueError(f"{node_where}: its input is an empty optional"
                                 + (f" ('{x}')" if x else ""))
            nodes.append(helper.make_node("Identity", [x], [node.output[0]], name=name))
    for o in graph.output:
        if o.name in empty:
            raise NotImplementedError(f"{where}: graph output '{o.name}' is an empty optional; "
                                      "the engine returns tensors")
        if o.type.HasField("optional_type"):
            o.type.CopyFrom(o.type.optional_type.elem_type)
    del graph.node[:]
    graph.node.extend(nodes)
    return out
