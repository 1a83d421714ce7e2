"""Operator suite: each operator, one at a time, on torch and on the engine.

Every operator is declared once as an ``OperatorConfig`` (its JSON file in
``configs/`` and its module in ``operators/``), turned into a parametrized
fixture by ``make_operator_fixture`` and driven by ``ModelTester``: outputs,
and for training cases loss, input gradients and parameter gradients, over
``EPOCHS`` SGD steps in lock-step.

    pytest test_operators.py -v                                   # all operators
    pytest test_operators.py -v -k Conv2D                         # one operator
    pytest test_operators.py -v -k Conv2D_attributes_kernel_square  # one case
"""
from pathlib import Path

import pytest

import aidge_interop
from aidge_interop.testing import ModelTester, OperatorConfig, make_operator_fixture
from operators import (
    AddModel, AvgPoolingModel, BatchNormModel, Conv2DModel, ConvDepthwise2DModel,
    ConvTranspose2DModel, FCModel, GELUModel, GlobalAvgPoolModel, LayerNormModel,
    LeakyReLUModel, MaxPool2DModel, MulModel, PadModel, ReduceMeanModel, ReduceSumModel,
    ReLUModel, ShiftGELUModel, ShiftMaxModel, SigmoidModel, SoftmaxModel, SubModel, TanhModel,
)

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"
EPOCHS = 3


def check_interop(case):
    """Runs ``ModelTester`` on one case of the operator fixture; the engine
    trains with the fixture's optimizer, torch with an SGD of the same
    hyper-parameters."""
    tester = ModelTester(
        model1=case["torch_model"],
        model2=case["aidge_model"],
        name=case["name"],
        test_backward=case["test_backward"],
        epochs=EPOCHS,
        cuda=case["cuda"],
        benchmark=True,
        optimizer2=case["optimizer"],
        max_slowdown_ratio=case["max_slowdown_ratio"],
    )
    tester.test_multiple_step(input_sizes=case["input_size"], label_sizes=case["output_size"])


# -- specs_to_kwargs: constructor arguments read from the JSON input specs --------

def _shapes(specs):
    return {spec["name"]: spec["shape"] for spec in specs}


def conv_kwargs(specs):
    """Conv weight is (out, in / groups, kH, kW)."""
    return {"in_channels": specs[0]["shape"][1], "out_channels": _shapes(specs)["weight"][0]}


def depthwise_kwargs(specs):
    return {"channels": specs[0]["shape"][1], "out_channels": _shapes(specs)["weight"][0]}


def conv_transpose_kwargs(specs):
    """ConvTranspose weight is (in, out / groups, kH, kW): out comes from the bias."""
    return {"in_channels": specs[0]["shape"][1], "out_channels": _shapes(specs)["bias"][0]}


def fc_kwargs(specs):
    """FC weight is (out_features, in_features)."""
    out_features, in_features = _shapes(specs)["weight"]
    return {"in_features": in_features, "out_features": out_features}


def other_operand_kwargs(specs):
    return {"other_shape": tuple(_shapes(specs)["other"])}


def batchnorm_kwargs(specs):
    return {"num_features": specs[0]["shape"][1]}


def layernorm_kwargs(specs):
    return {"normalized_shape": tuple(_shapes(specs)["scale"])}


# -- configurations -------------------------------------------------------------------

MAXPOOL2D_CONFIG = OperatorConfig(
    name="MaxPool2D", op_class=MaxPool2DModel, json_path=CONFIG_ROOT / "maxpool2d.json")
AVGPOOLING2D_CONFIG = OperatorConfig(
    name="AvgPooling2D", op_class=AvgPoolingModel, json_path=CONFIG_ROOT / "avgpooling2d.json")
GLOBALAVGPOOL_CONFIG = OperatorConfig(
    name="GlobalAvgPool", op_class=GlobalAvgPoolModel,
    json_path=CONFIG_ROOT / "globalavgpool.json")
RELU_CONFIG = OperatorConfig(
    name="ReLU", op_class=ReLUModel, json_path=CONFIG_ROOT / "relu.json")
