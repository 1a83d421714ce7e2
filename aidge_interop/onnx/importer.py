"""ONNX import: the ``onnx`` package parses, the C engine builds and runs.

``load_onnx(path_or_model)`` walks the ONNX graph once and hands every
input, initializer and node to ``_C.Graph``; shape inference, constant
folding, scheduling and memory planning happen in C.
"""
from __future__ import annotations

import os
import numpy as np

from .. import _C
from .._C import Tensor
from .attention import fuse_attention
from .functions import expand_functions
from .optional import OPTIONAL_OPERATORS, rewrite_optionals
from .qlinear import CONTRIB, expand_contrib, fuse_qdq
from .sequences import SEQUENCE_OPERATORS, rewrite_sequences

__all__ = ["load_onnx", "build_graph", "supported_operators", "ONNX_DTYPES", "EXPANDED"]

MAX_OPSET = 1000  # any real opset version is far below; keeps it a C int

# TensorProto.DataType -> engine dtype name
ONNX_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 16: "bfloat16", 4: "uint16", 12: "uint32",
    13: "uint64", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2",
    20: "float8_e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu",
    25: "uint2", 26: "int2",
}
_ONNX_TYPE_NAMES = {
    0: "UNDEFINED", 8: "STRING", 14: "COMPLEX64", 15: "COMPLEX128",
}


def _onnx():
    import onnx

    return onnx


def _read_model(model, where: str):
    """A ModelProto from a path, bytes or a ModelProto; errors name the file."""
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model)), None
        except Exception as exc:  # protobuf raises its own DecodeError
            raise ValueError(f"{where}: the bytes are not a valid ONNX model ({exc})") from exc
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{where}: no ONNX file at {path!r}")
        try:
            proto = onnx.load(path, load_external_data=False)
        except Exception as exc:
            raise ValueError(f"{where}: {path!r} is not a valid ONNX model ({exc})") from exc
        return proto, os.path.dirname(os.path.abspath(path))
    raise TypeError(
        f"{where}: expected a path, bytes or onnx.ModelProto, not {type(model).__name__}"
    )


def _load_external(init, base_dir, where):
    """Reads an initializer's external data, refusing paths that leave base_dir."""
    onnx = _onnx()
    from onnx.external_data_helper import load_external_data_for_tensor

    info = {e.key: e.value for e in init.external_data}
    location = info.get("location", "")
    if base_dir is None:
        raise ValueError(
            f"{where}: initializer '{init.name}' has external data ({location!r}) but the "
            "model was not loaded from a file"
        )
    target = os.path.realpath(os.path.join(base_dir, location))
    if os.path.isabs(location) or os.path.commonpath([target, os.path.realpath(base_dir)]) != os.path.realpath(base_dir):
        raise ValueError(
            f"{where}: initializer '{init.name}' points to external data {location!r} "
            "outside the model's folder; refused"
        )
    load_external_data_for_tensor(init, base_dir)
    init.data_location = onnx.TensorProto.DEFAULT
    del init.external_data[:]


def _to_array(tensor_proto, where):
    from onnx import numpy_helper

    if tensor_proto.data_type not in ONNX_DTYPES:
        t = tensor_proto.data_type
        raise TypeError(
            f"{where}: tensor '{tensor_proto.name}' has ONNX data type "
            f"{_ONNX_TYPE_NAMES.get(t, t)}, not supported by the engine "
            f"(supported: {', '.join(sorted(set(ONNX_DTYPES.values())))})"
        )
    try:
        return numpy_helper.to_array(tensor_proto)
    except ValueError as exc:  # data that does not fill the dims, ...
        raise ValueError(f"{where}: tensor '{tensor_proto.name}': {exc}") from exc


def _check_attribute_names(node, opset, where):
    """Refuses attributes that the operator's ONNX schema does not define
    (a typo would otherwise be ignored silently, and the default used)."""
    from onnx import defs

    try:
        schema = defs.get_schema(node.op_type, opset, "")
    except defs.SchemaError:  # not an ONNX operator: the engine names it
        return
    unknown = sorted({a.name for a in node.attribute} - set(schema.attributes))
    if unknown:
        raise ValueError(
            f"{where}: unknown attribute{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(u) for u in unknown)}; {node.op_type} (opset {opset}) takes "
            f"{', '.join(sorted(schema.attributes)) or 'none'}"
        )


