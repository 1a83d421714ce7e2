"""Suites written for the upstream harness run on ours with only the import
changed (issue 45): a conftest, a test_operators.py and a test_models.py as
upstream's documentation writes them (``from conftest import OperatorConfig,
...``, ``from utils import ModelTester`` become imports from
``aidge_interop.testing``, ``import aidge_interop_torch`` imports
``aidge_interop``), with operator JSON files as upstream's users wrote them
(a float64 data input, list sweeps, ``data`` values, keys of other tools).
Each suite runs through pytest in a subprocess; the outcomes asserted are
those of the engine compared with torch by ModelTester.

Also: ``aidge_interop.testing`` imports and ModelTester runs without pytest
installed; a pytest-only function then says it needs pytest.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aidge_interop

REPO = Path(aidge_interop.__file__).resolve().parent.parent

# -- the upstream-style suite ------------------------------------------------------

# upstream's conftest.py held the framework; now it imports it
CONFTEST = '''
from aidge_interop.testing import (INCLUDE_FORWARD_ONLY_CASES, SUPPORTED_ATTRS,  # noqa: F401
                                   OperatorCase, OperatorConfig, build_cases,
                                   make_operator_fixture)
'''

OPERATORS_INIT = '''
from .avgpooling2d import AvgPoolingModel
from .fc import FCModel
from .scaled import ScaledModel
'''

# the AvgPool2d wrapper of upstream's documentation, verbatim
AVGPOOLING2D = '''
from torch import nn


class AvgPoolingModel(nn.Module):
    def __init__(
        self,
        kernel_size=(3, 3),
        stride=(2, 2),
        padding=(0, 0),
        ceil_mode=False,
        count_include_pad=True,
    ):
        super().__init__()
        self.pool = nn.AvgPool2d(
            kernel_size=kernel_size,
            stride=stride,
            padding=padding,
            ceil_mode=ceil_mode,
            count_include_pad=count_include_pad,
        )

    def forward(self, x):
        return self.pool(x)
'''

FC = '''
import torch
from torch import nn


class FCModel(nn.Module):
    def __init__(self, in_features, out_features, bias=True, bias_values=None):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)
        if bias and bias_values is not None:
            with torch.no_grad():
                self.fc.bias.copy_(torch.tensor(bias_values))

    def forward(self, x):
        return self.fc(x)
'''

# deliberately wrong: what torch exports (and the engine runs) is not what
# torch computes, as an engine bug would make it
SCALED = '''
import torch
from torch import nn


class ScaledModel(nn.Module):
    def forward(self, x):
        return x * (2.0 if torch.onnx.is_in_onnx_export() else 3.0)
'''

AVGPOOLING2D_JSON = {  # benchmark_ok, a float64 data input, a case key of another tool
    "operation": "AvgPooling2D",
    "base_configuration": {
        "attributes": {"kernel_dims": [2, 2], "stride_dims": [2, 2], "dilations": [1, 1]},
        "input_specs": [{"name": "data_input", "shape": [2, 3, 8, 8], "dtype": "float64"}],
    },
    "test_configurations": {
        "ok": {
            "attr": {
                "kernel_3": {"attributes": {"kernel_dims": [3, 3]}, "comment": "odd kernel"},
                "pad_3": {"attributes": {"padding_dims": [3, 3]},
                          "expected_failure": "torch takes a padding of half the kernel at most"},
            },
            "shape": {"wide": {"input_specs": [{"name": "data_input", "shape": [2, 3, 6, 12]}]}},
        },
        "ko": {"attr": {"floor": {"attributes": {"rounding_mode": "floor"}}}},
    },
}

FC_JSON = {  # benchmark_flat with list sweeps, data, and a key of the engine's benchmarks
    "operation": "FC",
    "opset_version": 21,
    "base_configuration": {
        "input_specs": [
            {"name": "data_input", "shape": [4, 6], "dtype": "float32"},
            {"name": "weight", "shape": [3, 6]},
            {"name": "bias", "data": [0.5, -1.0, 2.0]},
        ],
    },
    "test_configurations": {
        "attributes": {"no_bias": {"attributes": {"no_bias": True}}},
        "sweeps": {
            "data_input": [[1, 6], [5, 6]],
            "in_f64": [{"input_specs": [{"name": "data_input", "dtype": "float64"}]}],
        },
    },
}

TEST_OPERATORS = '''
from pathlib import Path

from aidge_interop.testing import ModelTester   # upstream: from utils import ModelTester
from conftest import OperatorCase, OperatorConfig, make_operator_fixture
from operators import AvgPoolingModel, FCModel, ScaledModel

CONFIG_ROOT = Path(__file__).parent / "configs"


def fc_extractor(merged_specs):
    specs = {spec["name"]: spec for spec in merged_specs}
    out_features, in_features = specs["weight"]["shape"]
    return {"in_features": in_features, "out_features": out_features,
            "bias_values": specs["bias"]["data"]}


AVGPOOLING_CONFIG = OperatorConfig(
    name="AvgPooling2D",
    json_path=CONFIG_ROOT / "avgpooling2d.json",
    op_class=AvgPoolingModel,
    ignored_attrs=frozenset(
        {
            "rounding_mode",  # Aidge-specific
            "dilations",  # not used by AvgPool
        }
    ),
)
FC_CONFIG = OperatorConfig(
    name="FC",
    json_path=CONFIG_ROOT / "fc.json",
    op_class=FCModel,
    specs_to_kwargs=fc_extractor,
)
SCALED_CONFIG = OperatorConfig(
    name="Scaled",
    op_class=ScaledModel,
    manual_cases=[OperatorCase(id="Scaled_2d", op_class=ScaledModel, torch_kwargs={},
                               input_size=(2, 5), test_backward=False)],
)

avgpooling_case = make_operator_fixture(AVGPOOLING_CONFIG)
fc_case = make_operator_fixture(FC_CONFIG)
scaled_case = make_operator_fixture(SCALED_CONFIG)


def run(case):
    tester = ModelTester(
        model1=case["torch_model"],
        model2=case["aidge_model"],
        name=case["name"],
        test_backward=case["test_backward"],
        epochs=3,
        benchmark=False,
    )
    tester.test_multiple_step(input_sizes=case["input_size"], label_sizes=case["output_size"])
    print("RAN", case["name"], tester.dtype)


def test_AvgPooling2D_interop(avgpooling_case):
    run(avgpooling_case)


def test_FC_interop(fc_case):
    run(fc_case)


def test_Scaled_interop(scaled_case):
    run(scaled_case)
'''

TEST_MODELS = '''
import pytest
import torch

import aidge_interop as aidge_interop_torch    # upstream: import aidge_interop_torch
from aidge_interop.testing import ModelTester  # upstream: from utils import ModelTester
from models import perceptron_model

BATCH_SIZE = 4

test_cases = [
    {
        "name": "Perceptron_eval",
        "model": perceptron_model.TorchPerceptron(),
        "input_size": (BATCH_SIZE, 16),
        "output_size": (BATCH_SIZE, 4),
        "test_backward": False,
    },
    {
        "name": "Perceptron_train",
        "model": perceptron_model.TorchPerceptron(),
        "input_size": (BATCH_SIZE, 16),
        "output_size": (BATCH_SIZE, 4),
        "test_backward": True,
    },
    {
        "name": "Perceptron_bad_labels",
        "model": perceptron_model.TorchPerceptron(),
        "input_size": (BATCH_SIZE, 16),
        "output_size": (BATCH_SIZE, 7),
        "test_backward": True,
        "expected_failure": "output_size is not the model's",
    },
]


def _param(case):
    marks = ()
    if "expected_failure" in case:
        marks = pytest.mark.xfail(reason=case["expected_failure"])
    return pytest.param(case, id=case["name"], marks=marks)


@pytest.fixture(params=[_param(case) for case in test_cases])
def model_test_case(request):
    case = request.param
    model = case["model"]
    model.train(case["test_backward"])
    aidge_model = aidge_interop_torch.wrap(model, [case["input_size"]])
    return {**case, "torch_model": model, "aidge_model": aidge_model}


def test_model(model_test_case):
    tester = ModelTester(
        model1=model_test_case["torch_model"],
        model2=model_test_case["aidge_model"],
        name=model_test_case["name"],
        test_backward=model_test_case["test_backward"],
        benchmark=False,
    )
    tester.test_multiple_step(
        input_sizes=model_test_case["input_size"],
        label_sizes=model_test_case["output_size"],
    )
    print("EPOCHS", model_test_case["name"], tester.epochs)
'''

PERCEPTRON = '''
import torch


class TorchPerceptron(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sequence = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.sequence(x)
'''


@pytest.fixture
def upstream_suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.mkpydir("operators")
    pytester.mkpydir("models")
    for path, text in {"operators/__init__.py": OPERATORS_INIT,
                       "operators/avgpooling2d.py": AVGPOOLING2D, "operators/fc.py": FC,
                       "operators/scaled.py": SCALED,
                       "models/perceptron_model.py": PERCEPTRON,
                       "test_operators.py": TEST_OPERATORS,
                       "test_models.py": TEST_MODELS}.items():
        (pytester.path / path).write_text(textwrap.dedent(text))
    configs = pytester.mkdir("configs")
    (configs / "avgpooling2d.json").write_text(json.dumps(AVGPOOLING2D_JSON, indent=2))
    (configs / "fc.json").write_text(json.dumps(FC_JSON, indent=2))
    return pytester


def run(pytester, *args):
    """pytest in a subprocess (torch cannot be imported twice in one
    interpreter), without unrelated plugins."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                         "-p", "no:benchmark", "-p", "no:xdist", *args)


