"""Pictures of the engine's graph: one self-contained SVG (or HTML page with
the SVG inline), no network, no viewer but a browser.

::

    graph.visualize("lenet.svg", title="LeNet after recipes")
    graph.visualize("lenet.html", comparison=aidge_interop.locate(model, x))
    graph.visualize(title="LeNet")    # no path: a Picture, shown inline in Jupyter
    aidge-interop show lenet --recipes all --out lenet.svg

What a node shows: its op type (fused nodes: ``FusedConv = Conv + Relu``),
its name, its output shape and dtype, and the parameters and constants it
reads, folded into the box with their shapes. Quantized nodes (any node
with an integer ``nb_bits`` attribute, e.g. those of domain
``aidge_interop.quant``) carry a badge with the bit width and the shift.
Nodes a recipe changed carry the recipe's name; the header lists every
recipe applied (``graph.history``). Hovering a node shows everything in its
tooltip (an SVG ``<title>``): domain, attributes, inputs, outputs,
parameters, the recipe lines, and the error figures of a comparison.

With ``comparison`` (see :func:`value_errors`), nodes are coloured by the
error of the values they compute or the parameters they own: green within
tolerance, red over it, dark red with a thick border for the first
divergence, grey when nothing was compared.

Layout (:func:`layout`): layered top to bottom in the Sugiyama manner:
longest-path layering (a node sits one layer below its lowest input;
nodes fed only by constants move down next to their first reader), dummy
points on edges that span several layers, barycentre ordering sweeps that
keep the order with the fewest crossings, and x coordinates that stay as
close as possible to the mean of each node's neighbours while keeping the
order and a gap (isotonic regression per layer, so boxes never overlap).
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from ._util import write_atomic

__all__ = ["visualize", "render", "layout", "value_errors", "recipe_notes", "quant_badge",
           "Layout", "Box", "ValueStatus", "Picture", "STATUS_STYLE", "STATUS_TEXT",
           "QUANT_STYLE"]

# -- geometry of text (monospace: widths are predictable) -----------------------------

FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
FONT_SIZE = 11
CHAR_W = 0.62 * FONT_SIZE  # a little above the 0.6 em of common monospace fonts
LINE_H = 15
PAD_X, PAD_Y = 8, 6
MAX_CHARS = 44  # longer lines are cut with an ellipsis (the tooltip has them whole)
MAX_PARAM_LINES = 4
GAP_X, GAP_Y = 28, 36
DUMMY_W = 8
MARGIN = 16

_CATEGORIES = [  # (category, fill, stroke, op types)
    ("conv", "#dbeafe", "#2563eb", {"Conv", "ConvTranspose", "FusedConv", "QConv"}),
    ("matmul", "#e0e7ff", "#4f46e5", {"Gemm", "MatMul", "FusedGemm", "FusedMatMul", "QGemm",
                                          "QMatMul"}),
    ("activation", "#fef3c7", "#d97706", {
        "Relu", "Clip", "Sigmoid", "Tanh", "Gelu", "LeakyRelu", "Softmax", "LogSoftmax",
        "Softplus", "Erf", "ShiftGELU", "ShiftMax", "HardSigmoid", "HardSwish", "Elu"}),
    ("norm", "#dcfce7", "#16a34a", {"BatchNormalization", "LayerNormalization"}),
    ("pool", "#cffafe", "#0891b2", {
        "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "QAveragePool",
        "QGlobalAveragePool"}),
    ("arith", "#fce7f3", "#db2777", {"Add", "Sub", "Mul", "Div", "Pow", "QAdd", "Sqrt", "Exp",
                                     "Log", "Neg", "Abs", "Reciprocal", "ReduceMean",
                                     "ReduceSum", "Requantize"}),
]
_SHAPE_STYLE = ("shape", "#f3f4f6", "#6b7280")
_IO_STYLE = ("io", "#ffffff", "#111827")
QUANT_STYLE = ("quant", "#ede9fe", "#7c3aed")
STATUS_STYLE = {  # comparison colours: fill, stroke, stroke width
    "ok": ("#dcfce7", "#16a34a", 1.5),
    "over": ("#fee2e2", "#dc2626", 2.0),
    "first": ("#fca5a5", "#7f1d1d", 4.0),
    "unchecked": ("#f3f4f6", "#9ca3af", 1.0),
}
STATUS_TEXT = {"ok": "within tolerance", "over": "over tolerance",
                "first": "first divergence", "unchecked": "not compared"}


def _style(op_type: str, domain: str):
    if domain.endswith(".quant"):
        return QUANT_STYLE
    for cat, fill, stroke, ops in _CATEGORIES:
        if op_type in ops:
            return cat, fill, stroke
    return _SHAPE_STYLE


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _shape(shape) -> str:
    if shape is None:
        return "?"
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def _short(value) -> str:
    """An attribute value in a line (tensors and long lists cut)."""
    text = str(value)
    return _cut(text.replace("\n", " "), 80)


# -- comparison results -> per-value status -------------------------------------------

@dataclass
class ValueStatus:
    """The comparison of one value (or parameter): ``status`` is ``"ok"``,
    ``"over"`` (over tolerance) or ``"first"`` (the first divergence);
    ``text``: the figures."""
    status: str
    text: str


def _status_of(check) -> tuple[bool, str]:
    if isinstance(check, ValueStatus):
        return check.status == "ok", check.text
    if isinstance(check, bool):
        return check, "within tolerance" if check else "over tolerance"
    if isinstance(check, (int, float)):
        return False, f"error {check:.3g}"  # a bare figure: the caller found it over
    ok = getattr(check, "ok", None)
    if ok is None:
        raise TypeError(f"comparison: cannot read {type(check).__name__} {check!r}: expected "
                        "a locate Check, a ValueStatus, a bool or a number")
    return bool(ok), str(check)


def _tester_checks(tester, graph) -> list:
    """ModelTester's checks of its last step -> (value name, check)."""
    checks = getattr(tester, "checks", None)
    if checks is None:
        raise ValueError("comparison: the ModelTester has no checks yet; run unit_test or "
                         "test_multiple_step first")
    named = []
    outputs, inputs = (graph.output_names, graph.input_names) if graph else ([], [])
    for check in checks:
        m = re.fullmatch(r"(output|input gradient)(?:\[(\d+)\])?", check.what)
        p = re.fullmatch(r"gradient of parameter '(.*)'", check.what)
        if m:
            names = outputs if m.group(1) == "output" else inputs
            k = int(m.group(2) or 0)
            if k < len(names):
                named.append((names[k], check))
        elif p:
            named.append((p.group(1), check))
    return named