def _float_attr(f: float) -> float:
    """ONNX stores float attributes in float32: 0.01 arrives as 0.0099999998.
    The shortest decimal that rounds to that float32 is the value the model's
    author wrote, which float64 graphs (and torch) use."""
    return float(str(np.float32(f)))


def _attributes(node, where, graphs=None):
    """The node's attributes for the engine; ``graphs``: its graph-valued
    attributes, already built (Loop's body, If's branches)."""
    onnx = _onnx()
    A = onnx.AttributeProto
    out = {}
    for a in node.attribute:
        if a.type == A.GRAPH and graphs is not None:
            out[a.name] = graphs[a.name]
            continue
        if a.type == A.INT:
            out[a.name] = int(a.i)
        elif a.type == A.FLOAT:
            out[a.name] = _float_attr(a.f)
        elif a.type == A.STRING:
            out[a.name] = a.s.decode("utf-8", "replace")
        elif a.type == A.INTS:
            out[a.name] = [int(v) for v in a.ints]
        elif a.type == A.FLOATS:
            out[a.name] = [_float_attr(v) for v in a.floats]
        elif a.type == A.TENSOR:
            out[a.name] = Tensor(_to_array(a.t, where), copy=True)
        elif a.type == A.STRINGS:
            out[a.name] = ",".join(s.decode("utf-8", "replace") for s in a.strings)
        else:
            raise NotImplementedError(
                f"{where}: attribute '{a.name}' of {node.op_type} node '{node.name}' has type "
                f"{A.AttributeType.Name(a.type)}, which the engine does not support"
            )
    return out


def _declared_dims(value_info, free_batch: bool):
    """The dims a graph input declares (None for a symbolic or unknown one),
    or None without a declared shape: forward refuses an input that
    contradicts them. With ``free_batch``, dim 0 stays free (None)."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if free_batch and dims:
        dims[0] = None
    return dims


def _constant_value(node, attrs, where):
    """The value of a Constant node (any of its attribute forms)."""
    if "value" in attrs:
        return attrs["value"]
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64),
                       ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attrs:
            try:
                return Tensor(np.asarray(attrs[key], dtype=dtype), copy=True)
            except (OverflowError, TypeError, ValueError) as exc:
                raise ValueError(f"{where}: Constant node '{node.name}': its {key} is not "
                                 f"{np.dtype(dtype).name} ({exc})") from None
    raise NotImplementedError(
        f"{where}: Constant node '{node.name}' uses attributes {sorted(attrs)}; the engine "
        "reads value, value_float(s) and value_int(s)"
    )


def _elem_type(value_info):
    t = value_info.type
    if not t.HasField("tensor_type"):
        return None
    return t.tensor_type.elem_type


def _value_dims(proto, input_shapes=None):
    """Value name -> its dims (ints; None where one is symbolic or unknown)
    by ONNX shape inference, for the few nodes that need shapes at import.
    ``input_shapes``: shapes of the graph's inputs (initializers aside, in
    order) that fill their symbolic dims first (wrap's example shapes)."""
    onnx = _onnx()
    if input_shapes:
        proto = onnx.ModelProto.FromString(proto.SerializeToString())
        inits = {i.name for i in proto.graph.initializer}
        graph_inputs = [i for i in proto.graph.input if i.name not in inits]
        for inp, shape in zip(graph_inputs, input_shapes):
            dims = inp.type.tensor_type.shape.dim
            if len(dims) == len(shape):
                for d, n in zip(dims, shape):
                    if not d.HasField("dim_value"):
                        d.dim_value = int(n)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
    except Exception:  # the engine's own shape inference reports what is wrong
        inferred = proto.graph
    dims = {}
    for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                             for d in t.shape.dim]
    for init in inferred.initializer:
        dims[init.name] = list(init.dims)
    return dims


# operators written at import as other engine operators (einsum.py)
EXPANDED = ("Einsum",)


# what an export can do to avoid an operator the engine does not have
_SEQUENCE_LOOP = ("the engine runs a loop that collects one tensor per iteration in a "
                  "sequence then concatenates it (the dynamo exporter's nn.EmbeddingBag), "
                  "other uses of sequences not; the TorchScript exporter (wrap(..., "
                  "exporter='torchscript'), the default) writes Loops with scan outputs")
