"""The engine's graph in Google's Model Explorer (``ai-edge-model-explorer``).

::

    from aidge_interop import explorer
    explorer.visualize(graph, "Imported LeNet")          # opens Model Explorer
    explorer.save(graph, "lenet.json", comparison=ait.locate(model, x))
    # then: model-explorer lenet.json

Model Explorer draws graphs that its adapters hand it as JSON (its
``graph_builder`` dataclasses, ``{"graphs": [...]}``) and colours nodes
from *node data* (``{"results": {node id: {"value": ...}}}``). This module
builds both from our graph, without importing Model Explorer:

- a node per engine node (label: its op type; namespace: the path of its
  ONNX name, ``/conv1/Conv`` -> ``conv1``, so that layers fold), one per
  graph input and output; edges from value names, parameters and constants
  listed among the node's inputs (``inputsMetadata``);
- the node's attributes, output shapes and dtypes (``tensor_shape``), the
  recipes that changed it (``graph.history``), its quantization
  (``nb_bits``, ``shift``) and, with ``comparison`` (as for
  :func:`aidge_interop.visualize.visualize`: a ``locate`` result, a
  ``ModelTester`` that ran, or a mapping), its status and error figures as
  attributes and as the node's colour;
- node data (:func:`node_data`): the quantization bits and the comparison
  status (1 within tolerance, 2 over, 3 the first divergence) per node.

:func:`visualize` needs Model Explorer (``pip install
"aidge_interop[explorer]"``) and starts its local server, as its own
``visualize`` does; :func:`graph_json`, :func:`node_data` and :func:`save`
need nothing.
"""
from __future__ import annotations

import json

from ._util import write_atomic
from .visualize import (QUANT_STYLE, STATUS_STYLE, STATUS_TEXT, quant_badge, recipe_notes,
                        value_errors)

__all__ = ["graph_json", "node_data", "save", "visualize", "config"]

_STATUS_VALUE = {"unchecked": 0, "ok": 1, "over": 2, "first": 3}


def _kv(key, value) -> dict:
    text = str(value)  # long tensors cut: the side panel shows a value as text
    return {"key": key, "value": text if len(text) <= 2000 else text[:1999] + "…"}


def _namespace(name: str) -> str:
    parts = [p for p in name.split("/") if p]
    return "/".join(parts[:-1])


def _tensor_shape(meta) -> str:
    if not meta:
        return "?"
    dtype, shape = meta
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


def graph_json(graph, name: str | None = None, comparison=None) -> dict:
    """The graph as Model Explorer's adapter response: ``{"graphs": [graph]}``
    with one node per engine node, graph input and graph output."""
    values = {v["name"]: v for v in graph._g.values()}
    meta = {n: v["meta"] for n, v in values.items()}
    errors = value_errors(comparison, graph) if comparison is not None else None
    notes = recipe_notes(graph)
    producer = {}  # value -> (node id, output slot)
    nodes = []

    def out_meta(k, value):
        return {"id": str(k), "attrs": [_kv("__tensor_tag", value),
                                        _kv("tensor_shape", _tensor_shape(meta.get(value)))]}

    def status_of(names):
        own = [x for x in names if errors is not None and x in errors]
        status = max((errors[x].status for x in own), key=_STATUS_VALUE.get, default=None)
        return status, [f"{x}: {STATUS_TEXT[errors[x].status]}\n{errors[x].text}" for x in own]

    def style(status, quant):
        if status:
            fill, stroke, _ = STATUS_STYLE[status]
        elif quant:
            _, fill, stroke = QUANT_STYLE
        else:
            return None
        return {"backgroundColor": fill, "borderColor": stroke, "hoveredBorderColor": stroke}

    for name_ in graph.input_names:
        node = {"id": f"input:{name_}", "label": "Input", "namespace": "",
                "attrs": [_kv("name", name_)], "incomingEdges": [],
                "outputsMetadata": [out_meta(0, name_)]}
        status, texts = status_of([name_])
        if status:
            node["attrs"] += [_kv("comparison", STATUS_TEXT[status]),
                              _kv("errors", "\n\n".join(texts))]
            node["style"] = style(status, False)
        nodes.append(node)
        producer[name_] = (node["id"], 0)
    for i, n in enumerate(graph.nodes()):
        attrs = n["attrs"]
        node_id = str(i)
        node = {"id": node_id, "label": n["op_type"], "namespace": _namespace(n["name"]),
                "attrs": [_kv("name", n["name"]), _kv("op_type", n["op_type"])]
                + ([_kv("domain", n["domain"])] if n["domain"] else [])
                + [_kv(k, v) for k, v in sorted(attrs.items())],
                "incomingEdges": [], "inputsMetadata": [], "outputsMetadata": []}
        owned = []
        for k, x in enumerate(n["inputs"]):
            if not x:
                continue
            kind = values.get(x, {}).get("kind", "?")
            node["inputsMetadata"].append({"id": str(k), "attrs": [
                _kv("__tensor_tag", x), _kv("tensor_shape", _tensor_shape(meta.get(x))),
                _kv("kind", kind)]})
            if x in producer:
                src, slot = producer[x]
                node["incomingEdges"].append({"sourceNodeId": src,
                                              "sourceNodeOutputId": str(slot),
                                              "targetNodeInputId": str(k)})
            elif kind in ("param", "buffer", "const"):
                owned.append(x)
        for k, o in enumerate(n["outputs"]):
            if o:
                node["outputsMetadata"].append(out_meta(k, o))
                producer[o] = (node_id, k)
        for recipe, text in notes.get(n["name"], []):
            node["attrs"].append(_kv(f"recipe {recipe}", text))
        badge = quant_badge(attrs)
        if badge:
            node["attrs"].append(_kv("quantized", badge))
        status, texts = status_of([o for o in n["outputs"] if o] + owned)
        if status:
            node["attrs"] += [_kv("comparison", STATUS_TEXT[status]),
                              _kv("errors", "\n\n".join(texts))]
        st = style(status, bool(badge))
        if st:
            node["style"] = st
        nodes.append(node)
    for name_ in graph.output_names:
        node = {"id": f"output:{name_}", "label": "Output", "namespace": "",
                "attrs": [_kv("name", name_)], "incomingEdges": []}
        if name_ in producer:
            src, slot = producer[name_]
            node["incomingEdges"].append({"sourceNodeId": src, "sourceNodeOutputId": str(slot),
                                          "targetNodeInputId": "0"})
        nodes.append(node)
    history = ", ".join(f"{r.recipe} ({len(r)})" for r in getattr(graph, "history", []))
    graph_attrs = {"recipes applied": history} if history else {}
    out = {"id": name or "aidge_interop graph", "nodes": nodes}
    if graph_attrs:
        out["groupNodeAttributes"] = {"": graph_attrs}
    return {"graphs": [out]}


