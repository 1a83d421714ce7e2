"""Post-training int8 quantization (symmetric; weights per output channel or
per tensor).

``quantize(model, calibration_inputs)`` calibrates the float graph on
sample inputs, quantizes weights to ``nb_bits`` and biases to int32, and
builds an engine graph of integer operators (ONNX domain
``aidge_interop.quant``, see csrc/ops/quant.c) that runs on int8 inputs.
The exact arithmetic is in docs/quantization.md; in short:

- activation ``v`` has a scale ``s_v``: real ≈ int * s_v, ints in
  [-qmax, qmax], qmax = 2**(nb_bits - 1) - 1;
- ``single_shift=True``: every activation scale is a power of two, and
  the weights' scale is chosen (at most 2x coarser than max/qmax) so that
  each layer rescales its int32 accumulator by one rounding right shift;
  ``single_shift=False``: scales are clip/qmax and each rescale is a 15-bit
  fixed-point multiplier and a shift;
- ``clipping="max"`` takes the calibrated maximum |value|; ``"mse"`` the
  clip (among the candidates of the scale grid) with the least mean square
  error on the calibration histogram (weights always use their maximum);
- ``per_channel=True``: every output channel of a Conv or Gemm has its own
  weight scale (its own maximum), and so its own rescale of the
  accumulator; ``False``: one weight scale per layer.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..graph import Graph
from .layers import Layer, extract_layers

__all__ = ["quantize", "QuantizedModel", "accuracy", "QUANT_DOMAIN"]

QUANT_DOMAIN = "aidge_interop.quant"
_HIST_BINS = 2048


def round_half_up(x):
    """floor(x + 1/2): the rounding of every quantization step here and in C."""
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5)


# -- inputs ---------------------------------------------------------------------

def _as_graph(model, sample_shapes, where):
    """A float engine Graph from a Graph, an AidgeModule, a torch module
    (wrapped here), an ONNX path, bytes or ModelProto."""
    if isinstance(model, Graph):
        return model
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(model, torch.nn.Module):
        from ..bridge import AidgeModule, wrap

        if not isinstance(model, AidgeModule):
            _check_arity(model, len(sample_shapes), where)
            model = wrap(model.eval(), [(1, *s) for s in sample_shapes])
        # the module's graph again, its values shared, with the attention
        # blocks unfused: the quantizer reads their MatMuls and Softmax
        from ..bridge.wrapping import _build_graph

        g, _ = _build_graph(model.onnx_model, values=model._sources, share_values=True,
                            where=where, input_shapes=model.input_dims,
                            param_kinds={i.name: "buffer" if i.name in model._sources
                                         else "const" for i in model.onnx_model.graph.initializer},
                            fuse_attention_blocks=False)
        return Graph(g, model.onnx_model)
    from ..onnx import load_onnx

    return load_onnx(model, where=where, fuse_attention_blocks=False)


def _check_arity(module, n, where):
    """A clear error when `n` input arrays cannot feed module.forward."""
    import inspect

    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= n <= len(positional):
        raise ValueError(f"{where}: {type(module).__name__}.forward takes {len(required)} "
                         f"inputs, got {n} arrays (one array per input, samples first; a "
                         "list of samples needs a graph that declares its input ranks: "
                         "aidge_interop.wrap the module first, or stack the samples)")


def _array(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _declared_dims(graph) -> list:
    """Per graph input, the dims its model declares (an int, or None where
    symbolic), or None where the rank is not declared."""
    declared = {}
    if graph.proto is not None:
        for v in graph.proto.graph.input:
            t = v.type.tensor_type
            if t.HasField("shape"):
                declared[v.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                         for d in t.shape.dim)
    return [declared.get(n) for n in graph.input_names]


def _fits(shape, dims, batched: bool) -> bool:
    """Whether an array of `shape` matches declared `dims` (with its batch
    axis, or without when not `batched`); static dims past the batch must be equal."""
    if dims is None:
        return True
    dims = dims if batched else dims[1:]
    skip = 1 if batched else 0
    return len(shape) == len(dims) and all(
        d is None or s == d for k, (s, d) in enumerate(zip(shape, dims)) if k >= skip)


def _calibration_arrays(inputs, graph, where):
    """The calibration set as one array per graph input, samples first.

    ``inputs``: one array per input (samples first; a single array for a
    one-input graph), or a list of samples: for a one-input graph each an
    array (or engine/torch tensor) with or without the batch axis, for
    several inputs each a list or tuple of one array per input. A flat list
    as long as the graph's inputs is one array per input when the declared
    ranks say so."""
    n, dims = len(graph.input_names), _declared_dims(graph)
    if not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    if inputs and all(isinstance(x, (list, tuple)) for x in inputs):  # samples of n arrays
        bad = [k for k, x in enumerate(inputs) if len(x) != n]
        if bad:
            raise ValueError(f"{where}: sample {bad[0]} holds {len(inputs[bad[0]])} arrays; "
                             f"the graph takes {n} inputs")
        samples = [[_array(a) for a in x] for x in inputs]
    else:
        arrays = [_array(x) for x in inputs]
        if len(arrays) == n and all(_fits(a.shape, d, True) for a, d in zip(arrays, dims)):
            return _as_arrays(arrays, n, where)  # one array per input
        if n != 1:
            raise ValueError(f"{where}: the graph takes {n} inputs, got {len(arrays)} arrays; "
                             "give one array per input (samples first) or a list of samples, "
                             f"each a list of {n} arrays")
        samples = [[a] for a in arrays]
    stacked = []
    for k in range(n):
        shapes = {s[k].shape for s in samples}
        if len(shapes) != 1:
            raise ValueError(f"{where}: the samples of input {k} have different shapes "
                             f"{sorted(shapes)}")
        shape = shapes.pop()
        if dims[k] is None:
            raise ValueError(f"{where}: input '{graph.input_names[k]}' declares no rank, so "
                             f"samples of shape {shape} are ambiguous (with or without the "
                             "batch axis); give one array per input, samples first")
        if shape[:1] == (1,) and _fits(shape, dims[k], True):  # a batch of one
            stacked.append(np.concatenate([s[k] for s in samples]))
        elif _fits(shape, dims[k], False):
            stacked.append(np.stack([s[k] for s in samples]))
        else:
            want = "x".join("?" if d is None else str(d) for d in dims[k])
            raise ValueError(f"{where}: the graph takes {n} input(s), got a list of "
                             f"{len(samples)} arrays of shape {shape}: not one array per input, "
                             f"nor samples of input '{graph.input_names[k]}' (declared {want}; "
                             "a sample has a batch axis of 1 or none)")
    return _as_arrays(stacked, n, where)


def _as_arrays(inputs, n_inputs, where):
    """One float array per graph input, the first axis the samples."""
    if len(inputs) != n_inputs:
        raise ValueError(f"{where}: the graph takes {n_inputs} inputs, got {len(inputs)} arrays")
    arrays = []
    for i, x in enumerate(inputs):
        x = _array(x)
        if x.ndim < 1 or x.shape[0] == 0:
            raise ValueError(f"{where}: input {i} has no samples (shape {x.shape})")
        if x.dtype.kind != "f":
            raise TypeError(f"{where}: input {i} is {x.dtype}; float samples expected")
        arrays.append(np.ascontiguousarray(x, dtype=np.float32))
    if len({a.shape[0] for a in arrays}) != 1:
        raise ValueError(f"{where}: the inputs have different numbers of samples")
    return arrays


def _static_batch(graph, arrays, batch_size, where) -> int:
    """The batch the calibration runs: the model's declared batch where it
    is static (a model exported for batch 1 runs one sample at a time),
    else batch_size."""
    static = {d[0] for d in _declared_dims(graph) if d and d[0] is not None}
    if not static:
        return batch_size
    b = min(static)
    if arrays[0].shape[0] % b:
        raise ValueError(f"{where}: the model's batch dimension is {b}, and "
                         f"{arrays[0].shape[0]} calibration samples are not a multiple of it")
    return b


def _batches(arrays, batch_size):
    n = arrays[0].shape[0]
    for i in range(0, n, batch_size):
        yield [a[i:i + batch_size] for a in arrays]


# -- scales ---------------------------------------------------------------------

def _mse_clip(hist, edges, zeros, candidates, qmax):
    """The candidate clip with the least squared error over the histogram of
    |value| (bin centres; exact zeros are exact)."""
    centres = (edges[:-1] + edges[1:]) / 2
    hist = hist.copy()
    hist[0] -= zeros  # exact zeros (after a ReLU, most values) quantize exactly
    best, best_err = candidates[0], math.inf
    for c in candidates:
        step = c / qmax
        q = np.minimum(round_half_up(centres / step), qmax) * step
        err = float(np.sum(hist * (centres - q) ** 2))
        if err < best_err:
            best, best_err = c, err
    return best


def _scale(stats, qmax, clipping, pow2):
    """Scale of one activation from its calibration statistics."""
    amax = stats["max"]
    if not amax > 0 or not math.isfinite(amax):
        if not math.isfinite(amax):
            raise ValueError("non-finite calibration value")
        amax = 1.0  # an all-zero tensor: any scale represents it
    if pow2:
        k = math.floor(math.log2(qmax / amax))  # scale 2**-k covers amax
        if clipping == "mse" and "hist" in stats:
            cands = [qmax * 2.0 ** -(k + j) for j in range(0, 9)]
            c = _mse_clip(stats["hist"], stats["edges"], stats["zeros"], cands, qmax)
            return c / qmax
        return 2.0 ** -k
    if clipping == "mse" and "hist" in stats:
        cands = list(np.linspace(amax / 64, amax, 128))
        return _mse_clip(stats["hist"], stats["edges"], stats["zeros"], cands, qmax) / qmax
    return amax / qmax


def _fixed_point(ratio, where, single_shift):
    """(multiplier, shift) with multiplier * 2**-shift ≈ ratio (> 0). With
    single_shift the ratio is a power of two and the multiplier 1 (or a
    power of two when the ratio is above 1)."""
    if single_shift:
        e = round(math.log2(ratio))
        if not math.isclose(2.0 ** e, ratio, rel_tol=1e-9):
            raise AssertionError(f"{where}: ratio {ratio} is not a power of two")
        if e > 30:
            raise ValueError(f"{where}: rescale factor 2**{e} overflows")
        return (1, min(-e, 62)) if e <= 0 else (1 << e, 0)
    shift = 14 - math.floor(math.log2(ratio))
    shift = min(max(shift, 0), 62)
    m = int(round_half_up(ratio * 2.0 ** shift))
    if m > 2 ** 31 - 1:
        raise ValueError(f"{where}: rescale factor {ratio:g} is too large")
    return max(m, 1), shift


# -- the quantized model --------------------------------------------------------

@dataclass
class QLayer:
    """A layer of the quantized model, with its integer parameters."""
    name: str
    op: str
    inputs: list[str]
    output: str
    attrs: dict
    weight: np.ndarray | None = None   # int8
    bias: np.ndarray | None = None     # int32
    # per-channel Conv/Gemm: int64 arrays of one value per output channel
    multiplier: int | np.ndarray = 1
    shift: int | np.ndarray = 0
    lo: int = 0
    hi: int = 0
    multipliers: tuple = ()            # Add: (a, b); Requantize of Concat inputs
    in_scales: list[float] = field(default_factory=list)
    out_scale: float = 1.0
    weight_scale: float | np.ndarray | None = None  # per channel: an array
    sources: list[str] = field(default_factory=list)
    half_even: bool = False  # its requantization rounds ties to even (rounding="half_even")


class QuantizedModel:
    """An int8 model: the engine graph of integer operators, its layers and
    scales. Call it on float inputs (quantized, run, dequantized), or use
    :meth:`run` on int8 inputs; :meth:`accuracy` on a labelled set."""

    def __init__(self, layers, inputs, outputs, shapes, scales, nb_bits, single_shift,
                 clipping, sample_inputs, per_channel=False, rounding="half_up"):
        self.layers: list[QLayer] = layers
        self.input_names, self.output_names = inputs, outputs
        self.shapes = shapes  # value -> shape at the calibration batch
        self.scales: dict[str, float] = scales
        self.nb_bits, self.single_shift, self.clipping = nb_bits, single_shift, clipping
        self.per_channel, self.rounding = per_channel, rounding
        self.qmax = 2 ** (nb_bits - 1) - 1
        self.sample_inputs = sample_inputs  # one calibration sample per input (float)
        self.onnx_model = self._build_onnx()
        from ..onnx import load_onnx

        self.graph = load_onnx(self.onnx_model, where="quantize")

    @property
    def input_scales(self):
        return [self.scales[n] for n in self.input_names]

    @property
    def output_scales(self):
        return [self.scales[n] for n in self.output_names]

    def quantize_inputs(self, *inputs):
        """Float inputs -> int8: clamp(round_half_up(x / scale), -qmax, qmax); with
        rounding="half_even" ONNX's QuantizeLinear, rint(x / scale) in float32."""
        out = []
        for x, name in zip(inputs, self.input_names):
            x = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
            if self.rounding == "half_even":
                q = np.rint(x.astype(np.float32) / np.float32(self.scales[name]))
            else:
                q = round_half_up(x / self.scales[name])
            q = np.clip(q, -self.qmax, self.qmax)
            out.append(q.astype(np.int8))
        return out

    def dequantize_outputs(self, outputs):
        return [o.astype(np.float32) * np.float32(self.scales[n])
                for o, n in zip(outputs, self.output_names)]

    def run(self, *int_inputs):
        """The engine's int8 outputs for int8 inputs."""
        return self.graph.forward(list(int_inputs))

    def __call__(self, *inputs):
        return self.dequantize_outputs(self.run(*self.quantize_inputs(*inputs)))

    def accuracy(self, inputs, labels, batch_size: int = 256) -> float:
        """Top-1 accuracy (0..1) on float inputs with integer labels."""
        return accuracy(self, inputs, labels, batch_size)

    def to_onnx_qdq(self, path=None):
        """The model in ONNX's QDQ format (float in, float out), for ONNX Runtime
        and other runtimes: an ``onnx.ModelProto``, also saved to ``path`` when
        given. It computes the integer model but for rounding: QuantizeLinear
        rounds half to even where the engine rounds half up, unless quantized with
        ``rounding="half_even"`` (``quant/qdq.py``)."""
        from .qdq import to_qdq_onnx

        model = to_qdq_onnx(self)
        if path is not None:
            import onnx

            onnx.save(model, os.fspath(path))
        return model

    def summary(self) -> str:
        """One line per layer: op, scales, rescale, clamp (per channel: the
        smallest..largest weight scale, multiplier and shift)."""
        rows = [f"{'layer':<28} {'op':<12} {'in scale':>10} {'w scale':>18} {'out scale':>10} "
                f"{'mult':>12} {'shift':>6}  clamp"]
        def span(v, fmt=""):  # per channel: the smallest..largest
            if np.ndim(v) == 0:
                return f"{v:{fmt}}"
            lo, hi = np.min(v), np.max(v)
            return f"{lo:{fmt}}" if lo == hi else f"{lo:{fmt}}..{hi:{fmt}}"

        for q in self.layers:
            ins = ",".join(f"{s:.3g}" for s in q.in_scales)
            ws = "-" if q.weight_scale is None else span(q.weight_scale, ".3g")
            rows.append(f"{q.name[:28]:<28} {q.op:<12} {ins:>10} {ws:>18} {q.out_scale:>10.3g} "
                        f"{span(q.multiplier):>12} {span(q.shift):>6}  [{q.lo}, {q.hi}]")
        return "\n".join(rows)

    def __repr__(self):
        return (f"QuantizedModel({len(self.layers)} layers, int{self.nb_bits}, "
                f"single_shift={self.single_shift}, clipping={self.clipping!r}, "
                f"per_channel={self.per_channel})")

    # -- the engine graph --------------------------------------------------
    def _build_onnx(self):
        from onnx import TensorProto, helper, numpy_helper

        inits, nodes = [], []

        def const(name, array):
            inits.append(numpy_helper.from_array(np.array(array, order="C"), name))  # 0-d kept
            return name

        ints = lambda v: [int(i) for i in v] if np.ndim(v) else int(v)  # noqa: E731
        rq = lambda q: {"multiplier": ints(q.multiplier), "shift": ints(q.shift),  # noqa
                        "out_min": q.lo, "out_max": q.hi, "nb_bits": self.nb_bits,
                        **({"half_even": 1} if q.half_even else {})}
        qnode = lambda op, ins, layer, **at: nodes.append(helper.make_node(  # noqa: E731
            op, ins, [layer.output], name=name, domain=QUANT_DOMAIN, **at))
        window = lambda a: {k: a[k] for k in ("strides", "dilations", "pads")}  # noqa
        for i, q in enumerate(self.layers):
            name = f"{q.name}" if not any(q.name == p.name for p in self.layers[:i]) \
                else f"{q.name}_{i}"
            if q.op in ("Conv", "Gemm"):
                x, out, xs = q.inputs[0], q.output, self.shapes[q.inputs[0]]
                rows = q.op == "Gemm" and len(xs) > 2
                if rows:  # (..., K) rows through a 2-D QGemm
                    x, out = f"{name}.rows", f"{name}.rows_out"
                    nodes.append(helper.make_node("Reshape", [q.inputs[0], const(
                        f"{name}.rows_shape", np.array([-1, xs[-1]], np.int64))], [x]))
                ins = [x, const(f"{name}.weight", q.weight)]
                if q.bias is not None:
                    ins.append(const(f"{name}.bias", q.bias))
                attrs = rq(q)
                if q.op == "Conv":
                    attrs.update(window(q.attrs), group=q.attrs["group"])
                nodes.append(helper.make_node("Q" + q.op, ins, [out], name=name,
                                              domain=QUANT_DOMAIN, **attrs))
                if rows:  # back to the input's leading dims (the batch may be any of them)
                    lead = f"{name}.lead"
                    nodes += [helper.make_node("Shape", [q.inputs[0]], [lead], end=-1),
                              helper.make_node("Concat", [lead, const(
                                  f"{name}.m", np.array([q.weight.shape[0]], np.int64))],
                                  [lead + "_m"], axis=0),
                              helper.make_node("Reshape", [out, lead + "_m"], [q.output])]
            elif q.op == "Add":
                a = rq(q)
                del a["multiplier"]
                ins = list(q.inputs)
                if q.weight is not None:  # a constant of the activation's last axes
                    ins.append(const(f"{name}.constant", q.weight))
                nodes.append(helper.make_node("QAdd", ins, [q.output], name=name,
                                              domain=QUANT_DOMAIN, multiplier_a=q.multipliers[0],
                                              multiplier_b=q.multipliers[1], **a))
            elif q.op == "MatMul":
                a = rq(q)
                del a["nb_bits"]
                qnode("QMatMul", q.inputs, q, **a)
            elif q.op == "Lookup":
                qnode("QLookup", [q.inputs[0], const(f"{name}.table", q.weight)], q)
            elif q.op == "Softmax":
                qnode("QSoftmax", [q.inputs[0], const(f"{name}.exp_table", q.weight)], q,
                      q=q.multiplier, out_max=q.hi)
            elif q.op == "LayerNorm":
                qnode("QLayerNorm", [q.inputs[0], const(f"{name}.gamma", q.weight),
                                     const(f"{name}.beta", q.bias)], q, eps=q.attrs["eps"],
                      pre_shift=q.attrs["pre_shift"], out_min=q.lo, out_max=q.hi)
            elif q.op == "Scale":
                nodes.append(helper.make_node("Identity", q.inputs, [q.output], name=name))
            elif q.op == "Transpose":
                nodes.append(helper.make_node("Transpose", q.inputs, [q.output], name=name,
                                              perm=q.attrs["perm"]))
            elif q.op == "Gather":
                nodes.append(helper.make_node("Gather", [q.inputs[0], const(
                    f"{name}.indices", q.attrs["indices"])], [q.output], name=name,
                    axis=q.attrs["axis"]))
            elif q.op == "Requantize":
                nodes.append(helper.make_node("Requantize", q.inputs, [q.output], name=name,
                                              domain=QUANT_DOMAIN, **rq(q)))
            elif q.op in ("MaxPool", "AveragePool"):
                attrs = dict(window(q.attrs), kernel_shape=q.attrs["kernel_shape"])
                if q.op == "AveragePool":
                    attrs["count_include_pad"] = q.attrs["count_include_pad"]
                    if q.half_even:
                        attrs["half_even"] = 1
                nodes.append(helper.make_node("Q" + q.op, q.inputs, [q.output], name=name,
                                              domain=QUANT_DOMAIN, **attrs))
            elif q.op == "Reshape":
                shp = q.attrs.get("batch_shape") or [-1] + list(q.attrs["shape"][1:])
                nodes.append(helper.make_node("Reshape", [q.inputs[0], const(
                    f"{name}.shape", np.array(shp, np.int64))], [q.output], name=name))
            elif q.op == "Concat":
                ins = list(q.inputs)
                for k, c in sorted(q.attrs["constants"].items()):  # expanded along the batch
                    batch = f"{name}.batch{k}"
                    nodes += [helper.make_node("Shape", [q.inputs[0]], [batch + "_shape"],
                                               end=1),
                              helper.make_node("Concat", [batch + "_shape", const(
                                  f"{batch}_tail", np.array(c.shape[1:], np.int64))],
                                  [batch + "_dims"], axis=0),
                              helper.make_node("Expand", [const(f"{name}.constant{k}", c),
                                                          batch + "_dims"], [batch])]
                    ins.insert(k, batch)
                nodes.append(helper.make_node("Concat", ins, [q.output], name=name,
                                              axis=q.attrs["axis"]))
            elif q.op == "Clip":
                nodes.append(helper.make_node("Clip", [q.inputs[0], const(
                    f"{name}.min", np.array(q.lo, np.int8)), const(
                    f"{name}.max", np.array(q.hi, np.int8))], [q.output], name=name))
            else:  # pragma: no cover - every layer op is handled above
                raise AssertionError(q.op)
        ins = [helper.make_tensor_value_info(n, TensorProto.INT8, ["N", *self.shapes[n][1:]])
               for n in self.input_names]
        outs = [helper.make_tensor_value_info(n, TensorProto.INT8, None)
                for n in self.output_names]
        g = helper.make_graph(nodes, "quantized", ins, outs, inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20),
                                                   helper.make_opsetid(QUANT_DOMAIN, 1)],
                                 producer_name="aidge_interop.quantize")