_AVOID = {
    "SequenceConstruct": "a list of tensors kept as a list exports one; return a tuple",
    "SplitToSequence": "the dynamo exporter writes one for torch.split and torch.unbind; the "
                       "TorchScript exporter (wrap(..., exporter='torchscript'), the default) "
                       "writes a Split",
    "SequenceEmpty": _SEQUENCE_LOOP, "SequenceInsert": _SEQUENCE_LOOP,
    "ConcatFromSequence": _SEQUENCE_LOOP,
}
# operators whose graph attributes are subgraphs the engine runs (ops/control.c)
_CONTROL = ("Loop", "If", "Scan")


def _captures(body) -> list:
    """The outer values a subgraph reads (in its nodes, its nested subgraphs
    and its outputs) without defining them, in the order of first use."""
    onnx = _onnx()
    defined = {i.name for i in body.input} | {i.name for i in body.initializer}
    found = []

    def use(name):
        if name and name not in defined and name not in found:
            found.append(name)

    for node in body.node:
        for name in node.input:
            use(name)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                for name in _captures(a.g):
                    use(name)
        defined.update(node.output)
    for o in body.output:
        use(o.name)
    return found


def _sequence_scans(nodes) -> list:
    """``nodes`` with each loop-carried sequence that only collects one value
    per iteration turned into a scan output (the dynamo exporter's form of
    nn.EmbeddingBag): a Loop's carried value that starts as SequenceEmpty,
    gets ``SequenceInsert(seq, x)`` once per iteration in the body and ends
    in ``ConcatFromSequence`` becomes the scan output of x, reshaped as the
    concatenation. Anything else is left as it is (and refused by name)."""
    onnx = _onnx()
    helper = onnx.helper
    readers = {}
    for n in nodes:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    producer = {o: n for n in nodes for o in n.output}
    out, removed = [], set()
    replaced = {}  # id(node) -> the nodes that take its place
    for loop in nodes:
        if loop.op_type != "Loop" or (loop.domain or "") not in ("", "ai.onnx"):
            continue
        attr = next((a for a in loop.attribute if a.name == "body"), None)
        if attr is None:
            continue
        body = onnx.GraphProto()
        body.CopyFrom(attr.g)
        new_loop = onnx.NodeProto()
        new_loop.CopyFrom(loop)
        n_carried = len(loop.input) - 2
        changed = False
        for j in reversed(range(n_carried)):
            init, seq_out = loop.input[2 + j], loop.output[j] if j < len(loop.output) else ""
            empty = producer.get(init)
            concats = readers.get(seq_out, [])
            if empty is None or empty.op_type != "SequenceEmpty" or len(readers[init]) != 1 \
                    or not concats or not all(c.op_type == "ConcatFromSequence" and
                               {a.name: a.i for a in c.attribute}.get("axis") == 0
                               for c in concats):
                continue
            b_in, b_out = body.input[2 + j].name, body.output[1 + j].name
            users = [n for n in body.node if b_in in n.input]
            if len(users) != 1 or users[0].op_type != "SequenceInsert" or \
                    list(users[0].input[:1]) != [b_in] or len(users[0].input) != 2 or \
                    list(users[0].output) != [b_out] or \
                    any(b_out in n.input for n in body.node) or \
                    [o.name for o in body.output].count(b_out) != 1 or \
                    any(o.name == b_in for o in body.output):
                continue
            value = users[0].input[1]
            body.node.remove(users[0])
            del body.input[2 + j]
            del body.output[1 + j]
            body.output.append(helper.make_tensor_value_info(value, 0, None))
            scan = f"{seq_out or init}/scan"
            del new_loop.input[2 + j]
            outputs = list(new_loop.output)
            del outputs[j]
            del new_loop.output[:]
            new_loop.output.extend(outputs + [scan])
            removed.add(id(empty))
            for c in concats:  # (new_axis 1: the stack itself; else axis 0 merged with 1)
                y = c.output[0]
                new_axis = {a.name: a.i for a in c.attribute}.get("new_axis", 0)
                replaced[id(c)] = [helper.make_node("Identity", [scan], [y])] if new_axis else [
                    helper.make_node("Shape", [scan], [f"{y}/shape"], start=2),
                    helper.make_node("Constant", [], [f"{y}/minus_one"],
                                     value_ints=[-1]),
                    helper.make_node("Concat", [f"{y}/minus_one", f"{y}/shape"],
                                     [f"{y}/dims"], axis=0),
                    helper.make_node("Reshape", [scan, f"{y}/dims"], [y])]
            changed = True
        if changed:
            for a in new_loop.attribute:
                if a.name == "body":
                    a.g.CopyFrom(body)
            replaced[id(loop)] = [new_loop]
    for n in nodes:
        if id(n) not in removed:
            out.extend(replaced.get(id(n), [n]))
    return out