def test_upstream_operator_suite(upstream_suite):
    result = run(upstream_suite, "test_operators.py", "-v", "-rA")
    # the engine agrees with torch on every real case; the wrong one fails
    result.assert_outcomes(passed=5, xfailed=1, failed=1)
    result.stdout.fnmatch_lines_random([
        "*test_AvgPooling2D_interop?AvgPooling2D_attr_kernel_3? PASSED*",
        "*test_AvgPooling2D_interop?AvgPooling2D_attr_pad_3? XFAIL*",
        "*test_FC_interop?FC_attributes_no_bias? PASSED*",
        "*test_FC_interop?FC_sweeps_data_input_1_6? PASSED*",
        "*test_FC_interop?FC_sweeps_data_input_5_6? PASSED*",
        "*test_FC_interop?FC_sweeps_in_f64_0? PASSED*",
        "*test_Scaled_interop?Scaled_2d? FAILED*",
        # float64 where the data input says so, with and without parameters
        "*RAN AvgPooling2D_attr_kernel_3 torch.float64",
        "*RAN FC_sweeps_in_f64_0 torch.float64",
        "*RAN FC_sweeps_data_input_5_6 torch.float32",
        "*Scaled_2d, epoch 1/3, output: Tensor-likes are not close!",
        # keys of other tools: warnings naming the file and the key
        f"*OperatorConfigWarning: {upstream_suite.path}/configs/avgpooling2d.json: "
        "test_configurations.ok.attr.kernel_3.comment: unknown key 'comment' ignored*",
        f"*OperatorConfigWarning: {upstream_suite.path}/configs/fc.json: opset_version: "
        "unknown key 'opset_version' ignored*",
    ])
    assert "AvgPooling2D_shape_wide" not in result.stdout.str()  # forward-only: dropped

    # upstream's workflow: pytest ... -v | tee results.txt; analyze_results.py results.txt
    (upstream_suite.path / "results.txt").write_text(result.stdout.str())
    analyzed = subprocess.run([sys.executable, "-m", "aidge_interop.analyze", "results.txt",
                               "--json"], cwd=upstream_suite.path, capture_output=True,
                              text=True, timeout=120)
    report = json.loads(analyzed.stdout)
    assert report["counts"] == {"passed": 5, "failed": 1, "xfailed": 1, "warnings": 2}
    assert [(bug["nodeid"], bug["category"]) for bug in report["engine_bugs"]] == [
        ("test_operators.py::test_Scaled_interop[Scaled_2d]", "outputs_differ")]
    assert [xfail["nodeid"] for xfail in report["expected_failures"]] == [
        "test_operators.py::test_AvgPooling2D_interop[AvgPooling2D_attr_pad_3]"]