# -- calibration and quantization -----------------------------------------------

def _calibrate(graph, arrays, names, clipping, batch_size):
    """max |value| (and, for mse, a histogram of |value|) of every named
    value over the calibration set."""
    stats = {n: {"max": 0.0} for n in names}
    passes = 2 if clipping == "mse" else 1
    for p in range(passes):
        for batch in _batches(arrays, batch_size):
            graph.forward(batch)
            for n in names:
                v = np.abs(graph.intermediate(n).astype(np.float64, copy=False))
                if not np.isfinite(v).all():
                    raise ValueError(f"quantize: value '{n}' is not finite on the "
                                     "calibration inputs")
                s = stats[n]
                if p == 0:
                    s["max"] = max(s["max"], float(v.max()) if v.size else 0.0)
                    continue
                if "hist" not in s:
                    s["edges"] = np.linspace(0.0, s["max"] or 1.0, _HIST_BINS + 1)
                    s["hist"] = np.zeros(_HIST_BINS)
                    s["zeros"] = 0
                s["zeros"] += int(np.count_nonzero(v == 0))
                s["hist"] += np.histogram(v, bins=s["edges"])[0]
    return stats


def quantize(model, calibration_inputs, nb_bits: int = 8, single_shift: bool = True,
             clipping: str = "max", batch_size: int = 256,
             per_channel: bool = True, rounding: str = "half_up") -> QuantizedModel:
    """Post-training quantization of a float model to ``nb_bits`` integers.

    ``model``: an engine :class:`Graph`, an :class:`AidgeModule`, a torch
    module (wrapped in eval mode) or an ONNX model. ``calibration_inputs``:
    an array (samples first) per graph input, e.g. 100 to 1000 samples of
    the training set; or, for a graph (an ONNX model or an AidgeModule), a
    list of samples: arrays or tensors, with or without the batch axis, for
    a one-input graph; lists of one array per input otherwise. They are
    stacked; a model whose declared batch dimension is static (exported for
    batch 1) is calibrated a batch of that size at a time. ``per_channel``:
    one weight scale per output channel of every Conv and Gemm (else one
    per layer). ``rounding``: how the run-time requantizations (Conv, Gemm,
    Add, Requantize, AveragePool, MatMul) and the input quantization round a
    tie: ``"half_up"`` (floor(v + 1/2)) or ``"half_even"`` (ONNX's
    QuantizeLinear: the QDQ export then computes the same integers in ONNX
    Runtime). Returns a :class:`QuantizedModel`.
    """
    where = "quantize"
    if not isinstance(nb_bits, int) or not 2 <= nb_bits <= 8:
        raise ValueError(f"{where}: nb_bits={nb_bits!r}; an int in [2, 8] expected")
    if clipping not in ("max", "mse"):
        raise ValueError(f"{where}: clipping={clipping!r}; 'max' or 'mse' expected")
    if not isinstance(per_channel, bool):
        raise ValueError(f"{where}: per_channel={per_channel!r}; True or False expected")
    if rounding not in ("half_up", "half_even"):
        raise ValueError(f"{where}: rounding={rounding!r}; 'half_up' or 'half_even' expected")
    probe = calibration_inputs if isinstance(calibration_inputs, (list, tuple)) \
        else [calibration_inputs]
    try:
        shapes = [tuple(np.shape(x)[1:]) for x in probe]  # what a torch module is wrapped for
    except ValueError:  # samples of several inputs, which only a graph reads
        shapes = []
    graph = _as_graph(model, shapes, where)
    arrays = _calibration_arrays(calibration_inputs, graph, where)
    batch_size = _static_batch(graph, arrays, batch_size, where)
    was_training, was_keeping = graph.training, graph.keep_intermediates
    graph.training, graph.keep_intermediates = False, True
    try:
        graph.forward([a[:min(len(a), batch_size)] for a in arrays])
        layers, inputs, outputs, shapes = extract_layers(graph, where)
        _batch_axes(graph, layers, arrays, batch_size)
        # values whose scale is calibrated: inputs and outputs of computing layers
        calibrated = list(inputs) + [lay.output for lay in layers if lay.op in (
            "Conv", "Gemm", "Add", "Concat", "MatMul", "LayerNorm", "Lookup", "Scale")]
        stats = _calibrate(graph, arrays, calibrated, clipping, batch_size)
    finally:
        graph.training, graph.keep_intermediates = was_training, was_keeping
    qmax = 2 ** (nb_bits - 1) - 1
    scales = {n: _scale(stats[n], qmax, clipping, single_shift) for n in calibrated}
    qlayers = []
    for layer in layers:
        qlayers += _quantize_layer(layer, scales, qmax, single_shift, per_channel,
                                   f"{where}: layer '{layer.name}' ({layer.op})")
    for q in qlayers:
        q.half_even = rounding == "half_even" and q.op in _ROUNDED
    samples = [a[:1].copy() for a in arrays]
    return QuantizedModel(qlayers, inputs, outputs, shapes, scales, nb_bits, single_shift,
                          clipping, samples, per_channel, rounding)