def value_errors(comparison, graph=None) -> dict[str, ValueStatus]:
    """``comparison`` as value name -> :class:`ValueStatus`.

    Accepts a :class:`~aidge_interop.compare.locate.LocateResult` (every check
    forward and backward; the first diverging node's failing values are
    ``"first"``), a :class:`~aidge_interop.testing.ModelTester` after a step
    (its ``checks``: outputs, input gradients and parameter gradients of the
    last step, mapped to ``graph``'s output, input and parameter names; the
    first failing one is ``"first"``), or a mapping name -> Check, ValueStatus,
    bool (ok) or number (an error found over tolerance).
    """
    pairs, first = [], None
    if all(hasattr(comparison, a) for a in ("forward", "backward", "first")):  # LocateResult
        reports = comparison.forward + (comparison.backward or [])
        pairs = [(c.name, c) for r in reports for c in r.checks]
        if comparison.first is not None:
            first = {c.name for c in comparison.first.checks if not c.ok}
    elif hasattr(comparison, "checks") and hasattr(comparison, "test_multiple_step"):
        pairs = _tester_checks(comparison, graph)
        bad = [name for name, c in pairs if not c.ok]
        first = set(bad[:1])
    elif isinstance(comparison, dict):
        pairs = list(comparison.items())
    else:
        raise TypeError(f"comparison: expected a locate result, a ModelTester or a dict, not "
                        f"{type(comparison).__name__}")
    out = {}
    for name, check in pairs:
        ok, text = _status_of(check)
        if isinstance(check, ValueStatus):
            status = check.status
        else:
            status = "ok" if ok else ("first" if first and name in first else "over")
        prev = out.get(name)
        if prev and _RANK[prev.status] >= _RANK[status]:
            prev.text += "\n" + text
            continue
        out[name] = ValueStatus(status, text if not prev else prev.text + "\n" + text)
    if first is None and not isinstance(comparison, dict):
        return out
    if first is None:  # a plain mapping: the first failing value (in graph order) is first
        order = _value_order(graph) if graph else list(out)
        for name in order:
            if name in out and out[name].status == "over":
                out[name].status = "first"
                break
    return out