def test_upstream_operator_suite_with_the_conftest_toggle(upstream_suite):
    (upstream_suite.path / "conftest.py").write_text(CONFTEST
                                                     + "\nINCLUDE_FORWARD_ONLY_CASES = True\n")
    result = run(upstream_suite, "test_operators.py", "-v", "-k", "AvgPooling2D")
    result.assert_outcomes(passed=2, xfailed=1)
    result.stdout.fnmatch_lines(["*AvgPooling2D_shape_wide* PASSED*"])


def test_upstream_model_suite(upstream_suite):
    result = run(upstream_suite, "test_models.py", "-v", "-rA")
    result.assert_outcomes(passed=2, xfailed=1)
    result.stdout.fnmatch_lines_random(["*EPOCHS Perceptron_eval 10",
                                        "*EPOCHS Perceptron_train 10"])


def test_the_operator_data_reaches_the_model(upstream_suite):
    """The bias values of fc.json set the model's bias (specs_to_kwargs), in
    the torch model and in the engine's."""
    (upstream_suite.path / "test_data.py").write_text(textwrap.dedent('''
        import torch
        from test_operators import fc_case  # noqa: F401

        def test_bias(fc_case):
            if fc_case["name"] == "FC_attributes_no_bias":
                assert fc_case["torch_model"].fc.bias is None
                return
            expected = torch.tensor([0.5, -1.0, 2.0], dtype=fc_case["dtype"])
            assert torch.equal(fc_case["torch_model"].fc.bias, expected)
            assert torch.equal(dict(fc_case["aidge_model"].named_parameters())["fc.bias"],
                               expected)
            assert fc_case["input_specs"][2] == {"name": "bias", "data": [0.5, -1.0, 2.0],
                                                 "shape": [3]}
        '''))
    result = run(upstream_suite, "test_data.py")
    result.assert_outcomes(passed=4)


