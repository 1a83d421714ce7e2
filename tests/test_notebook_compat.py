"""Aidge's "Quantized LeNet CPP Export" notebook on aidge_interop (issue 45):
its calls as a user of Aidge writes them, with `import aidge_interop as ait`.

load_onnx(verbose=), a calibration set given as a list of per-sample
tensors (and a model exported for batch 1, calibrated a sample at a time),
the recipes in the notebook's order, export and compile from relative
folders, the graph inline and in Model Explorer (its JSON, no browser), and
the example (examples/quantized_lenet_cpp_export.py and its notebook) run
from another working directory.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import aidge_interop as ait
from aidge_interop import explorer, recipes
from aidge_interop import visualize as viz
from aidge_interop.examples import _seeded
from aidge_interop.export import compile_and_run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOTEBOOK = EXAMPLES / "quantized_lenet_cpp_export"
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


class Batch1Net(torch.nn.Module):
    """Conv, Relu, then a view that writes the batch (1): the exported
    Reshape runs only on batch 1, like a model exported for one sample."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).view(1, -1))


@pytest.fixture(scope="module")
def batch1(tmp_path_factory):
    """(torch model, path of its ONNX export for batch 1, 20 samples (1, 1, 8, 8))."""
    net = _seeded(Batch1Net, 0).eval()
    path = tmp_path_factory.mktemp("batch1") / "net.onnx"
    torch.onnx.export(net, (torch.zeros(1, 1, 8, 8),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"])
    xs = np.random.default_rng(0).standard_normal((20, 1, 1, 8, 8)).astype(np.float32)
    return net, path, xs


def _pow2_scale(amax: float, qmax: int = 127) -> float:
    """The single-shift scale of an activation of max |value| amax (NumPy side)."""
    return 2.0 ** -math.floor(math.log2(qmax / amax))


# -- load_onnx -------------------------------------------------------------------------

def test_load_onnx_verbose_prints_a_summary(batch1, capsys):
    _, path, _ = batch1
    graph = ait.load_onnx(path, verbose=False)
    assert capsys.readouterr().out == ""
    graph = ait.load_onnx(str(path), verbose=True)
    out = capsys.readouterr().out
    assert out.startswith(f"load_onnx: {str(path)!r}: ")
    ops = [n["op_type"] for n in graph.nodes()]  # the engine's (the Constant became a value)
    assert ops == ["Conv", "Relu", "Reshape", "Gemm"]
    assert f"{len(ops)} nodes" in out and all(f"{op} {ops.count(op)}" in out for op in ops)
    assert "inputs 'x' 1x1x8x8" in out and "outputs 'y'" in out
    n_params = sum(int(np.prod(p.shape)) for p in graph.parameters().values())
    assert f"{n_params} parameters in {len(graph.parameters())} tensors" in out


# -- the calibration set as a list of samples ------------------------------------------

@pytest.mark.parametrize("form", ["ait.Tensor", "numpy without batch axis", "torch",
                                  "stacked array"])
def test_quantize_takes_a_list_of_per_sample_tensors(batch1, form):
    """The notebook calibrates on `tensors[0:NB_CALIB]`, one (1, 1, H, W)
    tensor per sample. The model is exported for batch 1 (its Reshape writes
    the batch): calibrated a sample at a time, on every sample."""
    net, path, xs = batch1
    graph = ait.load_onnx(path)
    with pytest.raises(ValueError):  # the whole set at once does not run on this model
        graph.forward(xs[:, 0])
    calib = {"ait.Tensor": [ait.Tensor(x) for x in xs],
             "numpy without batch axis": [x[0] for x in xs],
             "torch": [torch.from_numpy(x) for x in xs],
             "stacked array": xs[:, 0]}[form]
    q = ait.quantize(graph, calib)
    with torch.no_grad():
        hidden = torch.relu(net.conv(torch.from_numpy(xs[:, 0])))
    conv = q.layers[0]
    assert conv.op == "Conv"
    assert q.scales["x"] == _pow2_scale(float(np.abs(xs).max()))
    assert q.scales[conv.output] == _pow2_scale(float(hidden.abs().max()))
    # the quantized model runs the samples; its outputs follow the float model's
    with torch.no_grad():
        ref = np.concatenate([net(torch.from_numpy(x)).numpy() for x in xs])
    out = np.concatenate([q(x)[0] for x in xs])
    assert np.abs(out - ref).max() <= 0.1 * np.abs(ref).max()


def _two_input_graph():
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["a", "w"], ["h"], name="fc"),
             helper.make_node("Add", ["h", "b"], ["y"], name="add")]
    g = helper.make_graph(nodes, "two", [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(w, "w")])
    return ait.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_quantize_samples_of_several_inputs_and_clear_errors():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 4)).astype(np.float32)
    b = 3 * rng.standard_normal((6, 3)).astype(np.float32)
    per_input = ait.quantize(_two_input_graph(), [a, b])  # one array per input
    samples = ait.quantize(_two_input_graph(), [(a[i], b[i]) for i in range(6)])
    assert samples.scales == per_input.scales
    assert per_input.scales["b"] == _pow2_scale(float(np.abs(b).max()))
    with pytest.raises(ValueError, match="the graph takes 2 inputs, got 3 arrays"):
        ait.quantize(_two_input_graph(), [a, b, b])
    with pytest.raises(ValueError, match="sample 1 holds 1 arrays; the graph takes 2"):
        ait.quantize(_two_input_graph(), [(a[0], b[0]), (a[1],)])