_RANK = {"unchecked": 0, "ok": 1, "over": 2, "first": 3}


def _value_order(graph) -> list[str]:
    names = list(graph.input_names)
    for n in graph.nodes():
        names += list(n["inputs"]) + list(n["outputs"])
    return list(dict.fromkeys(x for x in names if x))


# -- the picture's model --------------------------------------------------------------

@dataclass
class _Item:
    id: str
    kind: str  # "input", "node", "output", "dummy"
    lines: list = field(default_factory=list)  # (text, css class)
    tooltip: list = field(default_factory=list)
    style: tuple = _SHAPE_STYLE
    status: str | None = None
    badge: str = ""
    w: float = DUMMY_W
    h: float = 0.0


def recipe_notes(graph) -> dict[str, list[tuple[str, str]]]:
    """Node name -> (recipe, line) of every change ``graph.history`` records."""
    notes = defaultdict(list)
    for report in getattr(graph, "history", []):
        for node, text in zip(getattr(report, "nodes", []), report):
            notes[node].append((report.recipe, text))
    return notes


def quant_badge(attrs: dict) -> str:
    """``int8 >>7`` for a quantized node's attributes (an integer ``nb_bits``,
    ``shift``; ``>>5..9`` for shifts per output channel), else ``""``."""
    bits = attrs.get("nb_bits")
    if not isinstance(bits, int):
        return ""
    badge = f"int{bits}"
    shift = attrs.get("shift")
    if isinstance(shift, int):
        badge += f" >>{shift}"
    elif isinstance(shift, (list, tuple)) and shift and all(isinstance(s, int) for s in shift):
        lo, hi = min(shift), max(shift)
        badge += f" >>{lo}" if lo == hi else f" >>{lo}..{hi}"
    return badge


