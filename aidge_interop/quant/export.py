"""Standalone C99 export of a model, checked layer by layer.

``export_c(model, folder)`` writes a C project that computes the model with
no dependency beyond libc and no heap: ``forward.c`` (one function, a fixed
schedule over one static activation arena sized by a liveness plan), one
header per layer (configuration and ``const`` weights), the portable
kernels (``kernels/``, the very kernels the engine runs for quantized
graphs), ``main.c`` and a ``Makefile``. ``model`` is a
:class:`~aidge_interop.quant.quantization.QuantizedModel` (int8 export) or a
float model (an engine Graph, an AidgeModule, a torch module or an ONNX
model: float32 export).

With ``compare=True`` the engine's output of every layer for the embedded
input is written to ``reference/`` and the program checks each layer as it
runs it: integers exactly, floats within atol 1e-5 + rtol 1e-3.

``compile_and_run(folder)`` builds the project with the system C compiler
and returns its outputs.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..graph import Graph
from .layers import extract_layers

__all__ = ["export_c", "compile_and_run", "ExportResult", "ExportError", "BuildError"]

MARKER = ".aidge_interop_export"
INFO = "export.json"
BUILD_OUTPUTS = ("bin",)  # what compile_and_run / make add to an export
FLOAT_ATOL, FLOAT_RTOL = 1e-5, 1e-3
_ALIGN = 16
# layers of transformers that only the int8 export computes
_INT8_ONLY = ("MatMul", "Scale", "Transpose", "Gather", "LayerNorm", "Softmax", "Lookup")


class ExportError(ValueError):
    """The model or the folder cannot be exported to."""


class BuildError(RuntimeError):
    """Compiling or running an export failed (the message has the output)."""


@dataclass
class ExportResult:
    folder: Path
    ram_bytes: int        # the static activation arena
    rom_bytes: int        # weights, biases and layer constants
    reference_bytes: int  # the layer references (compare=True), not part of the model
    layers: int
    quantized: bool

    def __str__(self):
        kind = "int8" if self.quantized else "float32"
        return (f"{kind} export of {self.layers} layers in {self.folder}: RAM (activation "
                f"arena) {self.ram_bytes} bytes, ROM (weights) {self.rom_bytes} bytes")


# -- the model to export --------------------------------------------------------

@dataclass
class _Value:
    name: str
    shape: tuple
    ctype: str          # "int8_t" or "float"

    @property
    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        return self.numel * (1 if self.ctype == "int8_t" else 4)


def _float_model(model, inputs, where):
    """(layers, inputs, outputs, embedded inputs, references) of a float
    model; the embedded input is ``inputs`` or a seeded normal sample of
    the model's input shape (batch 1)."""
    from .quantization import _as_graph

    if inputs is not None:
        inputs = [np.ascontiguousarray(np.asarray(x), dtype=np.float32)
                  for x in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
        shapes = [x.shape for x in inputs]
    elif hasattr(model, "input_dims"):  # an AidgeModule
        shapes = [(1, *tuple(s)[1:]) for s in model.input_dims]
    elif isinstance(model, Graph):
        shapes = None  # the planned ones, below
    else:
        raise ExportError(f"{where}: pass `inputs` (a sample with its batch axis) to export "
                          f"a {type(model).__name__}")
    graph = _as_graph(model, [s[1:] for s in shapes or []], where)
    if shapes is None:
        metas = {v["name"]: v.get("meta") for v in graph._g.values()}
        planned = [metas.get(n) for n in graph.input_names]
        if any(m is None for m in planned):
            raise ExportError(f"{where}: pass `inputs`: the graph has not run, so its input "
                              "shapes are unknown")
        shapes = [(1, *m[1][1:]) for m in planned]
    if inputs is None:
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    was = graph.training, graph.keep_intermediates
    graph.training, graph.keep_intermediates = False, True
    try:
        graph.forward(inputs)
        layers, ins, outs, _ = extract_layers(graph, where)
        for lay in layers:
            if lay.weight is not None:  # extraction folds in float64
                lay.weight = lay.weight.astype(np.float32)
                lay.bias = None if lay.bias is None else lay.bias.astype(np.float32)
        refs = dict(zip(ins, inputs))
        for lay in layers:  # a recipe's flatten has no value of its own in the graph
            refs[lay.output] = (refs[lay.inputs[0]].reshape(lay.attrs["shape"])
                                if lay.op == "Reshape" else graph.intermediate(lay.output))
        refs = {lay.output: refs[lay.output] for lay in layers}
    finally:
        graph.training, graph.keep_intermediates = was
    for v in [*ins, *refs]:
        dtype = refs[v].dtype if v in refs else inputs[ins.index(v)].dtype
        if dtype != np.float32:
            raise ExportError(f"{where}: value '{v}' is {dtype}; a float export is float32 "
                              "throughout (quantize the model for int8)")
    return layers, ins, outs, inputs, refs


def _quantized_model(q, inputs, where):
    if inputs is None:
        inputs = q.sample_inputs
    inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    ints = [np.asarray(x) if np.asarray(x).dtype == np.int8 else q.quantize_inputs(x)[0]
            for x in inputs]
    g = q.graph
    was = g.keep_intermediates
    g.keep_intermediates = True
    try:
        g.forward(ints)
        refs = {lay.output: g.intermediate(lay.output) for lay in q.layers}
    finally:
        g.keep_intermediates = was
    return q.layers, q.input_names, q.output_names, ints, refs


# -- memory plan ------------------------------------------------------------------

def _plan(layers, values, inputs, outputs):
    """Offsets in one arena: a Reshape's output shares its input's storage;
    storages whose lifetimes overlap never overlap in memory (greedy,
    largest first). Returns ({value: offset}, arena bytes)."""
    root = {}
    for v in values:
        root[v] = v
    for layer in layers:
        if layer.op in ("Reshape", "Scale"):  # the same bytes
            root[layer.output] = root[layer.inputs[0]]
    first, last = {}, {}
    for v in inputs:
        first[root[v]] = 0
    for step, layer in enumerate(layers, 1):
        first.setdefault(root[layer.output], step)
        for i in layer.inputs:
            last[root[i]] = max(last.get(root[i], 0), step)
        last[root[layer.output]] = max(last.get(root[layer.output], 0), step)
    for v in outputs:
        last[root[v]] = len(layers) + 1
    storages = sorted({root[v] for v in values},
                      key=lambda r: (-values[r].nbytes, first[r]))
    placed, offset = [], {}
    for r in storages:
        size = -(-values[r].nbytes // _ALIGN) * _ALIGN
        busy = sorted((offset[p], offset[p] + sz) for p, sz in placed
                      if first[p] <= last[r] and first[r] <= last[p])
        off = 0
        for a, b in busy:
            if off + size <= a:
                break
            off = max(off, b)
        offset[r] = off
        placed.append((r, size))
    arena = max((offset[r] + sz for r, sz in placed), default=0)
    return {v: offset[root[v]] for v in values}, arena


# -- C code -------------------------------------------------------------------------

def _cname(text):
    s = re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_")
    return s[-40:] or "layer"


def _comment(text):
    """Text safe inside a C comment."""
    return str(text).replace("*/", "* /")


def _c_array(ctype, name, array):
    flat = np.asarray(array).reshape(-1)
    if ctype == "float":
        if not np.isfinite(flat).all():
            raise ExportError(f"array {name} has non-finite values")
        items = [_float_literal(v) for v in flat.astype(np.float32)]
    else:
        items = [str(int(v)) for v in flat]
    lines = [", ".join(items[i:i + 16]) for i in range(0, len(items), 16)]
    body = ",\n    ".join(lines) if lines else "0"
    return f"static const {ctype} {name}[{max(len(items), 1)}] = {{\n    {body}\n}};\n"


def _window(layer, x_shape, y_shape, group=1):
    a = layer.attrs
    nsp = len(x_shape) - 2
    pad = lambda d: a["pads"][d]  # noqa: E731 - begin pads only, the end is implied
    two = lambda v, one: ([one] + list(v)) if nsp == 1 else list(v)  # noqa: E731
    h, w = two(x_shape[2:], 1)
    oh, ow = two(y_shape[2:], 1)
    kh, kw = two(a["kernel_shape"], 1)
    sh, sw = two(a["strides"], 1)
    dh, dw = two(a["dilations"], 1)
    pt, pl = two([pad(d) for d in range(nsp)], 0)
    fields = [x_shape[0], x_shape[1], h, w, y_shape[1], oh, ow, kh, kw, sh, sw, dh, dw, pt, pl,
              group, a.get("count_include_pad", 0)]
    return "{" + ", ".join(str(int(f)) for f in fields) + "}"


def _float_literal(v):
    """A C float literal for a float32 value (the shortest exact decimal)."""
    v = float(np.float32(v))
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return repr(v) + "f"


class _Writer:
    """Generates the files of one export into a folder."""

    def __init__(self, layers, inputs, outputs, values, quantized, compare, refs, embedded):
        self.layers, self.inputs, self.outputs = layers, inputs, outputs
        self.values, self.quantized, self.compare = values, quantized, compare
        self.refs, self.embedded = refs, embedded
        self.offsets, self.arena = _plan(layers, values, inputs, outputs)
        self.ids = []
        used = set()
        for i, layer in enumerate(layers):
            cid = f"L{i:02d}_{_cname(layer.name)}"
            while cid in used:
                cid += "_"
            used.add(cid)
            self.ids.append(cid)
        self.vid = {v: f"v{k}" for k, v in enumerate(values)}
        self.rom = 0
        self.ref_bytes = 0
        self.files: dict[str, str] = {}

    def ptr(self, v):
        """The C name of value v: a pointer into the arena (see declarations)."""
        return self.vid[v]

    def declarations(self, code):
        """The pointers `code` uses (a value between two reshapes is not used)."""
        out = []
        used = set(re.findall(r"\bv\d+\b", code))
        for v, cname in self.vid.items():
            if cname not in used:
                continue
            val = self.values[v]
            out.append(f"    {val.ctype} *const {cname} = ({val.ctype} *)((unsigned char *)arena + "
                       f"{self.offsets[v]}); /* '{_comment(v)}' {list(val.shape)} */")
        return out

    def layer_header(self, i, layer):
        cid = self.ids[i]
        x = self.values[layer.inputs[0]] if layer.inputs else None
        y = self.values[layer.output]
        lines = [f"/* layer {i}: {layer.op} '{_comment(layer.name)}'",
                 f" * from: {_comment(', '.join(layer.sources) or layer.name)}",
                 f" * output {list(y.shape)} {y.ctype} */",
                 f"#ifndef {cid.upper()}_H", f"#define {cid.upper()}_H", "",
                 '#include "aidge_kernels.h"', ""]
        q = self.quantized
        if layer.op in ("Conv", "MaxPool", "AveragePool"):
            group = layer.attrs.get("group", 1)
            lines.append(f"static const aik_window {cid}_window = "
                         f"{_window(layer, x.shape, y.shape, group)};")
        if layer.op in ("Conv", "Gemm"):
            wt = "int8_t" if q else "float"
            lines.append(_c_array(wt, f"{cid}_weight", layer.weight))
            self.rom += layer.weight.size * (1 if q else 4)
            if layer.bias is not None:
                lines.append(_c_array("int32_t" if q else "float", f"{cid}_bias", layer.bias))
                self.rom += layer.bias.size * 4
        if q:
            lines += self.nonlinear_constants(cid, layer)
        even = int(getattr(layer, "half_even", False))  # ties to even (a quantized layer's)
        if q and layer.op in ("Conv", "Gemm"):  # one requantization per output channel
            m = layer.weight.shape[0]
            mult, shift = (np.broadcast_to(v, (m,)) for v in (layer.multiplier, layer.shift))
            rows = [f"{{{int(a)}, {int(b)}, {layer.lo}, {layer.hi}, 0, {even}}}"
                    for a, b in zip(mult, shift)]
            lines.append(f"static const aik_rq {cid}_rq[{m}] = {{\n    " +
                         ",\n    ".join(rows) + "\n};")
            self.rom += m * 16  # sizeof(aik_rq)
        if q and layer.op in ("Requantize", "MatMul"):
            lines.append(f"static const aik_rq {cid}_rq = {{{layer.multiplier}, {layer.shift}, "
                         f"{layer.lo}, {layer.hi}, 0, {even}}};")
        if not q and layer.op in ("Conv", "Gemm", "Add", "Clip"):
            lines.append(f"#define {cid}_LO ({_float_literal(layer.lo)})")
            lines.append(f"#define {cid}_HI ({_float_literal(layer.hi)})")
        lines += ["", "#endif", ""]
        return "\n".join(lines)

    def nonlinear_constants(self, cid, layer):
        """The constant arrays of the int8 layers of transformers."""
        arrays = []
        if layer.op == "Lookup":
            arrays.append(("int8_t", "table", layer.weight))
        elif layer.op == "Softmax":
            arrays.append(("int32_t", "exp_table", layer.weight))
        elif layer.op == "LayerNorm":
            arrays += [("int32_t", "gamma", layer.weight), ("int64_t", "beta", layer.bias)]
        elif layer.op == "Add" and layer.weight is not None:
            arrays.append(("int8_t", "constant", layer.weight))
        elif layer.op == "Concat":
            batch = self.values[layer.output].shape[0]
            for k, c in sorted(layer.attrs["constants"].items()):
                arrays.append(("int8_t", f"constant{k}", np.repeat(c, batch, axis=0)))
        elif layer.op == "Gather":
            arrays.append(("int64_t", "indices", layer.attrs["indices"]))
        elif layer.op == "Transpose":
            arrays += [("int64_t", "shape", self.values[layer.inputs[0]].shape),
                       ("int32_t", "perm", layer.attrs["perm"])]
        out = []
        for ctype, what, a in arrays:
            out.append(_c_array(ctype, f"{cid}_{what}", a))
            if what not in ("shape", "perm", "indices"):  # not counted: a few ints
                self.rom += np.asarray(a).size * np.dtype(ctype[:-2]).itemsize
        return out

    def call(self, i, layer):
        cid, q = self.ids[i], self.quantized
        if not q and (layer.op in _INT8_ONLY or layer.attrs.get("constants") or
                      layer.op == "Add" and layer.weight is not None):
            raise ExportError(f"layer '{layer.name}': {layer.op} is exported in int8 only "
                              "(quantize the model first)")
        x = [self.ptr(v) for v in layer.inputs]
        y = self.ptr(layer.output)
        suffix = "i8" if q else "f32"
        if layer.op == "Conv":
            b = f"{cid}_bias" if layer.bias is not None else "NULL"
            tail = f"{cid}_rq" if q else f"{cid}_LO, {cid}_HI"
            return f"aik_conv2d_{suffix}(&{cid}_window, {x[0]}, {cid}_weight, {b}, {tail}, {y});"
        if layer.op == "Gemm":
            xs, ys = self.values[layer.inputs[0]].shape, self.values[layer.output].shape
            b = f"{cid}_bias" if layer.bias is not None else "NULL"
            tail = f"{cid}_rq" if q else f"{cid}_LO, {cid}_HI"
            return (f"aik_fc_{suffix}({int(np.prod(xs[:-1]))}, {xs[-1]}, {ys[-1]}, {x[0]}, "
                    f"{cid}_weight, {b}, {tail}, {y});")
        if layer.op in ("MaxPool", "AveragePool"):
            kind = "max" if layer.op == "MaxPool" else "avg"
            even = f"{int(layer.half_even)}, " if q and kind == "avg" else ""
            return f"aik_{kind}pool2d_{suffix}(&{cid}_window, {x[0]}, {even}{y});"
        n = self.values[layer.output].numel
        if q and layer.op in ("MatMul", "Lookup", "Softmax", "LayerNorm", "Transpose",
                              "Gather", "Scale"):
            return self.nonlinear_call(cid, layer, x, y)
        if layer.op == "Add":
            if q:
                ma, mb = layer.multipliers
                b, nb = (x[1], n) if layer.weight is None else \
                    (f"{cid}_constant", layer.weight.size)
                return (f"aik_add_i8({n}, {x[0]}, {ma}, {b}, {nb}, {mb}, {layer.shift}, "
                        f"{layer.lo}, {layer.hi}, {int(layer.half_even)}, {y});")
            add = f"aik_add_f32({n}, {x[0]}, {x[1]}, {y});"
            if layer.lo == -math.inf and layer.hi == math.inf:
                return add
            return f"{add}\n    aik_clip_f32({n}, {y}, {cid}_LO, {cid}_HI, {y});"
        if layer.op == "Requantize":
            return f"aik_requant_i8({n}, {x[0]}, &{cid}_rq, {y});"
        if layer.op == "Clip":
            if q:
                return f"aik_clip_i8({n}, {x[0]}, {layer.lo}, {layer.hi}, {y});"
            return f"aik_clip_f32({n}, {x[0]}, {cid}_LO, {cid}_HI, {y});"
        if layer.op == "Concat":
            axis = layer.attrs["axis"]
            ys = self.values[layer.output].shape
            el = 1 if q else 4
            consts = layer.attrs.get("constants", {})
            inner = [int(np.prod(self.values[v].shape[axis:])) * el for v in layer.inputs]
            for k, c in sorted(consts.items()):
                x.insert(k, f"{cid}_constant{k}")
                inner.insert(k, int(np.prod(c.shape[axis:])) * el)
            return ("{\n"
                    f"        const void *const parts[{len(x)}] = {{{', '.join(x)}}};\n"
                    f"        static const int64_t bytes[{len(x)}] = "
                    f"{{{', '.join(str(b) for b in inner)}}};\n"
                    f"        aik_concat({int(np.prod(ys[:axis]))}, {len(x)}, parts, bytes, {y});\n"
                    "    }")
        if layer.op == "Reshape":
            return "/* reshape: the output shares the input's memory */"
        raise ExportError(f"layer '{layer.name}': {layer.op} cannot be exported")

    def nonlinear_call(self, cid, layer, x, y):
        xs = self.values[layer.inputs[0]].shape
        rows, d = int(np.prod(xs[:-1])), xs[-1] if xs else 1
        if layer.op == "MatMul":
            bs = self.values[layer.inputs[1]].shape
            return (f"aik_matmul_i8({int(np.prod(xs[:-2]))}, {xs[-2]}, {xs[-1]}, {bs[-1]}, "
                    f"{x[0]}, {x[1]}, &{cid}_rq, {y});")
        if layer.op == "Lookup":
            return f"aik_lookup_i8({int(np.prod(xs))}, {x[0]}, {cid}_table, {y});"
        if layer.op == "Softmax":
            return (f"aik_softmax_i8({rows}, {d}, {x[0]}, {cid}_exp_table, {layer.multiplier}, "
                    f"{layer.hi}, {y});")
        if layer.op == "LayerNorm":
            return (f"aik_layernorm_i8({rows}, {d}, {x[0]}, {cid}_gamma, {cid}_beta, "
                    f"{layer.attrs['eps']}, {layer.attrs['pre_shift']}, {layer.lo}, {layer.hi}, "
                    f"{y});")
        if layer.op == "Transpose":
            return (f"aik_transpose({len(xs)}, {cid}_shape, {cid}_perm, 1, {x[0]}, {y});")
        if layer.op == "Gather":
            axis = layer.attrs["axis"]
            idx = layer.attrs["indices"]
            return (f"aik_gather({int(np.prod(xs[:axis]))}, {xs[axis]}, {idx.size}, "
                    f"{cid}_indices, {int(np.prod(xs[axis + 1:]))}, {x[0]}, {y});")
        return "/* scale: the same integers at another scale, in the input's memory */"

    def io_type(self, v):
        return self.values[v].ctype

    def generate(self):
        f = self.files
        f["kernels/aidge_kernels.h"] = _kernel_source("aidge_kernels.h")
        f["kernels/aidge_kernels.c"] = _kernel_source("aidge_kernels.c")
        includes, body = [], []
        for i, layer in enumerate(self.layers):
            cid = self.ids[i]
            f[f"layers/{cid}.h"] = self.layer_header(i, layer)
            includes.append(f'#include "layers/{cid}.h"')
            body.append(f"    /* {i}: {layer.op} '{_comment(layer.name)}' */")
            body.append("    " + self.call(i, layer))
            if self.compare and layer.op != "Reshape":
                ref = self.refs[layer.output]
                ctype = self.values[layer.output].ctype
                f[f"reference/{cid}.h"] = (f"/* engine output of layer {i} "
                                           f"('{_comment(layer.name)}') for the embedded "
                                           "input */\n" +
                                           _c_array(ctype, f"{cid}_reference", ref))
                self.ref_bytes += ref.nbytes
                includes.append(f'#include "reference/{cid}.h"')
                if self.quantized:
                    check = (f"aik_check_i8(\"{cid}\", {self.ptr(layer.output)}, "
                             f"{cid}_reference, {ref.size})")
                else:
                    check = (f"aik_check_f32(\"{cid}\", {self.ptr(layer.output)}, "
                             f"{cid}_reference, {ref.size}, {FLOAT_ATOL}, {FLOAT_RTOL})")
                body.append(f"    if (model_check && {check})\n        return {i + 1};")
        args = [f"const {self.io_type(v)} *in_{k}" for k, v in enumerate(self.inputs)]
        args += [f"{self.io_type(v)} *out_{k}" for k, v in enumerate(self.outputs)]
        proto = f"int model_forward({', '.join(args)})"
        copy_in = [f"    memcpy({self.ptr(v)}, in_{k}, {self.values[v].nbytes});"
                   for k, v in enumerate(self.inputs)]
        copy_out = [f"    memcpy(out_{k}, {self.ptr(v)}, {self.values[v].nbytes});"
                    for k, v in enumerate(self.outputs)]
        sizes = [f"#define MODEL_IN_{k}_SIZE {self.values[v].numel} /* '{_comment(v)}' "
                 f"{list(self.values[v].shape)} */" for k, v in enumerate(self.inputs)]
        sizes += [f"#define MODEL_OUT_{k}_SIZE {self.values[v].numel} /* '{_comment(v)}' "
                  f"{list(self.values[v].shape)} */" for k, v in enumerate(self.outputs)]
        f["forward.h"] = "\n".join([
            "/* The exported model: one function, a fixed schedule, no heap. */",
            "#ifndef MODEL_FORWARD_H", "#define MODEL_FORWARD_H", "",
            "#include <stdint.h>", "",
            f"#define MODEL_NB_INPUTS {len(self.inputs)}",
            f"#define MODEL_NB_OUTPUTS {len(self.outputs)}",
            f"#define MODEL_NB_LAYERS {len(self.layers)}",
            f"#define MODEL_ARENA_BYTES {self.arena}",
            f"#define MODEL_HAS_REFERENCE {int(self.compare)}", *sizes, "",
            "/* When nonzero (and MODEL_HAS_REFERENCE), model_forward compares every layer",
            " * with the engine's output for the embedded input. */",
            "extern int model_check;", "",
            "/* Returns 0, or 1 + the index of the first layer that differs. */",
            f"{proto};", "", "#endif", ""])
        f["forward.c"] = "\n".join([
            "/* Generated by aidge_interop.export_c: do not edit. */",
            "#include <math.h>", "#include <stddef.h>", "#include <string.h>", "",
            '#include "forward.h"', '#include "aidge_kernels.h"', *includes, "",
            "/* every activation lives in this arena, at offsets from a liveness plan */",
            f"static float arena[{max(1, -(-self.arena // 4))}];", "",
            "int model_check = 0;", "",
            f"{proto}", "{", *self.declarations("\n".join(copy_in + body + copy_out)), "",
            *copy_in, *body, *copy_out,
            "    return 0;", "}", ""])
        f["input.h"] = "\n".join(
            ["/* The embedded input. */", "#ifndef MODEL_INPUT_H", "#define MODEL_INPUT_H",
             '#include <stdint.h>', ""] +
            [_c_array(self.io_type(v), f"model_input_{k}", x)
             for k, (v, x) in enumerate(zip(self.inputs, self.embedded))] + ["#endif", ""])
        f["main.c"] = _main_c(self)
        f["Makefile"] = _MAKEFILE


_MAKEFILE = """\
# make            builds bin/model; `make run` runs it on the embedded input
# make CFLAGS="-std=c99 -O2 -Wall -Wextra -Werror -fsanitize=address,undefined" \\
#      LDFLAGS=-fsanitize=address,undefined
CC ?= cc
CFLAGS ?= -std=c99 -O2 -Wall -Wextra
LDLIBS += -lm
SRC := main.c forward.c kernels/aidge_kernels.c

bin/model: $(SRC) $(wildcard *.h kernels/*.h layers/*.h reference/*.h)
\tmkdir -p bin
\t$(CC) $(CFLAGS) -Ikernels -o $@ $(SRC) $(LDFLAGS) $(LDLIBS)

run: bin/model
\t./bin/model

clean:
\trm -rf bin

.PHONY: run clean
"""


def _main_c(w: _Writer):
    n_in, n_out = len(w.inputs), len(w.outputs)
    fmt = '"%.9g"' if not w.quantized else '"%d"'
    decl = [f"static {w.io_type(v)} in_{k}[MODEL_IN_{k}_SIZE];" for k, v in enumerate(w.inputs)]
    decl += [f"static {w.io_type(v)} out_{k}[MODEL_OUT_{k}_SIZE];"
             for k, v in enumerate(w.outputs)]
    call = ", ".join([f"in_{k}" for k in range(n_in)] + [f"out_{k}" for k in range(n_out)])
    prints = "\n".join(
        f'    printf("output {k} sample %ld:", sample);\n'
        f"    for (long i = 0; i < MODEL_OUT_{k}_SIZE; i++)\n"
        f"        printf(\" \" {fmt}, {'(double)' if not w.quantized else '(int)'}out_{k}[i]);\n"
        '    printf("\\n");' for k in range(n_out))
    embedded = "\n".join(f"        memcpy(in_{k}, model_input_{k}, sizeof in_{k});"
                         for k in range(n_in))
    reads = "\n".join(
        f"        if (fread(in_{k}, 1, sizeof in_{k}, files[{k}]) != sizeof in_{k}) {{\n"
        f'            fprintf(stderr, "%s: not a whole number of samples of %lu bytes, or '
        f'fewer samples than %s\\n", argv[{k + 1}], (unsigned long)sizeof in_{k}, argv[1]);\n'
        "            return 2;\n        }"
        for k in range(1, n_in))
    return f"""/* Runs the exported model on the embedded input (checking every layer
 * against the engine when MODEL_HAS_REFERENCE), or on raw input files:
 *   bin/model [input_0.bin ...]   one file per model input, each holding one
 *   or more samples in the input's type (native byte order). */
#include <stdio.h>
#include <string.h>

#include "forward.h"
#include "input.h"

{chr(10).join(decl)}

static int run(long sample)
{{
    int status = model_forward({call});
    if (status) {{
        printf("aidge_cmp: FAILED at layer %d of %d\\n", status - 1, MODEL_NB_LAYERS);
        return status;
    }}
{prints}
    return 0;
}}

int main(int argc, char **argv)
{{
    if (argc == 1) {{
{embedded}
        model_check = MODEL_HAS_REFERENCE;
        if (run(0))
            return 1;
        if (model_check)
            printf("aidge_cmp: all %d layers match the engine\\n", MODEL_NB_LAYERS);
        return 0;
    }}
    if (argc != 1 + MODEL_NB_INPUTS) {{
        fprintf(stderr, "usage: %s [one input file per model input (%d)]\\n", argv[0],
                MODEL_NB_INPUTS);
        return 2;
    }}
    FILE *files[MODEL_NB_INPUTS];
    for (int k = 0; k < MODEL_NB_INPUTS; k++)
        if (!(files[k] = fopen(argv[k + 1], "rb"))) {{
            fprintf(stderr, "%s: cannot open\\n", argv[k + 1]);
            return 2;
        }}
    for (long sample = 0;; sample++) {{
        size_t got = fread(in_0, 1, sizeof in_0, files[0]);
        if (got == 0 && sample > 0)
            break;
        if (got != sizeof in_0) {{
            fprintf(stderr, "%s: not a whole number of samples of %lu bytes\\n", argv[1],
                    (unsigned long)sizeof in_0);
            return 2;
        }}
{reads}
        if (run(sample))
            return 1;
    }}
    for (int k = 0; k < MODEL_NB_INPUTS; k++)
        fclose(files[k]);
    return 0;
}}
"""


def _kernel_source(name):
    """The portable kernels: package data of an install (aidge_interop/portable/,
    setup.py puts them there), csrc/ in a checkout."""
    package = Path(__file__).resolve().parent.parent
    for path in (package / "portable" / name, package.parent / "csrc" / "portable" / name):
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError(f"aidge_interop is missing its portable kernel {name}")


# -- folders ----------------------------------------------------------------------

def _check_target(folder: Path, where):
    """Raises unless folder is absent, empty, or an export of ours whose
    files are all listed in its marker (plus build outputs)."""
    if not folder.exists():
        return False
    if not folder.is_dir():
        raise ExportError(f"{where}: {str(folder)!r} exists and is not a folder")
    entries = list(folder.iterdir())
    if not entries:
        return False
    marker = folder / MARKER
    if not marker.is_file():
        raise ExportError(f"{where}: {str(folder)!r} is not empty and is not an aidge_interop "
                          "export; choose another folder (nothing was written)")
    try:
        listed = set(json.loads(marker.read_text())["files"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"{where}: {str(marker)!r} is damaged ({exc}); refusing to "
                          "replace the folder") from exc
    found = set()
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() or p.is_symlink():
            found.add(rel)
    foreign = sorted(r for r in found - listed - {MARKER}
                     if r.split("/")[0] not in BUILD_OUTPUTS)
    if foreign:
        raise ExportError(f"{where}: {str(folder)!r} holds files that are not part of the "
                          f"previous export ({', '.join(foreign[:5])}); refusing to replace it")
    return True


def export_c(model, folder, inputs=None, compare: bool = True, verbose: bool = True):
    """Writes a standalone C99 project computing ``model`` into ``folder``.

    ``model``: a QuantizedModel (int8 export) or a float model. ``inputs``:
    the embedded input (one array per model input, with the batch axis;
    float, quantized for an int8 export); by default a calibration sample
    (quantized models) or a seeded normal sample. Returns an
    :class:`ExportResult` (and prints it when ``verbose``).

    The folder must be absent, empty, or a previous export (replaced whole,
    atomically); anything else is refused.
    """
    from .quantization import QuantizedModel

    where = "export_c"
    folder = Path(folder).absolute()  # relative to the working directory of the call
    replacing = _check_target(folder, where)
    quantized = isinstance(model, QuantizedModel)
    if quantized:
        layers, ins, outs, embedded, refs = _quantized_model(model, inputs, where)
    else:
        layers, ins, outs, embedded, refs = _float_model(model, inputs, where)
    ctype = "int8_t" if quantized else "float"
    values = {v: _Value(v, tuple(x.shape), ctype) for v, x in zip(ins, embedded)}
    for lay in layers:
        values[lay.output] = _Value(lay.output, tuple(refs[lay.output].shape), ctype)
    writer = _Writer(layers, ins, outs, values, quantized, compare, refs, embedded)
    writer.generate()
    info = {
        "quantized": quantized,
        "nb_bits": model.nb_bits if quantized else None,
        "inputs": [{"name": v, "shape": list(values[v].shape), "ctype": ctype,
                    "scale": model.scales[v] if quantized else None} for v in ins],
        "outputs": [{"name": v, "shape": list(values[v].shape), "ctype": ctype,
                     "scale": model.scales[v] if quantized else None} for v in outs],
        "layers": [{"id": writer.ids[i], "op": lay.op, "name": lay.name,
                    "output": lay.output, "shape": list(values[lay.output].shape)}
                   for i, lay in enumerate(layers)],
        "ram_bytes": writer.arena, "rom_bytes": writer.rom,
        "reference_bytes": writer.ref_bytes, "compare": compare,
    }
    writer.files[INFO] = json.dumps(info, indent=1) + "\n"
    _write_atomically(folder, writer.files, replacing)
    result = ExportResult(folder, writer.arena, writer.rom, writer.ref_bytes, len(layers),
                          quantized)
    if verbose:
        print(result)
    return result


def _write_atomically(folder: Path, files: dict, replacing: bool):
    """All files into a fresh sibling folder, then one rename: a crash leaves
    either the old export or the new one, never a half-written file."""
    parent = folder.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=parent))
    try:
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (tmp / MARKER).write_text(json.dumps({"files": sorted(files)}) + "\n")
        if replacing:
            if _exchange(tmp, folder):  # tmp now holds the previous export
                shutil.rmtree(tmp)
            else:
                old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=parent))
                os.rename(folder, old / "export")
                os.rename(tmp, folder)
                shutil.rmtree(old)  # the previous export of ours, checked whole above
        else:
            if folder.exists():
                folder.rmdir()  # empty (checked); rename needs it gone
            os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two folders in one step (Linux renameat2 RENAME_EXCHANGE), so
    that the target never goes missing; False where that is unavailable."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    return False  # e.g. a file system without the flag: the two-rename fallback


