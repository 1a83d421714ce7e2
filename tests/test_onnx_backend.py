"""ONNX's own backend node tests, run against the engine.

Only the node tests of the operators the engine claims are included (the
explicit table below); the cases we do not pass are excluded by name with
the reason. ``python tests/test_onnx_backend.py --report`` prints the pass
rate per operator.
"""
import re

import onnx.backend.test
import pytest

from aidge_interop.onnx.backend import AidgeBackend

# operator -> regex of its node test names (test_<name>_cpu)
OPERATOR_TESTS = {
    "Abs": r"test_abs", "Add": r"test_add(_bcast)?", "AveragePool": r"test_averagepool_",
    "BatchNormalization": r"test_batchnorm_", "Cast": r"test_cast_(FLOAT|DOUBLE|INT|UINT8|BOOL)",
    "Ceil": r"test_ceil", "Clip": r"test_clip", "Concat": r"test_concat_",
    "Constant": r"test_constant$", "ConstantOfShape": r"test_constantofshape_",
    "Conv": r"test_conv_", "ConvTranspose": r"test_convtranspose",
    "Div": r"test_div(_bcast|_example)?", "Dropout": r"test_dropout",
    "Equal": r"test_equal", "Erf": r"test_erf", "Exp": r"test_exp", "Expand": r"test_expand_",
    "Flatten": r"test_flatten_", "Floor": r"test_floor", "Gather": r"test_gather_(?!elements)",
    "Gelu": r"test_gelu", "Gemm": r"test_gemm_", "GlobalAveragePool": r"test_globalaveragepool",
    "GlobalMaxPool": r"test_globalmaxpool", "Greater": r"test_greater(_bcast)?$",
    "Identity": r"test_identity$", "LayerNormalization": r"test_layer_normalization_",
    "LeakyRelu": r"test_leakyrelu", "Less": r"test_less(_bcast)?$",
    "Log": r"test_log(_example)?$", "LogSoftmax": r"test_logsoftmax_",
    "MatMul": r"test_matmul_", "Max": r"test_max_", "MaxPool": r"test_maxpool_",
    "Min": r"test_min_", "Mul": r"test_mul", "Neg": r"test_neg",
    "Pad": r"test_(constant|reflect|edge|wrap)_pad", "Pow": r"test_pow",
    "Reciprocal": r"test_reciprocal", "ReduceMax": r"test_reduce_max_",
    "ReduceMean": r"test_reduce_mean_", "ReduceMin": r"test_reduce_min_",
    "ReduceSum": r"test_reduce_sum_(?!square)", "Relu": r"test_relu", "Reshape": r"test_reshape_",
    "Round": r"test_round", "Shape": r"test_shape", "Sigmoid": r"test_sigmoid",
    "Slice": r"test_slice", "Softmax": r"test_softmax_", "Softplus": r"test_softplus",
    "Split": r"test_split_(?!to_sequence)", "Sqrt": r"test_sqrt", "Squeeze": r"test_squeeze(?!net)",
    "Sub": r"test_sub", "Tanh": r"test_tanh", "Transpose": r"test_transpose_",
    "CastLike": r"test_castlike_(FLOAT|DOUBLE)_to_(FLOAT|DOUBLE)", "Size": r"test_size",
    "Sum": r"test_sum_",
    "Unsqueeze": r"test_unsqueeze", "Where": r"test_where",
    "HardSwish": r"test_hardswish", "HardSigmoid": r"test_hardsigmoid", "Elu": r"test_elu",
    "Selu": r"test_selu", "Celu": r"test_celu", "Sin": r"test_sin(_example)?(?=_cpu)",
    "Cos": r"test_cos(_example)?(?=_cpu)", "Atan": r"test_atan(_example)?(?=_cpu)",
    "Sign": r"test_sign", "Mod": r"test_mod_", "PRelu": r"test_prelu",
    "InstanceNormalization": r"test_instancenorm", "Resize": r"test_resize_",
    "ReduceProd": r"test_reduce_prod_", "ReduceL1": r"test_reduce_l1_",
    "ReduceL2": r"test_reduce_l2_", "ReduceSumSquare": r"test_reduce_sum_square_",
    "ReduceLogSum": r"test_reduce_log_sum_(?!exp)",
    "ReduceLogSumExp": r"test_reduce_log_sum_exp_", "Tile": r"test_tile",
    "DepthToSpace": r"test_depthtospace", "SpaceToDepth": r"test_spacetodepth",
    "Not": r"test_not_", "And": r"test_and", "Or": r"test_or", "Xor": r"test_xor",
    "IsNaN": r"test_isnan", "IsInf": r"test_isinf", "ArgMax": r"test_argmax_",
    "ArgMin": r"test_argmin_", "CumSum": r"test_cumsum_", "Trilu": r"test_tri[lu]",
    "GatherElements": r"test_gather_elements", "TopK": r"test_top_k",
    "LSTM": r"test_lstm_", "GRU": r"test_gru_", "RNN": r"test_(simple_rnn|rnn_seq)",
    "Einsum": r"test_einsum_", "Range": r"test_range_", "LessOrEqual": r"test_less_equal",
    "GreaterOrEqual": r"test_greater_equal", "GatherND": r"test_gathernd_",
    "ScatterND": r"test_scatternd", "Loop": r"test_loop", "If": r"test_if",
    "NegativeLogLikelihoodLoss": r"test_nllloss_", "SoftmaxCrossEntropyLoss": r"test_sce_",
    "Tan": r"test_tan(_example)?(?=_cpu)", "Asin": r"test_asin", "Acos": r"test_acos",
    "Atanh": r"test_atanh", "Asinh": r"test_asinh", "Acosh": r"test_acosh",
    "Sinh": r"test_sinh", "Cosh": r"test_cosh", "Softsign": r"test_softsign",
    "Mish": r"test_mish", "Swish": r"test_swish", "ThresholdedRelu": r"test_thresholdedrelu",
    "Shrink": r"test_shrink", "Mean": r"test_mean_", "BitwiseAnd": r"test_bitwise_and_",
    "BitwiseOr": r"test_bitwise_or_", "BitwiseXor": r"test_bitwise_xor_",
    "BitwiseNot": r"test_bitwise_not_", "BitShift": r"test_bitshift_",
    "CumProd": r"test_cumprod_", "Hardmax": r"test_hardmax_",
    "LpNormalization": r"test_lpnormalization_", "MeanVarianceNormalization": r"test_mvn",
    "EyeLike": r"test_eyelike_", "OneHot": r"test_onehot_",
}

