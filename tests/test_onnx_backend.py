"""ONNX's own backend node tests, run against the engine.

Only the node tests of the operators the engine claims are included (the
explicit table below); the cases we do not pass are excluded by name with
the reason. ``python tests/test_onnx_backend.py --report`` prints the pass
rate per operator.
"""
import re

import onnx.backend.test
import pytest

from aidge_interop.backend import AidgeBackend

# operator -> regex of its node test names (test_<name>_cpu)
OPERATOR_TESTS = {
    "Abs": r"test_abs", "Add": r"test_add(_bcast)?", "Ceil": r"test_ceil",
    "Clip": r"test_clip", "Cast": r"test_cast_(FLOAT|DOUBLE|INT|UINT8|BOOL)",
    "Div": r"test_div(_bcast|_example)?", "Dropout": r"test_dropout",
    "Equal": r"test_equal", "Erf": r"test_erf", "Exp": r"test_exp",
    "Floor": r"test_floor", "Gelu": r"test_gelu", "Greater": r"test_greater(_bcast)?$",
    "Identity": r"test_identity$", "LeakyRelu": r"test_leakyrelu", "Less": r"test_less(_bcast)?$",
    "Log": r"test_log(_example)?$", "Max": r"test_max_", "Min": r"test_min_",
    "Mul": r"test_mul", "Neg": r"test_neg", "Pow": r"test_pow", "Reciprocal": r"test_reciprocal",
    "Relu": r"test_relu", "Round": r"test_round", "Sigmoid": r"test_sigmoid",
    "Softplus": r"test_softplus", "Sqrt": r"test_sqrt", "Sub": r"test_sub", "Tanh": r"test_tanh",
    "Where": r"test_where",
}

# name regex -> reason. Each is a real limitation of the engine.
EXCLUDED = {
    r"test_(add|sub|mul|div|max|min|pow|equal|less|greater|clip|abs|neg)_.*u?int(8|16|32)":
        "small integer dtypes: engine arithmetic is float32/float64/int32/int64",
    r"test_.*_uint(16|32|64)": "uint16/32/64 are not engine dtypes",
    r"test_.*(bfloat16|float8|FLOAT8|BFLOAT16|INT4|UINT4|FLOAT4|_e4m3|_e5m2|STRING|int4|uint4)":
        "bfloat16, float8, 4-bit and string dtypes are not engine dtypes",
    r"test_(max|min)_(one|three)_input": "Min/Max with other than two inputs",
    r"test_(max|min)_float16": "float16 arithmetic is not supported (float16 is storage only)",
    r"test_(clip|abs|neg|add|sub|mul|div)_.*float16": "float16 arithmetic is not supported",
    r"test_dropout_default_mask": "Dropout's training-mode RNG is not bit-compatible",
    r"test_dropout_random": "Dropout's training-mode RNG is not bit-compatible",
    r"test_training_dropout": "Dropout's training-mode RNG is not bit-compatible",
    r"test_pow_types_int": "Pow of an integer base with a float exponent (mixed types)",
}

backend_test = onnx.backend.test.BackendTest(AidgeBackend, __name__)
for pattern in OPERATOR_TESTS.values():
    backend_test.include(rf"^{pattern}.*_cpu$")
for pattern in EXCLUDED:
    backend_test.exclude(pattern)

globals().update(backend_test.test_cases)
