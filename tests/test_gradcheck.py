"""Every differentiable operator's backward against central finite differences
of its own forward, in float64 — independent of torch. (ShiftGELU/ShiftMax
are not here: their floors are straight-through, so their gradient is not the
derivative of their forward; test_ops_shift.py checks them against torch.)"""
import numpy as np
import pytest

import aidge_interop
from op_harness import make_model

R = np.random.default_rng(42)


def x(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, shape)


def i64(*v):
    return np.array(v, np.int64)


# name: (op_type, inputs, attrs, consts, domain)
CASES = {
    "Relu": ("Relu", {"x": x(3, 4)}, {}, {}),
    "LeakyRelu": ("LeakyRelu", {"x": x(3, 4)}, {"alpha": 0.3}, {}),
    "Sigmoid": ("Sigmoid", {"x": x(3, 4)}, {}, {}),
    "Tanh": ("Tanh", {"x": x(3, 4)}, {}, {}),
    "Gelu": ("Gelu", {"x": x(3, 4)}, {}, {}),
    "Gelu_tanh": ("Gelu", {"x": x(3, 4)}, {"approximate": "tanh"}, {}),
    "Erf": ("Erf", {"x": x(3, 4)}, {}, {}),
    "Sqrt": ("Sqrt", {"x": x(3, 4, lo=0.5)}, {}, {}),
    "Log": ("Log", {"x": x(3, 4, lo=0.5)}, {}, {}),
    "Reciprocal": ("Reciprocal", {"x": x(3, 4, lo=0.5)}, {}, {}),
    "Exp": ("Exp", {"x": x(3, 4)}, {}, {}),
    "Softplus": ("Softplus", {"x": x(3, 4)}, {}, {}),
    "HardSwish": ("HardSwish", {"x": x(3, 4, lo=-4, hi=4)}, {}, {}),
    "HardSigmoid": ("HardSigmoid", {"x": x(3, 4, lo=-4, hi=4)}, {}, {}),
    "Elu": ("Elu", {"x": x(3, 4)}, {"alpha": 0.7}, {}),
    "Selu": ("Selu", {"x": x(3, 4)}, {}, {}),
    "Celu": ("Celu", {"x": x(3, 4)}, {"alpha": 1.3}, {}),
    "Sin": ("Sin", {"x": x(3, 4)}, {}, {}),
    "Cos": ("Cos", {"x": x(3, 4)}, {}, {}),
    "Atan": ("Atan", {"x": x(3, 4)}, {}, {}),
    "Tan": ("Tan", {"x": x(3, 4, lo=-1.2, hi=1.2)}, {}, {}),
    "Asin": ("Asin", {"x": x(3, 4, lo=-0.9, hi=0.9)}, {}, {}),
    "Acos": ("Acos", {"x": x(3, 4, lo=-0.9, hi=0.9)}, {}, {}),
    "Sinh": ("Sinh", {"x": x(3, 4)}, {}, {}),
    "Cosh": ("Cosh", {"x": x(3, 4)}, {}, {}),
    "Asinh": ("Asinh", {"x": x(3, 4)}, {}, {}),
    "Acosh": ("Acosh", {"x": x(3, 4, lo=1.1, hi=4)}, {}, {}),
    "Atanh": ("Atanh", {"x": x(3, 4, lo=-0.9, hi=0.9)}, {}, {}),
    "Softsign": ("Softsign", {"x": x(3, 4)}, {}, {}),
    "Mish": ("Mish", {"x": x(3, 4)}, {}, {}),
    "ThresholdedRelu": ("ThresholdedRelu", {"x": x(3, 4)}, {"alpha": 0.3}, {}),
    "Shrink": ("Shrink", {"x": x(3, 4)}, {"lambd": 0.3, "bias": 0.2}, {}),
    "PRelu": ("PRelu", {"x": x(2, 3, 4), "slope": x(3, 1)}, {}, {}),
    "Mod": ("Mod", {"a": x(3, 4, lo=-5, hi=5), "b": x(4, lo=0.5, hi=2)}, {"fmod": 1}, {}),
    "Mod_floor": ("Mod", {"a": x(3, 4, lo=-5, hi=5), "b": x(4, lo=-2, hi=-0.5)}, {}, {}),
    "Mean": ("Mean", {"a": x(2, 3, 4), "b": x(3, 1), "c": x(4)}, {}, {}),
    "Add_bcast": ("Add", {"a": x(2, 3, 4), "b": x(3, 1)}, {}, {}),
    "Sub_bcast": ("Sub", {"a": x(2, 3, 4), "b": x(4)}, {}, {}),
    "Mul_bcast": ("Mul", {"a": x(2, 3, 4), "b": x(1, 3, 1)}, {}, {}),
    "Div_bcast": ("Div", {"a": x(2, 3, 4), "b": x(4, lo=0.5)}, {}, {}),
    "Pow": ("Pow", {"a": x(3, 4, lo=0.5), "b": x(4)}, {}, {}),
    "Gemm": ("Gemm", {"a": x(3, 5), "b": x(4, 5), "c": x(4)},
             {"transB": 1, "alpha": 0.7, "beta": 1.3}, {}),
    "MatMul_batched": ("MatMul", {"a": x(2, 3, 5), "b": x(5, 4)}, {}, {}),
    "Conv": ("Conv", {"x": x(2, 4, 6, 5), "w": x(6, 2, 3, 2), "b": x(6)},
             {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]}, {}),
    "ConvTranspose": ("ConvTranspose", {"x": x(2, 4, 3, 3), "w": x(4, 3, 3, 3), "b": x(3)},
                      {"strides": [2, 2], "output_padding": [1, 0]}, {}),
    "MaxPool": ("MaxPool", {"x": x(2, 3, 6, 6)},
                {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, {}),
    "AveragePool": ("AveragePool", {"x": x(2, 3, 5, 5)},
                    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, {}),
    "GlobalAveragePool": ("GlobalAveragePool", {"x": x(2, 3, 4, 4)}, {}, {}),
    "LpPool": ("LpPool", {"x": x(2, 3, 5, 5)},
               {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 1], "p": 3}, {}),
    "MaxUnpool": ("MaxUnpool", {"x": x(1, 2, 2, 2)}, {"kernel_shape": [2, 2], "strides": [2, 2]},
                  {"i": np.array([[[[0, 3], [9, 14]], [[16, 22], [25, 31]]]], np.int64)}),
    "GridSample_cubic": ("GridSample", {"x": x(1, 2, 4, 3), "g": x(1, 3, 2, 2, lo=-1.2, hi=1.2)},
                         {"mode": "cubic", "padding_mode": "reflection"}, {}),
    "GridSample_linear": ("GridSample", {"x": x(2, 2, 3, 4, 3),
                                         "g": x(2, 2, 3, 2, 3, lo=-1.2, hi=1.2)},
                          {"padding_mode": "border", "align_corners": 1}, {}),
    "Resize_cubic": ("Resize", {"x": x(1, 2, 4, 5)},
                     {"mode": "cubic", "exclude_outside": 1, "antialias": 1},
                     {"roi": np.zeros(0), "scales": np.array([1, 1, 0.6, 1.5], np.float32)}),
    "Col2Im": ("Col2Im", {"x": x(1, 8, 6)}, {"strides": [2, 1], "pads": [1, 0, 0, 1]},
               {"image": i64(4, 3), "block": i64(2, 2)}),
    "GlobalMaxPool": ("GlobalMaxPool", {"x": x(2, 3, 4, 4)}, {}, {}),
    "BatchNormalization_eval": ("BatchNormalization", {"x": x(3, 4, 5), "s": x(4), "b": x(4)},
                                {}, {"m": x(4), "v": x(4, lo=0.5)}),
    "LayerNormalization": ("LayerNormalization", {"x": x(3, 4, 5), "s": x(5), "b": x(5)},
                           {"axis": -1}, {}),
    "InstanceNormalization": ("InstanceNormalization",
                              {"x": x(2, 3, 4), "s": x(3), "b": x(3)}, {"epsilon": 0.01}, {}),
    "Softmax": ("Softmax", {"x": x(3, 5)}, {"axis": -1}, {}),
    "LogSoftmax": ("LogSoftmax", {"x": x(3, 5)}, {"axis": 0}, {}),
    "ReduceMean": ("ReduceMean", {"x": x(3, 4, 5)}, {"keepdims": 0}, {"axes": i64(1)}),
    "ReduceSum": ("ReduceSum", {"x": x(3, 4, 5)}, {"keepdims": 1}, {"axes": i64(0, 2)}),
    "ReduceMax": ("ReduceMax", {"x": x(3, 4, 5)}, {"keepdims": 0}, {"axes": i64(2)}),
    "ReduceProd": ("ReduceProd", {"x": x(3, 4, 5)}, {"keepdims": 0}, {"axes": i64(0, 2)}),
    "ReduceL1": ("ReduceL1", {"x": x(3, 4)}, {}, {"axes": i64(1)}),
    "ReduceL2": ("ReduceL2", {"x": x(3, 4, 5)}, {"keepdims": 0}, {"axes": i64(1)}),
    "ReduceSumSquare": ("ReduceSumSquare", {"x": x(3, 4)}, {}, {"axes": i64(0)}),
    "ReduceLogSum": ("ReduceLogSum", {"x": x(3, 4, lo=0.5)}, {}, {"axes": i64(1)}),
    "ReduceLogSumExp": ("ReduceLogSumExp", {"x": x(3, 4, 5)}, {}, {"axes": i64(2, 0)}),
    "Transpose": ("Transpose", {"x": x(2, 3, 4)}, {"perm": [2, 0, 1]}, {}),
    "Reshape": ("Reshape", {"x": x(2, 3, 4)}, {}, {"shape": i64(4, -1)}),
    "Concat": ("Concat", {"a": x(2, 3), "b": x(2, 4)}, {"axis": 1}, {}),
    "Slice": ("Slice", {"x": x(5, 6)}, {}, {"starts": i64(4, 1), "ends": i64(0, 6),
                                             "axes": i64(0, 1), "steps": i64(-2, 2)}),
    "Gather": ("Gather", {"x": x(5, 3)}, {"axis": 0}, {"idx": i64(0, 4, 0, -1)}),
    "Expand": ("Expand", {"x": x(3, 1)}, {}, {"shape": i64(2, 3, 4)}),
    "Tile": ("Tile", {"x": x(2, 3)}, {}, {"repeats": i64(2, 3)}),
    "Trilu": ("Trilu", {"x": x(3, 4)}, {"upper": 0}, {"k": np.array(1, np.int64)}),
    "GatherElements": ("GatherElements", {"x": x(3, 4)}, {"axis": 1},
                       {"i": np.array([[0, 3, 3], [1, 1, 0], [2, 0, 3]], np.int64)}),
    "CumSum": ("CumSum", {"x": x(3, 4)}, {"exclusive": 1, "reverse": 1}, {"axis": i64(1)}),
    "CumProd": ("CumProd", {"x": x(3, 4)}, {}, {"axis": i64(1)}),
    "CumProd_exclusive_reverse": ("CumProd", {"x": x(3, 4)}, {"exclusive": 1, "reverse": 1},
                                  {"axis": i64(0)}),
    "LpNormalization_p1": ("LpNormalization", {"x": x(3, 4)}, {"p": 1, "axis": 0}, {}),
    "LpNormalization_p2": ("LpNormalization", {"x": x(3, 4, 2)}, {"axis": 1}, {}),
    "MeanVarianceNormalization": ("MeanVarianceNormalization", {"x": x(2, 3, 2, 2)}, {}, {}),
    "LRN": ("LRN", {"x": x(2, 5, 2, 3)}, {"size": 3, "alpha": 0.4, "beta": 0.7, "bias": 1.2}, {}),
    "MeanVarianceNormalization_axes": ("MeanVarianceNormalization", {"x": x(3, 4, 2)},
                                       {"axes": [1, -1]}, {}),
    "DepthToSpace": ("DepthToSpace", {"x": x(1, 8, 2, 3)}, {"blocksize": 2}, {}),
    "SpaceToDepth": ("SpaceToDepth", {"x": x(1, 2, 4, 2)}, {"blocksize": 2}, {}),
    "Pad_reflect": ("Pad", {"x": x(2, 4, 5)}, {"mode": "reflect"},
                    {"pads": i64(0, 1, 2, 0, 2, 1)}),
    "Where": ("Where", {"a": x(3, 4), "b": x(4)}, {},
              {"c": R.integers(0, 2, (3, 4)).astype(bool)}),
    # weights as inputs: the mean's divisor depends on them; class 1 ignored
    "NegativeLogLikelihoodLoss": ("NegativeLogLikelihoodLoss",
                                  {"x": x(3, 4, 2), "w": x(4, lo=0.5, hi=2.0)},
                                  {"ignore_index": 1}, {"t": R.integers(0, 4, (3, 2))}),
    "SoftmaxCrossEntropyLoss": ("SoftmaxCrossEntropyLoss",
                                {"x": x(3, 4, 2), "w": x(4, lo=0.5, hi=2.0)},
                                {"ignore_index": 1}, {"t": R.integers(0, 4, (3, 2))}),
}