def _with_nodes(proto, nodes):
    """A copy of ``proto`` whose graph has ``nodes``."""
    out = _onnx().ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _build_subgraph(body, captures, add_nodes, where, untyped=()):
    """A Loop or Scan body or an If branch as a ``_C.Graph``: its own inputs, then
    one input per captured outer value (the node passes them as extra
    inputs), its initializers as constants, its nodes, its outputs.
    A subgraph's inputs take the dtypes of the values its node binds; an
    input the body leaves untyped gets ``untyped[i]`` (a Loop's iteration
    number and condition), else float32 until then."""
    g = _C.Graph()
    for i, inp in enumerate(body.input):
        et = _elem_type(inp)
        if not inp.type.HasField("value") or et == 0:  # untyped (a Scan body's, often)
            g.add_input(inp.name, untyped[i] if i < len(untyped) else "float32", None)
            continue
        if et not in ONNX_DTYPES:
            kind = inp.type.WhichOneof("value") or "untyped"
            raise TypeError(
                f"{where}: subgraph input '{inp.name}' is "
                + (f"a {kind.replace('_type', '')}" if kind != "tensor_type" else
                   f"a tensor of ONNX data type {_ONNX_TYPE_NAMES.get(et, et)}")
                + "; the engine runs subgraphs over tensors of its dtypes only")
        g.add_input(inp.name, ONNX_DTYPES[et], None)
    for name in captures:
        g.add_input(name, "float32", None)
    for init in body.initializer:
        g.add_initializer(init.name, Tensor(_to_array(init, where), copy=True), "const")
    add_nodes(g, body.node, where)
    outputs = [o.name for o in body.output]
    if not outputs:
        raise ValueError(f"{where}: the subgraph has no outputs")
    g.set_outputs(outputs)
    return g


def supported_operators() -> dict[str, dict]:
    """Operators of the engine: ``{"Conv": {"domain": "", "backward": True}, ...}``
    (Einsum, and the sequence and optional operators in their static forms:
    written as the engine's operators at import)."""
    ops = {}
    for dom, name, bwd in _C.supported_operators():  # a name in two domains: the first (QGemm)
        ops.setdefault(name, {"domain": dom, "backward": bwd})
    ops.update({name: {"domain": "", "backward": True}
                for name in EXPANDED + SEQUENCE_OPERATORS + OPTIONAL_OPERATORS})
    for name in CONTRIB:  # ONNX Runtime's, written as ONNX's at import
        ops.setdefault(name, {"domain": "com.microsoft", "backward": False})
    return ops


def _add_expanded(g, node, attrs, opset, dims, where):
    """An operator of EXPANDED as the engine operators that compute it.
    ``dims()``: value name -> dims by ONNX shape inference, with the graph's
    symbolic input dims left unknown (Einsum keeps a dynamic batch dynamic)."""
    node_opset = max(int(opset), 13)  # the nodes written use opset 13's input forms
    emit_node = lambda name, op, ins, outs, a: g.add_node(name, op, ins, outs, a, domain="",  # noqa: E731
                                                         opset=node_opset)
    emit_const = lambda name, value: g.add_initializer(name, value, "const")  # noqa: E731
    from .einsum import check_equation, expand_einsum

    check_equation(attrs, where)
    return expand_einsum(node, attrs, dims(), emit_node, emit_const, where)