LEAKYRELU_CONFIG = OperatorConfig(
    name="LeakyReLU", op_class=LeakyReLUModel, json_path=CONFIG_ROOT / "leakyrelu.json")
SIGMOID_CONFIG = OperatorConfig(
    name="Sigmoid", op_class=SigmoidModel, json_path=CONFIG_ROOT / "sigmoid.json")
TANH_CONFIG = OperatorConfig(
    name="Tanh", op_class=TanhModel, json_path=CONFIG_ROOT / "tanh.json")
GELU_CONFIG = OperatorConfig(
    name="GELU", op_class=GELUModel, json_path=CONFIG_ROOT / "gelu.json")
SOFTMAX_CONFIG = OperatorConfig(
    name="Softmax", op_class=SoftmaxModel, json_path=CONFIG_ROOT / "softmax.json")
CONV2D_CONFIG = OperatorConfig(
    name="Conv2D", op_class=Conv2DModel, json_path=CONFIG_ROOT / "conv2d.json",
    specs_to_kwargs=conv_kwargs)
CONVDEPTHWISE2D_CONFIG = OperatorConfig(
    name="ConvDepthwise2D", op_class=ConvDepthwise2DModel,
    json_path=CONFIG_ROOT / "convdepthwise2d.json", specs_to_kwargs=depthwise_kwargs)
CONVTRANSPOSE2D_CONFIG = OperatorConfig(
    name="ConvTranspose2D", op_class=ConvTranspose2DModel,
    json_path=CONFIG_ROOT / "convtranspose2d.json", specs_to_kwargs=conv_transpose_kwargs)
FC_CONFIG = OperatorConfig(
    name="FC", op_class=FCModel, json_path=CONFIG_ROOT / "fc.json", specs_to_kwargs=fc_kwargs)
REDUCEMEAN_CONFIG = OperatorConfig(
    name="ReduceMean", op_class=ReduceMeanModel, json_path=CONFIG_ROOT / "reducemean.json")
REDUCESUM_CONFIG = OperatorConfig(
    name="ReduceSum", op_class=ReduceSumModel, json_path=CONFIG_ROOT / "reducesum.json")
ADD_CONFIG = OperatorConfig(
    name="Add", op_class=AddModel, json_path=CONFIG_ROOT / "add.json",
    specs_to_kwargs=other_operand_kwargs)
MUL_CONFIG = OperatorConfig(
    name="Mul", op_class=MulModel, json_path=CONFIG_ROOT / "mul.json",
    specs_to_kwargs=other_operand_kwargs)
SUB_CONFIG = OperatorConfig(
    name="Sub", op_class=SubModel, json_path=CONFIG_ROOT / "sub.json",
    specs_to_kwargs=other_operand_kwargs)
BATCHNORM_CONFIG = OperatorConfig(
    name="BatchNorm", op_class=BatchNormModel, json_path=CONFIG_ROOT / "batchnorm.json",
    specs_to_kwargs=batchnorm_kwargs)
LAYERNORM_CONFIG = OperatorConfig(
    name="LayerNorm", op_class=LayerNormModel, json_path=CONFIG_ROOT / "layernorm.json",
    specs_to_kwargs=layernorm_kwargs)
PAD_CONFIG = OperatorConfig(
    name="Pad", op_class=PadModel, json_path=CONFIG_ROOT / "pad.json")
SHIFTGELU_CONFIG = OperatorConfig(
    name="ShiftGeLU", op_class=ShiftGELUModel, json_path=CONFIG_ROOT / "shiftgelu.json")
SHIFTMAX_CONFIG = OperatorConfig(
    name="ShiftMax", op_class=ShiftMaxModel, json_path=CONFIG_ROOT / "shiftmax.json")