# name regex -> reason. Each is a real limitation of the engine.
EXCLUDED = {
    r"test_.*_uint(16|32|64)": "uint16/32/64 are not engine dtypes",
    r"test_bitwise_(.*_ui64|not_3d)": "uint64 and uint16 (bitwise_not_3d's input) are not "
        "engine dtypes",
    r"test_.*(bfloat16|float8|FLOAT8|BFLOAT16|INT4|UINT4|INT2|UINT2|FLOAT4|_e4m3|_e5m2|STRING|"
    r"string|int4|uint4)": "bfloat16, float8, 2- and 4-bit and string dtypes are not engine dtypes",
    r"test_(max|min)_float16": "float16 arithmetic is not supported (float16 is storage only)",
    r"test_(clip|abs|neg|add|sub|mul|div|mod|celu)_.*float16":
        "float16 arithmetic is not supported",
    r"test_maxpool_2d_uint8": "pools take float32/float64",
    r"test_maxpool_with_argmax_2d_precomputed_strides":
        "MaxPool Indices in column-major order (storage_order=1)",
    r"test_convtranspose_output_shape": "ConvTranspose output_shape larger than the input can "
        "give (zero-extension) is refused",
    r"test_dropout_default_mask": "Dropout's training-mode RNG is not bit-compatible",
    r"test_dropout_random": "Dropout's training-mode RNG is not bit-compatible",
    r"test_training_dropout": "Dropout's training-mode RNG is not bit-compatible",
    r"test_pow_types_int": "Pow of an integer base with a float exponent (mixed types)",
    r"test_batchnorm_.*training_mode": "running variance is updated with the unbiased batch "
        "variance, like torch; ONNX's reference uses the biased one",
    r"test_lstm_with_peepholes": "LSTM peepholes (input P) are refused",
    r"test_einsum_batch_diagonal": "Einsum with a letter twice in one operand (a diagonal) "
        "is refused",
    r"test_resize_.*cubic": "Resize mode 'cubic' is not supported",
    r"test_resize_tf_crop_and_resize": "Resize tf_crop_and_resize is not supported",
    r"test_resize_.*antialias": "Resize antialias is not supported",
    r"test_(loop13_seq|loop16_seq_none|if_seq|if_opt)": "sequence and optional types "
        "(loop-carried sequences, branches that give one) are not engine types",
    r"test_range_float_type_positive_delta_expanded": "the expanded Range's Loop has a scan "
        "output and a trip count computed from float graph inputs: the engine needs it when "
        "planning, and reads only integer and bool inputs then (float ones may need gradients)",
    r"test_range_float16": "float16 arithmetic is not supported (float16 is storage only)",
    r"test_resize_.*_scales_": "scales is a graph input there, the output shape must be known "
        "at plan time (exporters write a constant): test_resize_with_constant_scales runs them",
}

