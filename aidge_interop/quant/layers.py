"""The layer list that quantization and the C export work on.

:func:`extract_layers` turns an engine :class:`~aidge_interop.graph.Graph`
(float, eval mode, planned by a forward) into a short list of
:class:`Layer` — the inference graph as an embedded export sees it:
BatchNormalization folded into the preceding Conv/Gemm (in float64),
Relu/Clip fused into the layer before when it is that layer's only
consumer, Identity/Dropout removed, MatMul with a constant matrix and its
bias Add turned into Gemm, Flatten/Reshape/Squeeze/Unsqueeze as
``Reshape`` to the planned shape, global pools as pools over the whole
map, and shape subgraphs (Shape, Gather, ... computing int64 shapes)
dropped. Transformers add MatMul of two activations, LayerNorm, Softmax,
Sigmoid/Tanh/Gelu (``Lookup``), scalar scalings (``Scale``), Transpose,
Gather/Slice/Split (``Gather``) and constants concatenated or added to an
activation. Anything else raises ``NotImplementedError`` naming the node.

Value names are the float graph's, so each layer output can be compared
with ``graph.intermediate(name)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Layer", "extract_layers", "LAYER_OPS"]

# layer op -> what it is
LAYER_OPS = {
    "Conv": "convolution (1 or 2 spatial dims, groups, fused clamp)",
    "Gemm": "fully connected y = x w^T + b (fused clamp)",
    "Add": "sum of two activations of one shape (fused clamp)",
    "MaxPool": "max pool (1 or 2 spatial dims)",
    "AveragePool": "average pool (1 or 2 spatial dims)",
    "Concat": "concatenation",
    "Reshape": "reshape (no data movement)",
    "Clip": "clamp (Relu, Clip) that could not be fused",
    "MatMul": "batched product of two activations (..., m, k) x (..., k, n)",
    "Scale": "multiplication by a positive scalar constant (a change of scale)",
    "Transpose": "axis permutation",
    "Gather": "constant indices along one axis (Gather, Slice of one axis, Split)",
    "LayerNorm": "layer normalization over the last axis",
    "Softmax": "softmax over the last axis",
    "Lookup": "elementwise function by a table (Sigmoid, Tanh, Gelu, Erf, ...)",
}
# elementwise functions computed by a table, with their attributes' defaults
LOOKUP_OPS = {"Sigmoid": {}, "Tanh": {}, "Erf": {}, "Gelu": {}, "Softplus": {},
              "HardSwish": {}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
              "LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 1.0}}


@dataclass
class Layer:
    name: str                 # the (first) source node's name
    op: str                   # one of LAYER_OPS (quantized graphs add "Requantize")
    inputs: list[str]         # activation values read
    output: str               # activation value written
    attrs: dict = field(default_factory=dict)
    weight: np.ndarray | None = None   # Conv (M, C/g, kh, kw) / Gemm (M, K)
    bias: np.ndarray | None = None     # (M,)
    lo: float = -math.inf     # fused clamp of the output
    hi: float = math.inf
    sources: list[str] = field(default_factory=list)  # node names merged into it


def _window_attrs(node, x_shape, y_shape, weight_shape=None):
    """strides, dilations, explicit pads (begin..., end...) and kernel of a
    Conv or pool node with 1 or 2 spatial dims, auto_pad resolved."""
    a = node["attrs"]
    nsp = len(x_shape) - 2
    where = f"{node['op_type']} node '{node['name']}'"
    if nsp not in (1, 2):
        raise NotImplementedError(f"{where}: {nsp} spatial dims; the export takes 1 or 2")
    kernel = list(weight_shape[2:]) if weight_shape is not None else list(a["kernel_shape"])
    strides = list(a.get("strides", [1] * nsp))
    dil = list(a.get("dilations", [1] * nsp))
    pads = list(a.get("pads", [0] * (2 * nsp)))
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        for d in range(nsp):
            out = -(-x_shape[2 + d] // strides[d])
            total = max(0, (out - 1) * strides[d] + dil[d] * (kernel[d] - 1) + 1 - x_shape[2 + d])
            small = total // 2
            pads[d], pads[nsp + d] = ((small, total - small) if auto == "SAME_UPPER"
                                      else (total - small, small))
    elif auto == "VALID":
        pads = [0] * (2 * nsp)
    # ceil_mode: fine when the planned output is the floor-mode one
    for d in range(nsp):
        span = dil[d] * (kernel[d] - 1) + 1
        floor_out = (x_shape[2 + d] + pads[d] + pads[nsp + d] - span) // strides[d] + 1
        if floor_out != y_shape[2 + d]:
            raise NotImplementedError(f"{where}: ceil_mode output sizes are not supported "
                                      "by the export")
    return {"kernel_shape": kernel, "strides": strides, "dilations": dil, "pads": pads}


def extract_layers(graph, where: str = "extract_layers"):
    """Returns ``(layers, inputs, outputs, shapes)``: the layer list, the
    graph's input and output value names, and every value's planned shape.
    ``graph`` must have run a forward (shapes planned) in eval mode."""
    nodes = graph.nodes()
    if any(n["output_shapes"] and n["output_shapes"][0] is None for n in nodes):
        raise ValueError(f"{where}: run a forward first (the graph has no planned shapes)")
    consts = {}
    for v in graph._g.values():
        if v["kind"] in ("param", "buffer", "const"):
            consts[v["name"]] = graph._g.value(v["name"]).numpy()
    inputs, outputs = list(graph.input_names), list(graph.output_names)
    producer = {o: n for n in nodes for o in n["outputs"]}
    shape = {}
    for n in nodes:
        shape.update({v: s for v, s in zip(n["inputs"], n["input_shapes"]) if v})
        shape.update(zip(n["outputs"], n["output_shapes"]))

    # values computed from the data of the graph inputs (the rest is fixed:
    # initializers, what is computed from them alone, e.g. an Identity of a
    # parameter, and from the planned shapes: attention's 1 / sqrt(head dim))
    varying = set(inputs)
    for n in nodes:
        if n["op_type"] not in ("Shape", "Size") and any(i in varying for i in n["inputs"]):
            varying.update(n["outputs"])

    # which nodes compute data that reaches an output (shape subgraphs do not)
    data_inputs = {"Pad": 1, "Reshape": 1, "Squeeze": 1, "Unsqueeze": 1, "Clip": 1, "Conv": 1,
                   "Gemm": 1, "BatchNormalization": 1, "Dropout": 1, "Gather": 1, "Slice": 1,
                   "Split": 1}
    needed, stack = set(), list(outputs)
    while stack:
        v = stack.pop()
        n = producer.get(v)
        if n is None or n["name"] in needed:
            continue
        needed.add(n["name"])
        k = data_inputs.get(n["op_type"], len(n["inputs"]))
        stack += [i for i in n["inputs"][:k] if i in varying]

    alias = {}  # removed value -> the value it equals
    layers: list[Layer] = []
    by_output: dict[str, Layer] = {}
    uses: dict[str, int] = {}
    for n in nodes:
        if n["name"] in needed:
            for i in n["inputs"]:
                uses[i] = uses.get(i, 0) + 1

    def val(name):
        while name in alias:
            name = alias[name]
        return name

    def fixed(name):
        """A value that does not depend on the inputs: an initializer, or computed
        from initializers (a folded shape subgraph, an Identity of a parameter)."""
        return consts[name] if name in consts else graph.intermediate(name)

    def planned(n, i):
        name = n["inputs"][i] if i < len(n["inputs"]) else ""
        return fixed(name) if name else None

    def const(n, i, what):
        name = n["inputs"][i] if i < len(n["inputs"]) else ""
        if not name:
            return None
        if name in varying:
            raise NotImplementedError(f"{where}: {n['op_type']} node '{n['name']}': the {what} "
                                      f"'{name}' depends on the inputs, it is not a constant; "
                                      "cannot export")
        return planned(n, i).astype(np.float64)

    def fusable(x):
        """The layer producing x, when x feeds nothing else and is not an output."""
        layer = by_output.get(x)
        if layer and uses.get(x, 0) == 1 and x not in outputs:
            return layer
        return None

    def add(layer):
        layers.append(layer)
        by_output[layer.output] = layer

    def absorb(layer, n):
        """Layer now ends with node n: its output becomes n's."""
        del by_output[layer.output]
        layer.output = n["outputs"][0]
        layer.sources.append(n["name"])
        by_output[layer.output] = layer

    def extract(n):
        op, name = n["op_type"], n["name"]
        nwhere = f"{where}: {op} node '{name}'"
        x = val(n["inputs"][0]) if n["inputs"] else ""
        y = n["outputs"][0]
        if n["domain"] == "aidge_interop" and op == "FusedMatMul":
            # recipe fuse_linear: a Gemm (transB, bias as C) over the rows of an
            # input of any rank, as a MatMul by a constant
            extract(dict(n, op_type="Gemm", domain="", any_rank=True))
            return
        if n["domain"] == "aidge_interop" and op in ("FusedConv", "FusedGemm"):
            # a recipe's fusion (aidge_interop.recipes): the base operator, an
            # optional flatten before it and an activation after it
            a = n["attrs"]
            if a.get("y_blocked", 0):
                raise NotImplementedError(f"{nwhere}: it runs in blocked channels (recipe "
                                          "block_channels), which cannot be exported; export "
                                          "the graph before that recipe")
            if "bn_epsilon" in a:
                raise NotImplementedError(f"{nwhere}: its BatchNorm epilogue (recipe "
                                          "batchnorm_epilogue) cannot be exported; use "
                                          "fuse_batchnorm, or expand_metaops first")
            if op == "FusedGemm" and a.get("flatten_axis", -1) >= 0:
                ax, xs = a["flatten_axis"], shape[x]
                flat = f"{name}.flatten"
                shape[flat] = (int(np.prod(xs[:ax])), int(np.prod(xs[ax:])))
                add(Layer(flat, "Reshape", [x], flat, {"shape": list(shape[flat])},
                          sources=[name]))
                x = flat
            base = dict(n, op_type=op[len("Fused"):], domain="",
                        inputs=[x] + list(n["inputs"][1:]))
            extract(base)
            act = a.get("activation", "")
            if act:
                lo, hi = (0.0, math.inf) if act == "Relu" else tuple(a["activation_params"])
                layer = by_output[y]
                layer.lo, layer.hi = max(layer.lo, lo), min(layer.hi, hi)
            return
        if n["domain"] not in ("", "ai.onnx"):
            raise NotImplementedError(f"{nwhere}: domain '{n['domain']}' cannot be exported")
        if op in ("Identity", "Dropout"):
            if op == "Dropout" and len(n["outputs"]) > 1 and n["outputs"][1] in uses:
                raise NotImplementedError(f"{nwhere}: the mask output is used")
            alias[y] = x
        elif op == "Pad":
            pads, value = planned(n, 1), planned(n, 2)
            mode = n["attrs"].get("mode", "constant")
            if mode != "constant" or (value is not None and float(value) != 0.0) or \
                    len(n["inputs"]) > 3 and n["inputs"][3]:
                raise NotImplementedError(f"{nwhere}: only zero padding (folded into the "
                                          "Conv after it) can be exported")
            add(Layer(name, "Pad", [x], y, {"pads": [int(p) for p in pads]}, sources=[name]))
        elif op == "Conv":
            w = const(n, 1, "weight")
            attrs = _window_attrs(n, shape[x], shape[y], w.shape)
            attrs["group"] = n["attrs"].get("group", 1)
            pad = fusable(x)
            if pad is not None and pad.op == "Pad":
                r, p = len(shape[y]), pad.attrs["pads"]
                nsp = r - 2
                if any(p[:2]) or any(p[r:r + 2]):
                    raise NotImplementedError(f"{nwhere}: the Pad before it pads the batch or "
                                              "channel axis")
                attrs["pads"] = [a + b for a, b in zip(attrs["pads"], p[2:r] + p[r + 2:])]
                del by_output[pad.output]
                layers.remove(pad)
                x = pad.inputs[0]
                assert len(attrs["pads"]) == 2 * nsp
            b = const(n, 2, "bias")
            add(Layer(name, "Conv", [x], y, attrs, w, b, sources=[name]))
        elif op == "MatMul" and val(n["inputs"][1]) in varying:
            b = val(n["inputs"][1])
            xs, bs = shape[x], shape[b]
            if len(xs) < 2 or len(xs) != len(bs) or xs[:-2] != bs[:-2]:
                raise NotImplementedError(f"{nwhere}: a product of two activations is "
                                          "exported for (..., m, k) x (..., k, n) with the "
                                          f"same leading dims, not {xs} x {bs}")
            add(Layer(name, "MatMul", [x, b], y, sources=[name]))
        elif op in ("Gemm", "MatMul"):
            a = n["attrs"]
            b_const = const(n, 1, "weight")
            if (len(shape[x]) != 2 and op == "Gemm" and not n.get("any_rank")) or \
                    len(shape[x]) < 2 or b_const.ndim != 2:
                raise NotImplementedError(f"{nwhere}: only (..., K) inputs times a constant "
                                          "matrix can be exported")
            if a.get("transA", 0):
                raise NotImplementedError(f"{nwhere}: transA=1 is not supported")
            w = b_const if (op == "Gemm" and a.get("transB", 0)) else b_const.T
            w = w * a.get("alpha", 1.0)
            bias = const(n, 2, "bias") if op == "Gemm" else None
            if bias is not None:
                bias = np.broadcast_to(bias * a.get("beta", 1.0), (w.shape[0],)).copy()
            add(Layer(name, "Gemm", [x], y, {}, np.ascontiguousarray(w), bias, sources=[name]))
        elif op == "BatchNormalization":
            layer = fusable(x)
            if layer is None or layer.op not in ("Conv", "Gemm") or layer.lo > -math.inf or \
                    layer.hi < math.inf:
                raise NotImplementedError(f"{nwhere}: a BatchNormalization must follow a Conv or "
                                          "Gemm that feeds nothing else, to be folded into it")
            scale, beta, mean, var = (const(n, i, w) for i, w in
                                      enumerate(("scale", "bias", "mean", "var"), 1))
            k = scale / np.sqrt(var + n["attrs"].get("epsilon", 1e-5))
            layer.weight = layer.weight * k.reshape((-1,) + (1,) * (layer.weight.ndim - 1))
            b = layer.bias if layer.bias is not None else 0.0
            layer.bias = (b - mean) * k + beta
            absorb(layer, n)
        elif op == "Add":
            other = [val(i) for i in n["inputs"]]
            if any(i not in varying for i in other):
                c_name = next(i for i in other if i not in varying)
                xin = next((i for i in other if i in varying), None)
                layer = fusable(xin) if xin else None
                c = fixed(c_name).astype(np.float64)
                if layer is None or layer.op not in ("Gemm", "Conv") or layer.hi < math.inf \
                        or layer.lo > -math.inf or c.size != layer.weight.shape[0]:
                    while c.ndim and c.shape[0] == 1:
                        c = c[0]
                    xs = shape[xin] if xin else ()
                    if xin is None or c.ndim > len(xs) or tuple(xs[len(xs) - c.ndim:]) != \
                            c.shape or tuple(shape[y]) != tuple(xs):
                        raise NotImplementedError(f"{nwhere}: adding a constant is exported as "
                                                  "the bias of the Conv/Gemm/MatMul before it, "
                                                  "or when it has the shape of the last axes "
                                                  "of the activation")
                    add(Layer(name, "Add", [xin], y, weight=c, sources=[name]))
                    return
                if layer.op == "Conv" and c.ndim >= 3 and c.shape[-1] * c.shape[-2] != 1:
                    raise NotImplementedError(f"{nwhere}: the constant is not per channel")
                b = layer.bias if layer.bias is not None else 0.0
                layer.bias = b + c.reshape(-1)
                absorb(layer, n)
            else:
                if shape[other[0]] != shape[other[1]]:
                    raise NotImplementedError(f"{nwhere}: broadcasting Add cannot be exported")
                add(Layer(name, "Add", other, y, sources=[name]))
        elif op in ("Mul", "Div") and any(val(i) not in varying for i in n["inputs"]):
            c_name = next(val(i) for i in n["inputs"] if val(i) not in varying)
            xin = next((val(i) for i in n["inputs"] if val(i) in varying), None)
            layer = fusable(xin) if xin else None
            c = fixed(c_name).astype(np.float64)
            if op == "Div" and c_name != val(n["inputs"][1]):
                layer = None  # constant / x is not a scaling
            m = layer.weight.shape[0] if layer is not None and layer.weight is not None else -1
            per_channel = c.size == 1 or (c.size == m and (layer.op == "Gemm" or c.ndim >= 3
                                          and c.shape[-1] * c.shape[-2] == 1 if c.ndim >= 2
                                          else layer.op == "Gemm"))
            if (layer is None or layer.op not in ("Conv", "Gemm") or layer.lo > -math.inf or
                    layer.hi < math.inf or not per_channel) and c.size == 1 and \
                    float(c.reshape(-1)[0]) > 0 and xin is not None:
                k = float(c.reshape(-1)[0])
                add(Layer(name, "Scale", [xin], y, {"factor": 1.0 / k if op == "Div" else k},
                          sources=[name]))
                return
            if layer is None or layer.op not in ("Conv", "Gemm") or layer.lo > -math.inf or \
                    layer.hi < math.inf or not per_channel:
                raise NotImplementedError(f"{nwhere}: scaling by a constant is exported only "
                                          "folded into the Conv/Gemm before it (per tensor or "
                                          "per output channel)")
            k = (1.0 / c if op == "Div" else c).reshape(-1)
            layer.weight = layer.weight * (k.reshape((-1,) + (1,) * (layer.weight.ndim - 1))
                                           if k.size > 1 else k[0])
            if layer.bias is not None:
                layer.bias = layer.bias * k
            absorb(layer, n)
        elif op in ("Relu", "Clip"):
            if op == "Relu":
                lo, hi = 0.0, math.inf
            else:
                lo = const(n, 1, "min")
                hi = const(n, 2, "max")
                lo = n["attrs"].get("min", -math.inf) if lo is None else float(lo)
                hi = n["attrs"].get("max", math.inf) if hi is None else float(hi)
            layer = fusable(x)
            if layer is not None and layer.op in ("Conv", "Gemm", "Add"):
                layer.lo, layer.hi = max(layer.lo, lo), min(layer.hi, hi)
                absorb(layer, n)
            else:
                add(Layer(name, "Clip", [x], y, lo=lo, hi=hi, sources=[name]))
        elif op in ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"):
            if op == "MaxPool" and len(n["outputs"]) > 1 and n["outputs"][1] in uses:
                raise NotImplementedError(f"{nwhere}: the Indices output cannot be exported")
            if op.startswith("Global"):
                sp = shape[x][2:]
                if len(sp) not in (1, 2):
                    raise NotImplementedError(f"{nwhere}: {len(sp)} spatial dims; the export "
                                              "takes 1 or 2")
                attrs = {"kernel_shape": list(sp), "strides": [1] * len(sp),
                         "dilations": [1] * len(sp), "pads": [0] * (2 * len(sp))}
            else:
                attrs = _window_attrs(n, shape[x], shape[y])
            attrs["count_include_pad"] = n["attrs"].get("count_include_pad", 0)
            add(Layer(name, op.replace("Global", ""), [x], y, attrs, sources=[name]))
        elif op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze"):
            add(Layer(name, "Reshape", [x], y, {"shape": list(shape[y])}, sources=[name]))
        elif op == "Concat":
            axis = n["attrs"]["axis"] % len(shape[y])
            ins = [val(i) for i in n["inputs"]]
            # constants (a class token expanded along the batch): the same for every sample
            consts = {k: fixed(i).astype(np.float64) for k, i in enumerate(ins)
                      if i not in varying}
            if consts and (axis == 0 or any((c != c[:1]).any() for c in consts.values())):
                raise NotImplementedError(f"{nwhere}: a constant that differs along the batch "
                                          "is concatenated")
            add(Layer(name, "Concat", [i for i in ins if i in varying], y,
                      {"axis": axis, "constants": {k: c[:1] for k, c in consts.items()}},
                      sources=[name]))
        elif op == "Transpose":
            r = len(shape[x])
            perm = [int(p) % r for p in n["attrs"].get("perm", range(r - 1, -1, -1))]
            if r > 8:
                raise NotImplementedError(f"{nwhere}: more than 8 axes")
            add(Layer(name, "Transpose", [x], y, {"perm": perm}, sources=[name]))
        elif op in ("Gather", "Slice"):
            r = len(shape[x])
            if op == "Gather":
                axis = n["attrs"].get("axis", 0) % r
                idx = const(n, 1, "indices").astype(np.int64)
            else:
                starts, ends = const(n, 1, "starts"), const(n, 2, "ends")
                axes, steps = planned(n, 3), planned(n, 4)
                axes = list(range(len(starts))) if axes is None else [int(a) % r for a in axes]
                steps = [1] * len(starts) if steps is None else list(steps)
                cut = [k for k, a in enumerate(axes)
                       if not (starts[k] == 0 and steps[k] == 1 and ends[k] >= shape[x][a])]
                if len(cut) > 1:
                    raise NotImplementedError(f"{nwhere}: a Slice of several axes cannot be "
                                              "exported")
                k = cut[0] if cut else 0
                axis = axes[k] if axes else 0
                idx = np.array(range(shape[x][axis]))[slice(int(max(starts[k], -2 ** 62)), int(
                    min(ends[k], 2 ** 62)), int(steps[k]))] if axes else np.arange(shape[x][0])
            n_axis = shape[x][axis]
            if ((idx < -n_axis) | (idx >= n_axis)).any():
                raise NotImplementedError(f"{nwhere}: an index is out of range")
            add(Layer(name, "Gather", [x], y, {"axis": axis, "indices": idx % n_axis},
                      sources=[name]))
        elif op == "Split":  # one Gather of a range per used output
            axis, start = n["attrs"].get("axis", 0) % len(shape[x]), 0
            for k, out in enumerate(n["outputs"]):
                size = shape[out][axis]
                if out in uses or out in outputs:
                    add(Layer(f"{name}.{k}", "Gather", [x], out,
                              {"axis": axis, "indices": np.arange(start, start + size)},
                              sources=[name]))
                start += size
        elif op == "LayerNormalization":
            r = len(shape[x])
            if n["attrs"].get("axis", -1) % r != r - 1:
                raise NotImplementedError(f"{nwhere}: only a normalization over the last axis "
                                          "can be exported")
            d = shape[x][-1]
            gamma = np.broadcast_to(const(n, 1, "scale"), (d,)).copy()
            beta = const(n, 2, "bias")
            beta = np.zeros(d) if beta is None else np.broadcast_to(beta, (d,)).copy()
            add(Layer(name, "LayerNorm", [x], y, {"epsilon": n["attrs"].get("epsilon", 1e-5)},
                      gamma, beta, sources=[name]))
        elif op == "Softmax":
            r = len(shape[x])
            if n["attrs"].get("axis", -1) % r != r - 1:
                raise NotImplementedError(f"{nwhere}: only a softmax over the last axis can be "
                                          "exported")
            add(Layer(name, "Softmax", [x], y, sources=[name]))
        elif op in LOOKUP_OPS:
            fn = op
            if op == "Gelu" and n["attrs"].get("approximate", "none") == "tanh":
                fn = "GeluTanh"
            params = {k: float(n["attrs"].get(k, v)) for k, v in LOOKUP_OPS[op].items()}
            add(Layer(name, "Lookup", [x], y, {"function": fn, **params}, sources=[name]))
        else:
            raise NotImplementedError(
                f"{nwhere}: not supported by quantization and export (supported: Conv, Gemm, "
                "MatMul, BatchNormalization, Add, Mul/Div by a constant, Relu, Clip, MaxPool, "
                "AveragePool, "
                "GlobalAveragePool, GlobalMaxPool, Flatten, Reshape, Squeeze, Unsqueeze, "
                "Concat, Identity, Dropout, Transpose, Gather, Slice, Split, "
                "LayerNormalization, Softmax, " + ", ".join(LOOKUP_OPS) + ")")
    for n in nodes:
        if n["name"] in needed:
            extract(n)

    for layer in layers:
        if layer.op == "Pad":
            raise NotImplementedError(f"{where}: Pad node '{layer.name}' does not feed a Conv "
                                      "alone; only padding folded into a Conv can be exported")
    outputs = [val(o) for o in outputs]
    for o in outputs:
        if o in inputs:
            raise NotImplementedError(f"{where}: output '{o}' is a graph input")
    for layer in layers:
        if layer.weight is not None:
            layer.weight = np.ascontiguousarray(layer.weight)
    return layers, inputs, outputs, shape