def test_quantize_refuses_samples_it_cannot_read(batch1):
    _, path, xs = batch1
    graph = ait.load_onnx(path)
    with pytest.raises(ValueError, match=r"different shapes"):
        ait.quantize(graph, [xs[0], xs[1, 0]])
    with pytest.raises(ValueError, match=r"got a list of 2 arrays of shape \(1, 1, 9, 8\).*"
                                         r"declared 1x1x8x8"):
        ait.quantize(graph, [np.zeros((1, 1, 9, 8), np.float32)] * 2)
    # a model that declares no rank: samples with or without a batch axis cannot be told apart
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "norank",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    norank = ait.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(ValueError, match="declares no rank.*ambiguous"):
        ait.quantize(norank, [np.ones((1, 4), np.float32)] * 3)


# -- the recipes in the notebook's order, then quantization and export ------------------

@needs_cc
def test_notebook_recipes_quantize_and_export_from_relative_folders(batch1, tmp_path,
                                                                     monkeypatch):
    net, path, xs = batch1
    model = ait.load_onnx(path, verbose=False)
    model.forward([xs[0]])
    recipes.remove_flatten(model)  # a Reshape that writes the batch: kept, with the reason
    recipes.fuse_batchnorm(model)
    recipes.expand_metaops(model)
    q = ait.quantize(model, [ait.Tensor(x) for x in xs])
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    ait.export_c(q, "export_int8", verbose=False)
    xq = np.concatenate(q.quantize_inputs(xs[:, 0]))
    engine = np.concatenate([q.run(x[None])[0] for x in xq])
    np.testing.assert_array_equal(compile_and_run("export_int8", [xq])[0], engine)
    monkeypatch.chdir(elsewhere)  # the same export, reached from another directory
    for folder in ("../work/export_int8", work / "export_int8"):
        np.testing.assert_array_equal(compile_and_run(folder, [xq])[0], engine)
    ait.export_c(q, "../work/export_int8", verbose=False)  # replaced through a relative path
    assert not list(elsewhere.iterdir())  # nothing written where the calls were made
    assert not (work / "export_int8" / "bin").exists()  # a fresh export: not built yet
    out = compile_and_run("../work/export_int8")  # the embedded sample, layer check on
    assert (work / "export_int8" / "bin" / "model").is_file()
    np.testing.assert_array_equal(out[0], q.run(q.quantize_inputs(q.sample_inputs[0])[0])[0])


# -- the graph inline and in Model Explorer --------------------------------------------