# the Resize modes the engine refuses (the scales cases of them stay out too)
RESIZE_UNSUPPORTED = [p for p in EXCLUDED if p.startswith("test_resize_") and "_scales_" not in p]
assert len(RESIZE_UNSUPPORTED) == 3, RESIZE_UNSUPPORTED

backend_test = onnx.backend.test.BackendTest(AidgeBackend, __name__)
for pattern in OPERATOR_TESTS.values():
    backend_test.include(rf"^{pattern}.*_cpu$")
for pattern in EXCLUDED:
    backend_test.exclude(pattern)

globals().update(backend_test.test_cases)


def _resize_scales_cases():
    from onnx.backend.test.loader import load_model_tests

    return [t for t in load_model_tests(kind="node")
            if re.match(r"test_resize_.*_scales_", t.name) and
            not any(re.search(p, t.name + "_cpu") for p in RESIZE_UNSUPPORTED)
            and t.name not in RESIZE_REFERENCE_ONLY]


# ONNX's reference computes align_corners over the fractional length in *
# scale (4 * 0.6 = 2.4: x * 3 / 1.4); torch and ONNX Runtime, like the
# engine, over the output's integer length (x * 3 / 1)
RESIZE_REFERENCE_ONLY = {"test_resize_downsample_scales_linear_align_corners"}


@pytest.mark.parametrize("case", _resize_scales_cases(), ids=lambda t: t.name)
def test_resize_with_constant_scales(case):
    """ONNX's Resize node tests whose scales are a graph input, with scales
    (and roi) made initializers, as exporters write them."""
    import copy

    import numpy as np
    from onnx import numpy_helper

    from aidge_interop import load_onnx

    model = copy.deepcopy(case.model)
    ins, (want,) = case.data_sets[0]
    graph = model.graph
    for inp, value in list(zip(graph.input, ins))[1:]:
        graph.initializer.append(numpy_helper.from_array(value, inp.name))
    keep = graph.input[0]
    del graph.input[:]
    graph.input.append(keep)
    (got,) = load_onnx(model, param_kinds={i.name: "const" for i in graph.initializer}) \
        .forward([ins[0]])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _report():
    """Per operator: node tests run and excluded (with the reasons)."""
    from onnx.backend.test.loader import load_model_tests

    names = [t.name for t in load_model_tests(kind="node")]
    total_run = total_excl = 0
    print(f"{'operator':<20}{'run':>5}{'excluded':>10}")
    for op, pattern in OPERATOR_TESTS.items():
        matched = [n for n in names if re.match(rf"^{pattern}", n)]
        excluded = [n for n in matched if any(re.search(p, n + "_cpu") for p in EXCLUDED)]
        total_run += len(matched) - len(excluded)
        total_excl += len(excluded)
        print(f"{op:<20}{len(matched) - len(excluded):>5}{len(excluded):>10}")
    share = total_run / (total_run + total_excl)
    print(f"{'total':<20}{total_run:>5}{total_excl:>10}   ({share:.1%} of the node tests of "
          "these operators run; every one that runs must pass)")


if __name__ == "__main__":
    import sys

    if "--report" in sys.argv:
        _report()
