"""ONNX operators the engine lacks, written at import as their function body.

Many ONNX operators are defined by a function: a body of other operators
(``Attention``, ``RMSNormalization``, ``GroupNormalization``,
``HannWindow``, ...), fixed (``schema.has_function``) or built for the
node's attributes and input types (``has_context_dependent_function``).
An operator the engine has natively is imported as itself; one it lacks
is replaced by its body's nodes, for the opset the model imports: every
value and node of the body renamed under the node's name
(``<node>/<value>``), the attributes it refers to (``ref_attr_name``)
taken from the node, else the function's or the schema's defaults, the
body's own opset kept per node. Bodies that use other function operators
are expanded in turn. Model-local functions (``model.functions``) are
inlined first, by ``onnx.inliner``, converted to the model's opset.
Operators over sequences (SequenceMap) are left alone. Backward needs nothing of its own: it runs
through the body's nodes like through any node.
"""
from __future__ import annotations

__all__ = ["expand_functions"]

_MAX_DEPTH = 16  # functions calling functions: far beyond any ONNX body


def _qualified(node) -> str:
    domain = node.domain or ""
    return node.op_type if domain in ("", "ai.onnx") else f"{domain}.{node.op_type}"


def _schema(node, opset):
    from onnx import defs

    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    try:
        return defs.get_schema(node.op_type, opset, domain)
    except defs.SchemaError:
        return None


def _has_body(schema, opset) -> bool:
    """Whether ``schema`` has a function body for ``opset`` that the engine
    can run: not one over sequences (SequenceMap: a Loop over one), which the
    engine has only as lists known at import."""
    if schema is None or any(all(t.startswith("seq(") for t in p.types)
                             for p in list(schema.inputs) + list(schema.outputs)):
        return False
    versions = list(schema.function_opset_versions) + \
        list(schema.context_dependent_function_opset_versions)
    return any(v <= opset for v in versions)


def _native_form(node) -> bool:
    """Whether the engine's own operator takes this node's form: its
    ``Attention`` (csrc/ops/attention.c) takes the 4-D inputs with the
    attributes scale, is_causal and softmax_precision, without past_key,
    past_value or later inputs, outputs beyond Y (even unnamed: the engine
    would make them values) or any other attribute
    (softcap, windows, the 3-D form's head counts); another form is
    imported as the function body."""
    if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
        return True
    native = {"scale", "is_causal", "softmax_precision", "qk_matmul_output_mode"}
    return (not any(node.input[4:]) and len(node.output) == 1
            and all(a.name in native for a in node.attribute))


def _graphs(graph):
    """``graph`` and the subgraphs of its nodes, at any depth."""
    from onnx import AttributeProto

    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.GRAPH:
                yield from _graphs(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _graphs(g)


def _types(proto, data_prop: bool = False) -> dict:
    """Value name -> TypeProto, by ONNX shape inference (as declared where it
    fails) on the graph with its initializers as typed inputs: types need
    no weights, and a model's weights may be gigabytes (over protobuf's 2 GB
    that inference serialises). ``data_prop``: shapes computed in the graph
    (Shape, Concat, Reshape) propagated too."""
    import onnx

    light = onnx.ModelProto(ir_version=proto.ir_version, opset_import=proto.opset_import)
    graph = light.graph
    graph.node.extend(proto.graph.node)
    graph.input.extend(proto.graph.input)
    graph.output.extend(proto.graph.output)
    graph.value_info.extend(proto.graph.value_info)
    declared = {i.name for i in proto.graph.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(i.name, i.data_type, i.dims)
                       for i in proto.graph.initializer if i.name not in declared)
    try:
        light = onnx.shape_inference.infer_shapes(light, data_prop=data_prop)
    except Exception:  # the engine reports what is wrong with the model
        pass
    types = {}
    for graph in _graphs(light.graph):
        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            if vi.type.WhichOneof("value"):
                types[vi.name] = vi.type
        for init in graph.initializer:
            types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, init.dims)
    return types


def _body(node, schema, opset, types, where):
    """The node's FunctionProto for ``opset`` (a context-dependent one built
    from the node and its inputs' types)."""
    import onnx

    fixed = max((v for v in schema.function_opset_versions if v <= opset), default=0)
    built = max((v for v in schema.context_dependent_function_opset_versions if v <= opset),
                default=0)
    if fixed >= built:  # (the newer of the two kinds, if a schema has both)
        return onnx.FunctionProto.FromString(schema.get_function_with_opset_version(opset))
    arg_types = []
    for name in node.input:
        if name and name not in types:
            raise NotImplementedError(
                f"{where}: the ONNX type of input '{name}' is not known at import (ONNX shape "
                "inference does not give it), and the function body that the engine runs "
                "this operator as depends on it")
        arg_types.append((types[name] if name else onnx.TypeProto()).SerializeToString())
    try:
        data = schema.get_context_dependent_function_with_opset_version(
            opset, node.SerializeToString(), arg_types)
    except Exception as exc:  # onnx's builder refuses the node (a bad attribute, ...)
        raise ValueError(f"{where}: ONNX cannot build its function body: {exc}") from exc
    return onnx.FunctionProto.FromString(data)


