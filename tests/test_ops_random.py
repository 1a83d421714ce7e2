"""The random operators (csrc/ops/random.c): RandomUniform, RandomNormal,
their Like forms, Multinomial and Bernoulli. Their draws cannot match numpy's, so the tests check
the distribution: a Kolmogorov-Smirnov test against the exact CDF at the
0.1% level, each class frequency within five standard errors, with fixed
seeds (deterministic); and the seed: the same seed gives the same values
in a graph built again, every forward new ones."""
import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import aidge_interop

N = 20000


def random_model(op_type, inputs=(), opset=22, **attrs):
    """One ``op_type`` node named 'r' reading float inputs ``[(name, shape)]``."""
    node = helper.make_node(op_type, [n for n, _ in inputs], ["y"], name="r", **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def draw(model, *inputs):
    return aidge_interop.load_onnx(model).forward(list(inputs))[0]


def assert_follows(sample, cdf, what):
    """Kolmogorov-Smirnov: the sample's largest distance to ``cdf`` within
    the 0.1% critical value."""
    x = np.sort(np.asarray(sample, np.float64).ravel())
    n = x.size
    f = np.array([cdf(v) for v in x])
    d = max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))
    critical = math.sqrt(-math.log(0.001 / 2) / 2) / math.sqrt(n)
    assert d < critical, f"{what}: KS distance {d:.4f} over {critical:.4f} ({n} values)"


def uniform_cdf(low, high):
    return lambda v: min(max((v - low) / (high - low), 0.0), 1.0)


def normal_cdf(mean, scale):
    return lambda v: 0.5 * (1 + math.erf((v - mean) / (scale * math.sqrt(2))))


@pytest.mark.parametrize("dtype, np_dtype", [(TensorProto.FLOAT, np.float32),
                                             (TensorProto.DOUBLE, np.float64),
                                             (TensorProto.FLOAT16, np.float16)])
def test_random_uniform(dtype, np_dtype):
    y = draw(random_model("RandomUniform", shape=[N // 100, 100], low=-2.0, high=3.0,
                          dtype=dtype, seed=1.0))
    assert y.shape == (N // 100, 100) and y.dtype == np_dtype
    assert y.min() >= -2.0 and y.max() <= 3.0
    if np_dtype != np.float16:  # (float16's rounding steps are visible to the test)
        assert_follows(y, uniform_cdf(-2.0, 3.0), "RandomUniform")


@pytest.mark.parametrize("dtype, np_dtype", [(TensorProto.FLOAT, np.float32),
                                             (TensorProto.DOUBLE, np.float64)])
def test_random_normal(dtype, np_dtype):
    y = draw(random_model("RandomNormal", shape=[N], mean=1.5, scale=0.5, dtype=dtype,
                          seed=2.0))
    assert y.shape == (N,) and y.dtype == np_dtype
    assert_follows(y, normal_cdf(1.5, 0.5), "RandomNormal")


def test_like_forms_take_the_input_shape_and_dtype():
    x = np.zeros((40, 500), np.float32)
    y = draw(random_model("RandomUniformLike", [("x", x.shape)], low=1.0, high=2.0), x)
    assert y.shape == x.shape and y.dtype == np.float32
    assert_follows(y, uniform_cdf(1.0, 2.0), "RandomUniformLike")
    y = draw(random_model("RandomNormalLike", [("x", x.shape)], scale=3.0,
                          dtype=TensorProto.DOUBLE), x)
    assert y.shape == x.shape and y.dtype == np.float64
    assert_follows(y, normal_cdf(0.0, 3.0), "RandomNormalLike")


def test_seed_repeats_run_to_run_and_each_forward_draws_anew():
    model = random_model("RandomNormal", shape=[64], seed=7.0)
    g1, g2 = aidge_interop.load_onnx(model), aidge_interop.load_onnx(model)
    first, second = g1.forward([])[0], g1.forward([])[0]
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(g2.forward([])[0], first)
    np.testing.assert_array_equal(g2.forward([])[0], second)
    other = draw(random_model("RandomNormal", shape=[64], seed=8.0))
    assert not np.array_equal(other, first)
    # without a seed: the graph's seed, mixed with the node's name
    unseeded = random_model("RandomNormal", shape=[64])
    np.testing.assert_array_equal(draw(unseeded), draw(unseeded))
    assert not np.array_equal(draw(unseeded), first)


def test_multinomial_frequencies():
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.0, 0.0, 0.3]])
    logits = np.log(np.maximum(p, 1e-300)).astype(np.float32) + 5.0  # unnormalised
    model = random_model("Multinomial", [("x", p.shape)], sample_size=N, seed=3.0)
    y = draw(model, logits)
    assert y.shape == (2, N) and y.dtype == np.int32
    for row, probs in zip(y, p):
        freq = np.bincount(row, minlength=4) / N
        bound = 5 * np.sqrt(probs * (1 - probs) / N)
        assert np.all(np.abs(freq - probs) <= bound), (freq, probs)
    y64 = draw(random_model("Multinomial", [("x", p.shape)], dtype=TensorProto.INT64), logits)
    assert y64.shape == (2, 1) and y64.dtype == np.int64