# -- without pytest ------------------------------------------------------------------

BLOCKER = '''
import sys


class _NoPytest:
    """pytest is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pytest", "_pytest"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoPytest())
'''

WITHOUT_PYTEST = '''
import sys
from pathlib import Path

import torch

import aidge_interop
from aidge_interop.testing import *  # noqa: F403
from aidge_interop.testing import ModelTester, OperatorConfig, build_cases, make_operator_fixture

try:
    import pytest  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    sys.exit("pytest is importable: the blocker did not work")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Tanh())
tester = ModelTester(model, aidge_interop.wrap(model, [(1, 8)]), name="no_pytest", epochs=2,
                     benchmark=False)
tester.test_multiple_step(input_sizes=(3, 8), label_sizes=(3, 5))
print("checked", len(tester.checks), "tensors")

cfg = OperatorConfig(name="Op", op_class=torch.nn.Identity, json_path=Path(sys.argv[1]))
print("cases", [case.id for case in build_cases(cfg)])
try:
    make_operator_fixture(cfg)
except ModuleNotFoundError as exc:
    print("error:", exc)
'''


def test_the_harness_works_without_pytest(tmp_path):
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    (tmp_path / "check.py").write_text(WITHOUT_PYTEST)
    (tmp_path / "op.json").write_text(json.dumps({"a": {"input_size": [2, 3]}}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "blocker"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "check.py", "op.json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # outputs, loss, input gradient and 2 parameter gradients, at the last epoch
    assert proc.stdout.splitlines() == [
        "checked 5 tensors",
        "cases ['Op_a']",
        "error: make_operator_fixture needs pytest, which is not installed "
        "(pip install pytest)",
    ]
