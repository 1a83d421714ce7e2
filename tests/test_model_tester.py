"""ModelTester (aidge_interop.testing) and the C comparison behind it.

- ``_C.compare`` against a NumPy computation of the assert_close rule (NaN,
  inf, empty, 0-d, strided and expanded inputs, dtypes) and against
  ``torch.testing.assert_close``'s own figures;
- ModelTester on engine models passes, trains both sides in lock-step, and
  fails on a model that differs, naming epoch, tensor and figures;
- benchmark: statistics, slowdown assertion, JSONL records appended by
  concurrent processes.
"""
import copy
import io
import json
import multiprocessing
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import aidge_interop
from aidge_interop import _C
from utils import ModelTester


@pytest.fixture(autouse=True)
def bench_log(tmp_path, monkeypatch):
    """Every test writes its benchmark records to its own file."""
    path = tmp_path / "benchmarks.jsonl"
    monkeypatch.setattr(ModelTester, "BENCH_LOG_FILE", str(path))
    return path


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- _C.compare

def reference(a, e, rtol, atol, equal_nan=False):
    """The assert_close rule and figures, in float64 NumPy."""
    a, e = np.asarray(a, np.float64).ravel(), np.asarray(e, np.float64).ravel()
    with np.errstate(all="ignore"):
        diff = np.abs(a - e)
        rel = diff / np.abs(e)
        matched = (a == e) | (equal_nan & np.isnan(a) & np.isnan(e))
        close = matched | (np.isfinite(diff) & (diff <= atol + rtol * np.abs(e)))
    diff[matched] = rel[matched] = 0.0
    if (~close).any():  # the greatest differences among the mismatches
        diff[close] = rel[close] = 0.0
    out = {"numel": a.size, "mismatches": int((~close).sum()),
           "max_abs_diff": 0.0, "max_abs_index": None, "max_rel_diff": 0.0, "max_rel_index": None}
    if a.size:
        i, j = int(np.argmax(diff)), int(np.argmax(rel))  # argmax: first NaN, else first max
        out.update(max_abs_diff=float(diff[i]), max_abs_index=i,
                   max_rel_diff=float(rel[j]), max_rel_index=j)
    return out


def same(got, want):
    assert got.keys() == want.keys()
    for k in got:
        if isinstance(want[k], float):
            np.testing.assert_equal(got[k], want[k], err_msg=k)  # NaN == NaN here
        else:
            assert got[k] == want[k], k


rng = np.random.default_rng(0)
BASE = rng.standard_normal((5, 7))
NOISY = BASE + rng.standard_normal((5, 7)) * 1e-3
SPECIAL_A = np.array([1.0, np.nan, np.nan, np.inf, -np.inf, np.inf, 2.0, 0.0, 5.0, 1e308])
SPECIAL_E = np.array([1.0, np.nan, 3.0, np.inf, -np.inf, -np.inf, np.inf, 1e-9, 0.0, -1e308])

COMPARE_CASES = {
    "identical": (BASE, BASE.copy(), 1e-3, 1e-4, False),
    "noisy_passes": (NOISY, BASE, 1e-1, 1e-2, False),
    "noisy_fails": (NOISY, BASE, 1e-4, 1e-5, False),
    "nan_inf": (SPECIAL_A, SPECIAL_E, 1e-3, 1e-3, False),
    "nan_inf_equal_nan": (SPECIAL_A, SPECIAL_E, 1e-3, 1e-3, True),
    "empty": (np.zeros((3, 0)), np.zeros((3, 0)), 0.0, 0.0, False),
    "zero_dim_close": (np.array(2.0), np.array(2.0 + 1e-9), 0.0, 1e-6, False),
    "zero_dim_far": (np.array(2.0), np.array(2.5), 1e-3, 1e-4, False),
    "transposed": (NOISY.T, np.ascontiguousarray(BASE.T), 1e-4, 1e-4, False),
    "negative_strides": (NOISY[::-1, ::-2], BASE[::-1, ::-2].copy(), 1e-4, 1e-4, False),
    "both_strided": (NOISY[1::2, ::3], BASE[1::2, ::3], 1e-4, 1e-5, False),
    "float32": (NOISY.astype(np.float32), BASE.astype(np.float32), 1e-4, 1e-5, False),
    "float16": (NOISY.astype(np.float16), BASE.astype(np.float16), 1e-3, 1e-3, False),
    "int32": (np.array([[1, -5, 7], [100, 0, 3]], np.int32),
              np.array([[1, -4, 7], [90, 0, 3]], np.int32), 0.05, 0.5, False),
    "bool": (np.array([True, False, True]), np.array([True, True, False]), 0.0, 0.0, False),
}


