"""The ``aidge-interop`` command: ``compare`` end to end (table, JSON, plot),
its model forms (example, module:callable, .py file, ONNX file), usage
errors (exit 2, one line, no traceback), exit 1 when an engine fails, the
progress line and the ``locate`` wiring."""
import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
import tomllib
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from aidge_interop import _util
from aidge_interop.compare import cli
from aidge_interop.compare import engines as backends
from aidge_interop.examples import EXAMPLES
from models import kws_model, lenet_model, perceptron_model, resnet_model

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--repeat", "2", "--warmup", "1"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh cache folder and working directory; sys.path, which loading a
    factory extends, comes back as it was."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(backends.CACHE_ENV, str(folder))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield folder
    backends.clear_runners()


def run_main(argv, capsys):
    """``cli.main(argv)`` in this process: (exit status, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own exits
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def engines(report):
    return {e["backend"]: e for e in report["engines"]}


def test_compare_end_to_end(tmp_path, cache):
    """The real command in a subprocess: table on stdout, nothing on stderr
    (not a terminal), the JSON report."""
    env = dict(os.environ, **{backends.CACHE_ENV: str(cache)})
    proc = subprocess.run(
        [sys.executable, "-m", "aidge_interop", "compare", "perceptron", "--train",
         "--repeat", "3", "--warmup", "1", "--json", "out.json"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0] == ("perceptron: input 1x16 float32, 1 thread, 1 warm-up + 3 timed runs; "
                        "errors against PyTorch")
    for name in ("PyTorch", "ONNX Runtime", "aidge_interop (C engine)", "Eclipse Aidge (CPU)"):
        assert any(line.startswith(name) for line in lines), name

    report = json.loads((tmp_path / "out.json").read_text())
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    assert (report["model"], report["kind"], report["input_shape"], report["dtype"]) == \
        ("perceptron", "example", [1, 16], "float32")
    assert (report["reference"], report["threads"], report["repeat"], report["warmup"]) == \
        ("torch", 1, 3, 1)
    assert report["versions"]["torch"] == torch.__version__
    by_key = engines(report)
    assert list(by_key) == list(backends.BACKENDS)
    for key, e in by_key.items():
        ok, reason = backends.available(key)
        if not ok:
            assert (e["status"], e["reason"]) == ("unavailable", reason)
            continue
        assert e["status"] == "ok", e
        lat = e["latency_ms"]
        assert len(e["samples_ms"]) == 3 and lat["min"] <= lat["median"] <= lat["max"]
        assert lat["min"] == min(e["samples_ms"]) and lat["max"] == max(e["samples_ms"])
        if key == "torch":
            assert e["error"] is None
        else:
            assert e["error"]["max_abs"] < 1e-6 and e["error"]["cosine"] > 0.999999
    torch_train, engine_train = by_key["torch"]["train"], by_key["aidge_interop"]["train"]
    assert len(torch_train["samples_ms"]) == 3 and torch_train["loss"] > 0
    assert engine_train["loss_abs_error"] < 1e-6
    assert engine_train["grad_error"]["max_abs"] < 1e-6
    assert engine_train["grad_error"]["cosine"] > 0.999999
    assert "train" not in by_key["onnxruntime"]  # inference engines
    assert report["train"] == {"loss": "mse against ones", "optimizer": "SGD", "lr": 0.01}


def test_compare_python_file_factory(tmp_path, capsys, request):
    request.addfinalizer(lambda: [sys.modules.pop(name, None)
                                  for name in ("helper", "aidge_interop_model_nets")])
    (tmp_path / "helper.py").write_text("WIDTH = 4\n")
    (tmp_path / "nets.py").write_text(textwrap.dedent("""
        import torch
        from helper import WIDTH  # a sibling module, as in a script

        def make():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, WIDTH), torch.nn.Tanh())
    """))
    code, out, err = run_main(["compare", str(tmp_path / "nets.py") + ":make", "--shape", "2,8",
                               "--backends", "aidge_interop", *FAST, "--json", "r.json"], capsys)
    assert (code, err) == (0, "")
    report = json.loads(Path("r.json").read_text())
    assert report["kind"] == "factory" and report["input_shape"] == [2, 8]
    by_key = engines(report)
    assert list(by_key) == ["torch", "aidge_interop"]  # the reference always runs, first
    assert by_key["aidge_interop"]["error"]["max_abs"] < 1e-6


def test_compare_importable_factory(capsys):
    code, out, err = run_main(["compare", "models.perceptron_model:perceptron", "--shape", "3x16",
                               "--backends", "torch,aidge_interop", *FAST, "--json", "r.json"],
                              capsys)
    assert (code, err) == (0, "")
    report = json.loads(Path("r.json").read_text())
    assert report["input_shape"] == [3, 16]
    assert engines(report)["aidge_interop"]["error"]["max_abs"] < 1e-6


def test_compare_onnx_file(tmp_path, capsys):
    path = backends.export_onnx(lenet_model.lenet(), (1, 1, 32, 32), cache_dir=tmp_path)
    code, out, err = run_main(["compare", str(path), "--backends", "aidge_interop", *FAST,
                               "--json", "r.json"], capsys)
    assert (code, err) == (0, "")
    report = json.loads(Path("r.json").read_text())
    assert (report["kind"], report["reference"], report["input_shape"]) == \
        ("onnx", "onnxruntime", [1, 1, 32, 32])
    by_key = engines(report)
    assert list(by_key) == ["onnxruntime", "aidge_interop"]
    assert by_key["aidge_interop"]["error"]["max_abs"] < 1e-6
    assert "errors against ONNX Runtime" in out

    for argv, message in (([str(path), "--backends", "torch"], "torch cannot run an ONNX file"),
                          ([str(path), "--train"], "--train needs a torch model"),
                          ([str(path), "--shape", "1,3,32,32"], "does not fit input 'input_0'")):
        code, out, err = run_main(["compare", *argv], capsys)
        assert code == 2 and message in err, err


@pytest.mark.parametrize("argv, message", [
    (["compare", "lenet", "--backends", "torch,tvm"], "unknown backend 'tvm' (known: torch,"),
    (["compare", "lenet", "--shape", "1,a"], "argument --shape: '1,a' is not a shape"),
    (["compare", "lenet", "--shape", "1,0,32"], "'1,0,32' is not a shape"),
    (["compare", "lenet", "--repeat", "0"], "argument --repeat: '0' is not an integer >= 1"),
    (["compare", "lenet", "--warmup", "-1"], "'-1' is not an integer >= 0"),
    (["compare", "missing.onnx"], "no ONNX file at 'missing.onnx'"),
    (["compare", "missing.py:make", "--shape", "1,2"], "no Python file at 'missing.py'"),
    (["compare", "no_such_module_xyz:make", "--shape", "1,2"],
     "cannot load 'no_such_module_xyz:make': ModuleNotFoundError"),
    (["compare", "models.perceptron_model:nothing", "--shape", "1,16"],
     "cannot load 'models.perceptron_model:nothing': AttributeError"),
    (["compare", "models.perceptron_model:perceptron"], "give the input shape"),
    (["compare", "resnet9"], "unknown model 'resnet9': give a built-in example (perceptron,"),
    (["compare", "lenet", "--shape", "1,3,32,32"], "'lenet' does not take an input of shape "
                                                   "1,3,32,32: RuntimeError"),
    (["compare", "lenet", "--json", "no/such/dir/out.json"], "--json 'no/such/dir/out.json': "
                                                             "folder"),
    (["compare"], "the following arguments are required: model"),
    ([], "the following arguments are required: COMMAND"),
    (["bench"], "invalid choice: 'bench'"),
])
def test_usage_errors_exit_2_on_one_line(argv, message, capsys):
    code, out, err = run_main(argv, capsys)
    assert code == 2
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("aidge-interop") and "error: " in err and message in err, err


def test_usage_error_from_the_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "aidge_interop", "compare", "missing.onnx"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("python -m aidge_interop compare: error: no ONNX file at "
                           "'missing.onnx'\n")


def test_help_and_console_script(capsys):
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0 and "compare" in out and "locate" in out
    code, out, _ = run_main(["compare", "--help"], capsys)
    assert code == 0 and "--train" in out and "module:callable" in out
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"aidge-interop": "aidge_interop.compare.cli:main"}


def test_unavailable_or_failing_engine_exits_1(monkeypatch, capsys):
    real_available, real_get_runner = backends.available, backends.get_runner

    def available(key):
        return (False, "ModuleNotFoundError: made unavailable by the test") \
            if key == "onnxruntime" else real_available(key)

    def get_runner(key, model, shape, **kwargs):
        if key == "aidge_interop":
            raise NotImplementedError("engine: operator 'Frobnicate' is not supported\nmore")
        return real_get_runner(key, model, shape, **kwargs)

    monkeypatch.setattr(backends, "available", available)
    # unavailable but not asked for by name: reported, not a failure
    code, out, err = run_main(["compare", "perceptron", "--backends", "torch", *FAST], capsys)
    assert code == 0
    code, out, err = run_main(["compare", "perceptron", "--backends", "onnxruntime", *FAST,
                               "--json", "r.json"], capsys)
    assert code == 1
    assert "ONNX Runtime unavailable: ModuleNotFoundError: made unavailable by the test" in out
    assert engines(json.loads(Path("r.json").read_text()))["onnxruntime"]["status"] == \
        "unavailable"

    monkeypatch.setattr(backends, "get_runner", get_runner)
    code, out, err = run_main(["compare", "perceptron", "--backends", "aidge_interop", *FAST,
                               "--json", "r.json"], capsys)
    assert code == 1 and err == ""
    e = engines(json.loads(Path("r.json").read_text()))["aidge_interop"]
    assert (e["status"], e["reason"]) == \
        ("failed", "NotImplementedError: engine: operator 'Frobnicate' is not supported")
    assert "aidge_interop (C engine) failed: NotImplementedError" in out


def _aidge_or_skip():
    ok, reason = backends.available("aidge")
    if not ok:
        pytest.skip(f"aidge unavailable: {reason}")


def test_compare_trains_on_eclipse_aidge(capsys):
    """Eclipse Aidge's training row (AidgeModel + AidgeSGD: Aidge's forward,
    backward and SGD) against torch's first step; ds_cnn runs on Aidge (its
    model is constant-folded first)."""
    _aidge_or_skip()
    pytest.importorskip("aidge_learning", reason="Eclipse Aidge trains with aidge_learning")
    import aidge_core

    level = aidge_core.Log.get_console_level()
    code, out, err = run_main(["compare", "lenet", "--train", "--backends", "aidge", *FAST,
                               "--json", "r.json"], capsys)
    assert code == 0, out
    # quiet while it ran (Fatal), then as it was: the process's later Aidge
    # errors are shown and caught again
    assert aidge_core.Log.get_console_level() == level
    report = json.loads(Path("r.json").read_text())
    assert "aidge_learning" in report["versions"]
    train = engines(report)["aidge"]["train"]
    assert len(train["samples_ms"]) == 2 and train["loss"] > 0
    # float32, same weights: measured 0 (loss) and 4e-8 (gradients)
    assert train["loss_abs_error"] < 1e-6
    assert train["grad_error"]["max_abs"] < 1e-6 and train["grad_error"]["cosine"] > 0.999999
    assert any(line.startswith("Eclipse Aidge (CPU)") for line in
               out.split("training step")[1].splitlines())
    code, out, err = run_main(["compare", "ds_cnn", "--backends", "aidge", *FAST,
                               "--json", "r.json"], capsys)
    e = engines(json.loads(Path("r.json").read_text()))["aidge"]
    assert code == 0 and e["status"] == "ok", e
    assert e["error"]["max_abs"] < 1e-5 and e["error"]["cosine"] > 0.999999


def test_aidge_training_row_without_aidge_learning(monkeypatch, capsys):
    _aidge_or_skip()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aidge_learning" else real(name, *a))
    code, out, err = run_main(["compare", "perceptron", "--train", "--backends", "aidge", *FAST,
                               "--json", "r.json"], capsys)
    assert code == 0  # not a failure: the inference row ran
    e = engines(json.loads(Path("r.json").read_text()))["aidge"]
    assert e["status"] == "ok" and e["train"]["status"] == "unavailable"
    assert "pip install aidge-learning==0.10.1" in e["train"]["reason"]
    assert "Eclipse Aidge (CPU) training unavailable: Eclipse Aidge trains with " \
           "aidge_learning" in out


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_only_on_a_terminal():
    target = cli.load_model("perceptron")
    terminal, pipe = _Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        cli.compare(target, ["torch", "aidge_interop"], repeat=2, warmup=1,
                    progress=_util.Progress(stream))
    assert pipe.getvalue() == ""
    text = terminal.getvalue()
    assert "\r\x1b[KPyTorch: preparing" in text
    assert "\r\x1b[Kaidge_interop (C engine): preparing" in text
    assert text.endswith("\r\x1b[K")  # the line is cleared before the table


def test_plot_writes_an_image(capsys):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    code, out, err = run_main(["compare", "perceptron", "--train", *FAST, "--plot", "p.png"],
                              capsys)
    assert code == 0, err
    assert Path("p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in Path.cwd().iterdir() if p.name.endswith(".tmp")]
    code, out, err = run_main(["compare", "perceptron", "--plot", "p.xyz"], capsys)
    assert code == 2 and "unknown image format 'xyz'" in err


def test_plot_without_matplotlib_says_what_to_install(monkeypatch, capsys):
    for name in ("matplotlib", "matplotlib.backend_bases"):
        monkeypatch.setitem(sys.modules, name, None)
    code, out, err = run_main(["compare", "perceptron", "--plot", "p.png"], capsys)
    assert code == 2 and out == ""
    assert err == ("aidge-interop compare: error: --plot needs matplotlib, which is not "
                   "installed: pip install matplotlib (or pip install 'aidge_interop[plot]')\n")


def test_locate_is_wired_lazily(monkeypatch, capsys):
    seen = {}

    def run(args):
        seen["model"] = args.model
        return 3

    fake = types.ModuleType("aidge_interop.compare.locate")
    fake.add_arguments = lambda parser: parser.add_argument("model")
    fake.run = run
    monkeypatch.setitem(sys.modules, "aidge_interop.compare.locate", fake)
    code, _, _ = run_main(["locate", "lenet"], capsys)
    assert (code, seen) == (3, {"model": "lenet"})
    monkeypatch.delitem(sys.modules, "aidge_interop.compare.locate")
    # the other commands never import it
    run_main(["compare", "--help"], capsys)
    assert "aidge_interop.compare.locate" not in sys.modules


def test_output_errors():
    e = cli.output_errors(np.array([1.0, 2.0, 3.5], np.float32), np.array([1.0, 2.0, 3.0]))
    assert e["max_abs"] == 0.5 and e["max_rel"] == pytest.approx(0.5 / 3)
    assert e["cosine"] == pytest.approx(15.5 / np.sqrt(17.25 * 14))
    zeros = cli.output_errors(np.zeros(3), np.zeros(3))
    assert zeros == {"max_abs": 0.0, "max_rel": None, "cosine": 1.0}
    with pytest.raises(ValueError, match=r"output shape \(2,\) differs from the reference's"):
        cli.output_errors(np.zeros(2), np.zeros(3))
    assert _util.finite({"a": [float("nan"), 1.5, float("-inf")]}) == {"a": [None, 1.5, None]}


@pytest.mark.parametrize("name, suite_factory", [
    ("perceptron", perceptron_model.perceptron), ("lenet", lenet_model.lenet),
    ("ds_cnn", kws_model.ds_cnn), ("resnet8", resnet_model.resnet8)])
def test_examples_are_the_suite_models(name, suite_factory):
    factory, shape, _ = EXAMPLES[name]
    example, suite = factory(seed=3).eval(), suite_factory(seed=3).eval()
    a, b = example.state_dict(), suite.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(shape)
    with torch.no_grad():
        assert torch.equal(example(x), suite(x))