# the layers whose run-time requantization takes quantize's `rounding`
_ROUNDED = ("Conv", "Gemm", "Add", "Requantize", "AveragePool", "MatMul")


def _batch_axes(graph, layers, arrays, batch_size):
    """Reshape targets with -1 where the batch goes: the dim that changes
    between the planned batch and a batch of one (the batch need not lead:
    (seq, batch, dim) attention layouts). Left out when the batch is 1."""
    b = min(len(arrays[0]), batch_size)
    if b == 1 or any(d and d[0] is not None for d in _declared_dims(graph)):
        return  # one sample, or a static batch: the planned shapes are the targets
    graph.forward([a[:1] for a in arrays])
    try:
        planned = {o: s for n in graph.nodes() for o, s in zip(n["outputs"], n["output_shapes"])}
        for lay in layers:
            if lay.op == "Reshape" and lay.output in planned:  # (a recipe's flatten is not)
                one = planned[lay.output]
                diff = [k for k, (p, o) in enumerate(zip(lay.attrs["shape"], one)) if p != o]
                if len(diff) == 1:
                    lay.attrs["batch_shape"] = [-1 if k == diff[0] else d
                                                for k, d in enumerate(lay.attrs["shape"])]
    finally:
        graph.forward([a[:b] for a in arrays])  # the planned batch back (shapes, values)


