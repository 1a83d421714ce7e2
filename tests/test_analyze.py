"""aidge_interop.testing.analyze on real pytest output.

A synthetic test file with passing, failing (ModelTester's messages),
xfail, error and crashing tests runs under pytest in a subprocess, verbose
and quiet (and under pytest-xdist); the analyser must sort what it reads.
Benchmark logs with known ratios check the ranking.
"""
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aidge_interop.testing.analyze import (benchmark_summary, categorize, load_benchmarks, main,
                                   parse_pytest_output)
from aidge_interop.testing import ModelTester

TESTS_DIR = Path(__file__).resolve().parent

SYNTHETIC = '''
import pytest

OUTPUT = """LeNet_eval, epoch 2/5, output: Tensor-likes are not close!

Mismatched elements: 3 / 40 (7.5%)
Greatest absolute difference: 0.5 at index (0, 3) (up to 0.0001 allowed)
Greatest relative difference: 0.25 at index (0, 3) (up to 0.001 allowed)"""
GRADIENT = OUTPUT.replace("LeNet_eval", "LeNet_train").replace(
    "output", "gradient of parameter 'sequence.0.weight'")
LOSS = """LeNet_train, epoch 1/5, loss: Scalars are not close!

Expected 0.5 but got 0.75.
Absolute difference: 0.25 (up to 0.0001 allowed)
Relative difference: 0.5 (up to 0.001 allowed)"""
SLOW = ("Conv2D_big: forward is 12.50x slower than torch (engine 2.500 ms, torch 0.200 ms, "
        "mean of 8 epochs; at most 10.0x allowed)")
SHAPE = ("ReLU_rank_3, epoch 1/10, output: The values for attribute 'shape' do not match: "
         "torch.Size([2, 3]) != torch.Size([3, 2]).")


@pytest.fixture
def engine_graph():
    raise RuntimeError("engine: node 'Conv_0' (Conv): input 0 has 3 channels, the weight 8")


@pytest.mark.parametrize("case", ["Conv2D_attr_k3", "ReLU_basic"])
def test_passes(case):
    pass


def test_outputs_differ():
    raise AssertionError(OUTPUT)


def test_gradient_differs():
    raise AssertionError(GRADIENT)


def test_loss_differs():
    raise AssertionError(LOSS)


def test_too_slow():
    raise AssertionError(SLOW)


def test_shape_mismatch():
    raise AssertionError(SHAPE)


def test_unsupported_attribute():
    raise ValueError("configs/conv2d.json: test_configurations.attr.x.attributes: case "
                     "'Conv2D_attr_x': attribute 'rounding_mode' is not supported by "
                     "operator 'Conv2D' (add it to supported_attrs)")


def test_missing_operator():
    raise NotImplementedError("wrap(Net): operator Celu (node '/Celu', opset 20) is not "
                              "supported by the engine")


def test_plain_assert():
    assert 1 + 1 == 3


@pytest.mark.xfail(reason="ShiftMax backward is not implemented")
def test_known_gap():
    raise NotImplementedError("ShiftMax backward")


@pytest.mark.xfail(reason="fixed since", strict=True)
def test_strict_xpass():
    pass


def test_setup_error(engine_graph):
    pass


def test_skipped():
    pytest.skip("needs CUDA")
'''

CRASH = '''
import faulthandler


def test_before():
    pass


def test_engine_crash():
    faulthandler._sigsegv()


def test_after():
    pass
'''

F = "test_synthetic.py::"
# nodeid -> (outcome, category); "" for no category
EXPECTED = {
    F + "test_passes[Conv2D_attr_k3]": ("passed", ""),
    F + "test_passes[ReLU_basic]": ("passed", ""),
    F + "test_outputs_differ": ("failed", "outputs_differ"),
    F + "test_gradient_differs": ("failed", "gradients_differ"),
    F + "test_loss_differs": ("failed", "loss_differs"),
    F + "test_too_slow": ("failed", "performance_regression"),
    F + "test_shape_mismatch": ("failed", "shape_mismatch (test strategy)"),
    F + "test_unsupported_attribute": ("failed", "unsupported_attribute (test strategy)"),
    F + "test_missing_operator": ("failed", "not_implemented"),
    F + "test_plain_assert": ("failed", "assertion_failed"),
    F + "test_known_gap": ("xfailed", ""),
    F + "test_strict_xpass": ("failed", "xpass (test strategy)"),
    F + "test_setup_error": ("error", "runtime_error"),
    F + "test_skipped": ("skipped", ""),
}
COUNTS = {"passed": 2, "failed": 9, "error": 1, "xfailed": 1, "skipped": 1}


