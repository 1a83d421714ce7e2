"""Quantized ONNX graphs at import: ONNX Runtime's quantized contrib
operators written as ONNX's own, and QDQ patterns fused into integer
operators.

``expand_contrib``: the ``com.microsoft`` operators that ONNX Runtime's
quantizer writes (QOperator format) and whose definition is
"dequantize, the float operator, quantize" become exactly that:

    QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearAveragePool,
    QLinearMul, QLinearConcat      DequantizeLinear -> op -> QuantizeLinear
    QuantizeLinear, DequantizeLinear (com.microsoft)    ONNX's
    MatMulIntegerToFloat, DynamicQuantizeMatMul         (Dynamic-
        QuantizeLinear ->) MatMulInteger -> Cast -> Mul by a_scale b_scale
        (-> Add bias)

ONNX Runtime computes the first group with 256-entry lookup tables
(sigmoid, leaky relu, the requantization of a concat input) or integer
approximations of exp (softmax): its results and the definition's are
within one quantum of each other. (QGemm, QLinearAdd and
QLinearGlobalAveragePool are engine operators, ops/qlinear.c.)

``fuse_qdq``: in the QDQ format a quantized Conv, MatMul or Gemm is
written as ``QuantizeLinear(op(DequantizeLinear(x), DequantizeLinear(w),
[DequantizeLinear(b)]))``. Where x and the output are quantized per tensor
to 8 bits, w is a constant quantized to 8 bits per tensor or per output
channel and the bias a constant int32 whose scale is x's times w's (as
ONNX Runtime's quantizer writes it), the pattern becomes one integer
operator: QLinearConv, QLinearMatMul or QGemm. The accumulation is then
exact (int32) and only the requantization rounds, where the float path
rounds every product and partial sum to float32 first: the two agree but
where the float sum lands within a float32 rounding of a tie of the final
QuantizeLinear, where they can differ by one quantum. ONNX Runtime fuses
the same patterns at its default optimization level.

Likewise ``QuantizeLinear(Add(DequantizeLinear(a), DequantizeLinear(b)))``
(the residual additions) and ``QuantizeLinear(GlobalAveragePool(
DequantizeLinear(x)))``, all per tensor with constant scales and zero
points of one 8-bit type, become ONNX Runtime's QLinearAdd and
QLinearGlobalAveragePool (com.microsoft, engine operators on the int8
kernels), computed in float64 (the pool's sum exact): the graph as written
rounds each dequantized value, the sum and the quotient to float32, and
the two differ by one quantum where that float32 value rounds onto or
across a tie k + 1/2 (2 sums in 10^6 of random scales,
tests/test_qlinear_add.py). ONNX Runtime fuses them too, into its fixed
point kernels, which round exact ties their own way.
"""
from __future__ import annotations

import numpy as np

__all__ = ["CONTRIB", "expand_contrib", "fuse_qdq"]

MS = "com.microsoft"
# contrib operator of one quantized input -> its float operator
_UNARY = {"QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu",
          "QLinearSoftmax": "Softmax", "QLinearAveragePool": "AveragePool"}
CONTRIB = tuple(_UNARY) + ("QLinearMul", "QLinearConcat", "QuantizeLinear", "DequantizeLinear",
                           "MatMulIntegerToFloat", "DynamicQuantizeMatMul")


def _onnx():
    import onnx

    return onnx


class _Writer:
    """New nodes and constants named under the replaced node's name."""

    def __init__(self, node, nodes, inits):
        self.prefix, self.nodes, self.inits, self.count = node.name or node.output[0], nodes, \
            inits, 0

    def name(self, what):
        self.count += 1
        return f"{self.prefix}/{what}_{self.count}"

    def op(self, op_type, inputs, outputs=None, **attrs):
        h = _onnx().helper
        outputs = outputs or [self.name(op_type)]
        self.nodes.append(h.make_node(op_type, list(inputs), outputs,
                                      name=self.name(op_type + "_node"), **attrs))
        return outputs[0]

    def const(self, array):
        name = self.name("const")
        self.inits.append(_onnx().numpy_helper.from_array(np.asarray(array), name))
        return name