def _clamp_bounds(layer, s, qmax):
    lo = -qmax if layer.lo == -math.inf else int(max(-qmax, round_half_up(layer.lo / s)))
    hi = qmax if layer.hi == math.inf else int(min(qmax, round_half_up(layer.hi / s)))
    return lo, max(lo, hi)


def _weight_scale(w, qmax, per_channel):
    """max|w| / qmax for the tensor, or per output channel (axis 0) as an
    array; an all-zero channel takes the tensor's scale, an all-zero tensor 1."""
    whole = float(np.max(np.abs(w))) / qmax or 1.0
    if not per_channel:
        return whole
    s = np.abs(w).reshape(w.shape[0], -1).max(axis=1) / qmax
    return np.where(s > 0, s, whole)


def _quantize_layer(layer: Layer, scales, qmax, single_shift, per_channel,
                    where) -> list[QLayer]:
    """The quantized layer(s) of one float layer; sets the output's scale when
    the layer keeps its input's (pools, reshape, clamp)."""
    s_in = [scales[i] for i in layer.inputs]
    base = dict(name=layer.name, op=layer.op, inputs=list(layer.inputs), output=layer.output,
                attrs=dict(layer.attrs), in_scales=s_in, sources=list(layer.sources))
    if layer.op in ("MaxPool", "AveragePool", "Reshape", "Transpose", "Gather"):
        scales[layer.output] = s_in[0]
        return [QLayer(**base, out_scale=s_in[0])]
    if layer.op == "Clip":
        scales[layer.output] = s_in[0]
        lo, hi = _clamp_bounds(layer, s_in[0], qmax)
        return [QLayer(**base, out_scale=s_in[0], lo=lo, hi=hi)]
    if layer.op in _NONLINEAR:
        return _NONLINEAR[layer.op](layer, base, scales, qmax, single_shift, where)
    s_out = scales[layer.output]
    lo, hi = _clamp_bounds(layer, s_out, qmax)
    if layer.op == "Concat":
        out, inputs = [], []
        for i, (x, s) in enumerate(zip(layer.inputs, s_in)):
            if math.isclose(s, s_out, rel_tol=1e-12):
                inputs.append(x)
                continue
            m, sh = _fixed_point(s / s_out, f"{where} input {i}", single_shift)
            name = f"{layer.name}.requant{i}"
            out.append(QLayer(name=name, op="Requantize", inputs=[x], output=name, attrs={},
                              multiplier=m, shift=sh, lo=-qmax, hi=qmax, in_scales=[s],
                              out_scale=s_out, sources=list(layer.sources)))
            inputs.append(name)
        base["inputs"] = inputs
        base["attrs"]["constants"] = {k: np.clip(round_half_up(c / s_out), -qmax, qmax).astype(
            np.int8) for k, c in layer.attrs.get("constants", {}).items()}
        return out + [QLayer(**base, out_scale=s_out, lo=-qmax, hi=qmax)]
    if layer.op == "Add":
        cq = None
        if layer.weight is not None:  # a constant: int8 at its own scale
            s_c = _scale({"max": float(np.abs(layer.weight).max())}, qmax, "max", single_shift)
            cq = np.clip(round_half_up(layer.weight / s_c), -qmax, qmax).astype(np.int8)
            s_in = s_in + [s_c]
        ra, rb = s_in[0] / s_out, s_in[1] / s_out
        if single_shift:
            ea, eb = round(math.log2(ra)), round(math.log2(rb))
            shift = max(0, -min(ea, eb))
            ma, mb = 2 ** (ea + shift), 2 ** (eb + shift)
        else:
            shift = min(max(14 - math.floor(math.log2(max(ra, rb))), 0), 62)
            ma, mb = (int(round_half_up(r * 2.0 ** shift)) for r in (ra, rb))
        if max(ma, mb) > 2 ** 30:
            raise ValueError(f"{where}: the input scales differ too much to be added")
        return [QLayer(**base, out_scale=s_out, multipliers=(ma, mb), shift=shift,
                       lo=lo, hi=hi, weight=cq)]
    # Conv and Gemm
    w = layer.weight
    s_w = _weight_scale(w, qmax, per_channel)
    if single_shift:  # 2**-n >= the exact ratio, per channel
        n = np.minimum(np.floor(-np.log2(s_in[0] * s_w / s_out)), 62)
        s_w = 2.0 ** -n * s_out / s_in[0]  # compensated weights: at most 2x coarser
    if per_channel:
        pairs = [_fixed_point(r, f"{where} channel {oc}", single_shift)
                 for oc, r in enumerate(s_in[0] * s_w / s_out)]
        m, sh = (np.array(v, dtype=np.int64) for v in zip(*pairs))
    else:
        s_w = float(s_w)
        m, sh = _fixed_point(s_in[0] * s_w / s_out, where, single_shift)
    s_wb = np.reshape(s_w, (-1,) + (1,) * (w.ndim - 1))  # broadcast over a channel's weights
    wq = np.clip(round_half_up(w / s_wb), -qmax, qmax).astype(np.int8)
    bq = None
    if layer.bias is not None:
        b = round_half_up(layer.bias / (s_in[0] * s_w))
        if np.abs(b).max(initial=0) > 2 ** 31 - 1:
            raise ValueError(f"{where}: the bias does not fit in int32 at this scale")
        bq = b.astype(np.int32)
    k = int(np.prod(w.shape[1:]))
    # the engine's bound (any int8 input): |x w| <= 128 * 128
    bound = k * 128 * 128 + (int(np.abs(bq).max()) if bq is not None and bq.size else 0)
    if bound > 2 ** 31 - 1:
        raise ValueError(f"{where}: {k} products per output may overflow the int32 "
                         "accumulator")
    return [QLayer(**base, weight=wq, bias=bq, multiplier=m, shift=sh, lo=lo, hi=hi,
                   out_scale=s_out, weight_scale=s_w)]