@pytest.mark.parametrize("case", COMPARE_CASES)
def test_compare_matches_numpy(case):
    a, e, rtol, atol, equal_nan = COMPARE_CASES[case]
    same(_C.compare(a, e, rtol, atol, equal_nan=equal_nan),
         reference(a, e, rtol, atol, equal_nan))


def test_compare_edge_cases_explicitly():
    r = _C.compare(SPECIAL_A, SPECIAL_E, 1e-3, 1e-3)
    # NaN vs NaN, NaN vs 3, inf vs -inf, 2 vs inf, 0 vs 1e-9 passes (atol), 5 vs 0,
    # 1e308 vs -1e308 (the difference overflows)
    assert r["mismatches"] == 6
    assert np.isnan(r["max_abs_diff"]) and r["max_abs_index"] == 1
    assert _C.compare(SPECIAL_A, SPECIAL_E, 1e-3, 1e-3, equal_nan=True)["mismatches"] == 5
    empty = _C.compare(np.zeros(0), np.zeros(0), 0.0, 0.0)
    assert empty == {"numel": 0, "mismatches": 0, "max_abs_diff": 0.0, "max_abs_index": None,
                     "max_rel_diff": 0.0, "max_rel_index": None}
    scalar = _C.compare(np.float64(3.0), np.float64(2.0), 0.0, 0.5)
    assert scalar["mismatches"] == 1 and scalar["max_abs_index"] == 0
    assert scalar["max_rel_diff"] == 0.5


def test_compare_takes_torch_tensors_strided_and_expanded():
    base = torch.randn(4, 6, dtype=torch.float64)
    actual = base.t()  # a strided DLPack view
    expected = base.t().contiguous()
    expected[5, 2] += 1.0
    r = _C.compare(actual, expected, 0.0, 0.0)
    assert r["mismatches"] == 1 and r["max_abs_index"] == 5 * 4 + 2
    assert r["max_abs_diff"] == pytest.approx(1.0)
    # an expanded view addresses one element many times; it is read through a copy
    row = torch.arange(3.0)
    r = _C.compare(row.expand(4, 3), torch.arange(3.0).repeat(4, 1), 0.0, 0.0)
    assert r["numel"] == 12 and r["mismatches"] == 0
    # large enough for the comparison to run without the GIL
    big = torch.randn(512, 1024)
    other = big.clone()
    other[300, 7] += 0.5
    r = _C.compare(other, big, 1e-5, 1e-6)
    assert r["mismatches"] == 1 and r["max_abs_index"] == 300 * 1024 + 7


def test_compare_agrees_with_torch_assert_close():
    """Mismatch count, greatest differences and their indices as torch
    reports them (float64: both compute in double)."""
    gen = torch.Generator().manual_seed(1)
    expected = torch.randn(3, 8, 5, generator=gen, dtype=torch.float64)
    actual = expected + torch.randn(3, 8, 5, generator=gen, dtype=torch.float64) * 1e-4
    with pytest.raises(AssertionError) as info:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    r = _C.compare(actual, expected, 1e-4, 1e-5)
    shape = tuple(expected.shape)
    abs_index = tuple(int(i) for i in np.unravel_index(r["max_abs_index"], shape))
    rel_index = tuple(int(i) for i in np.unravel_index(r["max_rel_index"], shape))
    msg = str(info.value)
    assert f"Mismatched elements: {r['mismatches']} / 120 " in msg
    assert f"Greatest absolute difference: {r['max_abs_diff']} at index {abs_index}" in msg
    assert f"Greatest relative difference: {r['max_rel_diff']} at index {rel_index}" in msg


