"""Pictures of the graph (aidge_interop.visualize, Graph.visualize,
``aidge-interop show``): valid SVG/HTML holding every node, a layout whose
boxes never overlap and whose edges go top to bottom, recipes, quantization
and comparisons shown, and one end-to-end render in a headless browser."""
import itertools
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

import aidge_interop
from aidge_interop import _C, load_onnx, recipes
from aidge_interop.compare.cli import main
from aidge_interop.compare.locate import Check, torch_graph
from aidge_interop.visualize import layout, render, value_errors
from graph_builders import residual_chain
from models import SAMPLE_SHAPES, lenet_model, perceptron_model

SVG = "{http://www.w3.org/2000/svg}"
SUITE = {k: (f, (1,) + s) for k, (f, s) in SAMPLE_SHAPES.items()}


def _graph(name, fused=False):
    factory, shape = SUITE[name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    graph, _, _ = torch_graph(factory().eval(), [x], "test")
    graph.forward(x.numpy())
    if fused:
        for r in ("constant_fold", "fuse_batchnorm", "remove_flatten", "fuse_activation"):
            recipes.RECIPES[r](graph)
    return graph


def _node_groups(root):
    return [g for g in root.iter(f"{SVG}g") if "node" in g.get("class", "").split()]


def _check_svg(root, graph):
    """Every node, input and output has a box with its name in the tooltip."""
    assert root.tag == f"{SVG}svg"
    groups = _node_groups(root)
    assert len(groups) == len(graph.nodes()) + len(graph.input_names) + len(graph.output_names)
    tips = [g.find(f"{SVG}title").text for g in groups]
    for n in graph.nodes():
        assert any(f"node '{n['name']}'" in t for t in tips), n["name"]
    for g in groups:
        assert g.find(f"{SVG}rect").get("width") and g.findall(f"{SVG}text")
    return groups


def _check_layout(lay, edges):
    boxes = list(lay.boxes.values())
    for a, b in itertools.combinations(boxes, 2):
        apart = (a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y)
        assert apart, f"{a} overlaps {b}"
    for s, t, pts in lay.routes:
        src, dst = lay.boxes[s], lay.boxes[t]
        assert src.layer < dst.layer and src.y + src.h < dst.y  # top to bottom
        assert all(y0 <= y1 for (_, y0), (_, y1) in zip(pts, pts[1:]))
    assert len(lay.routes) == len(edges)


@pytest.mark.parametrize("fused", [False, True], ids=["imported", "recipes"])
@pytest.mark.parametrize("name", list(SUITE))
def test_suite_pictures(name, fused, tmp_path):
    graph = _graph(name, fused)
    path = graph.visualize(tmp_path / f"{name}.svg", title=f"{name} <&> test")
    root = ET.parse(path).getroot()
    groups = _check_svg(root, graph)
    text = open(path, encoding="utf-8").read()
    assert f"{name} &lt;&amp;&gt; test" in text
    shapes = {f"{'x'.join(map(str, v['meta'][1])) or 'scalar'} {v['meta'][0]}"
              for v in graph._g.values() if v["kind"] == "activation" and v["meta"]}
    assert all(s in text for s in shapes)  # output shapes are shown
    params = graph.parameters()
    assert all(f"{p}: {'x'.join(map(str, a.shape))}" in text for p, a in params.items()
               if len(p) < 30)
    if fused:
        assert "recipes applied: constant_fold" in text
        assert any("recipes:" in g.find(f"{SVG}title").text for g in groups) or name in (
            "perceptron",)
    _, lay = render(graph)
    edges = [(s, t) for s, t, _ in lay.routes]
    _check_layout(lay, edges)


def test_fused_nodes_say_what_they_fused(tmp_path):
    graph = _graph("lenet", fused=True)
    text = open(graph.visualize(tmp_path / "l.svg"), encoding="utf-8").read()
    assert "FusedConv = Conv + Relu" in text and "FusedGemm = Flatten + Gemm + Relu" in text
    assert "fuse_activation: Conv &#x27;/sequence/sequence.0/Conv&#x27;" in text or \
        "fuse_activation: Conv '/sequence/sequence.0/Conv'" in text


def test_html_page_is_self_contained(tmp_path):
    graph = _graph("resnet", fused=True)
    path = graph.visualize(tmp_path / "r.html", title="ResNet-8")

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.refs = [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.refs += [v for k, v in attrs if k in ("src", "href") and v]

    text = open(path, encoding="utf-8").read()
    parser = Tags()
    parser.feed(text)
    assert parser.tags[:2] == ["html", "head"] and "svg" in parser.tags
    assert parser.refs == [] and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    svg = text[text.index("<svg"):text.index("</svg>") + len("</svg>")]
    _check_svg(ET.fromstring(svg), graph)


def test_300_node_graph_layout(tmp_path):
    graph = load_onnx(residual_chain(60))
    graph.forward(np.zeros((1, 4, 6, 6), np.float32))
    assert len(graph.nodes()) >= 300
    svg, lay = render(graph, title="300 nodes")
    _check_svg(ET.fromstring(svg), graph)
    edges = [(s, t) for s, t, _ in lay.routes]
    _check_layout(lay, edges)
    assert any(b.dummy for b in lay.boxes.values())  # the long skips got dummy points
    assert len(lay.layers) > 60  # layered, not flattened


def test_layout_orders_to_avoid_crossings():
    """a feeds d, b feeds c: barycentre ordering puts c under b and d under a."""
    sizes = {k: (40, 20) for k in "abcd"}
    lay = layout(sizes, [("a", "d"), ("b", "c")], order=list("abcd"))
    assert lay.layers[0] == ["a", "b"] and lay.layers[1] == ["d", "c"]
    xs = {k: b.x for k, b in lay.boxes.items()}
    assert xs["a"] == xs["d"] and xs["b"] == xs["c"]  # straight down


def test_quantized_nodes_show_bits_and_shift(tmp_path):
    """Nodes with integer nb_bits/shift attributes (the lead's quantized graphs,
    domain aidge_interop.quant) are drawn with a badge; the graph need not be
    runnable to be drawn."""
    g = _C.Graph()
    g.add_input("x", "int8")
    g.add_initializer("w", aidge_interop.Tensor(np.ones((4, 3), np.int8)), "const")
    g.add_node("fc", "QGemm", ["x", "w"], ["y"], {"nb_bits": 8, "shift": 7, "multiplier": 3},
               domain="aidge_interop.quant")
    g.add_node("rq", "Requantize", ["y"], ["z"], {"nb_bits": 4, "shift": 2},
               domain="aidge_interop.quant")
    g.set_outputs(["z"])
    graph = aidge_interop.Graph(g)
    text = open(graph.visualize(tmp_path / "q.svg"), encoding="utf-8").read()
    assert ">int8 &gt;&gt;7<" in text and ">int4 &gt;&gt;2<" in text
    assert "quantized: nb_bits=8, shift=7, multiplier=3" in text
    assert "cat-quant" in text
    _check_svg(ET.fromstring(text), graph)


def _statuses(root):
    return {g.get("data-name"): g.get("class").split()[-1] for g in _node_groups(root)}


def test_comparison_colours_from_a_mapping(tmp_path):
    graph = _graph("lenet")
    nodes = graph.nodes()
    good = Check("output", "a", (1,), 1, 0)
    bad = Check("output", "b", (1, 120), 120, 4, 1.6e-3, (0, 13), 2e-2, (0, 28))
    errors = {nodes[0]["outputs"][0]: good, nodes[7]["outputs"][0]: bad,
              nodes[9]["outputs"][0]: bad}
    root = ET.parse(graph.visualize(tmp_path / "c.svg", comparison=errors)).getroot()
    status = _statuses(root)
    label = "{} node '{}'"
    assert status[label.format("Conv", nodes[0]["name"])] == "status-ok"
    assert status[label.format("Gemm", nodes[7]["name"])] == "status-first"
    assert status[label.format("Gemm", nodes[9]["name"])] == "status-over"
    assert status[label.format("Relu", nodes[1]["name"])] == "status-unchecked"
    first = next(g for g in _node_groups(root) if g.get("data-name").endswith(
        f"'{nodes[7]['name']}'"))
    tip = first.find(f"{SVG}title").text
    assert "first divergence" in tip and "4 / 120 mismatched" in tip and "0.0016" in tip


def test_comparison_from_locate(tmp_path):
    net = lenet_model.lenet().eval()
    x = torch.randn(1, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    result = aidge_interop.locate(net, x, reference="onnx")
    graph, _, _ = torch_graph(net, [x], "test")
    graph.forward(x.numpy())
    errors = value_errors(result, graph)
    assert set(errors) == {o for n in graph.nodes() for o in n["outputs"]}
    assert result.first is None and {e.status for e in errors.values()} == {"ok"}
    recipes.fuse_activation(graph)  # value names survive the recipes
    root = ET.parse(graph.visualize(tmp_path / "l.svg", comparison=result)).getroot()
    assert {s for k, s in _statuses(root).items() if " node " in k} == {"status-ok"}


def test_comparison_from_model_tester(tmp_path):
    from aidge_interop.testing import ModelTester

    torch.manual_seed(0)
    net = perceptron_model.perceptron().eval()
    engine = aidge_interop.wrap(net, [(2, 16)]).eval()
    with torch.no_grad():  # the engine model computes something else from layer 2 on
        dict(engine.named_parameters())["sequence.2.bias"].add_(1.0)
    tester = ModelTester(net, engine, "perceptron", test_backward=False, epochs=1,
                         benchmark=False)
    with pytest.raises(AssertionError, match="output"):
        tester.test_multiple_step((2, 16))
    assert [c.what for c in tester.checks] == ["output"] and not tester.checks[0].ok
    graph = _graph("perceptron")
    errors = value_errors(tester, graph)
    assert list(errors) == ["output_0"] and errors["output_0"].status == "first"
    root = ET.parse(graph.visualize(tmp_path / "t.svg", comparison=tester)).getroot()
    assert _statuses(root)[f"Gemm node '{graph.nodes()[-1]['name']}'"] == "status-first"


def test_visualize_arguments(tmp_path):
    graph = _graph("perceptron")
    with pytest.raises(ValueError, match=r"\.svg or \.html, not '\.png'"):
        graph.visualize(tmp_path / "g.png")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        graph.visualize(tmp_path / "missing" / "g.svg")
    with pytest.raises(TypeError, match="comparison: expected"):
        graph.visualize(tmp_path / "g.svg", comparison=[1, 2])
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_picture_without_a_path_shows_inline(tmp_path):
    """visualize() without a path returns the picture, which Jupyter shows
    (``_repr_svg_``); so does the Graph itself. The picture is taken when
    asked: a recipe after it does not change it, and save writes it."""
    from IPython.core.formatters import DisplayFormatter

    graph = _graph("lenet")
    picture = graph.visualize(title="Imported LeNet")
    svg, _ = render(graph, title="Imported LeNet")
    assert picture == svg and DisplayFormatter().format(picture)[0]["image/svg+xml"] == svg
    assert DisplayFormatter().format(graph)[0]["image/svg+xml"] == render(graph)[0]
    _check_svg(ET.fromstring(picture), graph)
    assert not list(tmp_path.iterdir())  # nothing written
    recipes.remove_flatten(graph)
    assert render(graph, title="Imported LeNet")[0] != picture
    path = picture.save(tmp_path / "imported.html")
    page = (tmp_path / "imported.html").read_text()
    assert path == str(tmp_path / "imported.html") and svg in page
    assert page.startswith("<!DOCTYPE html>") and "<title>Imported LeNet</title>" in page
    with pytest.raises(ValueError, match=r"\.svg or \.html"):
        picture.save(tmp_path / "imported.png")


def test_show_command(tmp_path, capsys):
    out = tmp_path / "p.svg"
    assert main(["show", "perceptron", "--recipes", "all", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "fuse_activation: 1 change(s)" in stdout and f"wrote {out}: 2 nodes" in stdout
    root = ET.parse(out).getroot()
    assert len(_node_groups(root)) == 4
    assert main(["show", "lenet", "--locate", "--out", str(tmp_path / "l.html")]) == 0
    assert "status-ok" in (tmp_path / "l.html").read_text()
    assert main(["show", "lenet", "--out", str(tmp_path / "l.png")]) == 2
    assert "the picture is .svg or .html" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["show", "lenet", "--recipes", "fuse_everything", "--out", str(out)])
    assert exc.value.code == 2


def _browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(_browser() is None, reason="no headless browser: none of chromium, "
                    "chromium-browser, google-chrome is on PATH")
def test_renders_in_a_headless_browser(tmp_path):
    graph = _graph("resnet", fused=True)
    page = graph.visualize(tmp_path / "r.html", title="ResNet-8 fused")
    shot = tmp_path / "r.png"
    common = [_browser(), "--headless", "--disable-gpu", "--no-sandbox",
              f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(common + ["--dump-dom", f"file://{page}"], capture_output=True,
                         text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    assert "FusedConv = Conv + Relu" in dom.stdout and "<svg" in dom.stdout
    subprocess.run(common + [f"--screenshot={shot}", "--window-size=900,1400",
                             f"file://{page}"], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