# -- nonlinear layers (transformers) ------------------------------------------------

def _prob_q(qmax, single_shift):
    """q, with 1 / q the scale of values in [-1, 1] (probabilities, Sigmoid,
    Tanh): qmax, or qmax + 1 (a power of two) when scales are powers of two
    (then 1.0 itself clamps to qmax / q)."""
    return qmax + 1 if single_shift else qmax


def lookup_function(name, alpha=None, beta=None):
    """The float64 function of a Lookup layer (ONNX's definitions)."""
    erf = np.vectorize(math.erf)
    return {
        "Sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
        "Tanh": np.tanh,
        "Erf": erf,
        "Softplus": lambda v: np.logaddexp(0.0, v),
        "HardSigmoid": lambda v: np.clip(alpha * v + beta, 0.0, 1.0),
        "HardSwish": lambda v: v * np.clip(v / 6.0 + 0.5, 0.0, 1.0),
        "LeakyRelu": lambda v: np.where(v < 0, alpha * v, v),
        "Elu": lambda v: np.where(v < 0, alpha * np.expm1(np.minimum(v, 0.0)), v),
        "Gelu": lambda v: 0.5 * v * (1.0 + erf(v / math.sqrt(2.0))),
        "GeluTanh": lambda v: 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi)
                                                       * (v + 0.044715 * v ** 3))),
    }[name]


