"""A :class:`QuantizedModel` as a QDQ ONNX model that ONNX Runtime (or any
ONNX runtime) runs: float inputs and outputs, ``DequantizeLinear -> float
operator -> QuantizeLinear`` around every Conv, Gemm and Add.

The scales written are the integer model's effective ones, so that the
float computation is the integer one: a Conv or Gemm dequantizes its input
with the input's scale ``s_x`` and its int8 weights with ``M s_out / s_x``
(``M = multiplier / 2**shift``, the rescale; its int32 bias with their
product ``M s_out``), then clips to the layer's clamp ``[lo s_out, hi
s_out]`` and quantizes with ``s_out``: ``QuantizeLinear`` gives ``rint(acc M)``
clamped, where the engine computes ``floor(acc M + 1/2)``. An Add dequantizes
its inputs with ``m_a s_out / 2**shift`` and ``m_b s_out / 2**shift``;
Requantize (a Concat input) likewise. MaxPool, Reshape, Concat and Clip
run on the int8 values (ONNX's operators on int8); AveragePool on them
dequantized with scale 1 (the integers: ``sum / count`` is then exact in
float32, ties included, whatever the real scale).

Differences with the engine: QuantizeLinear rounds half to even on a
float32 value, the engine half up on integers unless the model was
quantized with ``rounding="half_even"`` (then, with ``single_shift``, the
export computes the engine's integers exactly). With ``single_shift`` every
scale is a power of two and a Conv or Gemm's float32 sums are exact while
they stay below 2**24, so the two differ exactly on ties (``acc M`` an odd
multiple of 1/2: half up goes up, half to even to the even neighbour), by
one quantum; with 15-bit multipliers the float32 products round too, and a
value within that rounding of a tie may also go either way. AveragePool:
the engine's ``floor(sum / count + 1/2)`` against ``rint`` of the float
mean (ties, and float32 rounding near them). A difference of one quantum in
a layer's output moves the next layers' inputs: the outputs then differ by
a few quanta at most, on a small share of them.
"""
from __future__ import annotations

import numpy as np

__all__ = ["to_qdq_onnx"]