@pytest.mark.parametrize("args, error, message", [
    ((np.zeros((2, 3)), np.zeros((3, 2)), 0.0, 0.0), ValueError,
     "shapes differ: actual is (2, 3), expected is (3, 2)"),
    ((np.zeros(3, np.float32), np.zeros(3), 0.0, 0.0), ValueError,
     "dtypes differ: actual is float32, expected is float64"),
    ((np.zeros(3), np.zeros(3), -1.0, 0.0), ValueError, "rtol and atol must be >= 0"),
    ((np.zeros(3), np.zeros(3), 0.0, float("nan")), ValueError, "rtol and atol must be >= 0"),
    ((np.zeros(3, np.complex64), np.zeros(3, np.complex64), 0.0, 0.0), TypeError,
     "unsupported dtype"),
])
def test_compare_rejects_bad_input(args, error, message):
    with pytest.raises(error, match=re.escape(message)):
        _C.compare(*args)


def test_compare_leaks_nothing():
    before = _C._debug_counters()
    for _ in range(50):
        _C.compare(torch.randn(4, 3).t(), torch.randn(3, 4), 0.0, 0.0)
        _C.compare(torch.ones(3).expand(2, 3), torch.ones(2, 3), 0.0, 0.0)
        with pytest.raises(ValueError):
            _C.compare(np.zeros(2), np.zeros(3), 0.0, 0.0)
    assert _C._debug_counters() == before


# ---------------------------------------------------------------- models