def _lenet_graph():
    from aidge_interop.compare.locate import torch_graph
    from aidge_interop.examples import lenet

    net = lenet().eval()
    x = torch.randn(2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    graph, _, _ = torch_graph(net, [x], "test")
    graph.forward(x.numpy())
    return net, graph, x


def test_graph_shows_inline_in_jupyter():
    from IPython.core.formatters import DisplayFormatter

    _, graph, _ = _lenet_graph()
    data, _ = DisplayFormatter().format(graph)
    assert data["image/svg+xml"] == graph.visualize()  # the picture of visualize
    picture = graph.visualize(title="Imported LeNet")
    data, _ = DisplayFormatter().format(picture)
    assert data["image/svg+xml"].startswith("<svg") and "Imported LeNet" in data["image/svg+xml"]
    assert data["image/svg+xml"] == viz.render(graph, title="Imported LeNet")[0]


def _nodes_by_id(data):
    (g,) = data["graphs"]
    return {n["id"]: n for n in g["nodes"]}


def test_model_explorer_graph_json():
    """Model Explorer's adapter format (graph_builder: Graph, GraphNode,
    IncomingEdge, KeyValue, MetadataItem): every node, input and output; an
    edge per value read from another node, with its slots; shapes; recipes'
    marks."""
    _, graph, _ = _lenet_graph()
    recipes.remove_flatten(graph)
    recipes.fuse_activation(graph)
    data = json.loads(json.dumps(explorer.graph_json(graph, "LeNet")))  # plain JSON
    assert set(data) == {"graphs"} and data["graphs"][0]["id"] == "LeNet"
    nodes = _nodes_by_id(data)
    engine_nodes = graph.nodes()
    assert len(nodes) == len(engine_nodes) + len(graph.input_names) + len(graph.output_names)
    producer = {x: (f"input:{x}", 0) for x in graph.input_names}
    values = {v["name"]: v for v in graph._g.values()}
    for i, n in enumerate(engine_nodes):
        node = nodes[str(i)]
        assert node["label"] == n["op_type"]
        attrs = {a["key"]: a["value"] for a in node["attrs"]}
        assert attrs["name"] == n["name"] and attrs["op_type"] == n["op_type"]
        expected = [{"sourceNodeId": producer[x][0], "sourceNodeOutputId": str(producer[x][1]),
                     "targetNodeInputId": str(k)} for k, x in enumerate(n["inputs"])
                    if x in producer]
        assert node["incomingEdges"] == expected
        for k, o in enumerate(n["outputs"]):
            meta = node["outputsMetadata"][k]
            tags = {a["key"]: a["value"] for a in meta["attrs"]}
            dtype, shape = values[o]["meta"]
            assert tags == {"__tensor_tag": o,
                            "tensor_shape": f"{dtype}[{','.join(map(str, shape))}]"}
            producer[o] = (str(i), k)
        notes = [r.recipe for r in graph.history for node_name in r.nodes
                 if node_name == n["name"]]
        assert sorted(k[len("recipe "):] for k in attrs if k.startswith("recipe ")) == \
            sorted(set(notes))
    gemm = next(nodes[str(i)] for i, n in enumerate(engine_nodes) if "flatten_axis" in n["attrs"])
    assert {"key": "recipe remove_flatten", "value": next(
        t for r in graph.history if r.recipe == "remove_flatten" for t in r)} in gemm["attrs"]
    assert nodes["output:" + graph.output_names[0]]["incomingEdges"][0]["sourceNodeId"] == \
        producer[graph.output_names[0]][0]


def test_model_explorer_json_fits_its_dataclasses():
    """Where Model Explorer is installed: our JSON builds its own
    graph_builder dataclasses field by field (no server, no browser)."""
    gb = pytest.importorskip("model_explorer.graph_builder")
    _, graph, _ = _lenet_graph()
    data = explorer.graph_json(graph, "LeNet")
    for g in data["graphs"]:
        gb.Graph(**{k: v for k, v in g.items() if k != "nodes"})
        for n in g["nodes"]:
            gb.GraphNode(**n)
            [gb.IncomingEdge(**e) for e in n["incomingEdges"]]
            [gb.KeyValue(**a) for a in n["attrs"]]
            [gb.MetadataItem(**m) for m in n.get("outputsMetadata", [])]


def test_model_explorer_quantization_and_comparison_data(tmp_path):
    net, graph, x = _lenet_graph()
    q = ait.quantize(graph, x.numpy())
    qnodes = _nodes_by_id(explorer.graph_json(q.graph))
    bits = explorer.node_data(q.graph)["quantization bits"]["results"]
    expected = {str(i): {"value": n["attrs"]["nb_bits"]} for i, n in enumerate(q.graph.nodes())
                if "nb_bits" in n["attrs"]}
    assert bits == expected and len(expected) == sum(
        lay.op in ("Conv", "Gemm") for lay in q.layers)
    for i in expected:
        attrs = {a["key"]: a["value"] for a in qnodes[i]["attrs"]}
        node = q.graph.nodes()[int(i)]["attrs"]
        shift = node["shift"] if isinstance(node["shift"], tuple) else [node["shift"]]
        shifts = f"{min(shift)}" if min(shift) == max(shift) else f"{min(shift)}..{max(shift)}"
        assert attrs["quantized"] == f"int8 >>{shifts}" and "style" in qnodes[i]
    # locate's errors: every node compared, within tolerance, coloured green
    result = ait.locate(net, x)
    data = explorer.graph_json(graph, comparison=result)
    nodes = _nodes_by_id(data)
    compared = [nodes[str(i)] for i in range(len(graph.nodes()))]
    assert all({"key": "comparison", "value": "within tolerance"} in n["attrs"]
               for n in compared)
    assert {n["style"]["backgroundColor"] for n in compared} == \
        {viz.STATUS_STYLE["ok"][0]}
    # a mapping with one error: that node is the first divergence, in the data too
    bad = graph.nodes()[2]["outputs"][0]
    nd = explorer.node_data(graph, {bad: 0.5})["comparison"]
    assert nd["results"] == {"2": {"value": 3}}
    path = explorer.save(graph, tmp_path / "lenet.json", comparison={bad: 0.5})
    saved = _nodes_by_id(json.loads(Path(path).read_text()))
    assert {"key": "comparison", "value": "first divergence"} in saved["2"]["attrs"]
    assert saved["2"]["style"]["backgroundColor"] == viz.STATUS_STYLE["first"][0]
    with pytest.raises(ValueError, match=r"\.json"):
        explorer.save(graph, tmp_path / "lenet.svg")


def test_model_explorer_shows_a_model_testers_failure():
    """A ModelTester whose engine model differs from layer 2 on: the output
    node is the first divergence, in the node's attributes and the data."""
    from aidge_interop.testing import ModelTester

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 4)).eval()
    engine = ait.wrap(net, [(2, 16)]).eval()
    with torch.no_grad():
        dict(engine.named_parameters())["2.bias"].add_(1.0)
    tester = ModelTester(net, engine, "mlp", test_backward=False, epochs=1, benchmark=False)
    with pytest.raises(AssertionError, match="output"):
        tester.test_multiple_step((2, 16))
    graph = ait.Graph(engine._graph, engine.onnx_model)
    last = str(len(graph.nodes()) - 1)
    node = _nodes_by_id(explorer.graph_json(graph, comparison=tester))[last]
    attrs = {a["key"]: a["value"] for a in node["attrs"]}
    assert attrs["comparison"] == "first divergence" and "mismatched" in attrs["errors"]
    assert explorer.node_data(graph, tester)["comparison"]["results"] == {last: {"value": 3}}