def lookup_table(fn, s_in, s_out, qmax):
    """int8 table[i] = clamp(round(fn((i - 128) s_in) / s_out)), i = 0..255."""
    v = (np.arange(256, dtype=np.float64) - 128) * s_in
    return np.clip(round_half_up(fn(v) / s_out), -qmax, qmax).astype(np.int8)


def softmax_exp_table(s_in):
    """int32 e[k] = round(2^30 exp(-k s_in)), k = 0..255 (the difference
    max - x of two int8 values)."""
    return round_half_up(2.0 ** 30 * np.exp(-np.arange(256) * s_in)).astype(np.int32)


LN_FRAC, LN_GAMMA_FRAC = 24, 16  # Q24 normalized values, Q16 gamma


def layernorm_constants(gamma, beta, eps, s_in, s_out, where="layernorm"):
    """(gamma int32, beta int64, eps int64, pre_shift) of QLayerNorm over
    rows of d = gamma.size (see docs/quantization.md)."""
    d = gamma.size
    g = round_half_up(np.asarray(gamma, np.float64) * math.sqrt(d) / s_out * 2.0 ** LN_GAMMA_FRAC)
    b = round_half_up(np.asarray(beta, np.float64) / s_out * 2.0 ** (LN_FRAC + LN_GAMMA_FRAC))
    if np.abs(g).max(initial=0) > 2 ** 31 - 1 or np.abs(b).max(initial=0) > 2 ** 61:
        raise ValueError(f"{where}: gamma or beta is too large for the output scale {s_out:g}")
    s2max = 65025 * d ** 3
    for pre in range(30, -1, -1):
        e = int(round_half_up(d ** 3 * eps / s_in ** 2 * 4.0 ** pre))
        if (s2max << 2 * pre) + e <= 2 ** 62 and e <= 2 ** 61:
            return g.astype(np.int32), b.astype(np.int64), e, pre
    raise ValueError(f"{where}: epsilon {eps:g} is too large for the input scale {s_in:g}")


