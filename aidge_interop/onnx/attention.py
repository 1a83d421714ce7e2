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
exported sdpa does, instead of Softmax's NaN). It is written by
``nn.MultiheadAttention``/``nn.TransformerEncoderLayer`` and by
``transformers`` models (eager and sdpa attention: ViT, BERT with its mask,
GPT-2 with its causal mask as an additive one).

Around the block the node also takes, each a pass over memory forward and
backward less (issue 47):

- the scale torch's sdpa export applies to Q and K apart (a Mul by a
  scalar constant, or Cast(Sqrt(constant)), on each), into ``scale``;
- the Transposes that split the heads, rank 4: Q and V by (0, 2, 1, 3), Kt
  by (0, 2, 3, 1) from (B, T, H, D) projections, all three or none: the
  node reads Q, K, V in that layout (``bthd``, ``k_transposed`` 0); a
  Shape that read a transposed value reads the projection's, permuted
  (Shape -> Gather);
- a Transpose (0, 2, 1, 3) that alone reads the result: the node writes Y
  as (B, T, H, Dv) (``y_bthd``). sdpa's export puts a Reshape to the same
  shape between, which inference cannot prove the identity: that
  Transpose stays.

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
    import numpy as np
    from onnx import helper, numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer
              if all(d == 1 for d in i.dims)}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        elif n.op_type in ("Sqrt", "Cast") and n.input[0] in consts and \
                consts[n.input[0]].size == 1:  # sdpa's scales of Q and K: Cast(Sqrt(a constant))
            x = consts[n.input[0]]
            if n.op_type == "Sqrt":
                consts[n.output[0]] = np.sqrt(x)
            elif x.dtype.kind == "f":
                to = next(a.i for a in n.attribute if a.name == "to")
                consts[n.output[0]] = x.astype(helper.tensor_dtype_to_np_dtype(to))
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


def _perm(node):
    if node.op_type != "Transpose":
        return None
    return next((tuple(a.ints) for a in node.attribute if a.name == "perm"), None)


def _peel_scale(value, reader, producer, consts, only_reader):
    """``value`` (read by ``reader``) traced back through Muls by a scalar
    constant that nothing else reads: (the first value, the product of the
    constants, the Muls)."""
    scale, muls = 1.0, []
    while True:
        mul = producer.get(value)
        if mul is None or mul.op_type != "Mul" or not only_reader(value, reader):
            return value, scale, muls
        for k in (0, 1):
            c = _scalar(mul.input[1 - k], consts)
            if c:
                break
        else:
            return value, scale, muls
        scale *= c
        muls.append(mul)
        value, reader = mul.input[k], mul


def _transpose(value, perm, reader, producer, readers, outputs):
    """(the Transpose by ``perm`` that makes ``value``, the Shapes that read
    ``value`` besides ``reader``) when ``value`` has no other reader and is no
    graph output, else None."""
    t = producer.get(value)
    if t is None or _perm(t) != perm or value in outputs:
        return None
    others = [r for r in readers.get(value, []) if r is not reader]
    if len(others) + 1 != len(readers.get(value, [])) or \
            any(r.op_type != "Shape" or r.attribute for r in others):
        return None
    return t, others


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
        attrs = {"scale": scale, "k_transposed": 1, "masked_zero": int(masked_zero)}
        outs, shapes = list(final.output), []
        # the scale of Q and K apart (sdpa's two Muls by sqrt(scale)) into scale
        (q, cq, mq), (kt, ck, mk) = (_peel_scale(val, x, producer, consts, only_reader)
                                     for val in (q, kt))
        absorbed += mq + mk
        attrs["scale"] = scale * cq * ck
        # the heads' Transposes around the block: Q, K, V and Y read and
        # written in the projections' layout (B, T, H, D)
        if r == 4:
            last = {"q": mq[-1] if mq else x, "k": mk[-1] if mk else x}
            tq, tk, tv = (_transpose(val, perm, rd, producer, readers, outputs)
                          for val, perm, rd in ((q, (0, 2, 1, 3), last["q"]),
                                                (kt, (0, 2, 3, 1), last["k"]),
                                                (v, (0, 2, 1, 3), final)))
            if tq and tk and tv:
                absorbed += [tq[0], tk[0], tv[0]]
                shapes = [(sh, t) for t, shs in (tq, tk, tv) for sh in shs]
                q, kt, v = tq[0].input[0], tk[0].input[0], tv[0].input[0]
                attrs.update(k_transposed=0, bthd=1)
            ty = readers.get(final.output[0], [])
            if len(ty) == 1 and final.output[0] not in outputs and \
                    _perm(ty[0]) == (0, 2, 1, 3):
                absorbed.append(ty[0])
                outs = list(ty[0].output)
                attrs["y_bthd"] = 1
        return absorbed, [q, kt, v] + ([mask] if mask else []), outs, attrs, shapes

    replaced, done = {}, []
    dropped = set()
    for final in graph.node:
        if final.op_type != "MatMul" or (final.domain or "") not in ("", "ai.onnx"):
            continue
        m = match(final)
        if m is None:
            continue
        absorbed, inputs, outs, attrs, shapes = m
        name = final.name or final.output[0]
        replaced[id(final)] = [helper.make_node("FusedAttention", inputs, outs,
                                                name=f"{name}/attention", domain=_FUSED_DOMAIN,
                                                **attrs)]
        for sh, t in shapes:  # Shape(Transpose(x)): the Shape of x, permuted
            base = f"{sh.name or sh.output[0]}/untransposed"
            replaced[id(sh)] = [
                helper.make_node("Shape", [t.input[0]], [base], name=base),
                helper.make_node("Constant", [], [base + "_perm"], name=base + "_perm",
                                 value=helper.make_tensor(base + "_perm", onnx.TensorProto.INT64,
                                                          [len(_perm(t))], list(_perm(t)))),
                helper.make_node("Gather", [base, base + "_perm"], list(sh.output),
                                 name=base + "_gather", axis=0)]
        dropped.update(id(n) for n in absorbed[1:])
        done.append(name)
    if not done:
        return proto, []
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    nodes = [r for n in graph.node if id(n) not in dropped for r in replaced.get(id(n), [n])]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    if not any(o.domain == _FUSED_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(_FUSED_DOMAIN, 1))
    return out, done
