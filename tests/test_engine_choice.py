"""The harness's engine choice: ``pytest --engine aidge``,
``make_operator_fixture(cfg, engine=...)`` and ``ModelTester(engine=...)``
run the cases on Eclipse Aidge; what Aidge cannot run is a skip with its
message; without Aidge installed, a skip that says how to install it.

The Aidge tests skip where Eclipse Aidge is not installed (it is not among
CI's test dependencies; see docs/testing.md)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aidge_interop.testing import ModelTester
from aidge_interop.testing.engines import engine_available

ROOT = Path(__file__).resolve().parent.parent
AIDGE_OK, AIDGE_MISSING = engine_available("aidge")
needs_aidge = pytest.mark.skipif(not AIDGE_OK, reason=AIDGE_MISSING)


@needs_aidge
def test_operator_suite_runs_on_aidge(tmp_path):
    """A few cases of the real suite: ReLU runs on Aidge and agrees with torch
    (forward, backward, SGD); ShiftMax has no Aidge operator: skipped with
    Aidge's message; the benchmark records name the engine."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "-rs", str(ROOT / "tests" / "test_operators.py"), "--engine", "aidge",
         "-k", "test_ReLU_interop or test_ShiftMax_interop"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|skipped|failed)", out))
    assert counts.get("passed", 0) >= 1 and counts.get("skipped", 0) >= 1, out
    assert re.search(r"SKIPPED \[\d+\] .*: Eclipse Aidge: ONNX ShiftMax \{\} imported as a "
                     r"GenericOperator, which has no kernel", out), out
    records = [json.loads(line) for line in (tmp_path / "benchmarks.jsonl").read_text()
               .splitlines()]
    assert len(records) == counts["passed"]
    assert all(r["name"].startswith("ReLU_") and r["engine"] == "aidge" for r in records)


TINY = '''
import torch
from aidge_interop.testing import OperatorCase, OperatorConfig, make_operator_fixture


class Net(torch.nn.Module):
    def __init__(self, layer="linear"):
        super().__init__()
        self.layer = {{"linear": lambda: torch.nn.Linear(6, 3),
                       "pool": lambda: torch.nn.AvgPool2d(2),
                       "deconv": lambda: torch.nn.ConvTranspose1d(6, 4, 3, groups=2)}}[layer]()

    def forward(self, x):
        return self.layer(x)


CASES = [OperatorCase("Net_linear", Net, {{"layer": "linear"}}, (4, 6)),
         OperatorCase("Net_pool", Net, {{"layer": "pool"}}, (2, 6, 4, 4)),
         OperatorCase("Net_deconv", Net, {{"layer": "deconv"}}, (4, 6, 5))]
net_case = make_operator_fixture(OperatorConfig(name="Net", op_class=Net, manual_cases=CASES)
                                 {engine})


def test_net(net_case):
    from aidge_interop.testing import ModelTester

    assert net_case["engine"] == "aidge"
    assert type(net_case["aidge_model"]).__name__ == "AidgeModel"
    has_weights = any(True for _ in net_case["torch_model"].parameters())
    assert type(net_case["optimizer"]).__name__ == ("AidgeSGD" if has_weights else "NoneType")
    ModelTester(net_case["torch_model"], net_case["aidge_model"], name=net_case["name"],
                epochs=2, optimizer2=net_case["optimizer"]).test_multiple_step(
        net_case["input_size"], net_case["output_size"])
'''


def _run_tiny(pytester, engine_arg, *args):
    pytester.makepyfile(test_tiny=TINY.format(engine=engine_arg))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                         "-p", "no:benchmark", "-rs", *args)


@needs_aidge
@pytest.mark.parametrize("engine_arg, args", [(", engine='aidge'", ()),
                                              ("", ("--engine", "aidge"))],
                         ids=["fixture_argument", "pytest_option"])