class _Renamer:
    """Writes a function body's nodes for one call: formal inputs and outputs
    become the node's values, every other name goes under ``prefix``."""

    def __init__(self, node, function, schema, prefix):
        self.prefix = prefix
        self.names = {}
        for i, formal in enumerate(function.input):
            self.names[formal] = node.input[i] if i < len(node.input) else ""
        for i, formal in enumerate(function.output):
            if i < len(node.output) and node.output[i]:
                self.names[formal] = node.output[i]
        # the node's attributes, else the function's defaults, else the schema's
        self.attrs = {name: a.default_value for name, a in schema.attributes.items()
                      if a.default_value.type}
        self.attrs.update({a.name: a for a in function.attribute_proto})
        self.attrs.update({a.name: a for a in node.attribute})
        self.created = []  # every node written, those of the body's subgraphs too

    def name(self, n):
        if not n:
            return ""
        return self.names.get(n, f"{self.prefix}/{n}")

    def node(self, inner, k):
        import onnx

        out = onnx.NodeProto()
        out.CopyFrom(inner)
        out.name = f"{self.prefix}/{inner.name or f'{inner.op_type}_{k}'}"
        out.input[:] = [self.name(n) for n in inner.input]
        out.output[:] = [self.name(n) for n in inner.output]
        self._attributes(out)
        self.created.append(out)
        return out

    def _attributes(self, node):
        import onnx

        A = onnx.AttributeProto
        kept = []
        for a in node.attribute:
            if a.ref_attr_name:
                value = self.attrs.get(a.ref_attr_name)
                if value is None:  # not given, no default: the inner operator's default
                    continue
                b = A()
                b.CopyFrom(value)
                b.name = a.name
                a = b
            if a.type == A.GRAPH:
                self._graph(a.g)
            elif a.type == A.GRAPHS:
                for g in a.graphs:
                    self._graph(g)
            kept.append(a)
        del node.attribute[:]
        node.attribute.extend(kept)

    def _graph(self, graph):
        """A subgraph of the body (an If branch): its names renamed alike."""
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            vi.name = self.name(vi.name)
        for init in graph.initializer:
            init.name = self.name(init.name)
        for k, inner in enumerate(list(graph.node)):
            graph.node[k].CopyFrom(self.node(inner, k))


def expand_functions(proto, opsets: dict, known, where: str):
    """``proto`` with local functions inlined and every operator that the
    engine lacks (``known(domain, op_type)`` false) but ONNX defines by a
    function written as its body's nodes, and the opset of each written
    node, ``{node name: version}`` (its function's, which may be older than
    the model's). ``opsets``: the model's opset per domain ("ai.onnx" for
    the default). Returns ``(proto, node_opsets)``; ``proto`` itself when
    there is nothing to expand. An operator whose body uses one that the
    engine lacks and that has no body is refused, named with its node."""
    import onnx
    import onnx.inliner

    if proto.functions:  # (a function's own opset converted to the model's)
        try:
            proto = onnx.inliner.inline_local_functions(proto, convert_version=True)
        except Exception as exc:  # onnx's version converter lacks an adapter, ...
            raise ValueError(f"{where}: ONNX cannot inline the model's functions: {exc}") \
                from exc
        del proto.functions[:]
    node_opsets, origin = {}, {}

    def opset_of(node):
        if node.name in node_opsets:
            return node_opsets[node.name]
        domain = node.domain if node.domain not in ("", "ai.onnx") else "ai.onnx"
        return opsets.get(domain, opsets["ai.onnx"])

    def expandable(node):
        if (known(node.domain or "", node.op_type) and _native_form(node)) \
                or node.op_type == "Constant":
            return False
        opset = opset_of(node)
        if _has_body(_schema(node, opset), opset):
            return True
        if node.name in origin:
            op, name, op_opset = origin[node.name]
            raise NotImplementedError(
                f"{where}: operator {op} (node '{name}', opset {op_opset}): its ONNX "
                f"function body uses {_qualified(node)}, which the engine lacks")
        return False  # the importer names it

    for _ in range(_MAX_DEPTH):
        if not any(expandable(n) for g in _graphs(proto.graph) for n in g.node):
            return proto, node_opsets
        proto_in = proto
        proto = onnx.ModelProto()
        proto.CopyFrom(proto_in)
        types = _types(proto_in)
        imported = {o.domain or "" for o in proto.opset_import}
        fresh = set()  # nodes written in this pass: expanded in the next (their types)
        for graph in _graphs(proto.graph):
            nodes = []
            for i, node in enumerate(graph.node):
                if node.name in fresh or not expandable(node):
                    node.name = node.name or f"{node.op_type}_{i}"  # the importer's name
                    nodes.append(node)
                    continue
                opset = opset_of(node)
                name = node.name or f"{node.op_type}_{i}"
                node_where = f"{where}: operator {_qualified(node)} (node '{name}', opset {opset})"
                schema = _schema(node, opset)
                function = _body(node, schema, opset, types, node_where)
                fopsets = {o.domain or "": o.version for o in function.opset_import}
                for domain, version in fopsets.items():
                    if domain not in imported and domain != "ai.onnx":
                        proto.opset_import.append(onnx.helper.make_opsetid(domain, version))
                        imported.add(domain)
                renamer = _Renamer(node, function, schema, name)
                first = origin.get(node.name, (_qualified(node), name, opset))
                nodes += [renamer.node(inner, k) for k, inner in enumerate(function.node)]
                for new in renamer.created:
                    domain = "" if new.domain in ("", "ai.onnx") else new.domain
                    if domain in fopsets:  # (else the model's: a body may not import it)
                        node_opsets[new.name] = fopsets[domain]
                    origin[new.name] = first
                    fresh.add(new.name)
            del graph.node[:]
            graph.node.extend(nodes)
    raise ValueError(f"{where}: functions nested more than {_MAX_DEPTH} deep")