def test_model_explorer_visualize_hands_over_the_json(monkeypatch):
    """visualize() gives Model Explorer a config with our JSON as a graphs://
    source and the node data, and calls visualize_from_config (replaced here:
    no server); without Model Explorer it says what to install."""
    _, graph, _ = _lenet_graph()
    monkeypatch.setitem(sys.modules, "model_explorer", None)
    with pytest.raises(ImportError, match=r"aidge_interop\[explorer\]"):
        explorer.visualize(graph, "LeNet")
    calls = []

    class Config:  # the part of model_explorer.config.ModelExplorerConfig we use
        def __init__(self):
            self.graphs_list, self.model_sources, self.node_data = [], [], []

        def add_node_data(self, name, node_data, model_name=None):
            self.node_data.append((name, node_data))

    fake = types.SimpleNamespace(config=Config, visualize_from_config=lambda conf, **kw:
                                 calls.append((conf, kw)))
    monkeypatch.setitem(sys.modules, "model_explorer", fake)
    explorer.visualize(graph, "LeNet", comparison={graph.output_names[0]: True}, port=8123)
    (conf, kw), = calls
    assert kw == {"port": 8123}
    assert json.loads(conf.graphs_list[0]) == explorer.graph_json(
        graph, "LeNet", {graph.output_names[0]: True})
    assert conf.model_sources == [{"url": "graphs://LeNet/0"}]
    assert [name for name, _ in conf.node_data] == ["comparison"]