def node_data(graph, comparison=None) -> dict:
    """Model Explorer node data (``GraphNodeData`` JSON, keyed by the node
    ids of :func:`graph_json`), by name: ``"quantization bits"`` when nodes
    are quantized (value: ``nb_bits``), ``"comparison"`` with
    ``comparison`` (value: 1 within tolerance, 2 over, 3 the first
    divergence, 0 not compared; coloured like the pictures)."""
    out = {}
    nodes = graph.nodes()
    bits = {str(i): {"value": n["attrs"]["nb_bits"]} for i, n in enumerate(nodes)
            if isinstance(n["attrs"].get("nb_bits"), int)}
    if bits:
        out["quantization bits"] = {"name": "quantization bits", "results": bits}
    if comparison is not None:
        errors = value_errors(comparison, graph)
        kinds = {v["name"]: v["kind"] for v in graph._g.values()}
        results = {}
        for node_id, names in [(f"input:{x}", [x]) for x in graph.input_names] + [
                (str(i), [x for x in n["outputs"] if x] + [
                    x for x in n["inputs"] if kinds.get(x) in ("param", "buffer", "const")])
                for i, n in enumerate(nodes)]:
            own = [errors[x].status for x in names if x in errors]
            if own:
                results[node_id] = {"value": max(_STATUS_VALUE[s] for s in own)}
        out["comparison"] = {"name": "comparison", "results": results, "thresholds": [
            {"value": v, "bgColor": STATUS_STYLE[s][0]} for s, v in _STATUS_VALUE.items()]}
    return out


def save(graph, path, name: str | None = None, comparison=None) -> str:
    """Writes :func:`graph_json` to ``path`` (``.json``), a file Model
    Explorer opens (``model-explorer path``, or its upload button). Returns
    the path."""
    from pathlib import Path

    path = Path(path)
    if path.suffix.lower() != ".json":
        raise ValueError(f"explorer.save: {str(path)!r}: Model Explorer's graph file is .json")
    if not path.absolute().parent.is_dir():
        raise FileNotFoundError(f"explorer.save: folder {str(path.absolute().parent)!r} does "
                                "not exist")
    data = graph_json(graph, name or path.stem, comparison)
    write_atomic(path, (json.dumps(data, indent=1) + "\n").encode("utf-8"))
    return str(path)


def _model_explorer():
    try:
        import model_explorer
    except ImportError as exc:
        raise ImportError("aidge_interop.explorer.visualize needs Google's Model Explorer: "
                          "pip install \"aidge_interop[explorer]\" (ai-edge-model-explorer); "
                          "explorer.save writes a .json file it opens") from exc
    return model_explorer


def config(graph, name: str | None = None, comparison=None):
    """A ``model_explorer.ModelExplorerConfig`` holding the graph (its JSON
    as a ``graphs://`` source, as Model Explorer's own PyTorch entry adds
    one) and its node data."""
    me = _model_explorer()
    name = name or "aidge_interop graph"
    conf = me.config()
    index = len(conf.graphs_list)
    conf.graphs_list.append(json.dumps(graph_json(graph, name, comparison)))
    conf.model_sources.append({"url": f"graphs://{name}/{index}"})
    for label, data in node_data(graph, comparison).items():
        conf.add_node_data(label, json.dumps(data))
    return conf


def visualize(graph, name: str | None = None, comparison=None, **kwargs) -> None:
    """Opens the graph in Model Explorer (``model_explorer.visualize_from_config``:
    a local server and a browser tab, or an inline frame in Colab; ``kwargs``
    go to it: ``host``, ``port``, ``no_open_in_browser``...)."""
    me = _model_explorer()
    me.visualize_from_config(config(graph, name, comparison), **kwargs)