def test_aidge_outcomes_are_agree_or_skip(pytester, engine_arg, args):
    result = _run_tiny(pytester, engine_arg, *args)
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines_random([
        "SKIPPED * Eclipse Aidge: backward: Backward not yet implemented for AvgPooling*",
        "SKIPPED * Eclipse Aidge: ONNX ConvTranspose * imported as a GenericOperator, which has "
        "no kernel (aidge_onnx: Error: ConvTranspose DepthWise is not supported yet.)",
    ])


def test_without_aidge_the_cases_skip_saying_how_to_install(pytester):
    """Simulated: one of Aidge's packages is missing."""
    pytester.makeconftest('''
from aidge_interop.testing import engines
engines._AIDGE_PACKAGES = engines._AIDGE_PACKAGES + ("aidge_package_that_is_not_there",)
''')
    result = _run_tiny(pytester, "", "--engine", "aidge")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines([
        "SKIPPED [[]3[]] * Eclipse Aidge is not installed (no *aidge_package_that_is_not_there): "
        "pip install aidge-core==0.10.1*"])


def test_unknown_engine_is_refused(pytester):
    result = _run_tiny(pytester, "", "--engine", "tvm")
    assert result.ret == 4  # usage error
    result.stderr.fnmatch_lines(["*--engine: invalid choice: 'tvm' (choose from *aidge_interop*"
                                 "aidge*"])
    with pytest.raises(ValueError, match=r"ModelTester\(Linear\): unknown engine 'tvm' "
                                         r"\(known: aidge_interop, aidge\)"):
        ModelTester(torch.nn.Linear(2, 2), engine="tvm")


def test_model_tester_without_model2_wraps_with_our_engine():
    import aidge_interop

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    tester = ModelTester(model, epochs=2, benchmark=False)
    assert tester.engine == "aidge_interop" and tester.model2 is None
    before = model[0].weight.detach().clone()
    tester.test_multiple_step((4, 6))
    assert isinstance(tester.model2, aidge_interop.AidgeModule)
    assert isinstance(tester.optimizer2, aidge_interop.SGD)
    assert not torch.equal(model[0].weight, before)  # both sides trained in lock-step
    torch.testing.assert_close(dict(tester.model2.named_parameters())["0.weight"],
                               model[0].weight, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="without model2, the inputs must be float tensors, "
                                         "given positionally"):
        ModelTester(model, epochs=1).unit_test(torch.randn(4, 6), None, input_kwargs={"y": 1})


@needs_aidge
def test_model_tester_wraps_with_the_engine():
    from aidge_interop.compare.eclipse_aidge import AidgeModel, AidgeSGD

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    tester = ModelTester(model, engine="aidge", epochs=3, name="mlp", bench_print=False,
                         max_slowdown_ratio=None)
    tester.BENCH_LOG_FILE = None
    tester.test_multiple_step((4, 6))
    assert isinstance(tester.model2, AidgeModel) and isinstance(tester.optimizer2, AidgeSGD)
    stats = tester.performance_stats()
    assert stats["forward"]["samples"] == stats["backward"]["samples"] == 1
    # a given AidgeModel is recognised: its default optimizer is Aidge's SGD
    again = ModelTester(model, AidgeModel(model, [(4, 6)]), epochs=1, bench_print=False)
    assert again.engine == "aidge" and isinstance(again.optimizer2, AidgeSGD)


@needs_aidge
def test_model_tester_on_aidge_sees_a_difference():
    """A weight changed inside Aidge only (its Producer, not the torch
    mirror): the outputs differ and ModelTester says so."""
    import aidge_core
    import numpy as np

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    tester = ModelTester(model, engine="aidge", epochs=1, benchmark=False)
    x = torch.randn(2, 4)
    tester.unit_test(x, None)  # wraps, agrees, trains one step
    producer = tester.model2._producers[0].get_operator().get_output(0)
    changed = aidge_core.Tensor(np.array(producer) + np.float32(0.5))
    changed.set_backend("cpu")
    producer.copy_from(changed)
    with pytest.raises(AssertionError, match="output: Tensor-likes are not close"):
        tester.unit_test(x, None)