def _attrs(node):
    h = _onnx().helper
    return {a.name: h.get_attribute_value(a) for a in node.attribute}


def _input(node, k):
    return node.input[k] if len(node.input) > k else ""


def _dq(w, x, scale, zp):
    return w.op("DequantizeLinear", [x, scale] + ([zp] if zp else []))


def _q(w, x, scale, zp, out):
    return w.op("QuantizeLinear", [x, scale] + ([zp] if zp else []), [out])


def _expand_one(node, w, opset, where):
    """Writes ``node`` as ONNX operators with ``w`` (``opset``: the model's)."""
    op, a, out = node.op_type, _attrs(node), node.output[0]
    if op in ("QuantizeLinear", "DequantizeLinear"):
        w.op(op, node.input, list(node.output), **a)
    elif op in _UNARY:
        if len(node.input) < 4:
            raise ValueError(f"{where}: {op} takes X, X_scale, X_zero_point, Y_scale"
                             "[, Y_zero_point]")
        x = _dq(w, node.input[0], node.input[1], node.input[2])
        last = a.pop("channels_last", 0) if op == "QLinearAveragePool" else 0
        if last:  # (N, spatial..., C): the pool runs on (N, C, spatial...)
            rank = len(a.get("kernel_shape", ())) + 2
            x = w.op("Transpose", [x], perm=[0, rank - 1] + list(range(1, rank - 1)))
        if op == "QLinearSoftmax":
            old, axis = a.pop("opset", 13) < 13, a.get("axis", -1)
            if not old and opset < 13:
                raise NotImplementedError(f"{where}: a Softmax of opset 13 (over one axis) "
                                          f"in a model of opset {opset}")
            if old:  # Softmax before opset 13: over the dims from axis on, flattened
                shape = w.op("Shape", [x])
                x = w.op("Flatten", [x], axis=axis)
                a["axis"] = 1  # (of the flattened matrix: the same in every opset)
            x = w.op("Softmax", [x], **a)
            if old:
                x = w.op("Reshape", [x, shape])
        else:
            x = w.op(_UNARY[op], [x], **a)
        if last:
            rank = len(a.get("kernel_shape", ())) + 2
            x = w.op("Transpose", [x], perm=[0] + list(range(2, rank)) + [1])
        _q(w, x, node.input[3], _input(node, 4), out)
    elif op == "QLinearMul":
        if len(node.input) < 7:
            raise ValueError(f"{where}: QLinearMul takes A, A_scale, A_zero_point, B, B_scale, "
                             "B_zero_point, C_scale[, C_zero_point]")
        ab = [_dq(w, node.input[k], node.input[k + 1], node.input[k + 2]) for k in (0, 3)]
        _q(w, w.op("Mul", ab), node.input[6], _input(node, 7), out)
    elif op == "QLinearConcat":
        if len(node.input) < 5 or (len(node.input) - 2) % 3:
            raise ValueError(f"{where}: QLinearConcat takes Y_scale, Y_zero_point, then "
                             f"(X, X_scale, X_zero_point) per input; {len(node.input)} inputs")
        xs = [_dq(w, *node.input[k:k + 3]) for k in range(2, len(node.input), 3)]
        _q(w, w.op("Concat", xs, axis=a["axis"]), node.input[0], node.input[1], out)
    else:  # MatMulIntegerToFloat, DynamicQuantizeMatMul
        if op == "MatMulIntegerToFloat":  # A, B, a_scale, b_scale[, a_zp, b_zp, bias]
            a_q, b, a_s, b_s = node.input[:4]
            a_zp, b_zp, bias = _input(node, 4), _input(node, 5), _input(node, 6)
        else:  # A (float), B, b_scale[, b_zp, bias]
            b, b_s, b_zp, bias = node.input[1], node.input[2], _input(node, 3), _input(node, 4)
            a_q, a_s, a_zp = (w.name("DynamicQuantizeLinear") for _ in range(3))
            w.op("DynamicQuantizeLinear", [node.input[0]], [a_q, a_s, a_zp])
        acc = w.op("MatMulInteger", [a_q, b, a_zp, b_zp])
        y = w.op("Mul", [w.op("Cast", [acc], to=1), w.op("Mul", [a_s, b_s])])
        w.op("Add", [y, bias], [out]) if bias else w.op("Identity", [y], [out])