class MLP(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32, dtype=dtype)
        self.fc2 = torch.nn.Linear(32, 4, dtype=dtype)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Gate(torch.nn.Module):
    """Two inputs, one output."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        return torch.tanh(self.fc(x)) * y


class Offset(MLP):
    """MLP plus ``delta`` on every output from its ``start``-th forward on."""

    def __init__(self, like: MLP, delta, start=1):
        super().__init__(like.fc1.weight.dtype)
        self.load_state_dict(like.state_dict())
        self.delta, self.start, self.calls = delta, start, 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x) + (self.delta if self.calls >= self.start else 0.0)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1.01


class WrongWeightGrad(MLP):
    """The same values as MLP; the gradient of fc2.weight is 1% too large."""

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return torch.nn.functional.linear(h, _ScaleGrad.apply(self.fc2.weight), self.fc2.bias)


def quiet(model1, model2, **kwargs):
    """A tester that neither prints nor judges speed (timings on a shared
    machine are noise; the benchmark tests set what they check)."""
    kwargs.setdefault("bench_print", False)
    kwargs.setdefault("max_slowdown_ratio", float("inf"))
    return ModelTester(model1, model2, **kwargs)


def test_engine_model_passes_and_trains_in_lock_step(bench_log):
    torch.manual_seed(0)
    model = MLP()
    engine = aidge_interop.wrap(model, [(1, 16)])
    before = copy.deepcopy(model.state_dict())
    tester = quiet(model, engine, name="MLP_train", epochs=4, bench_warmup=1)
    tester.test_multiple_step(input_sizes=(8, 16), label_sizes=(8, 4))
    # both took the same SGD steps
    for name, p in engine.named_parameters():
        torch.testing.assert_close(p, model.get_parameter(name), rtol=1e-5, atol=1e-6)
        assert not torch.equal(p, before[name]), name
    stats = tester.performance_stats()
    assert stats["forward"]["samples"] == stats["backward"]["samples"] == 3
    (record,) = records(bench_log)
    assert record["name"] == "MLP_train" and record["forward"]["samples"] == 3


def test_engine_model_eval_and_two_inputs():
    torch.manual_seed(1)
    mlp = MLP().eval()
    quiet(mlp, aidge_interop.wrap(mlp, [(1, 16)]), name="MLP_eval", test_backward=False,
          epochs=2).test_multiple_step((4, 16))
    gate = Gate()
    quiet(gate, aidge_interop.wrap(gate, [(1, 8), (1, 8)]), name="Gate", epochs=2) \
        .test_multiple_step([(4, 8), (4, 8)])


def test_inputs_take_the_dtype_a_parameterless_model_was_wrapped_for():
    gelu = torch.nn.GELU()
    engine = aidge_interop.wrap(gelu, [torch.randn(2, 5, dtype=torch.float64)])
    tester = quiet(gelu, engine, name="GELU_f64", epochs=2)
    assert tester.dtype is torch.float64
    tester.test_multiple_step((3, 5))  # float64 outputs, loss and gradients compared
    assert quiet(gelu, aidge_interop.wrap(gelu, [(2, 5)])).dtype is torch.float32


def test_engine_optimizer_with_momentum_drives_torch_sgd():
    torch.manual_seed(2)
    model = MLP()
    engine = aidge_interop.wrap(model, [(1, 16)])
    opt = aidge_interop.SGD(engine, lr=0.05, momentum=0.9)
    tester = quiet(model, engine, epochs=3, learning_rate=0.05, optimizer2=opt)
    assert tester.optimizer1.defaults["momentum"] == 0.9
    tester.test_multiple_step((4, 16))
    for name, p in engine.named_parameters():
        torch.testing.assert_close(p, model.get_parameter(name), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"optimizer2 has lr=0.05 but learning_rate=0.01"):
        quiet(model, engine, optimizer2=opt)


@pytest.mark.parametrize("rtol, atol", [(0.001, 0.0001), (0.0, 0.0)])
def test_output_difference_names_epoch_tensor_and_figures(rtol, atol):
    torch.manual_seed(3)
    model = MLP(torch.float64)
    shifted = Offset(model, 1e-3, start=3)
    tester = quiet(model, shifted, name="Shifted", epochs=5, test_backward=False,
                   relative_precision=rtol, absolute_precision=atol)
    with pytest.raises(AssertionError) as info:
        tester.test_multiple_step((8, 16))
    head, body = str(info.value).split(": ", 1)
    assert head == "Shifted, epoch 3/5, output"
    # the body is torch.testing.assert_close's message for the same tensors
    # (float64: both compute the figures in double); epoch 3's input is the
    # third draw
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(8, 16, generator=gen, dtype=torch.float64) for _ in range(3)][-1]
    with torch.no_grad():
        expected, actual = model(x), shifted(x)
    with pytest.raises(AssertionError) as torch_info:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    assert body == str(torch_info.value)
    assert body.startswith("Tensor-likes are not close!" if atol else
                           "Tensor-likes are not equal!")
    assert re.search(r"Greatest absolute difference: 0\.00100\d* at index \(\d, \d\)", body)


def test_parameter_gradient_difference_is_named():
    torch.manual_seed(4)
    model = MLP(torch.float64)
    wrong = WrongWeightGrad(torch.float64)
    wrong.load_state_dict(model.state_dict())
    tester = quiet(model, wrong, name="Grad", epochs=2)
    with pytest.raises(AssertionError, match=r"^Grad, epoch 1/2, gradient of parameter "
                                             r"'fc2\.weight': Tensor-likes are not close!"):
        tester.test_multiple_step((8, 16))


def test_loss_and_input_gradient_are_compared():
    torch.manual_seed(5)
    model = MLP(torch.float64)
    # outputs within tolerance, loss not: a constant offset under atol on 4 outputs
    tester = quiet(model, Offset(model, 5e-5), name="Loss", epochs=1,
                   relative_precision=0.0, absolute_precision=6e-5)
    with pytest.raises(AssertionError, match=r"^Loss, epoch 1/1, loss: Scalars are not close!"
                                             r"\n\nExpected .* but got .*\.\nAbsolute difference"):
        tester.test_multiple_step((8, 16), (8, 4))

    class ScaledInputGrad(MLP):
        def forward(self, x):
            return super().forward(_ScaleGrad.apply(x))

    wrong = ScaledInputGrad(torch.float64)
    wrong.load_state_dict(model.state_dict())
    with pytest.raises(AssertionError, match=r"^In, input gradient: Tensor-likes"):
        x = torch.randn(8, 16, dtype=torch.float64)
        quiet(model, wrong, name="In").unit_test(x, torch.ones(8, 4, dtype=torch.float64))


def test_metadata_is_checked_first():
    torch.manual_seed(6)
    model = MLP()
    wider = torch.nn.Module()
    wider.fc1, wider.fc2 = model.fc1, torch.nn.Linear(32, 5)
    wider.forward = lambda x: wider.fc2(torch.relu(wider.fc1(x)))
    with pytest.raises(AssertionError, match=re.escape(
            "Meta, output: The values for attribute 'shape' do not match: "
            "torch.Size([2, 5]) != torch.Size([2, 4]).")):
        quiet(model, wider, name="Meta").unit_test(torch.randn(2, 16), None)

    class AsDouble(MLP):
        def forward(self, x):
            return super().forward(x).double()

    double = AsDouble()
    double.load_state_dict(model.state_dict())
    with pytest.raises(AssertionError, match=re.escape(
            "Meta, output: The values for attribute 'dtype' do not match: "
            "torch.float64 != torch.float32.")):
        quiet(model, double, name="Meta", test_backward=False).unit_test(torch.randn(2, 16), None)


def test_missing_gradient_and_parameter_names():
    model = MLP()
    frozen = copy.deepcopy(model)
    frozen.fc1.bias.requires_grad_(False)
    with pytest.raises(AssertionError, match=r"gradient of parameter 'fc1\.bias': model1 "
                                             r"computes it, model2 does not"):
        quiet(model, frozen, name="Frozen").unit_test(torch.randn(2, 16), None)
    renamed = torch.nn.Module()
    renamed.fc1, renamed.out = model.fc1, model.fc2
    with pytest.raises(ValueError, match=r"parameter names differ: only in model1: "
                                         r"\['fc2\.weight', 'fc2\.bias'\], only in model2: "
                                         r"\['out\.weight', 'out\.bias'\]"):
        quiet(model, renamed)


def test_other_assertion_errors_get_the_epoch():
    class Fragile(MLP):
        calls = 0

        def forward(self, x):
            Fragile.calls += 1
            assert Fragile.calls < 2, "the model's own check"
            return super().forward(x)

    model = MLP()
    fragile = Fragile()
    fragile.load_state_dict(model.state_dict())
    with pytest.raises(AssertionError, match=r"^Fragile, epoch 2/3: the model's own check"):
        quiet(model, fragile, name="Fragile", epochs=3).test_multiple_step((2, 16))


def test_bad_arguments():
    model = MLP()
    with pytest.raises(TypeError, match="argument 'model2' must be a torch.nn.Module"):
        ModelTester(model, "aidge")  # None is allowed: ModelTester wraps model1 itself
    with pytest.raises(ValueError, match="optimizer2 without model2"):
        ModelTester(model, optimizer2=aidge_interop.SGD(aidge_interop.wrap(model, [(2, 16)]),
                                                        lr=0.01))
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        ModelTester(model, model, epochs=0)
    with pytest.raises(ValueError, match="model1 is in train mode, model2 in eval mode"):
        quiet(model, copy.deepcopy(model).eval()).unit_test(torch.randn(2, 16), None)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda=True but CUDA is not available"):
            ModelTester(model, model, cuda=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_reference_against_engine():
    torch.manual_seed(7)
    model = MLP()
    engine = aidge_interop.wrap(model, [(1, 16)])
    tester = quiet(model, engine, name="MLP_cuda", epochs=3, cuda=True, bench_warmup=1)
    tester.test_multiple_step((8, 16))
    assert next(model.parameters()).is_cuda
    for name, p in engine.named_parameters():
        torch.testing.assert_close(p, model.get_parameter(name).cpu(), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- benchmark

def test_performance_stats_shape():
    model = MLP()
    tester = quiet(model, copy.deepcopy(model), epochs=4, bench_warmup=3,
                   test_backward=False)
    empty = tester.performance_stats()
    assert empty == {phase: {"mean1": None, "mean2": None, "ratio": None, "samples": 0}
                     for phase in ("forward", "backward")}
    tester.test_multiple_step((2, 16))
    stats = tester.performance_stats()
    fwd = stats["forward"]
    assert fwd["samples"] == 1
    assert fwd["mean1"] > 0 and fwd["mean2"] > 0
    assert fwd["ratio"] == pytest.approx(fwd["mean2"] / fwd["mean1"])
    assert stats["backward"]["samples"] == 0  # forward only


def test_slowdown_assertion_and_its_threshold(bench_log, capsys):
    model = MLP()
    tester = quiet(model, copy.deepcopy(model), name="Slow", epochs=2, bench_warmup=0,
                   max_slowdown_ratio=1e-9, bench_min_time_ms=0.0, bench_print=True)
    with pytest.raises(AssertionError, match=r"^Slow: forward is \d+\.\d\dx slower than torch "
                                             r"\(engine .* ms, torch .* ms, mean of 2 epochs; "
                                             r"at most 1e-09x allowed\)"):
        tester.test_multiple_step((2, 16))
    assert "[bench] Slow: forward" in capsys.readouterr().out
    assert records(bench_log)[0]["name"] == "Slow"  # logged before failing
    # the same ratio under a torch time below bench_min_time_ms is not judged
    quiet(model, copy.deepcopy(model), epochs=2, bench_warmup=0, max_slowdown_ratio=1e-9,
          bench_min_time_ms=1e9).test_multiple_step((2, 16))


def test_no_record_without_benchmark_or_log_file(bench_log, monkeypatch):
    model = MLP()
    quiet(model, copy.deepcopy(model), epochs=1, benchmark=False).test_multiple_step((2, 16))
    assert not bench_log.exists()
    monkeypatch.setattr(ModelTester, "BENCH_LOG_FILE", None)
    quiet(model, copy.deepcopy(model), epochs=1, bench_warmup=0).test_multiple_step((2, 16))
    assert not bench_log.exists()


def _append_records(path, worker, count):
    """A process appending `count` records through test_multiple_step."""
    torch.set_num_threads(1)
    ModelTester.BENCH_LOG_FILE = path
    model = torch.nn.Linear(4, 2)
    tester = ModelTester(model, model, epochs=1, test_backward=False, bench_warmup=0,
                         bench_print=False, max_slowdown_ratio=float("inf"))
    for i in range(count):
        tester.name = f"worker{worker}_{i}"
        tester.test_multiple_step((1, 4))


def test_concurrent_writers_never_tear_or_lose_a_record(bench_log, monkeypatch, tmp_path):
    # the children must import the installed package, not the checkout's
    # sources (pytest-xdist workers have the repository root on sys.path)
    monkeypatch.chdir(tmp_path)
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if p and Path(p).resolve() != root])
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_records, args=(str(bench_log), w, 2000))
             for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * 4
    lines = bench_log.read_text().splitlines()
    assert len(lines) == 8000
    names = {json.loads(line)["name"] for line in lines}  # every line parses
    assert names == {f"worker{w}_{i}" for w in range(4) for i in range(2000)}


def test_record_content(bench_log):
    model = MLP()
    quiet(model, copy.deepcopy(model), name="Rec", epochs=3, bench_warmup=1) \
        .test_multiple_step((2, 16))
    (rec,) = records(bench_log)
    assert set(rec) == {"name", "engine", "forward", "backward", "timestamp"}
    assert rec["engine"] == "aidge_interop"
    for phase in ("forward", "backward"):
        assert set(rec[phase]) == {"mean1", "mean2", "ratio", "samples"}
        assert rec[phase]["samples"] == 2
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", rec["timestamp"])


# ---------------------------------------------------------------- progress

class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_on_a_terminal_only(monkeypatch, capsys):
    model = MLP()
    quiet(model, copy.deepcopy(model), name="Prog", epochs=3).test_multiple_step((2, 16))
    assert capsys.readouterr().err == ""  # pytest's capture is no terminal
    term = FakeTerminal()
    monkeypatch.setattr("sys.stderr", term)
    quiet(model, copy.deepcopy(model), name="Prog", epochs=3, bench_warmup=1) \
        .test_multiple_step((2, 16))
    out = term.getvalue()
    assert "Prog: epoch 1/3" in out and "Prog: epoch 3/3, last ratio forward " in out
    assert out.endswith("\r\x1b[K")  # the line is cleared at the end