# -- the example, from another working directory ----------------------------------------

def _script_cells(path: Path) -> list[str]:
    chunks = re.split(r"^# %%", path.read_text(), flags=re.M)[1:]
    return [c.strip("\n") for c in chunks if not c.startswith(" [markdown]")]


def test_the_notebook_has_the_script_code():
    nb = json.loads(NOTEBOOK.with_suffix(".ipynb").read_text())
    code = ["".join(c["source"]).strip("\n") for c in nb["cells"] if c["cell_type"] == "code"]
    assert code == _script_cells(NOTEBOOK.with_suffix(".py"))


def _check_run(text: str, folder: Path):
    """The notebook's printed checks, recomputed from what the run left."""
    scores = [(int(a), int(b)) for a, b in re.findall(r"SCORE : (\d+)/(\d+)", text)]
    assert len(scores) == 2 and all(n == 10 for _, n in scores)
    preds = re.findall(r"Ref vs Pred \(Conf\) : (\d+) vs (\d+)", text)
    assert len(preds) == 21  # float, int8, and the compiled program on the first sample
    for (score, _), rows in zip(scores, (preds[:10], preds[10:20])):
        assert score == sum(a == b for a, b in rows) and score >= 8
    assert preds[20] == preds[10]  # the compiled program predicts what the engine does
    assert "compiled program == engine on 10 samples: True" in text
    for name in ("lenet_digits.onnx", "imported_lenet.json", "removed_flatten.svg",
                 "export_lenet_int8/bin/model", "export_lenet_int8/forward.c"):
        assert (folder / name).is_file(), name
    ops = [n["label"] for n in json.loads((folder / "imported_lenet.json").read_text())[
        "graphs"][0]["nodes"]]
    assert "Flatten" in ops  # as imported; the recipes then removed it:
    assert "'FusedGemm'" in text and "'Flatten'" not in text


@needs_cc
def test_example_script_runs_from_another_directory(tmp_path):
    pytest.importorskip("sklearn")
    proc = subprocess.run([sys.executable, str(NOTEBOOK.with_suffix(".py"))], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_run(proc.stdout, tmp_path)
    # a second run reuses the model file and replaces the export
    proc = subprocess.run([sys.executable, str(NOTEBOOK.with_suffix(".py"))], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Removing existing export directory..." in proc.stdout
    _check_run(proc.stdout, tmp_path)


_RUN_NOTEBOOK = r"""
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shown = []
shell.display_pub.publish = lambda data, **kw: shown.append(sorted(data))
shell.displayhook.write_format_data = lambda data, md=None: shown.append(sorted(data))
nb = json.load(open(sys.argv[1]))
for cell in nb["cells"]:
    if cell["cell_type"] == "code":
        result = shell.run_cell("".join(cell["source"]))
        if not result.success:
            sys.exit(f"cell failed: {result.error_in_exec or result.error_before_exec!r}")
print("SHOWN", json.dumps(shown))
"""


@needs_cc
def test_example_notebook_runs_in_ipython_with_pictures_inline(tmp_path):
    """The .ipynb's cells in an IPython shell, from another directory: they
    run, and the pictures they end with are shown as SVG."""
    pytest.importorskip("sklearn")
    proc = subprocess.run([sys.executable, "-c", _RUN_NOTEBOOK,
                           str(NOTEBOOK.with_suffix(".ipynb"))], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_run(proc.stdout, tmp_path)
    shown = json.loads(proc.stdout.rsplit("SHOWN ", 1)[1])
    assert sum("image/svg+xml" in formats for formats in shown) >= 2  # imported, quantized
