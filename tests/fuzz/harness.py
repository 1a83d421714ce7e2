"""The fuzz target: ONNX bytes -> ``load_onnx`` -> forward -> backward.

``run_one(data)`` is what the fuzzer calls on every input, and what the
regression test (tests/test_fuzz_regressions.py) replays on every saved
crash: the engine may refuse an input only with one of its documented
exceptions (``EXPECTED``); any other exception, a crash or a sanitizer report
is a bug. ``mutate(data, max_size, seed)`` is the structure-aware mutator:
it parses the model and changes what the engine must validate (dimensions,
attributes, wiring, operator types, initializers, dtypes, node order), and
falls back to byte mutations when the bytes do not parse.

Importable without atheris (the fuzzer itself is fuzz_engine.py).
"""
from __future__ import annotations

import random
import zlib

import numpy as np
import onnx
from onnx import TensorProto

# what the engine may raise on bad input (its status hierarchy; KeyError for
# an unknown value name, RecursionError never)
EXPECTED = (ValueError, TypeError, NotImplementedError, IndexError, MemoryError, KeyError)

# The plans' memory limit while an input runs (below run_fuzz.py's
# -rss_limit_mb and ASan's max_allocation_size_mb): a model whose plan needs
# more is refused with a MemoryError naming the node, and so is a shape past
# 2^63 bytes. Any other MemoryError is an allocation that failed: a memory
# blow-up the checks missed, a bug as a crash is (as libFuzzer's timeouts and
# RSS limit are).
MEMORY_LIMIT = 1 << 30
_REFUSALS = ("over the memory limit", "more than 2^63 elements", "shape needs more than")


def _refusal(exc: Exception) -> None:
    """Returns on an expected refusal; raises on a memory blow-up."""
    if isinstance(exc, MemoryError) and not any(r in str(exc) for r in _REFUSALS):
        raise AssertionError(f"memory blow-up (not refused at plan time): {exc}") from exc

MAX_INPUT_ELEMENTS = 1 << 12  # larger declared inputs are skipped (the run stays fast)
SYMBOLIC_DIM = 2

_NP = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64,
       TensorProto.FLOAT16: np.float16, TensorProto.INT8: np.int8,
       TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
       TensorProto.INT32: np.int32, TensorProto.INT64: np.int64, TensorProto.BOOL: np.bool_}


def _input_arrays(proto, rng):
    """One array per graph input (initializers excluded), from the declared
    types and shapes; None when a declared input is too large to build."""
    inits = {i.name for i in proto.graph.initializer}
    arrays = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = _NP.get(tt.elem_type, np.float32)
        if tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else SYMBOLIC_DIM
                     for d in tt.shape.dim]
        else:
            shape = [SYMBOLIC_DIM]
        if any(d < 0 or d > MAX_INPUT_ELEMENTS for d in shape) or \
                np.prod(shape, dtype=np.float64) > MAX_INPUT_ELEMENTS:  # empty ones too
            return None
        if np.dtype(dtype).kind == "f":
            a = rng.standard_normal(shape).astype(dtype)
            if a.size and rng.random() < 0.1:
                a.flat[rng.integers(a.size)] = rng.choice([np.nan, np.inf, -np.inf])
        elif dtype is np.bool_:
            a = rng.random(shape) < 0.5
        else:  # small integers, some negative or out of range: indices, shapes, axes
            a = rng.integers(-3, 6, size=shape).astype(dtype)
        arrays.append(a)
    return arrays


def run_one(data: bytes) -> None:
    """Loads, runs forward and backward under MEMORY_LIMIT; returns quietly on
    an EXPECTED refusal."""
    import aidge_interop

    saved = aidge_interop.get_memory_limit()
    aidge_interop.set_memory_limit(MEMORY_LIMIT)
    try:
        _run(data)
    finally:
        aidge_interop.set_memory_limit(saved)


