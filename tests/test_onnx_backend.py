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

# name regex -> reason: what the engine leaves out, each a real limitation
# or a deliberate difference (docs/engine.md, "What stays out").
EXCLUDED = {
    # out of scope
    r"test_.*(string|STRING|strnormalizer|regex_full_match|label_encoder)":
        "string tensors: the engine's tensors hold numbers (text goes in as token ids)",
    r"test_image_decoder_": "ImageDecoder needs image codecs (JPEG, PNG, TIFF, WebP ...)",
    # random draws: matched in distribution (tests/test_ops_random.py), not in values
    r"test_bernoulli": "the expected values are NumPy's random draws; the engine has its own "
        "generator (checked by distribution)",
    r"test_training_dropout(_default)?(_mask)?_cpu": "Dropout in training draws its mask from "
        "the engine's generator, not NumPy's",
    # deliberate differences
    r"test_batchnorm_.*training_mode": "running variance is updated with the unbiased batch "
        "variance, like torch; ONNX's reference uses the biased one",
    r"test_resize_downsample_scales_(linear|cubic)_align_corners": "align_corners over the "
        "output's integer length, as torch and ONNX Runtime; ONNX's reference uses the "
        "fractional length in * scale",
    r"test_maxunpool_export_with_output_shape": "MaxUnpool's indices count in output_shape, "
        "as torch and ONNX Runtime (MaxPool then MaxUnpool round trip); ONNX's reference "
        "counts them in the unpooled shape",
    r"test_dft_inverse(_opset19)?_cpu": "the expected values carry NumPy's float32 FFT "
        "rounding (1.9e-7 where the exact value is 0, over the test's atol 1e-7); the engine "
        "computes in float64",
    r"test_attention_4d_causal_fp16_expanded": "the expected values come from NumPy rounding "
        "to float16 after every step; the engine (as torch and ONNX Runtime) rounds once per "
        "operator of the function body: one element is 1.2e-3 off for an rtol of 1e-3 (the "
        "native Attention passes)",
    # limits of the engine's static graphs
    r"test_range_(float|float16|bfloat16)_type_positive_delta_expanded": "the expanded "
        "Range's Loop count comes from float graph inputs; the engine needs it when planning "
        "and reads only integer and bool inputs then (float ones may need gradients)",
    r"test_(if_opt|loop16_seq_none|optional_has_element_empty_optional_input)": "an optional "
        "that is empty at run time, or built in a subgraph: the engine's optionals are known "
        "at import",
    r"test_einsum_batch_diagonal": "Einsum with a letter twice in one operand (a diagonal)",
}


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
            not _excluded(t.name + "_cpu")]


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