def _model(graph, comparison):
    """The items (boxes) and edges of the picture, and the header lines."""
    values = {v["name"]: v for v in graph._g.values()}
    meta = {n: v["meta"] for n, v in values.items()}
    nodes = graph.nodes()
    errors = value_errors(comparison, graph) if comparison is not None else None
    notes = recipe_notes(graph)
    items, edges, producer = [], [], {}

    def shape_line(name):
        m = meta.get(name)
        return f"{_shape(m[1])} {m[0]}" if m else "shape ? (run a forward)"

    for name in graph.input_names:
        item = _Item(f"in:{name}", "input", [("input", "op"), (_cut(name), "name"),
                                             (shape_line(name), "shape")],
                     [f"graph input '{name}'", shape_line(name)], _IO_STYLE)
        if errors is not None:
            item.status = errors[name].status if name in errors else "unchecked"
            if name in errors:
                item.tooltip += ["", errors[name].text]
        items.append(item)
        producer[name] = item.id
    for i, n in enumerate(nodes):
        op, dom, attrs = n["op_type"], n["domain"], n["attrs"]
        head, act = op, attrs.get("activation")
        if op.startswith("Fused"):
            base = op[len("Fused"):]
            parts = (["Flatten"] if "flatten_axis" in attrs else []) + [base] + \
                    ([act] if act else [])
            head = f"{op} = {' + '.join(parts)}"
        lines = [(_cut(head), "op"), (_cut(n["name"]), "name")]
        outs = [o for o in n["outputs"] if o]
        for o in outs[:2]:
            lines.append((_cut(shape_line(o)), "shape"))
        params = [(k, x) for k, x in enumerate(n["inputs"])
                  if x and values.get(x, {}).get("kind") in ("param", "buffer", "const")]
        for k, x in params[:MAX_PARAM_LINES]:
            kind = values[x]["kind"]
            mark = {"param": "", "buffer": " (buffer)", "const": " (const)"}[kind]
            lines.append((_cut(f"{x}: {_shape(meta[x][1] if meta.get(x) else None)}{mark}"),
                          "param"))
        if len(params) > MAX_PARAM_LINES:
            lines.append((f"+{len(params) - MAX_PARAM_LINES} more", "param"))
        node_notes = notes.get(n["name"], [])
        if node_notes:
            recipes = ", ".join(dict.fromkeys(r for r, _ in node_notes))
            lines.append((_cut(f"recipes: {recipes}"), "recipe"))
        tip = [f"{op} node '{n['name']}'" + (f" (domain {dom})" if dom else "")]
        if attrs:
            tip.append("attributes:")
            tip += [f"  {k} = {_short(v)}" for k, v in sorted(attrs.items())]
        tip.append("inputs:")
        for x in n["inputs"]:
            if x:
                kind = values.get(x, {}).get("kind", "?")
                tip.append(f"  {x}: {shape_line(x)} ({kind})")
        tip.append("outputs:")
        tip += [f"  {o}: {shape_line(o)}" for o in outs]
        if node_notes:
            tip.append("recipes:")
            tip += [f"  {r}: {t}" for r, t in node_notes]
        item = _Item(f"n{i}", "node", lines, tip, _style(op, dom), badge=quant_badge(attrs))
        if item.badge:
            tip.insert(1, "quantized: " + ", ".join(
                f"{k}={attrs[k]}" for k in ("nb_bits", "shift", "multiplier") if k in attrs))
        if errors is not None:
            own = [x for x in outs + [x for _, x in params] if x in errors]
            item.status = max((errors[x].status for x in own), key=_RANK.get,
                              default="unchecked")
            tip.insert(1, STATUS_TEXT[item.status])
            for x in own:
                tip += ["", f"{x}: {STATUS_TEXT[errors[x].status]}", errors[x].text]
        items.append(item)
        for x in n["inputs"]:
            if x in producer:
                edges.append((producer[x], item.id))
        for o in outs:
            producer[o] = item.id
    for name in graph.output_names:
        item = _Item(f"out:{name}", "output", [("output", "op"), (_cut(name), "name"),
                                               (shape_line(name), "shape")],
                     [f"graph output '{name}'", shape_line(name)], _IO_STYLE)
        items.append(item)
        if name in producer:
            edges.append((producer[name], item.id))
    n_params = sum(v["kind"] == "param" for v in values.values())
    header = [f"{len(nodes)} nodes, {len(graph.input_names)} input(s), "
              f"{len(graph.output_names)} output(s), {n_params} parameter tensors"]
    history = [r.recipe + f" ({len(r)})" for r in getattr(graph, "history", [])]
    if history:
        header.append("recipes applied: " + ", ".join(history))
    if errors is not None:
        counts = defaultdict(int)
        for it in items:
            if it.kind == "node":
                counts[it.status] += 1
        header.append("comparison: " + ", ".join(
            f"{counts[s]} {STATUS_TEXT[s]}" for s in ("ok", "over", "first", "unchecked")
            if counts[s]))
    return items, edges, header


# -- layout -----------------------------------------------------------------------------

@dataclass
class Box:
    """A laid-out box: top-left corner, size, layer and position in it."""
    id: str
    x: float
    y: float
    w: float
    h: float
    layer: int
    dummy: bool = False


@dataclass
class Layout:
    """Boxes by id (dummies included, ``dummy=True``), the layers (ids in
    order, top to bottom) and each edge's polyline (points from the
    source's bottom to the target's top)."""
    boxes: dict
    layers: list
    routes: list  # (source id, target id, [(x, y), ...])
    width: float
    height: float


