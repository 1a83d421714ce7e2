"""ONNX's own backend node tests, every one of them, run against the engine.

Every CPU node test of the installed onnx package runs; those the engine
does not pass are listed in EXCLUDED with the reason, and run as strict
xfails (an excluded test that starts to pass fails the suite: its entry
goes). docs/engine.md ("What stays out") states the same reasons, operator
by operator. ``python tests/test_onnx_backend.py --report`` prints the
counts; benchmarks/onnx_node_coverage.py the share passed.
"""
import re

import onnx.backend.test
import pytest

from aidge_interop.onnx.backend import AidgeBackend

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

# the Resize cases refused for their mode (the scales cases of them stay out too)
RESIZE_UNSUPPORTED = [p for p in EXCLUDED if p.startswith("test_resize_") and "_scales_" not in p]


def _excluded(name):
    """The reason ``name`` (test_..._cpu) is excluded, or None."""
    return next((why for p, why in EXCLUDED.items() if re.search(p, name)), None)


backend_test = onnx.backend.test.BackendTest(AidgeBackend, __name__)
backend_test.include(r"_cpu$")
OnnxBackendNodeModelTest = backend_test.test_cases["OnnxBackendNodeModelTest"]
for _name in dir(OnnxBackendNodeModelTest):
    if _name.startswith("test_") and (_why := _excluded(_name)):
        setattr(OnnxBackendNodeModelTest, _name,
                pytest.mark.xfail(strict=True, reason=_why)(
                    getattr(OnnxBackendNodeModelTest, _name)))


def test_every_exclusion_names_node_tests():
    """An exclusion that matches no node test is stale."""
    from onnx.backend.test.loader import load_model_tests

    names = [t.name + "_cpu" for t in load_model_tests(kind="node")]
    assert not [p for p in EXCLUDED if not any(re.search(p, n) for n in names)]


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
    """Node tests run and excluded, and the exclusions by reason."""
    import collections

    from onnx.backend.test.loader import load_model_tests

    names = [t.name + "_cpu" for t in load_model_tests(kind="node")]
    reasons = collections.Counter(filter(None, map(_excluded, names)))
    excluded = sum(reasons.values())
    print(f"{len(names) - excluded} of {len(names)} node tests run and pass "
          f"({(len(names) - excluded) / len(names):.1%}); {excluded} excluded:")
    for why, n in reasons.most_common():
        print(f"  {n:4d}  {why}")


if __name__ == "__main__":
    import sys

    if "--report" in sys.argv:
        _report()