# input orders where the consts are not last
ORDER = {"Where": ["c", "a", "b"], "NegativeLogLikelihoodLoss": ["x", "t", "w"],
         "SoftmaxCrossEntropyLoss": ["x", "t", "w"]}


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_matches_finite_differences(name):
    op_type, inputs, attrs, consts = CASES[name]
    model = make_model(op_type, inputs, attrs, consts, input_order=ORDER.get(name))
    if op_type not in aidge_interop.supported_operators():
        pytest.fail(f"{op_type} is not an engine operator")
    g = aidge_interop.load_onnx(model, param_kinds={n: "const" for n in consts})
    names = list(inputs)
    values = [inputs[n].copy() for n in names]
    (y,) = g.forward(values, need_backward=True, input_grads=True)
    gy = R.standard_normal(y.shape)
    analytic = g.backward([gy])
    h = 1e-6
    for k, n in enumerate(names):
        numeric = np.zeros_like(values[k])
        flat = values[k].reshape(-1)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + h
            (yp,) = g.forward(values)
            flat[i] = old - h
            (ym,) = g.forward(values)
            flat[i] = old
            numeric.reshape(-1)[i] = np.sum(gy * (yp - ym)) / (2 * h)
        np.testing.assert_allclose(analytic[k], numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: gradient of input '{n}'")