def _isotonic(targets: list[float], weights: list[float] | None = None) -> list[float]:
    """Non-decreasing sequence closest (least squares) to ``targets`` (pool
    adjacent violators)."""
    blocks = []  # [mean, weight, count]
    for i, t in enumerate(targets):
        w = weights[i] if weights else 1.0
        blocks.append([t, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out = []
    for m, _, c in blocks:
        out += [m] * c
    return out


def _crossings(upper: list, lower: list, down: dict) -> int:
    pos = {v: i for i, v in enumerate(lower)}
    ends = [pos[t] for v in upper for t in sorted(down[v], key=pos.get) if t in pos]
    count = 0
    for i in range(len(ends)):  # inversions
        for j in range(i + 1, len(ends)):
            count += ends[i] > ends[j]
    return count


def layout(sizes: dict, edges: list, order: list | None = None, sweeps: int = 8) -> Layout:
    """Lays out a DAG: ``sizes`` id -> (w, h), ``edges`` (source, target),
    ``order`` a topological order of the ids (default: ``sizes``' order)."""
    order = list(order or sizes)
    preds, succs = defaultdict(list), defaultdict(list)
    for s, t in edges:
        preds[t].append(s)
        succs[s].append(t)
    layer = {}
    for v in order:  # longest path from the sources
        layer[v] = max((layer[p] + 1 for p in preds[v]), default=0)
    for v in reversed(order):  # sources other than the first row go down to their reader
        if not preds[v] and succs[v] and not v.startswith("in:"):
            layer[v] = min(layer[t] for t in succs[v]) - 1
    n_layers = max(layer.values(), default=-1) + 1
    # dummies on long edges
    down, up = defaultdict(list), defaultdict(list)
    chains = []
    for k, (s, t) in enumerate(edges):
        chain = [s] + [f"d{k}:{l}" for l in range(layer[s] + 1, layer[t])] + [t]
        for l, d in enumerate(chain[1:-1], start=layer[s] + 1):
            layer[d] = l
        for a, b in zip(chain, chain[1:]):
            down[a].append(b)
            up[b].append(a)
        chains.append(chain)
    rows = [[] for _ in range(n_layers)]
    seen = set()
    for v in order:  # initial order: depth first from the topological order
        stack = [v]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            rows[layer[x]].append(x)
            stack += reversed([c for c in down[x] if c.startswith("d")])
    # barycentre sweeps, keeping the order with the fewest crossings
    def total():
        return sum(_crossings(rows[l], rows[l + 1], down) for l in range(n_layers - 1))

    best, best_rows = total(), [list(r) for r in rows]
    for it in range(sweeps):
        if best == 0:
            break
        downward = it % 2 == 0
        span = range(1, n_layers) if downward else range(n_layers - 2, -1, -1)
        for l in span:
            ref = {v: i for i, v in enumerate(rows[l - 1 if downward else l + 1])}
            nbrs = up if downward else down
            cur = {v: i for i, v in enumerate(rows[l])}
            rows[l].sort(key=lambda v: (sum(ref[u] for u in nbrs[v]) / len(nbrs[v])
                                        if nbrs[v] else cur[v], cur[v]))
        c = total()
        if c < best:
            best, best_rows = c, [list(r) for r in rows]
    rows = best_rows
    # sizes and y
    size = {v: sizes.get(v, (DUMMY_W, 0.0)) for row in rows for v in row}
    heights = [max((size[v][1] for v in row), default=0.0) for row in rows]
    ys, y = [], MARGIN
    for h in heights:
        ys.append(y)
        y += h + GAP_Y
    # x: centres near the neighbours' mean, order and gaps kept (isotonic regression)
    cx = {}
    for row in rows:
        x = 0.0
        for v in row:
            cx[v] = x + size[v][0] / 2
            x += size[v][0] + GAP_X

    def place(row, nbrs):
        if not row:
            return
        offsets, off = [], 0.0
        for i, v in enumerate(row):
            if i:
                off += (size[row[i - 1]][0] + size[v][0]) / 2 + GAP_X
            offsets.append(off)
        targets = [(sum(cx[u] for u in nbrs[v]) / len(nbrs[v]) if nbrs[v] else cx[v]) - o
                   for v, o in zip(row, offsets)]
        weights = [1.0 if v.startswith("d") else 2.0 for v in row]  # boxes pull harder
        for v, c, o in zip(row, _isotonic(targets, weights), offsets):
            cx[v] = c + o

    both = {v: up[v] + down[v] for row in rows for v in row}
    for it in range(sweeps):  # first one way each (inputs above, then readers below), then both
        downward = it % 2 == 0
        span = range(n_layers) if downward else range(n_layers - 1, -1, -1)
        for l in span:
            place(rows[l], both if it >= 2 else up if downward else down)
    left = min((cx[v] - size[v][0] / 2 for row in rows for v in row), default=0.0)
    shift = MARGIN - left
    boxes = {}
    for l, row in enumerate(rows):
        for v in row:  # a dummy spans its row: edges pass boxes by, never through
            w, h = size[v] if v in sizes else (DUMMY_W, heights[l])
            boxes[v] = Box(v, cx[v] + shift - w / 2, ys[l] + (heights[l] - h) / 2, w, h, l,
                           dummy=v not in sizes)
    width = max((b.x + b.w for b in boxes.values()), default=0.0) + MARGIN
    height = y - GAP_Y + MARGIN
    routes = []
    for (s, t), chain in zip(edges, chains):
        pts = [(boxes[s].x + boxes[s].w / 2, boxes[s].y + boxes[s].h)]
        for d in chain[1:-1]:
            b = boxes[d]
            pts += [(b.x + b.w / 2, b.y), (b.x + b.w / 2, b.y + b.h)]
        pts.append((boxes[t].x + boxes[t].w / 2, boxes[t].y))
        routes.append((s, t, pts))
    _spread_ports(routes, boxes)
    return Layout(boxes, rows, routes, width, height)


def _spread_ports(routes, boxes) -> None:
    """Edges entering one box arrive at distinct points of its top, in the
    order of where they come from; edges leaving one box likewise."""
    for end, side in ((-1, "top"), (0, "bottom")):
        groups = defaultdict(list)
        for k, (s, t, pts) in enumerate(routes):
            groups[t if end == -1 else s].append(k)
        for v, ks in groups.items():
            if len(ks) < 2:
                continue
            b = boxes[v]
            ks.sort(key=lambda k: routes[k][2][end - 1 if end == -1 else 1][0])
            for j, k in enumerate(ks):
                x = b.x + b.w * (j + 1) / (len(ks) + 1)
                routes[k][2][end] = (x, routes[k][2][end][1])


# -- rendering --------------------------------------------------------------------------

def _path(pts) -> str:
    """A smooth path through the points (vertical tangents at each)."""
    d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        my = (y0 + y1) / 2
        d += f" C{x0:.1f},{my:.1f} {x1:.1f},{my:.1f} {x1:.1f},{y1:.1f}"
    return d


def _size(item: _Item) -> tuple[float, float]:
    chars = max(len(t) for t, _ in item.lines)
    if item.badge:
        chars = max(chars, len(item.lines[0][0]) + len(item.badge) + 3)
    return chars * CHAR_W + 2 * PAD_X, len(item.lines) * LINE_H + 2 * PAD_Y


_CSS = f"""
text {{ font-family: {FONT}; font-size: {FONT_SIZE}px; fill: #111827; }}
text.op {{ font-weight: bold; }}
text.name {{ fill: #374151; }}
text.shape {{ fill: #1d4ed8; }}
text.param {{ fill: #6b7280; }}
text.recipe {{ fill: #7c3aed; font-style: italic; }}
text.badge {{ fill: #ffffff; font-weight: bold; }}
text.title {{ font-size: 16px; font-weight: bold; }}
path.edge {{ fill: none; stroke: #6b7280; stroke-width: 1.2; }}
g.node:hover rect.box {{ stroke-width: 3; }}
"""


def render(graph, title: str | None = None, comparison=None) -> tuple[str, Layout]:
    """The picture as SVG text, and its layout."""
    items, edges, header = _model(graph, comparison)
    for it in items:
        it.w, it.h = _size(it)
    lay = layout({it.id: (it.w, it.h) for it in items}, edges, [it.id for it in items])
    head_lines = ([title] if title else []) + header
    head_h = LINE_H * len(head_lines) + 2 * PAD_Y + (LINE_H + 4 if comparison is not None else 0)
    legend, x = [], MARGIN
    if comparison is not None:
        for status in ("ok", "over", "first", "unchecked"):
            fill, stroke, sw = STATUS_STYLE[status]
            legend.append(f'<rect x="{x}" y="{head_h - LINE_H - 2}" width="14" height="12" '
                          f'fill="{fill}" stroke="{stroke}" stroke-width="{min(sw, 2)}"/>'
                          f'<text x="{x + 18}" y="{head_h - 6}">{STATUS_TEXT[status]}</text>')
            x += 24 + CHAR_W * len(STATUS_TEXT[status]) + 12
    legend_w = x + MARGIN if comparison is not None else 0
    width = max(lay.width, MARGIN * 2 + CHAR_W * max((len(t) for t in head_lines), default=0),
                legend_w, 360)
    height = lay.height + head_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}">',
           f"<title>{escape(title or 'aidge_interop graph')}</title>",
           f"<style>{_CSS}</style>",
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'fill="#6b7280"/></marker></defs>',
           f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
           '<g class="header">']
    for k, line in enumerate(head_lines):
        cls = ' class="title"' if title and k == 0 else ""
        out.append(f'<text x="{MARGIN}" y="{PAD_Y + LINE_H * (k + 1) - 3}"{cls}>'
                   f"{escape(line)}</text>")
    out += legend + ["</g>", f'<g class="graph" transform="translate(0,{head_h:.0f})">',
                     '<g class="edges">']
    for s, t, pts in lay.routes:
        out.append(f'<path class="edge" d="{_path(pts)}" marker-end="url(#arrow)" '
                   f'data-from={quoteattr(s)} data-to={quoteattr(t)}/>')
    out += ["</g>", '<g class="nodes">']
    for it in items:
        b = lay.boxes[it.id]
        cat, fill, stroke = it.style
        sw, dash = (2.0 if it.kind != "node" else 1.2), ""
        if it.status:
            fill, stroke, sw = STATUS_STYLE[it.status]
            dash = ' stroke-dasharray="4 3"' if it.status == "unchecked" else ""
        rx = 14 if it.kind != "node" else 4
        cls = f"node {it.kind} cat-{cat}" + (f" status-{it.status}" if it.status else "")
        name = it.tooltip[0] if it.tooltip else it.id
        out.append(f'<g class="{cls}" id={quoteattr(it.id)} data-name={quoteattr(name)}>')
        out.append(f"<title>{escape(chr(10).join(it.tooltip))}</title>")
        out.append(f'<rect class="box" x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" '
                   f'height="{b.h:.1f}" rx="{rx}" fill="{fill}" stroke="{stroke}" '
                   f'stroke-width="{sw}"{dash}/>')
        for k, (text, tcls) in enumerate(it.lines):
            out.append(f'<text class="{tcls}" x="{b.x + PAD_X:.1f}" '
                       f'y="{b.y + PAD_Y + LINE_H * (k + 1) - 4:.1f}">{escape(text)}</text>')
        if it.badge:
            bw = CHAR_W * len(it.badge) + 8
            bx = b.x + b.w - bw - 4
            out.append(f'<rect class="badge" x="{bx:.1f}" y="{b.y + 3:.1f}" width="{bw:.1f}" '
                       f'height="{LINE_H - 1}" rx="3" fill="#7c3aed"/>'
                       f'<text class="badge" x="{bx + 4:.1f}" y="{b.y + LINE_H - 1:.1f}">'
                       f"{escape(it.badge)}</text>")
        out.append("</g>")
    out += ["</g>", "</g>", "</svg>"]
    return "\n".join(out) + "\n", lay