def build_graph(model, *, param_kinds: dict[str, str] | None = None, values=None,
                share_values: bool = False, where: str = "load_onnx", input_shapes=None,
                free_batch: bool = True, grads=None, sequence_lengths=None,
                integer_qdq: bool = True, fuse_attention_blocks: bool = True):
    """Builds and finalizes a ``_C.Graph`` from an ONNX model.

    ``param_kinds`` maps initializer names to ``"param"``, ``"buffer"`` or
    ``"const"``; by default float initializers are parameters (BatchNorm
    running statistics: buffers; Resize's roi and scales: constants) and the
    others constants. ``values`` maps
    initializer names to engine Tensors that replace the stored values
    (same shape and dtype expected): copied, or with ``share_values`` read
    and written in place (the graph shares their memory); ``grads`` maps
    parameter names to engine Tensors that hold their gradients (shared:
    two graphs of one model accumulate into one gradient). ``input_shapes``
    (the shapes an export was traced with) is accepted and unused: no
    operator needs a shape at import since LSTM, GRU and RNN are the
    engine's own (they were unrolled for a fixed sequence length).
    Forward refuses an input whose rank or dims contradict the dims the
    model declares (as ONNX Runtime does); symbolic dims are free, and so
    is dim 0 with ``free_batch`` (a model exported for one batch size runs
    another). ``sequence_lengths`` (sequence graph input -> its length)
    makes each such input that many tensor inputs ``name[i]``, and each
    sequence graph output its items' outputs, named the same way
    (``sequences.py``). ONNX Runtime's quantized contrib operators are
    written as ONNX's, and with ``integer_qdq`` the QDQ patterns of Conv,
    MatMul and Gemm become integer operators (``qlinear.py``). With
    ``fuse_attention_blocks`` each attention block is one FusedAttention node
    of the graph (``attention.py``; the quantizer reads the blocks unfused).
    Returns ``(graph, proto)``: the proto as rewritten, but for the attention
    fusion (ONNX's operators only).
    """
    proto, base_dir = _read_model(model, where)
    graph = proto.graph
    opsets = {(o.domain or "ai.onnx"): o.version for o in proto.opset_import}
    for domain, version in opsets.items():
        if not 1 <= version <= MAX_OPSET:
            raise ValueError(f"{where}: opset_import of domain '{domain}' has version "
                             f"{version}; expected 1 to {MAX_OPSET}")
    if "ai.onnx" not in opsets:
        opsets["ai.onnx"] = 1
    # (domain, name) pairs: one name may be in two domains (QGemm)
    known = ({(d, n) for d, n, _ in _C.supported_operators()}
             | {("", n) for n in EXPANDED + SEQUENCE_OPERATORS + OPTIONAL_OPERATORS})
    proto = expand_contrib(proto, where)
    if integer_qdq:
        proto = fuse_qdq(proto)
    # operators the engine lacks but ONNX defines by a function: their body
    proto, node_opsets = expand_functions(
        proto, opsets, lambda d, op: ("" if d == "ai.onnx" else d, op) in known, where)
    proto = rewrite_optionals(proto, where)  # static optionals: tensors or constants
    nodes = list(proto.graph.node)
    scanned = _sequence_scans(nodes)  # a Loop's collecting sequence: a scan output
    if len(scanned) != len(nodes) or any(x is not y for x, y in zip(scanned, nodes)):
        proto = _with_nodes(proto, scanned)
    proto = rewrite_sequences(proto, _value_dims, where,  # static sequences: tensors
                              sequence_lengths)
    graph = proto.graph
    if fuse_attention_blocks:  # attention blocks: one node each, in the engine's graph
        graph = fuse_attention(proto, opsets["ai.onnx"])[0].graph  # (the proto returned:
        # ONNX's operators, which ONNX Runtime and `locate` run)
    g = _C.Graph()
    init_names = {i.name for i in graph.initializer}
    for inp in graph.input:
        if inp.name in init_names:
            continue
        et = _elem_type(inp)
        if et not in ONNX_DTYPES:
            raise TypeError(
                f"{where}: graph input '{inp.name}' has ONNX data type "
                f"{_ONNX_TYPE_NAMES.get(et, et)}, not supported by the engine"
            )
        g.add_input(inp.name, ONNX_DTYPES[et], _declared_dims(inp, free_batch))
    # running statistics of BatchNormalization are state, not parameters
    stats = {n.input[k] for n in graph.node if n.op_type == "BatchNormalization"
             for k in (3, 4) if len(n.input) > k}
    # float inputs that set a shape (Resize's roi and scales, Upsample's, Range's scalars)
    # are constants
    shaping = {"Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2)}
    fixed = {n.input[k] for n in graph.node for k in shaping.get(n.op_type, ())
             if len(n.input) > k}
    for init in graph.initializer:
        kind = (param_kinds or {}).get(init.name)
        value = (values or {}).get(init.name)
        share = share_values and value is not None
        if value is None:
            if init.data_location == _onnx().TensorProto.EXTERNAL:
                _load_external(init, base_dir, where)
            array = _to_array(init, where)
            if kind is None:
                trainable = ((array.dtype.kind == "f" or array.dtype.name == "bfloat16") and
                             init.name not in fixed)
                kind = "buffer" if init.name in stats else "param" if trainable else "const"
            value = Tensor(array, copy=True)
        g.add_initializer(init.name, value, kind or "const", share)
        if grads and init.name in grads and (kind or "const") == "param":
            g.share_grad(init.name, grads[init.name])
    inferred = []  # shapes by ONNX inference, when an operator of EXPANDED needs them

    def dims():
        if not inferred:
            inferred.append(_value_dims(proto))
        return inferred[0]

    def add_nodes(g, nodes, where):
        for i, node in enumerate(_sequence_scans(nodes)):
            name = node.name or f"{node.op_type}_{i}"
            domain = node.domain or ""
            opset = node_opsets.get(name) or opsets.get(domain or "ai.onnx", opsets["ai.onnx"])
            node_where = f"{where}: {node.op_type} node '{name}'"
            # (a sequence or optional operator left here is one that
            # rewrite_sequences or rewrite_optionals does not reach: in a subgraph)
            if node.op_type != "Constant" and \
                    (("" if domain == "ai.onnx" else domain, node.op_type) not in known
                     or node.op_type in SEQUENCE_OPERATORS + OPTIONAL_OPERATORS):
                qualified = (node.op_type if domain in ("", "ai.onnx")
                             else f"{domain}.{node.op_type}")
                raise NotImplementedError(
                    f"{where}: operator {qualified} (node '{name}', opset {opset}) is not "
                    "supported by the engine"
                    + (f"; {_AVOID[node.op_type]}" if node.op_type in _AVOID else ""))
            if domain in ("", "ai.onnx"):
                _check_attribute_names(node, opset, node_where)
            inputs, graphs = list(node.input), None
            if node.op_type in _CONTROL and domain in ("", "ai.onnx"):
                # implicit captures become explicit inputs, after the node's own
                bodies = [a for a in node.attribute if a.type == _onnx().AttributeProto.GRAPH]
                captures = []
                for a in bodies:
                    captures += [c for c in _captures(a.g) if c not in captures]
                untyped = ("int64", "bool") if node.op_type == "Loop" else ()
                graphs = {a.name: _build_subgraph(a.g, captures, add_nodes,
                                                  f"{node_where}: {a.name}", untyped)
                          for a in bodies}
                inputs += captures
            attrs = _attributes(node, node_where, graphs)
            if node.op_type in ("Loop", "Scan") and graphs is not None:
                attrs["captures"] = len(inputs) - len(node.input)
            if node.op_type == "Constant" and domain in ("", "ai.onnx"):
                if len(node.output) != 1:
                    raise ValueError(f"{node_where}: a Constant has one output")
                g.add_initializer(node.output[0], _constant_value(node, attrs, node_where),
                                  "const")
                continue
            if node.op_type in EXPANDED and domain in ("", "ai.onnx"):
                _add_expanded(g, node, attrs, opset, dims, node_where)
                continue
            g.add_node(name, node.op_type, inputs, list(node.output), attrs,
                       domain=domain, opset=int(opset))

    add_nodes(g, graph.node, where)
    outputs = [o.name for o in graph.output]
    if not outputs:
        raise ValueError(f"{where}: the ONNX graph has no outputs")
    g.set_outputs(outputs)
    g.finalize()
    return g, proto


def load_onnx(model, verbose: bool = False, **kwargs):
    """Loads an ONNX model (path, bytes or ``onnx.ModelProto``) into the engine.

    Returns an :class:`aidge_interop.graph.Graph`. ``verbose``: prints a short
    summary of the import (:meth:`Graph.summary`).
    """
    from ..graph import Graph

    cg, proto = build_graph(model, **kwargs)
    graph = Graph(cg, proto)
    if verbose:
        source = repr(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else "model"
        print(f"load_onnx: {source}: {graph.summary()}")
    return graph