maxpool2d_case = make_operator_fixture(MAXPOOL2D_CONFIG)
avgpooling2d_case = make_operator_fixture(AVGPOOLING2D_CONFIG)
globalavgpool_case = make_operator_fixture(GLOBALAVGPOOL_CONFIG)
relu_case = make_operator_fixture(RELU_CONFIG)
leakyrelu_case = make_operator_fixture(LEAKYRELU_CONFIG)
sigmoid_case = make_operator_fixture(SIGMOID_CONFIG)
tanh_case = make_operator_fixture(TANH_CONFIG)
gelu_case = make_operator_fixture(GELU_CONFIG)
softmax_case = make_operator_fixture(SOFTMAX_CONFIG)
conv2d_case = make_operator_fixture(CONV2D_CONFIG)
convdepthwise2d_case = make_operator_fixture(CONVDEPTHWISE2D_CONFIG)
convtranspose2d_case = make_operator_fixture(CONVTRANSPOSE2D_CONFIG)
fc_case = make_operator_fixture(FC_CONFIG)
reducemean_case = make_operator_fixture(REDUCEMEAN_CONFIG)
reducesum_case = make_operator_fixture(REDUCESUM_CONFIG)
add_case = make_operator_fixture(ADD_CONFIG)
mul_case = make_operator_fixture(MUL_CONFIG)
sub_case = make_operator_fixture(SUB_CONFIG)
batchnorm_case = make_operator_fixture(BATCHNORM_CONFIG)
layernorm_case = make_operator_fixture(LAYERNORM_CONFIG)
pad_case = make_operator_fixture(PAD_CONFIG)
shiftgelu_case = make_operator_fixture(SHIFTGELU_CONFIG)
shiftmax_case = make_operator_fixture(SHIFTMAX_CONFIG)


# -- tests ------------------------------------------------------------------------------

def test_MaxPool2D_interop(maxpool2d_case):
    check_interop(maxpool2d_case)


def test_AvgPooling2D_interop(avgpooling2d_case):
    check_interop(avgpooling2d_case)


def test_GlobalAvgPool_interop(globalavgpool_case):
    check_interop(globalavgpool_case)


def test_ReLU_interop(relu_case):
    check_interop(relu_case)


def test_LeakyReLU_interop(leakyrelu_case):
    check_interop(leakyrelu_case)


def test_Sigmoid_interop(sigmoid_case):
    check_interop(sigmoid_case)


def test_Tanh_interop(tanh_case):
    check_interop(tanh_case)


def test_GELU_interop(gelu_case):
    check_interop(gelu_case)


def test_Softmax_interop(softmax_case):
    check_interop(softmax_case)


def test_Conv2D_interop(conv2d_case):
    check_interop(conv2d_case)


def test_ConvDepthwise2D_interop(convdepthwise2d_case):
    check_interop(convdepthwise2d_case)


def test_ConvTranspose2D_interop(convtranspose2d_case):
    check_interop(convtranspose2d_case)


def test_FC_interop(fc_case):
    check_interop(fc_case)


def test_ReduceMean_interop(reducemean_case):
    check_interop(reducemean_case)


def test_ReduceSum_interop(reducesum_case):
    check_interop(reducesum_case)


def test_Add_interop(add_case):
    check_interop(add_case)


def test_Mul_interop(mul_case):
    check_interop(mul_case)


def test_Sub_interop(sub_case):
    check_interop(sub_case)


def test_BatchNorm_interop(batchnorm_case):
    check_interop(batchnorm_case)


def test_LayerNorm_interop(layernorm_case):
    check_interop(layernorm_case)


def test_Pad_interop(pad_case):
    check_interop(pad_case)


def test_ShiftGeLU_interop(shiftgelu_case):
    check_interop(shiftgelu_case)


def test_ShiftMax_interop(shiftmax_case):
    check_interop(shiftmax_case)


@pytest.mark.parametrize("op_class, op_type", [(ShiftGELUModel, "ShiftGELU"),
                                               (ShiftMaxModel, "ShiftMax")],
                         ids=["ShiftGeLU", "ShiftMax"])
def test_shift_operators_export_as_one_aidge_node(op_class, op_type):
    engine = aidge_interop.wrap(op_class(), [(2, 3, 17)])
    assert [(node.op_type, node.domain) for node in engine.onnx_model.graph.node] == [
        (op_type, "aidge")]