@pytest.mark.parametrize("in_dtype, dtype, np_dtype", [
    (np.float32, None, np.float32), (np.float32, TensorProto.INT64, np.int64),
    (np.float32, TensorProto.BOOL, np.bool_), (np.float16, None, np.float16),
    (np.float64, TensorProto.FLOAT, np.float32)])
def test_bernoulli_frequencies(in_dtype, dtype, np_dtype):
    """1 with the input's probability (ONNX's function body for Bernoulli,
    Greater(RandomUniformLike(p), p), gives 1 - p: the engine's is native)."""
    probs = np.tile(np.array([0.0, 0.25, 0.5, 0.9, 1.0], in_dtype), (N // 5, 1))
    attrs = {} if dtype is None else {"dtype": dtype}
    model = random_model("Bernoulli", [("x", probs.shape)], seed=4.0, **attrs)
    model.graph.input[0].type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(
        probs.dtype)
    y = draw(model, probs)
    assert y.dtype == np_dtype and set(np.unique(y.astype(np.float64))) <= {0.0, 1.0}
    freq = y.astype(np.float64).mean(axis=0)
    expected = probs[0]
    bound = 5 * np.sqrt(expected * (1 - expected) / probs.shape[0])
    assert np.all(np.abs(freq - expected) <= bound), (freq, expected)


def test_random_values_take_no_gradient():
    """x + RandomNormalLike(x): the gradient of x is the output's alone."""
    node_r = helper.make_node("RandomNormalLike", ["x"], ["r"], seed=5.0)
    node_y = helper.make_node("Add", ["x", "r"], ["y"])
    graph = helper.make_graph([node_r, node_y], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g = aidge_interop.load_onnx(helper.make_model(graph,
                                                  opset_imports=[helper.make_opsetid("", 22)]))
    g.forward([np.ones((3, 4), np.float32)], input_grads=True)
    gy = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(g.backward([gy])[0], gy)


@pytest.mark.parametrize("model, message", [
    (random_model("RandomUniform"), "RandomUniform node 'r': the shape attribute is missing"),
    (random_model("RandomNormal", shape=[2], dtype=TensorProto.INT32),
     "RandomNormal node 'r': dtype 6 is not supported (float16, float32 or float64)"),
    (random_model("Multinomial", [("x", [2, 3])], dtype=TensorProto.FLOAT),
     "Multinomial node 'r': dtype 1 is not supported (int32 or int64)"),
    (random_model("Multinomial", [("x", [2, 3])], sample_size=0),
     "Multinomial node 'r': sample_size is 0; at least 1 expected"),
])
def test_bad_attributes_are_refused_by_name(model, message):
    with pytest.raises((ValueError, NotImplementedError)) as info:
        aidge_interop.load_onnx(model).forward([np.zeros((2, 3), np.float32)][:len(
            model.graph.input)])
    assert message in str(info.value)


def test_like_of_integers_needs_a_dtype():
    node = helper.make_node("RandomUniformLike", ["x"], ["y"], name="r")
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g = aidge_interop.load_onnx(helper.make_model(graph,
                                                  opset_imports=[helper.make_opsetid("", 22)]))
    with pytest.raises(TypeError, match="RandomUniformLike node 'r': the input is int64 and no "
                                        "dtype is given"):
        g.forward([np.arange(3)])