class Picture(str):
    """The picture of a graph as SVG text (a ``str``), which Jupyter shows
    inline; :meth:`save` writes it like :func:`visualize`."""

    def __new__(cls, graph, title: str | None = None, comparison=None):
        self = super().__new__(cls, render(graph, title=title, comparison=comparison)[0])
        self.graph, self.title, self.comparison = graph, title, comparison
        return self

    def _repr_svg_(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"<Picture of {self.graph!r}" + (f" {self.title!r}>" if self.title else ">")

    def save(self, path) -> str:
        """Writes the picture to ``path`` (``.svg`` or ``.html``, as
        :func:`visualize`); returns the path."""
        return _write(path, str(self), self.title)


def visualize(graph, path, title: str | None = None, comparison=None) -> str:
    """Writes the picture of ``graph`` to ``path``: ``.svg``, or ``.html``
    (``.htm``) for a page with the SVG inline. The file is written
    atomically. Returns ``path`` as a string."""
    _check_path(path)
    return _write(path, render(graph, title=title, comparison=comparison)[0], title)


def _check_path(path) -> Path:
    path = Path(path)
    fmt = path.suffix.lower()
    if fmt not in (".svg", ".html", ".htm"):
        raise ValueError(f"visualize: {str(path)!r}: the picture is .svg or .html, not "
                         f"{fmt or 'a file without extension'!r}")
    if not path.absolute().parent.is_dir():
        raise FileNotFoundError(f"visualize: folder {str(path.absolute().parent)!r} does not "
                                "exist")
    return path


def _write(path, svg: str, title: str | None) -> str:
    path = _check_path(path)
    if path.suffix.lower() != ".svg":
        svg = ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8"/>\n'
               f"<title>{escape(title or 'aidge_interop graph')}</title>\n"
               "<style>body { margin: 0; background: #ffffff; }</style>\n</head>\n<body>\n"
               + svg + "</body>\n</html>\n")
    write_atomic(path, svg.encode("utf-8"))
    return str(path)