def to_qdq_onnx(qm):
    """The QDQ ``onnx.ModelProto`` of QuantizedModel ``qm`` (module docstring)."""
    from onnx import TensorProto, helper, numpy_helper

    inits, nodes = [], []
    names = set()

    def fresh(name):
        base, k = name, 0
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        return name

    def const(name, array):
        name = fresh(name)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, ins, out, name, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=fresh(name), **attrs))
        return out

    def dq(x, scale, name, zp_type=np.int8):
        """x (integers) -> x * scale (float32); a scale per channel (1-D)
        along axis 0 (weights (M, ...), biases (M,))."""
        scale = np.asarray(scale, np.float32)
        axis = {"axis": 0} if scale.ndim else {}
        return node("DequantizeLinear", [x, const(f"{name}.scale", scale),
                                         const(f"{name}.zero_point",
                                               np.zeros(scale.shape, zp_type))],
                    fresh(f"{name}.dq"), f"{name}.DequantizeLinear", **axis)

    def q(v, scale, lo, hi, out, name):
        """float v -> clamp(rint(v / scale), lo, hi) in int8, as ``out``."""
        s = np.float32(scale)
        v = node("Clip", [v, const(f"{name}.min", np.float32(lo * s)),
                          const(f"{name}.max", np.float32(hi * s))], fresh(f"{name}.clip"),
                 f"{name}.Clip")
        return node("QuantizeLinear", [v, const(f"{name}.y_scale", s),
                                       const(f"{name}.y_zero_point", np.int8(0))], out,
                    f"{name}.QuantizeLinear")

    window = lambda a: {k: list(a[k]) for k in ("strides", "dilations", "pads") if k in a}  # noqa
    graph_inputs = []
    for n in qm.input_names:
        graph_inputs.append(helper.make_tensor_value_info(
            n, TensorProto.FLOAT, ["N", *qm.shapes[n][1:]]))
        names.add(n)
    ints = {n: fresh(f"{n}.q") for n in qm.input_names}  # value -> its int8 tensor
    for n in qm.input_names:
        q(n, qm.scales[n], -qm.qmax, qm.qmax, ints[n], f"{n}.input")
    for layer in qm.layers:
        name = layer.name
        out = fresh(f"{layer.output}.q")
        ins = [ints[i] for i in layer.inputs]
        ints[layer.output] = out
        if layer.op in ("Conv", "Gemm"):
            s_x, s_y = layer.in_scales[0], layer.out_scale
            # (per channel: one rescale, so one weight scale, per output channel)
            m = np.asarray(layer.multiplier, np.float64) / 2.0 ** np.asarray(layer.shift)
            w_scale = (m * s_y / s_x).astype(np.float32)
            args = [dq(ins[0], s_x, f"{name}.x"),
                    dq(const(f"{name}.weight", layer.weight), w_scale, f"{name}.w")]
            if layer.bias is not None:
                args.append(dq(const(f"{name}.bias", layer.bias), np.float32(s_x) * w_scale,
                               f"{name}.b", np.int32))
            if layer.op == "Conv":
                a = dict(window(layer.attrs), group=layer.attrs["group"])
                y = node("Conv", args, fresh(f"{name}.conv"), name, **a)
            else:
                y = node("Gemm", args, fresh(f"{name}.gemm"), name, transB=1)
            q(y, s_y, layer.lo, layer.hi, out, name)
        elif layer.op in ("Add", "Requantize"):
            s_y = layer.out_scale
            mults = layer.multipliers if layer.op == "Add" else (layer.multiplier,)
            args = [dq(x, mk * s_y / 2.0 ** layer.shift, f"{name}.in{k}")
                    for k, (x, mk) in enumerate(zip(ins, mults))]
            y = node("Add", args, fresh(f"{name}.add"), name) if len(args) == 2 else args[0]
            q(y, s_y, layer.lo, layer.hi, out, name)
        elif layer.op == "MaxPool":
            node("MaxPool", ins, out, name, kernel_shape=list(layer.attrs["kernel_shape"]),
                 **window(layer.attrs))
        elif layer.op == "AveragePool":  # on the integers (scale 1): sum / count is exact
            s = 1.0
            y = node("AveragePool", [dq(ins[0], s, f"{name}.x")], fresh(f"{name}.pool"), name,
                     kernel_shape=list(layer.attrs["kernel_shape"]),
                     count_include_pad=int(layer.attrs["count_include_pad"]),
                     **window(layer.attrs))
            q(y, s, -qm.qmax, qm.qmax, out, name)
        elif layer.op == "Reshape":
            shape = [-1] + list(layer.attrs["shape"][1:])
            node("Reshape", [ins[0], const(f"{name}.shape", np.array(shape, np.int64))], out,
                 name)
        elif layer.op == "Concat":
            node("Concat", ins, out, name, axis=layer.attrs["axis"])
        elif layer.op == "Clip":
            node("Clip", [ins[0], const(f"{name}.min", np.int8(layer.lo)),
                          const(f"{name}.max", np.int8(layer.hi))], out, name)
        else:
            raise NotImplementedError(
                f"to_onnx_qdq: layer '{name}' ({layer.op}) has no QDQ form; the QDQ export "
                "covers Conv, Gemm, Add, Requantize, MaxPool, AveragePool, Reshape, Concat "
                "and Clip (the transformer layers export to C only)")
    outs = []
    for n in qm.output_names:
        node("DequantizeLinear", [ints[n], const(f"{n}.scale", np.float32(qm.scales[n])),
                                  const(f"{n}.zero_point", np.int8(0))], fresh(n),
             f"{n}.output")
        outs.append(helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT,
                                                  None))
    g = helper.make_graph(nodes, "quantized_qdq", graph_inputs, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10,
                             producer_name="aidge_interop.quantize")
