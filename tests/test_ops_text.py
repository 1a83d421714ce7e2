"""TfIdfVectorizer (csrc/ops/text.c) against onnx.reference on random token
rows and pools: every mode, skips, gram lengths, weights, repeated n-grams."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from aidge_interop import load_onnx


def _model(attrs, dtype, shape):
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "tfidf", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])


@pytest.mark.parametrize("seed", range(12))
def test_random_pools_against_onnx_reference(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 6))  # few ids: n-grams repeat in rows and pools
    sizes = [int(rng.integers(1, 5)) for _ in range(3)]  # n-grams of length 1, 2, 3
    pool, counts = [], []
    for n, k in enumerate(sizes, start=1):
        counts.append(len(pool))
        pool += rng.integers(0, vocab, k * n).tolist()
    n_grams = sum(sizes)
    min_n = int(rng.integers(1, 4))
    attrs = dict(mode=["TF", "IDF", "TFIDF"][seed % 3], min_gram_length=min_n,
                 max_gram_length=int(rng.integers(min_n, 4)),
                 max_skip_count=int(rng.integers(0, 3)), ngram_counts=counts,
                 ngram_indexes=rng.permutation(n_grams).tolist(), pool_int64s=pool)
    if seed % 2 or attrs["mode"] != "TF":  # (onnx.reference needs weights for IDF, TFIDF)
        attrs["weights"] = rng.uniform(0.5, 2, n_grams).round(3).tolist()
    dtype, np_dtype = (TensorProto.INT32, np.int32) if seed % 4 < 2 else \
        (TensorProto.INT64, np.int64)
    shape = [int(rng.integers(1, 4)), int(rng.integers(1, 12))] if seed % 3 else \
        [int(rng.integers(1, 12))]
    x = rng.integers(0, vocab, shape).astype(np_dtype)
    model = _model(attrs, dtype, shape)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    (got,) = load_onnx(model).forward([x])
    np.testing.assert_array_equal(got, want)


def test_string_pools_are_refused_by_name():
    model = _model(dict(mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0,
                        ngram_counts=[0], ngram_indexes=[0], pool_strings=["a"]),
                   TensorProto.INT64, [3])
    with pytest.raises(NotImplementedError, match="TfIdfVectorizer.*pool_strings: the engine "
                                                  "has no string tensors"):
        load_onnx(model)