def _q_matmul(layer, base, scales, qmax, single_shift, where):
    s_a, s_b = base["in_scales"]
    s_out = scales[layer.output]
    m, sh = _fixed_point(s_a * s_b / s_out, where, single_shift)
    if m > 2 ** 31 - 1:
        raise ValueError(f"{where}: the rescale factor is too large")
    lo, hi = _clamp_bounds(layer, s_out, qmax)
    return [QLayer(**base, multiplier=m, shift=sh, lo=lo, hi=hi, out_scale=s_out)]


def _q_scale(layer, base, scales, qmax, single_shift, where):
    s_in, f = base["in_scales"][0], layer.attrs["factor"]
    if not single_shift or math.log2(f).is_integer():  # a new scale, the same integers
        scales[layer.output] = s_in * f
        return [QLayer(**base, out_scale=s_in * f)]
    s_out = scales[layer.output]  # back to a power of two
    m, sh = _fixed_point(s_in * f / s_out, where, False)
    base["op"] = "Requantize"
    return [QLayer(**base, multiplier=m, shift=sh, lo=-qmax, hi=qmax, out_scale=s_out)]


def _q_lookup(layer, base, scales, qmax, single_shift, where):
    a = layer.attrs
    if a["function"] in ("Sigmoid", "Tanh", "Erf"):  # values in [-1, 1]
        scales[layer.output] = 1.0 / _prob_q(qmax, single_shift)
    s_out = scales[layer.output]
    fn = lookup_function(a["function"], a.get("alpha"), a.get("beta"))
    table = lookup_table(fn, base["in_scales"][0], s_out, qmax)
    return [QLayer(**base, weight=table, out_scale=s_out, lo=-qmax, hi=qmax)]


