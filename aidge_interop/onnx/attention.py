"""The attention block as one node: the importer's rewrite of what torch's
exporters write for scaled dot-product attention into the engine's
``FusedAttention`` (domain ``aidge_interop``, ``csrc/ops/attention.c``).

The pattern, on the ONNX graph before it is built::

    MatMul(Q, Kt) [-> Mul or Div by a scalar constant] [-> Add(mask)]
        -> Softmax(last axis) [-> Where(IsNaN(P), 0, P)] [-> Casts to its own type]
        -> MatMul(., V)

is replaced by ``FusedAttention(Q, Kt, V[, mask])`` with ``k_transposed``,
``scale`` (the constant, its inverse for Div, else 1) and ``masked_zero``
(from the Where: a row whose every score is -inf gives 0, as torch's
exported sdpa does, instead of Softmax's NaN). What comes before the
MatMul stays: the Transpose that makes Kt, and the scale torch's sdpa
export applies to Q and K apart (two Muls by sqrt(scale)). It is written
by ``nn.MultiheadAttention``/``nn.TransformerEncoderLayer`` and by
``transformers`` models (eager and sdpa attention: ViT, BERT with its mask,
GPT-2 with its causal mask as an additive one).

A candidate is rewritten only when every intermediate value has no other
reader and is no graph output, and ONNX shape inference (with data
propagation) gives Q, Kt and V one rank, 3 or 4, with no batch dim known to
differ (MatMul's broadcasting), and the mask a rank at most theirs with each
dim 1 or not known to differ from the scores'. A dim inference leaves
symbolic is checked when the graph is planned: the fused node then refuses
shapes that do not fit, naming itself. A Dropout between Softmax and the
MatMul (a model exported for training with attention dropout) is not a
candidate. The fused node computes the same sums in another order (row
blocks of GEMMs): values within float rounding of the unfused graph's. One
difference: a NaN that the Where would have zeroed because an input held NaN
or inf stays NaN in the fused node.
"""
from __future__ import annotations

__all__ = ["fuse_attention"]

_FUSED_DOMAIN = "aidge_interop"


def _scalar(name, consts):
    """The value of a one-element constant (initializer or Constant node), else None."""
    arr = consts.get(name)
    if arr is None or arr.size != 1 or arr.dtype.kind != "f":
        return None
    return float(arr.reshape(()))


def _constants(graph):
    from onnx import numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer
              if all(d == 1 for d in i.dims)}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return consts


def _dims(t):
    """Dims of a TypeProto (int, symbol str or None each), None without a shape."""
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in t.tensor_type.shape.dim]