def _failures(run) -> dict[str, str]:
    return {n: t.category for n, t in run.tests.items() if t.outcome in ("failed", "error")}


def run_pytest(directory: Path, *args: str) -> str:
    """pytest's console output (stdout and stderr, like ``2>&1 | tee``) on a
    160-column terminal, without third-party plugins and whatever options the
    caller's run has."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "NO_COLOR")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["COLUMNS"] = "160"  # pytest cuts reasons and summaries at the terminal width
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=directory, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    return proc.stdout


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("synthetic")
    (d / "test_synthetic.py").write_text(SYNTHETIC)
    (d / "test_crash.py").write_text(CRASH)
    return d


@pytest.fixture(scope="module")
def verbose_output(synthetic_dir) -> str:
    return run_pytest(synthetic_dir, "-v", "--color=yes", "test_synthetic.py")


@pytest.fixture(scope="module")
def quiet_output(synthetic_dir) -> str:
    return run_pytest(synthetic_dir, "-q", "test_synthetic.py")


# -- parsing --------------------------------------------------------------------

def test_verbose_output_gives_every_outcome_and_category(verbose_output):
    assert "\x1b[" in verbose_output  # coloured, as saved from a terminal
    run = parse_pytest_output(verbose_output)
    assert run.complete and not run.crash
    assert {n: (t.outcome, t.category) for n, t in run.tests.items()} == EXPECTED
    assert run.counts == COUNTS
    assert run.tests[F + "test_known_gap"].reason == "ShiftMax backward is not implemented"
    assert run.tests[F + "test_skipped"].reason == "needs CUDA"


def test_quiet_output_gives_the_same_failures(verbose_output, quiet_output):
    assert "PASSED" not in quiet_output
    quiet, verbose = parse_pytest_output(quiet_output), parse_pytest_output(verbose_output)
    assert _failures(quiet) == _failures(verbose) == {
        n: c for n, (o, c) in EXPECTED.items() if o in ("failed", "error")}
    assert quiet.counts == COUNTS


def test_messages_are_read_whole(quiet_output):
    run = parse_pytest_output(quiet_output)
    outputs = run.tests[F + "test_outputs_differ"]
    assert outputs.exc_type == "AssertionError"
    assert outputs.ae_msg.splitlines() == [
        "LeNet_eval, epoch 2/5, output: Tensor-likes are not close!", "",
        "Mismatched elements: 3 / 40 (7.5%)",
        "Greatest absolute difference: 0.5 at index (0, 3) (up to 0.0001 allowed)",
        "Greatest relative difference: 0.25 at index (0, 3) (up to 0.001 allowed)"]
    setup = run.tests[F + "test_setup_error"]
    assert setup.rt_msg == ("RuntimeError: engine: node 'Conv_0' (Conv): input 0 has 3 "
                            "channels, the weight 8")
    assert run.tests[F + "test_plain_assert"].ae_msg.startswith("assert (1 + 1) == 3")


def test_crash_names_the_running_test(synthetic_dir):
    verbose = parse_pytest_output(run_pytest(synthetic_dir, "-v", "test_crash.py"))
    assert not verbose.complete
    assert verbose.crash == "Fatal Python error: Segmentation fault"
    assert {n: (t.outcome, t.category) for n, t in verbose.tests.items()} == {
        "test_crash.py::test_before": ("passed", ""),
        "test_crash.py::test_engine_crash": ("failed", "crash"),
    }
    quiet = parse_pytest_output(run_pytest(synthetic_dir, "-q", "test_crash.py"))
    # -q prints no rootdir: the test is named by the path Python reports
    assert _failures(quiet) == {
        str(synthetic_dir / "test_crash.py") + "::test_engine_crash": "crash"}


def test_xdist_output_and_worker_crash(synthetic_dir):
    pytest.importorskip("xdist")
    # no faulthandler: the crashing worker's traceback goes to the same pipe
    # as the controller's report lines and, on a loaded machine, cut one of
    # them ("[gw1] [ 88%] SKIPPED ..." garbled: 1 run in 4 under load); the
    # crash is named by xdist's own "worker 'gw0' crashed" lines
    out = run_pytest(synthetic_dir, "-p", "xdist.plugin", "-p", "no:faulthandler", "-n", "2",
                     "-v", "test_synthetic.py", "test_crash.py")
    run = parse_pytest_output(out)
    assert run.complete
    expected = {**EXPECTED, "test_crash.py::test_before": ("passed", ""),
                "test_crash.py::test_engine_crash": ("failed", "crash"),
                "test_crash.py::test_after": ("passed", "")}
    assert {n: (t.outcome, t.category) for n, t in run.tests.items()} == expected


CRASH_OUTCOMES = {"test_crash.py::test_before": "passed",
                  "test_crash.py::test_engine_crash": "failed",
                  "test_crash.py::test_after": "passed"}


def test_crash_dump_glued_to_another_workers_result():
    # seen on a loaded machine: the dump starts on the line of a result
    out = "\n".join([
        "[gw1] [ 82%] PASSED test_crash.py::test_before Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f (most recent call first):",
        '  File "/x/test_crash.py", line 9 in test_engine_crash',
        "[gw0] node down: Not properly terminated",
        "[gw0] [ 88%] FAILED test_crash.py::test_engine_crash",
        "",
        "replacing crashed worker gw0",
        "[gw2] [ 94%] PASSED test_crash.py::test_after",
        "========================= 1 failed, 2 passed in 1.00s =========================",
    ])
    run = parse_pytest_output(out)
    assert {n: t.outcome for n, t in run.tests.items()} == CRASH_OUTCOMES


def test_crash_dump_between_a_results_prefix_and_its_rest():
    # seen in CI: "[gw0] [ 88%] " then the dump, then "PASSED <nodeid>" alone
    out = "\n".join([
        "test_crash.py::test_before ",
        "[gw0] [ 88%] Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f (most recent call first):",
        '  File "/x/test_crash.py", line 10 in test_engine_crash',
        "PASSED test_crash.py::test_before ",
        "test_crash.py::test_engine_crash ",
        "[gw1] node down: Not properly terminated",
        "[gw1] [ 94%] FAILED test_crash.py::test_engine_crash ",
        "",
        "replacing crashed worker gw1",
        "[gw0] [100%] PASSED test_crash.py::test_after ",
        "========================= 1 failed, 2 passed in 1.00s =========================",
    ])
    run = parse_pytest_output(out)
    assert {n: t.outcome for n, t in run.tests.items()} == CRASH_OUTCOMES
    assert run.complete and run.crash.startswith("Fatal Python error: Segmentation fault")


def test_crash_dump_interleaved_inside_results():
    # seen in CI: faulthandler writes its dump piece by piece while the
    # controller prints results, so the pieces land inside the result lines
    out = "\n".join([
        "test_crash.py::test_before ",
        '"test_crash.py::test_before , line 121 in _multicall',
        "Fatal Python error: Segmentation fault",
        '  File "/x/test_crash.py", line 9 in test_engine_crash',
        '[gw0]/usr/lib/pluggy/_manager.py [ 88%] "PASSED test_crash.py::test_before , line 120',
        "test_crash.py::test_after   File \"/usr/lib/pluggy/_hooks.py\", line 512 in __call__",
        '[gw0]  File  [ 94%] PASSED test_crash.py::test_after "/usr/lib/python.py", line 1 in f',
        "[gw1] node down: Not properly terminated",
        "[gw1] [100%] FAILED test_crash.py::test_engine_crash ",
        "========================= 1 failed, 2 passed in 1.00s =========================",
    ])
    run = parse_pytest_output(out)
    assert run.crash == "Fatal Python error: Segmentation fault"
    assert {n: t.outcome for n, t in run.tests.items()} == {
        "test_crash.py::test_before": "passed", "test_crash.py::test_engine_crash": "failed",
        "test_crash.py::test_after": "passed"}


# -- categorize -----------------------------------------------------------------

def _tester_message(model2, **kwargs) -> str:
    """The AssertionError of a real ModelTester run of Linear(16, 4) against model2."""
    torch.manual_seed(0)
    model1 = torch.nn.Linear(16, 4)
    model2.load_state_dict(model1.state_dict())
    tester = ModelTester(model1, model2, name="Linear_case", epochs=3, bench_print=False,
                         **kwargs)
    with pytest.raises(AssertionError) as info:
        tester.test_multiple_step((2, 16))
    return str(info.value)


class _Shifted(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) + 1.0


class _DoubledInputGrad(torch.nn.Linear):
    def forward(self, x):
        if x.requires_grad:
            x.register_hook(lambda g: 2 * g)
        return super().forward(x)


class _Unsqueezed(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x).unsqueeze(0)


class _Slow(torch.nn.Linear):
    def forward(self, x):
        time.sleep(0.002)
        return super().forward(x)


def _doubled_weight_grad():
    m = torch.nn.Linear(16, 4)
    m.weight.register_hook(lambda g: 2 * g)
    return m


@pytest.mark.parametrize("model2, kwargs, category", [
    (lambda: _Shifted(16, 4), {"test_backward": False}, "outputs_differ"),
    (lambda: _DoubledInputGrad(16, 4), {}, "gradients_differ"),
    (_doubled_weight_grad, {}, "gradients_differ"),
    (lambda: _Unsqueezed(16, 4), {"test_backward": False}, "shape_mismatch (test strategy)"),
    (lambda: _Slow(16, 4), {"test_backward": False, "max_slowdown_ratio": 2.0,
                            "bench_min_time_ms": 0.0, "bench_warmup": 1},
     "performance_regression"),
], ids=["output", "input_gradient", "parameter_gradient", "shape", "slowdown"])
def test_categorize_real_model_tester_messages(model2, kwargs, category, monkeypatch):
    monkeypatch.setattr(ModelTester, "BENCH_LOG_FILE", None)
    message = _tester_message(model2(), **kwargs)
    assert categorize("", message)[0] == category, message


@pytest.mark.parametrize("rt_msg, ae_msg, expected", [
    ("", "LeNet_train, epoch 1/5, loss: Scalars are not close!\n\nExpected 0.5 but got 0.7.",
     ("loss_differs", "🔴")),
    ("", "Tensor-likes are not close!\n\nMismatched elements: 1 / 4 (25.0%)",
     ("outputs_differ", "🔴")),
    ("", "MLP, output[1]: The values for attribute 'dtype' do not match: torch.float64 != "
     "torch.float32.", ("outputs_differ", "🔴")),
    ("", "MLP, epoch 2/3, gradient of parameter 'fc.bias': model1 computes it, model2 does "
     "not (None)", ("gradients_differ", "🔴")),
    ("", "assert 'gradient of parameter, output: x' == ''", ("assertion_failed", "⚪")),
    ("worker 'gw0' crashed while running 'tests/test_models.py::test_model[LeNet_eval]'", "",
     ("crash", "🔴")),
    ("Fatal Python error: Segmentation fault (the run stopped here)", "", ("crash", "🔴")),
    ("NotImplementedError: operator Celu (node '/Celu', opset 20) is not supported by the "
     "engine", "", ("not_implemented", "🔴")),
    ("ValueError: node 'Gemm_3': input 1 has 8 columns, input 0 has 9", "",
     ("runtime_error", "🔴")),
    ("RuntimeError: Given groups=1, weight of size [16, 8, 3, 3], expected input[4, 3, 16, 16] "
     "to have 8 channels, but got 3 channels instead", "",
     ("shape_mismatch (test strategy)", "🟡")),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x9 and 8x4)", "",
     ("shape_mismatch (test strategy)", "🟡")),
    ("TypeError: Conv2d.__init__() got an unexpected keyword argument 'rounding_mode'", "",
     ("unsupported_attribute (test strategy)", "🟡")),
    ("", "[XPASS(strict)] fixed since", ("xpass (test strategy)", "🟡")),
    ("", "assert 2 == 3", ("assertion_failed", "⚪")),
    ("", "", ("unknown", "⚪")),
    (None, None, ("unknown", "⚪")),
])
def test_categorize_rules(rt_msg, ae_msg, expected):
    assert categorize(rt_msg, ae_msg) == expected


# -- benchmarks -----------------------------------------------------------------

def _phase(ratio, torch_ms=1.0, samples=3):
    return {"mean1": torch_ms / 1e3, "mean2": ratio * torch_ms / 1e3, "ratio": ratio,
            "samples": samples}


NO_PHASE = {"mean1": None, "mean2": None, "ratio": None, "samples": 0}

# name -> (forward ratio, backward ratio or None); known ranking
RATIOS = {
    "Conv2D_attributes_kernel_square": (0.5, 0.8),
    "Conv2D_attributes_stride_2": (2.0, 4.0),
    "Conv2D_sweeps_dilation_d2": (8.0, 1.5),
    "Conv2D_sweeps_dilation_d3": (12.0, 30.0),  # regression in both phases
    "ReLU_basic": (1.0, 1.0),
    "ReLU_odd_sizes": (3.0, 6.0),
    "ReLU_batch_1": (0.25, 0.125),
    "LeNet_eval": (1.5, None),
    "LeNet_train": (0.9, 0.7),
    "Softmax_axis_0": (5.0, 2.5),
    "Softmax_axis_1": (7.0, 9.0),
    "Tanh_rank_4": (50.0, 2.0),  # over the limit, but torch takes 0.01 ms: overhead
}


def _write_log(path: Path) -> None:
    lines = [json.dumps({"name": "Conv2D_sweeps_dilation_d3", "forward": _phase(99.0),
                         "backward": _phase(99.0)})]  # an older run: superseded
    for name, (fwd, bwd) in RATIOS.items():
        lines.append(json.dumps({
            "name": name,
            "forward": _phase(fwd, torch_ms=0.01 if name.startswith("Tanh") else 1.0),
            "backward": NO_PHASE if bwd is None else _phase(bwd),
            "timestamp": "2026-01-01T00:00:00+00:00"}))
    path.write_text("\n".join(lines) + "\n")


def test_benchmark_summary_ranks_and_flags(tmp_path):
    _write_log(tmp_path / "benchmarks.jsonl")
    records = load_benchmarks(tmp_path / "benchmarks.jsonl")
    assert [r["name"] for r in records] == list(RATIOS)
    summary = benchmark_summary(records, top=10, max_ratio=10.0, min_time_ms=0.1)

    by_fwd = sorted(RATIOS, key=lambda n: -RATIOS[n][0])[:10]
    assert [e["name"] for e in summary["worst"]["forward"]] == by_fwd
    timed_bwd = [n for n in RATIOS if RATIOS[n][1] is not None]
    assert [e["name"] for e in summary["worst"]["backward"]] == sorted(
        timed_bwd, key=lambda n: -RATIOS[n][1])[:10]
    assert summary["worst"]["forward"][0]["ratio"] == 50.0

    assert list(summary["operators"]) == ["Conv2D", "LeNet", "ReLU", "Softmax", "Tanh"]
    conv = summary["operators"]["Conv2D"]
    assert conv["tests"] == 4
    assert conv["forward"]["geomean"] == pytest.approx((0.5 * 2.0 * 8.0 * 12.0) ** 0.25)
    assert conv["backward"]["worst"] == 30.0
    assert summary["operators"]["LeNet"]["backward"]["count"] == 1
    assert [(e["name"], e["phase"]) for e in summary["regressions"]] == [
        ("Conv2D_sweeps_dilation_d3", "backward"), ("Conv2D_sweeps_dilation_d3", "forward")]


@pytest.mark.parametrize("line, error", [
    ('{"name": "ReLU_basic", "forward": ', r"bench\.jsonl:2: not valid JSON"),
    ('{"forward": null, "backward": null}', r"bench\.jsonl:2: .*'name'"),
    ('{"name": "X", "forward": {"mean1": 1}, "backward": null}', r"bench\.jsonl:2: 'forward'"),
    ('{"name": "X", "forward": null, "backward": {"mean1": 1, "mean2": 1, "ratio": "fast", '
     '"samples": 1}}', r"bench\.jsonl:2: backward\.ratio must be a number"),
])
def test_bad_benchmark_log_names_file_and_line(tmp_path, line, error):
    log = tmp_path / "bench.jsonl"
    log.write_text(json.dumps({"name": "ok", "forward": _phase(1.0), "backward": None})
                   + "\n" + line + "\n")
    with pytest.raises(ValueError, match=error):
        load_benchmarks(log)


# -- command line ------------------------------------------------------------------

def _sections(report: str) -> dict[str, str]:
    """Plain report text split at its upper-case headings."""
    out, current = {}, None
    for line in report.splitlines():
        head = line.split(" (")[0]
        if head and head == head.upper() and head[0].isalpha():
            current = head
            out[current] = ""
        elif current:
            out[current] += line + "\n"
    return out


@pytest.fixture
def saved_run(tmp_path, verbose_output) -> Path:
    """results.txt with benchmarks.jsonl beside it, as ``tee`` leaves them."""
    (tmp_path / "results.txt").write_text(verbose_output)
    _write_log(tmp_path / "benchmarks.jsonl")
    return tmp_path / "results.txt"


def test_cli_plain_report(saved_run, capsys):
    assert main([str(saved_run)]) == 0
    report = capsys.readouterr().out
    assert "\x1b[" not in report and "🔴" not in report  # captured: not a terminal
    assert "Tests: 2 passed, 9 failed, 1 error, 1 xfailed, 1 skipped" in report
    sections = _sections(report)
    for nodeid, (_, category) in EXPECTED.items():
        if category:
            heading = {"outputs_differ": "ENGINE", "gradients_differ": "ENGINE",
                       "loss_differs": "ENGINE", "not_implemented": "ENGINE",
                       "runtime_error": "ENGINE", "performance_regression": "PERFORMANCE",
                       "assertion_failed": "OTHER"}.get(category, "TEST-STRATEGY")
            section = next(v for k, v in sections.items() if k.startswith(heading))
            assert f"{nodeid}  " in section and category in section, (nodeid, heading)
    perf = sections["PERFORMANCE REGRESSIONS"]
    slow = [line.split()[:3] for line in perf.splitlines() if line.startswith("  Conv2D")]
    assert slow == [["Conv2D_sweeps_dilation_d3", "backward", "30.00x"],
                    ["Conv2D_sweeps_dilation_d3", "forward", "12.00x"]]
    assert "Tanh_rank_4" not in perf  # torch time under --min-time-ms
    assert "test_synthetic.py::test_known_gap — ShiftMax backward is not implemented" in report
    worst = report.split("Worst forward ratios (top 10)")[1].splitlines()
    assert worst[3].split()[:3] == ["1", "Tanh_rank_4", "50.00x"]
    assert worst[4].split()[:3] == ["2", "Conv2D_sweeps_dilation_d3", "12.00x"]
    per_operator = report.split("Benchmarks per operator")[1].split("Worst")[0]
    conv = next(line.split() for line in per_operator.splitlines()
                if line.startswith("  Conv2D "))
    # tests, forward geometric mean (96 ** 0.25) and worst, backward (144 ** 0.25) and worst
    assert conv == ["Conv2D", "4", "3.13x", "12.00x", "3.46x", "30.00x"]


def test_cli_json(saved_run, capsys):
    assert main([str(saved_run), "--json", "--top", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {b["nodeid"]: b["category"] for b in data["engine_bugs"]} == {
        n: c for n, (o, c) in EXPECTED.items()
        if c in ("outputs_differ", "gradients_differ", "loss_differs", "not_implemented",
                 "runtime_error")}
    assert [e["name"] for e in data["benchmarks"]["worst"]["forward"]] == [
        "Tanh_rank_4", "Conv2D_sweeps_dilation_d3", "Conv2D_sweeps_dilation_d2"]
    assert data["counts"] == COUNTS
    assert data["benchmarks_file"] == str(saved_run.parent / "benchmarks.jsonl")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("no_color, option, coloured", [
    ("", [], True), ("1", [], False), ("1", ["--color", "yes"], True),
    ("", ["--color", "no"], False)])
def test_cli_colours_follow_the_terminal_and_no_color(saved_run, monkeypatch, no_color,
                                                      option, coloured):
    monkeypatch.setenv("NO_COLOR", no_color)
    monkeypatch.setenv("TERM", "xterm")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    assert main([str(saved_run), *option]) == 0
    report = terminal.getvalue()
    assert ("\x1b[" in report) == coloured
    assert ("🔴 Engine bugs to report" in report) == coloured
    assert ("ENGINE BUGS TO REPORT" in report) != coloured


def test_wrapper_reads_piped_output(tmp_path, quiet_output):
    """``pytest -q ... | python analyze_results.py``: stdin, and the benchmark
    log of the current directory."""
    _write_log(tmp_path / "benchmarks.jsonl")
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    proc = subprocess.run([sys.executable, str(TESTS_DIR / "analyze_results.py")],
                          input=quiet_output, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout
    assert "test_synthetic.py::test_gradient_differs  gradients_differ" in proc.stdout
    assert (f"Benchmarks per operator (12 records, {tmp_path / 'benchmarks.jsonl'})"
            in proc.stdout)


def test_cli_bad_input_is_a_clear_error(tmp_path, saved_run, capsys):
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "missing.txt")])
    assert info.value.code == 2
    assert "results file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main([str(saved_run), "--bench", str(tmp_path / "nowhere.jsonl")])
    assert info.value.code == 2
    assert "nowhere.jsonl' does not exist" in capsys.readouterr().err
    (tmp_path / "benchmarks.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit) as info:
        main([str(saved_run)])
    assert info.value.code == 2
    assert "benchmarks.jsonl:1: not valid JSON" in capsys.readouterr().err


def test_cli_plot(saved_run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "ratios.png"
    assert main([str(saved_run), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_without_matplotlib(saved_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(SystemExit) as info:
        main([str(saved_run), "--plot", str(tmp_path / "ratios.png")])
    assert info.value.code == 2
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "ratios.png").exists()