def _run(data: bytes) -> None:
    from aidge_interop import load_onnx

    try:
        proto = onnx.load_from_string(data)
    except Exception:  # not a model: load_onnx must refuse the bytes too
        proto = None
    try:
        graph = load_onnx(data)
    except EXPECTED as exc:
        _refusal(exc)
        return
    if proto is None:
        raise AssertionError("load_onnx accepted bytes that onnx cannot parse")
    rng = np.random.default_rng(zlib.crc32(data))
    inputs = _input_arrays(proto, rng)
    if inputs is None:
        return
    float_in = all(a.dtype.kind == "f" for a in inputs)
    try:
        outs = graph.forward(inputs, need_backward=True, input_grads=float_in)
    except EXPECTED as exc:
        _refusal(exc)
        return
    grads = [np.ones_like(o) if o.dtype.kind == "f" else None for o in outs]
    try:
        graph.backward(grads)
    except EXPECTED as exc:
        _refusal(exc)
    try:  # a second forward on the same plan (buffers reused)
        graph.training = not graph.training
        graph.forward(inputs)
    except EXPECTED as exc:
        _refusal(exc)


# -- structure-aware mutations ----------------------------------------------

_INTS = [0, 1, 2, 3, -1, -2, 5, 7, 64, 2**31 - 1, 2**31, -2**31, 2**62, 2**63 - 1, -2**63]
_FLOATS = [0.0, -1.0, 1.0, 0.5, 1e-30, 1e30, float("nan"), float("inf"), -float("inf")]
_STRINGS = [b"", b"NOTSET", b"SAME_UPPER", b"SAME_LOWER", b"VALID", b"constant", b"reflect",
            b"edge", b"wrap", b"tanh", b"none", b"\xff\xfe"]
_DTYPES = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32,
           TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL, TensorProto.FLOAT16,
           TensorProto.STRING, TensorProto.UINT64, TensorProto.BFLOAT16, 0, 99]
_OPS = None


def _ops():
    global _OPS
    if _OPS is None:
        from aidge_interop import supported_operators

        _OPS = sorted(supported_operators()) + ["Constant", "NoSuchOp"]
    return _OPS


def _value_names(g):
    names = [v.name for v in g.input] + [i.name for i in g.initializer]
    names += [o for n in g.node for o in n.output]
    return names or ["x"]


def _mut_dim(g, rng):
    vis = [v for v in list(g.input) + list(g.output) if v.type.tensor_type.shape.dim]
    if vis:
        d = rng.choice(vis).type.tensor_type.shape.dim
        rng.choice(d).dim_value = rng.choice([0, 1, 2, 3, 4, 7, 16, 1000, 2**40])


def _mut_attr(g, rng):
    nodes = [n for n in g.node if n.attribute]
    if not nodes:
        return _add_attr(g, rng)
    node = rng.choice(nodes)
    a = rng.choice(node.attribute)
    A = onnx.AttributeProto
    r = rng.random()
    if r < 0.1:
        node.attribute.remove(a)
    elif a.type == A.INT:
        a.i = rng.choice(_INTS)
    elif a.type == A.FLOAT:
        a.f = rng.choice(_FLOATS)
    elif a.type == A.STRING:
        a.s = rng.choice(_STRINGS)
    elif a.type == A.INTS:
        v = list(a.ints)
        if v and r < 0.6:
            v[rng.randrange(len(v))] = rng.choice(_INTS)
        elif v and r < 0.8:
            v.pop()
        else:
            v.append(rng.choice(_INTS))
        del a.ints[:]
        a.ints.extend(v)
    elif a.type == A.TENSOR:
        _mut_tensor(a.t, rng)
    else:
        a.type = rng.choice([A.INT, A.FLOAT, A.STRING, A.INTS, A.GRAPH])


def _add_attr(g, rng):
    if not g.node:
        return
    node = rng.choice(g.node)
    name = rng.choice(["axis", "axes", "kernel_shape", "pads", "strides", "group", "perm",
                       "keepdims", "alpha", "epsilon", "mode", "bogus", "to", "dilations"])
    value = rng.choice([rng.choice(_INTS), [rng.choice(_INTS) for _ in range(rng.randrange(1, 5))],
                        rng.choice(_FLOATS), rng.choice(_STRINGS)])
    node.attribute.append(onnx.helper.make_attribute(name, value))