def _q_softmax(layer, base, scales, qmax, single_shift, where):
    q = _prob_q(qmax, single_shift)
    scales[layer.output] = 1.0 / q
    return [QLayer(**base, weight=softmax_exp_table(base["in_scales"][0]), multiplier=q,
                   lo=0, hi=qmax, out_scale=1.0 / q)]


def _q_layernorm(layer, base, scales, qmax, single_shift, where):
    s_out = scales[layer.output]
    g, b, e, pre = layernorm_constants(layer.weight, layer.bias, layer.attrs["epsilon"],
                                       base["in_scales"][0], s_out, where)
    lo, hi = _clamp_bounds(layer, s_out, qmax)
    base["attrs"].update(eps=e, pre_shift=pre)
    return [QLayer(**base, weight=g, bias=b, lo=lo, hi=hi, out_scale=s_out)]


_NONLINEAR = {"MatMul": _q_matmul, "Scale": _q_scale, "Lookup": _q_lookup,
              "Softmax": _q_softmax, "LayerNorm": _q_layernorm}


# -- evaluation -------------------------------------------------------------------

def accuracy(model, inputs, labels, batch_size: int = 256) -> float:
    """Top-1 accuracy (0..1) of a QuantizedModel, an engine Graph, or a torch
    module on float ``inputs`` (samples first) and integer ``labels``."""
    labels = np.asarray(labels.detach().cpu().numpy() if hasattr(labels, "detach") else labels)
    arrays = [np.asarray(inputs.detach().cpu().numpy() if hasattr(inputs, "detach") else inputs,
                         dtype=np.float32)]
    if len(labels) != len(arrays[0]):
        raise ValueError(f"accuracy: {len(arrays[0])} inputs but {len(labels)} labels")
    correct = 0
    for start, batch in zip(range(0, len(labels), batch_size), _batches(arrays, batch_size)):
        if isinstance(model, (QuantizedModel, Graph)):
            out = model(*batch) if isinstance(model, QuantizedModel) else model.forward(batch)
            out = np.asarray(out[0])
        else:
            import torch

            with torch.no_grad():
                out = model(torch.from_numpy(batch[0])).numpy()
        correct += int(np.sum(out.argmax(axis=1) == labels[start:start + batch_size]))
    return correct / len(labels)
