"""Whole networks on torch and on the engine, compared epoch by epoch.

Every model of ``models/`` runs twice: ``<Model>_eval`` (``model.eval()``,
forward only) and ``<Model>_train`` (``model.train()``: batch statistics in
BatchNorm, loss and gradients compared, one SGD step per epoch on each side).
Cases are a plain list of dicts, ``test_cases``, turned into the
``model_test_case`` fixture; a case with ``expected_failure`` is an xfail.

    pytest tests/test_models.py -v -k "LeNet_eval"

Precision. Eval cases and the train cases of LeNet and the perceptron run
in float32. The train cases of the BatchNorm networks run in float64: with
batch statistics over BATCH_SIZE = 4 samples and ReLU kinks, their float32
gradients are ill-conditioned, so much that *torch's own* float32 gradients
miss its float64 gradients at the default tolerances (rtol 1e-3, atol 1e-4)
on random batches: anomaly autoencoder 11/30, DS-CNN 1/30, ResNet-8 1/30,
MobileNet 3/6 (a ReLU after the last strided depthwise BatchNorm flips).
In float32 those cases would measure rounding, not the engine.

Cases are written as upstream's suite writes them: ``"model"`` is a model
instance (``lenet_model.TorchLeNet()``) or a factory that builds one, and
``epochs`` may be left out (ModelTester's default). The fixture works on a
copy of an instance: a train case does not change the weights the next
case starts from.
"""
import copy
import inspect

import pytest
import torch

import aidge_interop
from aidge_interop.testing import ModelTester
from models import anomaly_model, kws_model, lenet_model, mobilenet_model, perceptron_model, \
    resnet_model

BATCH_SIZE = 4

# an instance, as upstream writes cases; the others are factories
_PERCEPTRON = {"model": perceptron_model.perceptron(), "input_size": (BATCH_SIZE, 16),
               "output_size": (BATCH_SIZE, 4)}
_LENET = {"model": lenet_model.lenet, "input_size": (BATCH_SIZE, 1, 32, 32),
          "output_size": (BATCH_SIZE, 10)}
_ANOMALY = {"model": anomaly_model.anomaly_autoencoder, "input_size": (BATCH_SIZE, 640),
            "output_size": (BATCH_SIZE, 640)}
_KWS = {"model": kws_model.ds_cnn, "input_size": (BATCH_SIZE, 1, 49, 10),
        "output_size": (BATCH_SIZE, 12)}
_MOBILENET = {"model": mobilenet_model.mobilenet_v1, "input_size": (BATCH_SIZE, 3, 96, 96),
              "output_size": (BATCH_SIZE, 2)}
_RESNET = {"model": resnet_model.resnet8, "input_size": (BATCH_SIZE, 3, 32, 32),
           "output_size": (BATCH_SIZE, 10)}

# name, model (an instance or a factory), input_size, output_size,
# test_backward (True: train mode), and optional epochs (default: ModelTester's,
# 10), dtype (default float32) and expected_failure. Epochs stay few for the
# big networks: the whole suite runs in about a minute.
test_cases = [
    {"name": "Perceptron_eval", **_PERCEPTRON, "test_backward": False},
    {"name": "Perceptron_train", **_PERCEPTRON, "test_backward": True},
    {"name": "LeNet_eval", **_LENET, "test_backward": False, "epochs": 5},
    {"name": "LeNet_train", **_LENET, "test_backward": True, "epochs": 5},
    {"name": "Anomaly_eval", **_ANOMALY, "test_backward": False, "epochs": 5},
    {"name": "Anomaly_train", **_ANOMALY, "test_backward": True, "epochs": 5,
     "dtype": torch.float64},
    {"name": "KWS_eval", **_KWS, "test_backward": False, "epochs": 3},
    {"name": "KWS_train", **_KWS, "test_backward": True, "epochs": 3, "dtype": torch.float64},
    {"name": "MobileNet_eval", **_MOBILENET, "test_backward": False, "epochs": 3},
    {"name": "MobileNet_train", **_MOBILENET, "test_backward": True, "epochs": 3,
     "dtype": torch.float64},
    {"name": "ResNet_eval", **_RESNET, "test_backward": False, "epochs": 3},
    {"name": "ResNet_train", **_RESNET, "test_backward": True, "epochs": 3,
     "dtype": torch.float64},
]

_REQUIRED = {"name", "model", "input_size", "output_size", "test_backward"}
_OPTIONAL = {"epochs", "dtype", "expected_failure"}
DEFAULT_EPOCHS = inspect.signature(ModelTester).parameters["epochs"].default


def _param(case: dict):
    name = case.get("name", "<unnamed>")
    missing, unknown = _REQUIRED - case.keys(), case.keys() - _REQUIRED - _OPTIONAL
    if missing or unknown:
        raise ValueError(f"test_models.py: case '{name}' has missing key(s) {sorted(missing)} "
                         f"and unknown key(s) {sorted(unknown)}; a case has "
                         f"{sorted(_REQUIRED)} and optionally {sorted(_OPTIONAL)}")
    if not (isinstance(case["model"], torch.nn.Module) or callable(case["model"])):
        raise TypeError(f"test_models.py: case '{name}': 'model' must be a torch.nn.Module "
                        f"or a factory returning one, not {type(case['model']).__name__}")
    marks = ()
    if case.get("expected_failure"):
        marks = pytest.mark.xfail(reason=case["expected_failure"])
    return pytest.param(case, id=name, marks=marks)


def _build(case: dict) -> torch.nn.Module:
    """A fresh model of the case: a copy of its instance, or its factory's."""
    model = case["model"]
    return copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model()


@pytest.fixture(params=[_param(case) for case in test_cases])
def model_test_case(request):
    """The case's dict plus ``torch_model`` (seeded, in the case's mode and
    dtype) and ``aidge_model`` (its :func:`aidge_interop.wrap`)."""
    case = request.param
    torch_model = _build(case).to(case.get("dtype", torch.float32))
    torch_model.train(case["test_backward"])
    aidge_model = aidge_interop.wrap(torch_model, [case["input_size"]])
    return {**case, "torch_model": torch_model, "aidge_model": aidge_model}


def test_model(model_test_case, aidge_max_slowdown):
    case = model_test_case
    assert case["aidge_model"].training == case["torch_model"].training == case["test_backward"]
    tester = ModelTester(
        model1=case["torch_model"],
        model2=case["aidge_model"],
        name=case["name"],
        test_backward=case["test_backward"],
        epochs=case.get("epochs", DEFAULT_EPOCHS),
        max_slowdown_ratio=aidge_max_slowdown,
    )
    tester.test_multiple_step(input_sizes=case["input_size"], label_sizes=case["output_size"])


@pytest.mark.parametrize("case", [c for c in test_cases if not c["test_backward"]],
                         ids=lambda c: c["name"].removesuffix("_eval"))
def test_output_size(case):
    """Each network maps its documented input shape to its documented output
    shape (models.md), at BATCH_SIZE and at batch 1."""
    model = _build(case).eval()
    for batch in (BATCH_SIZE, 1):
        with torch.no_grad():
            out = model(torch.zeros(batch, *case["input_size"][1:]))
        assert tuple(out.shape) == (batch, *case["output_size"][1:])