# -- build and run ------------------------------------------------------------------

def _read_info(folder: Path, where):
    if not (folder / MARKER).is_file() or not (folder / INFO).is_file():
        raise ExportError(f"{where}: {str(folder)!r} is not an aidge_interop export")
    return json.loads((folder / INFO).read_text())


def compile_and_run(folder, inputs=None, cc: str | None = None,
                    cflags: str = "-std=c99 -O2 -Wall -Wextra", ldflags: str = "",
                    timeout: float = 300):
    """Builds the export in ``folder`` (``bin/model``) and runs it.

    Without ``inputs`` it runs the embedded input (and the layer check when
    the export has references); with ``inputs`` (one array per model input,
    either one sample of the exported shape or a stack of them, float
    arrays quantized for int8 exports) it runs every sample. Returns one
    array per model output (stacked like the inputs). A missing compiler,
    a build failure or a failed layer check raises :class:`BuildError` with
    the compiler's or the program's output.
    """
    where = "compile_and_run"
    folder = Path(folder).absolute()  # the compiler and the program run in it (cwd=folder)
    info = _read_info(folder, where)
    cc = cc or os.environ.get("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        raise BuildError(f"{where}: no C compiler {cc!r} on PATH; install one (gcc or "
                         "clang) or pass cc=")
    (folder / "bin").mkdir(exist_ok=True)
    cmd = [*cc.split(), *cflags.split(), "-Ikernels", "-o", "bin/model", "main.c", "forward.c",
           "kernels/aidge_kernels.c", *ldflags.split(), "-lm"]
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise BuildError(f"{where}: building {str(folder)!r} failed:\n$ {' '.join(cmd)}\n"
                         f"{proc.stdout}{proc.stderr}")
    if proc.stderr.strip():  # warnings: keep them visible
        print(proc.stderr, end="")
    with tempfile.TemporaryDirectory() as tmp:
        args, batch = [], None
        if inputs is not None:
            inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
            if len(inputs) != len(info["inputs"]):
                raise ValueError(f"{where}: the export takes {len(info['inputs'])} inputs, "
                                 f"got {len(inputs)}")
            for k, (x, spec) in enumerate(zip(inputs, info["inputs"])):
                x = _input_array(x, spec, info["nb_bits"], f"{where}: input {k}")
                shape = tuple(spec["shape"])
                if x.shape == shape:
                    mode = None  # one run
                elif x.shape[1:] == shape:
                    mode = "stacked"  # (samples, *shape)
                elif shape[0] == 1 and x.ndim == len(shape) and x.shape[1:] == shape[1:]:
                    mode = "batch"  # batch-1 export: the batch axis holds the samples
                else:
                    raise ValueError(f"{where}: input {k} has shape {x.shape}; {shape}, "
                                     f"(samples, *{shape}) or (samples, *{shape[1:]}) expected")
                batch = mode if k == 0 else batch
                path = os.path.join(tmp, f"input_{k}.bin")
                x.tofile(path)
                args.append(path)
        proc = subprocess.run([str(folder / "bin" / "model"), *args], cwd=folder,
                              capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise BuildError(f"{where}: {str(folder / 'bin' / 'model')!r} exited with "
                         f"{proc.returncode}:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    return _parse_outputs(proc.stdout, info, batch)


def _input_array(x, spec, nb_bits, where):
    x = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
    if spec["ctype"] == "float":
        return np.ascontiguousarray(x, dtype=np.float32)
    if x.dtype == np.int8:
        return np.ascontiguousarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"{where}: {x.dtype} given; int8 or float (quantized here) expected")
    from .quantization import round_half_up

    qmax = 2 ** (nb_bits - 1) - 1
    return np.clip(round_half_up(x / spec["scale"]), -qmax, qmax).astype(np.int8)


def _parse_outputs(stdout, info, batch):
    dtype = np.int8 if info["quantized"] else np.float32
    per = [dict() for _ in info["outputs"]]
    for line in stdout.splitlines():
        m = re.match(r"output (\d+) sample (\d+):(.*)$", line)
        if m:
            per[int(m[1])][int(m[2])] = np.array(m[3].split(), dtype=np.float64)
    outs = []
    for k, spec in enumerate(info["outputs"]):
        shape = tuple(spec["shape"])
        rows = [per[k][s].astype(dtype).reshape(shape) for s in sorted(per[k])]
        if not rows:
            raise BuildError(f"compile_and_run: the program printed no output {k}")
        if batch == "stacked":
            outs.append(np.stack(rows))
        elif batch == "batch":
            outs.append(np.concatenate(rows))
        else:
            outs.append(rows[0])
    return outs