def _mut_wiring(g, rng):
    if not g.node:
        return
    node = rng.choice(g.node)
    names = _value_names(g)
    r = rng.random()
    if r < 0.35 and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice(names + ["", "dangling"])
    elif r < 0.5 and node.input:
        node.input.pop()
    elif r < 0.65:
        node.input.append(rng.choice(names + [""]))
    elif r < 0.85 and node.output:
        node.output[rng.randrange(len(node.output))] = rng.choice(names)  # duplicates, cycles
    elif g.output:
        g.output[rng.randrange(len(g.output))].name = rng.choice(names + ["dangling"])


def _mut_op(g, rng):
    if g.node:
        node = rng.choice(g.node)
        node.op_type = rng.choice(_ops())
        if rng.random() < 0.1:
            node.domain = rng.choice(["", "ai.onnx", "com.example", "aidge_interop.quant"])


def _mut_tensor(t, rng):
    r = rng.random()
    if r < 0.3 and t.dims:
        t.dims[rng.randrange(len(t.dims))] = rng.choice([0, 1, 2, 3, 5, 2**31, 2**40, 2**62])
    elif r < 0.45:
        t.dims.append(rng.choice([1, 2, 3]))
    elif r < 0.6 and t.dims:
        t.dims.pop()
    elif r < 0.75:
        t.data_type = rng.choice(_DTYPES)
    elif t.raw_data:
        raw = bytearray(t.raw_data)
        if rng.random() < 0.5:
            raw = raw[: rng.randrange(len(raw) + 1)]
        else:
            for _ in range(rng.randrange(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        t.raw_data = bytes(raw)
    elif t.int64_data:
        t.int64_data[rng.randrange(len(t.int64_data))] = rng.choice(_INTS)
    elif t.float_data:
        t.float_data[rng.randrange(len(t.float_data))] = rng.choice(_FLOATS)


def _mut_init(g, rng):
    if g.initializer:
        t = rng.choice(g.initializer)
        if rng.random() < 0.1:
            g.initializer.remove(t)
        else:
            _mut_tensor(t, rng)


def _mut_order(g, rng):
    if len(g.node) >= 2:
        nodes = list(g.node)
        i, j = rng.randrange(len(nodes)), rng.randrange(len(nodes))
        if rng.random() < 0.5:
            nodes[i], nodes[j] = nodes[j], nodes[i]
        else:
            nodes.append(nodes[i])  # a duplicate node: duplicate outputs
        del g.node[:]
        g.node.extend(nodes)


def _mut_types(g, rng):
    vis = list(g.input) + list(g.output)
    if vis:
        rng.choice(vis).type.tensor_type.elem_type = rng.choice(_DTYPES)


def _mut_opset(model, rng):
    if model.opset_import:
        model.opset_import[0].version = rng.choice([1, 6, 7, 9, 11, 13, 17, 18, 20, 21, 99, -1])


_MUTATIONS = [_mut_dim, _mut_attr, _add_attr, _mut_wiring, _mut_op, _mut_init, _mut_order,
              _mut_types]


def mutate(data: bytes, max_size: int, seed: int, byte_mutate=None) -> bytes:
    """One structure-aware mutation of the model in ``data`` (or a byte
    mutation by ``byte_mutate(data, max_size)`` when it does not parse, or at
    random)."""
    rng = random.Random(seed)
    model = None
    if byte_mutate is None or rng.random() < 0.8:
        try:
            model = onnx.load_from_string(data)
        except Exception:
            model = None
    if model is None:
        return byte_mutate(data, max_size) if byte_mutate else data
    try:
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            if rng.random() < 0.05:
                _mut_opset(model, rng)
            else:
                rng.choice(_MUTATIONS)(model.graph, rng)
        out = model.SerializeToString()
    except Exception:  # a value protobuf or onnx.helper refuses: another try next time
        return byte_mutate(data, max_size) if byte_mutate else data
    if len(out) > max_size:
        return byte_mutate(data, max_size) if byte_mutate else data[:max_size]
    return out
