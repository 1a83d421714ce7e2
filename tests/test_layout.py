"""The package layout (issue 43): the older module paths are the new modules
themselves, the entry points resolve, and the import graph is a tree (no
module imports, even lazily, one that imports it back) whose modules import
only from their own layer and the ones below (aidge_interop/__init__.py)."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import aidge_interop

PACKAGE = Path(aidge_interop.__file__).resolve().parent
ROOT = Path(__file__).resolve().parent.parent

# older path -> the module it names now
MOVED = {
    "aidge_interop.backends": "aidge_interop.compare.engines",
    "aidge_interop.backend": "aidge_interop.onnx.backend",
    "aidge_interop.cli": "aidge_interop.compare.cli",
    "aidge_interop.analyze": "aidge_interop.testing.analyze",
    "aidge_interop.export": "aidge_interop.quant.export",
    "aidge_interop.quantization": "aidge_interop.quant.quantization",
    "aidge_interop.layers": "aidge_interop.quant.layers",
    "aidge_interop.divergence": "aidge_interop.compare.locate",
    "aidge_interop.onnx_import": "aidge_interop.onnx.importer",
    "aidge_interop.wrapping": "aidge_interop.bridge.wrapping",
    "aidge_interop.optim": "aidge_interop.bridge.optim",
}
# the part (first name under aidge_interop) -> its layer; the older paths (aliases), the
# package and __main__ are above them all
LAYERS = {"_util": 0, "tensor_converter": 1, "graph": 1, "recipes": 1, "profiling": 1,
          "visualize": 1, "explorer": 1, "examples": 1, "onnx": 2, "bridge": 3, "compare": 4,
          "quant": 4, "testing": 5}
UNMOVED = ["aidge_interop.tensor_converter", "aidge_interop.graph", "aidge_interop.recipes",
           "aidge_interop.profiling", "aidge_interop.visualize", "aidge_interop.explorer",
           "aidge_interop.examples", "aidge_interop.testing", "aidge_interop.testing.plugin",
           "aidge_interop.testing.operators", "aidge_interop.testing.model_tester"]


@pytest.mark.parametrize("old", MOVED)
def test_older_path_is_the_new_module(old):
    new = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new
    assert sys.modules[old] is new
    parent, _, name = old.rpartition(".")
    assert getattr(sys.modules[parent], name) is new  # `from aidge_interop import backends`


def test_patching_the_older_path_patches_the_module(monkeypatch):
    import aidge_interop.backends
    from aidge_interop.compare import engines

    monkeypatch.setattr(aidge_interop.backends, "THREADS", 7)
    assert engines.THREADS == 7


@pytest.mark.parametrize("name", UNMOVED)
def test_unmoved_paths_import(name):
    assert importlib.import_module(name).__name__ == name


@pytest.mark.parametrize("name", aidge_interop.__all__)
def test_public_names_resolve(name):
    assert getattr(aidge_interop, name) is not None


def _entry_point(spec: str):
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def test_entry_points_resolve():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert callable(_entry_point(project["scripts"]["aidge-interop"]))
    plugin = _entry_point(project["entry-points"]["pytest11"]["aidge_interop"])
    assert plugin.__name__ == "aidge_interop.testing.plugin"


@pytest.mark.parametrize("argv, usage", [
    (["-m", "aidge_interop.analyze", "--help"], "usage: python -m aidge_interop.analyze"),
    (["-m", "aidge_interop.cli", "--help"], "usage: aidge-interop"),
    (["-m", "aidge_interop", "--help"], "usage: python -m aidge_interop"),
])
def test_run_as_module(argv, usage, tmp_path):
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(usage)


# -- the import graph -------------------------------------------------------------------

def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("aidge_interop",) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported(name: str, path: Path, node) -> list[str]:
    """The dotted names an import statement of module ``name`` reaches."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        anchor = package[:len(package) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, anywhere in its code (lazy
    imports included). Importing the package root is left out: every module
    does, when it is imported."""
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(name, path, node):
                while target not in modules and "." in target:  # a name in a module
                    target = target.rpartition(".")[0]
                if target in modules and target not in (name, "aidge_interop"):
                    graph[name].add(target)
    return graph


def _a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (a depth-first search meeting a module
    it is inside of), or None."""
    state = {}  # name -> "open" while on the search path, "done" after

    def visit(name, path):
        state[name] = "open"
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target, path)
                if found:
                    return found
        path.pop()
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name, [])
            if found:
                return found
    return None


def test_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _a_circle(graph) == ["a", "b", "c", "a"]
    assert _a_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_import_graph_has_no_circle():
    graph = _import_graph()
    assert graph["aidge_interop.compare.cli"] >= {"aidge_interop.compare.engines",
                                                   "aidge_interop.compare.locate"}
    circle = _a_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], len(LAYERS)) if len(parts) > 1 else len(LAYERS)


def test_modules_import_only_their_layer_and_lower_ones():
    graph = _import_graph()
    assert set(LAYERS) <= {name.split(".")[1] for name in graph if "." in name}
    upward = [f"{m} -> {t}" for m, targets in sorted(graph.items()) for t in sorted(targets)
              if _layer(t) > _layer(m)]
    assert not upward, "imports from a higher layer: " + ", ".join(upward)