def expand_contrib(proto, where: str):
    """``proto`` with the operators of CONTRIB (domain com.microsoft) written as
    ONNX's (a copy; ``proto`` itself when it has none)."""
    graph = proto.graph
    if not any(n.domain == MS and n.op_type in CONTRIB for n in graph.node):
        return proto
    nodes, inits = [], []
    opset = max([o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] or [1])
    for n in graph.node:
        if n.domain == MS and n.op_type in CONTRIB:
            _expand_one(n, _Writer(n, nodes, inits), opset,
                        f"{where}: {n.op_type} node '{n.name}'")
        else:
            nodes.append(n)
    return _rebuilt(proto, nodes, inits)


def _rebuilt(proto, nodes, inits):
    out = _onnx().ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(inits)
    return out


# ---------------------------------------------------------------- QDQ fusion

_INT8 = (2, 3)  # uint8, int8


def fuse_qdq(proto):
    """``proto`` with its QDQ Conv, MatMul, Gemm, Add and GlobalAveragePool
    fused into QLinearConv, QLinearMatMul, QGemm, QLinearAdd and
    QLinearGlobalAveragePool (module docstring); ``proto`` itself when none
    fits."""
    onnx = _onnx()
    h = onnx.helper
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}

    def const(name):
        return onnx.numpy_helper.to_array(inits[name]) if name in inits else None

    def dq_of(name):
        """(q, scale, zp, axis) of the DequantizeLinear (opset default domain)
        giving ``name`` with a constant scale and zero point, else None."""
        n = producer.get(name)
        if n is None or n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx"):
            return None
        a = _attrs(n)
        if a.get("block_size", 0) or "output_dtype" in a:
            return None
        s, zp = const(n.input[1]), const(_input(n, 2)) if _input(n, 2) else None
        if s is None or s.dtype != np.float32 or (_input(n, 2) and zp is None):
            return None
        return n, s, zp, a.get("axis", 1)

    def int8(name, zp):
        dt = inits[name].data_type if name in inits else None
        return (zp is not None and zp.dtype in (np.int8, np.uint8)) or dt in _INT8

    def q_after(n):
        """(the QuantizeLinear, its zero point) alone reading ``n``'s output, per tensor
        to 8 bits with constants, else None."""
        users = consumers.get(n.output[0], [])
        if len(users) != 1 or n.output[0] in outputs or users[0].op_type != "QuantizeLinear" \
                or users[0].domain not in ("", "ai.onnx"):
            return None
        q = users[0]
        qa = _attrs(q)
        qs, qzp = const(q.input[1]), const(_input(q, 2)) if _input(q, 2) else None
        if (qs is None or qs.size != 1 or qs.dtype != np.float32 or qzp is None or
                qzp.size != 1 or qzp.dtype not in (np.int8, np.uint8) or
                "output_dtype" in qa or qa.get("block_size", 0)):
            return None
        return q, qzp

    def dq_per_tensor(name, dtype):
        """the DequantizeLinear giving ``name``, per tensor with a zero point of ``dtype``"""
        d = dq_of(name)
        return d[0] if d and d[1].size == 1 and d[2] is not None and d[2].size == 1 and \
            d[2].dtype == dtype else None

    fused, dropped = {}, set()  # id(op node) -> replacement; consumed DQ/Q nodes
    for n in graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type in ("Add", "GlobalAveragePool"):  # (elementwise: one type throughout)
            qz = q_after(n)
            if qz is None or len(n.input) != (2 if n.op_type == "Add" else 1):
                continue
            q, qzp = qz
            dqs = [dq_per_tensor(i, qzp.dtype) for i in n.input]
            if None in dqs:
                continue
            name = (n.name or n.output[0]) + "/qdq"
            ins = [i for d in dqs for i in d.input[:3]] + list(q.input[1:3])
            fused[id(n)] = h.make_node("QLinear" + n.op_type, ins, [q.output[0]], name=name,
                                       domain=MS)
            dropped.add(id(q))
            continue
        if n.op_type not in ("Conv", "MatMul", "Gemm"):
            continue
        qz = q_after(n)
        if qz is None:
            continue
        q = qz[0]
        x, wt = dq_of(n.input[0]), dq_of(n.input[1])
        if x is None or wt is None or x[1].size != 1 or wt[0].input[0] not in inits:
            continue
        xq_dt = x[2].dtype if x[2] is not None else None
        if xq_dt not in (np.int8, np.uint8) or not int8(wt[0].input[0], wt[2]):
            continue
        a = _attrs(n)
        wdims = list(inits[wt[0].input[0]].dims)
        # the axis of w's output channels: Conv 0, MatMul 1, Gemm 0 (transB) or 1
        ch = 0 if n.op_type == "Conv" else (0 if a.get("transB", 0) else 1)
        if n.op_type == "MatMul" and len(wdims) != 2:
            continue
        if wt[1].size > 1 and (wt[2] is None or wt[1].ndim != 1 or
                               wt[3] % len(wdims) != ch):
            continue
        if wt[2] is None:
            continue
        bias = _input(n, 2)
        b = dq_of(bias) if bias else None
        if bias:
            if n.op_type == "MatMul" or b is None or b[0].input[0] not in inits or \
                    inits[b[0].input[0]].data_type != 6:  # int32
                continue
            want = np.float32(x[1].reshape(())) * wt[1].astype(np.float32)
            if b[1].size != want.size or not np.array_equal(b[1].reshape(-1),
                                                            want.reshape(-1)) or \
                    (b[2] is not None and np.any(b[2] != 0)):
                continue
            if n.op_type == "Gemm" and a.get("beta", 1.0) != 1.0:
                continue
        if n.op_type == "Gemm" and a.get("transA", 0):
            continue
        ins = [x[0].input[0], x[0].input[1], x[0].input[2], wt[0].input[0], wt[0].input[1],
               wt[0].input[2]]
        name = (n.name or n.output[0]) + "/qdq"
        if n.op_type == "Conv":
            new = h.make_node("QLinearConv", ins + [q.input[1], q.input[2]] +
                              ([b[0].input[0]] if bias else []), [q.output[0]], name=name, **a)
        elif n.op_type == "MatMul":
            new = h.make_node("QLinearMatMul", ins + [q.input[1], q.input[2]], [q.output[0]],
                              name=name)
        else:
            a.pop("beta", None)
            new = h.make_node("QGemm", ins + [b[0].input[0] if bias else "", q.input[1],
                                              q.input[2]], [q.output[0]], name=name,
                              domain=MS, **a)
        fused[id(n)] = new
        dropped.add(id(q))
    if not fused:
        return proto
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in dropped]
    # DequantizeLinear nodes whose outputs nothing reads any more
    while True:
        used = {i for n in nodes for i in n.input} | outputs
        dead = [n for n in nodes if n.op_type == "DequantizeLinear" and n.output[0] not in used]
        if not dead:
            break
        gone = {id(n) for n in dead}
        nodes = [n for n in nodes if id(n) not in gone]
    out = _rebuilt(proto, nodes, [])
    if not any(o.domain == MS for o in out.opset_import):
        out.opset_import.append(h.make_opsetid(MS, 1))
    return out