def _differ(a, b):
    """Whether two dims are known to differ (two ints; a symbol may be anything)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def fuse_attention(proto, opset: int):
    """``proto`` with each attention block written as one FusedAttention node
    (a copy; ``proto`` itself when there is none), and the list of the
    rewritten blocks (the name of each final MatMul). ``opset``: the
    model's default-domain opset (Softmax's default axis before 13)."""
    import onnx
    from onnx import helper

    from .functions import _types

    graph = proto.graph
    if not any(n.op_type == "Softmax" for n in graph.node):
        return proto, []
    producer = {o: n for n in graph.node for o in n.output}
    readers = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}
    consts = _constants(graph)
    types = None

    def only_reader(value, node):
        return value not in outputs and [id(r) for r in readers.get(value, [])] == [id(node)]

    def match(final):
        """(nodes absorbed, inputs, attributes) of a block ending at MatMul
        ``final``, else None."""
        nonlocal types
        absorbed = [final]
        p = producer.get(final.input[0])
        if p is None or not only_reader(p.output[0], final):
            return None
        while p.op_type == "Cast":  # (softmax(dtype=float32) then .to(q.dtype): two)
            absorbed.append(p)
            src = p.input[0]
            if types is None:
                types = _types(proto, data_prop=True)
            t = types.get(src)
            to = next((a.i for a in p.attribute if a.name == "to"), None)
            if t is None or t.tensor_type.elem_type != to:
                return None
            p = producer.get(src)
            if p is None or not only_reader(p.output[0], absorbed[-1]):
                return None
        masked_zero = False
        if p.op_type == "Where":
            isnan = producer.get(p.input[0])
            if (isnan is None or isnan.op_type != "IsNaN" or _scalar(p.input[1], consts) != 0.0
                    or not only_reader(isnan.output[0], p)):
                return None
            sm = producer.get(p.input[2])
            if (sm is None or isnan.input[0] != sm.output[0] or sm.output[0] in outputs or
                    sorted(id(r) for r in readers[sm.output[0]]) != sorted([id(p), id(isnan)])):
                return None
            absorbed += [p, isnan]
            masked_zero = True
            p = sm
        if p.op_type != "Softmax":
            return None
        absorbed.append(p)
        axis = next((helper.get_attribute_value(a) for a in p.attribute if a.name == "axis"),
                    -1 if opset >= 13 else 1)
        x = producer.get(p.input[0])
        if x is None or not only_reader(x.output[0], p):
            return None
        mask = None
        if x.op_type == "Add":
            for k in (0, 1):
                s = producer.get(x.input[k])
                if s is not None and s.op_type in ("Mul", "Div", "MatMul") and \
                        only_reader(s.output[0], x):
                    mask = x.input[1 - k]
                    absorbed.append(x)
                    x = s
                    break
            else:
                return None
        scale = 1.0
        if x.op_type in ("Mul", "Div"):
            for k in ((0, 1) if x.op_type == "Mul" else (0,)):
                c = _scalar(x.input[1 - k], consts)
                mm = producer.get(x.input[k])
                if c and mm is not None and mm.op_type == "MatMul" and \
                        only_reader(mm.output[0], x):
                    scale = c if x.op_type == "Mul" else 1 / c
                    absorbed.append(x)
                    x = mm
                    break
            else:
                return None
        if x.op_type != "MatMul":
            return None
        absorbed.append(x)
        q, kt, v = x.input[0], x.input[1], final.input[1]
        if types is None:
            types = _types(proto, data_prop=True)
        dq, dk, dv = (_dims(types.get(n)) for n in (q, kt, v))
        if dq is None or dk is None or dv is None or len(dq) not in (3, 4) or \
                not len(dq) == len(dk) == len(dv):
            return None
        r = len(dq)
        if axis not in (-1, r - 1):
            return None
        if any(_differ(dq[i], dk[i]) or _differ(dq[i], dv[i]) for i in range(r - 2)) or \
                _differ(dq[-1], dk[-2]) or _differ(dk[-1], dv[-2]):
            return None
        if mask is not None:
            dm = _dims(types.get(mask))
            scores = dq[:-1] + [dk[-1]]
            if dm is None or len(dm) > r or any(
                    d != 1 and _differ(d, s)
                    for d, s in zip(reversed(dm), reversed(scores))):
                return None
        return absorbed, [q, kt, v] + ([mask] if mask else []), \
            {"scale": scale, "k_transposed": 1, "masked_zero": int(masked_zero)}

    replaced, done = {}, []
    dropped = set()
    for final in graph.node:
        if final.op_type != "MatMul" or (final.domain or "") not in ("", "ai.onnx"):
            continue
        m = match(final)
        if m is None:
            continue
        absorbed, inputs, attrs = m
        name = final.name or final.output[0]
        replaced[id(final)] = helper.make_node("FusedAttention", inputs, list(final.output),
                                               name=f"{name}/attention", domain=_FUSED_DOMAIN,
                                               **attrs)
        dropped.update(id(n) for n in absorbed[1:])
        done.append(name)
    if not done:
        return proto, []
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    if not any(o.domain == _FUSED_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(_FUSED_DOMAIN, 1))
    return out, done
