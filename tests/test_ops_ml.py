"""The ai.onnx.ml operators over numbers (csrc/ops/ml.c) against
onnx.reference: ArrayFeatureExtractor, Binarizer, and TreeEnsemble on
random forests (every comparison mode, set membership, NaN routing, every
aggregation)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from aidge_interop import load_onnx

ML = "ai.onnx.ml"


def _model(node, inputs, opset_ml):
    graph = helper.make_graph([node], "ml", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid(ML, opset_ml)])


def _check(model, feeds):
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    (got,) = load_onnx(model).forward(list(feeds.values()))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("shape, idx", [([5], [3, 0]), ([2, 3, 4], [[1, 1, 3]]), ([3, 4], [2])])
def test_array_feature_extractor(shape, idx):
    vi = helper.make_tensor_value_info
    model = _model(helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain=ML),
                   [vi("x", TensorProto.FLOAT, shape), vi("i", TensorProto.INT64, None)], 1)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    _check(model, {"x": x, "i": np.array(idx, np.int64)})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_binarizer(dtype):
    onnx_dtype = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = _model(helper.make_node("Binarizer", ["x"], ["y"], domain=ML, threshold=0.5),
                   [helper.make_tensor_value_info("x", onnx_dtype, [3, 4])], 1)
    x = (np.random.default_rng(1).standard_normal([3, 4]) * 3).astype(dtype)
    _check(model, {"x": x})


def _forest(rng, n_trees, n_features, n_targets, depth):
    """Random trees written as TreeEnsemble's attributes."""
    a = {k: [] for k in ("nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids",
                         "nodes_trueleafs", "nodes_falseleafs", "leaf_targetids",
                         "nodes_missing_value_tracks_true", "tree_roots")}
    splits, modes, weights, members = [], [], [], []

    def grow(d):
        """A node (returns its index, False) or a leaf (its index, True)."""
        if d == 0 or rng.random() < 0.2:
            weights.append(float(rng.normal()))
            a["leaf_targetids"].append(int(rng.integers(n_targets)))
            return len(weights) - 1, True
        i = len(splits)
        mode = int(rng.integers(7))
        splits.append(float(rng.normal()) if mode < 4 else float(rng.integers(-2, 3)))
        modes.append(mode)
        if mode == 6:  # (no 0 in a set: onnx.reference's reading of the sets ends one there)
            members.extend(sorted(set(rng.choice([-2, -1, 1, 2], 2).tolist())) + [np.nan])
        for k in ("nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids",
                  "nodes_trueleafs", "nodes_falseleafs", "nodes_missing_value_tracks_true"):
            a[k].append(0)
        a["nodes_featureids"][i] = int(rng.integers(n_features))
        a["nodes_missing_value_tracks_true"][i] = int(rng.integers(2))
        for side in ("true", "false"):
            j, leaf = grow(d - 1)
            a[f"nodes_{side}nodeids"][i], a[f"nodes_{side}leafs"][i] = j, int(leaf)
        return i, False

    for _ in range(n_trees):
        root, leaf = grow(depth)
        if leaf:  # a root is a node: a one-leaf tree is a node with both branches on it
            i = len(splits)
            splits.append(0.0)
            modes.append(0)
            for k, v in (("nodes_featureids", 0), ("nodes_truenodeids", root),
                         ("nodes_falsenodeids", root), ("nodes_trueleafs", 1),
                         ("nodes_falseleafs", 1), ("nodes_missing_value_tracks_true", 0)):
                a[k].append(v)
            root = i
        a["tree_roots"].append(root)
    a["nodes_splits"] = numpy_helper.from_array(np.array(splits, np.float32))
    a["nodes_modes"] = numpy_helper.from_array(np.array(modes, np.uint8))
    a["leaf_weights"] = numpy_helper.from_array(np.array(weights, np.float32))
    if members:
        a["membership_values"] = numpy_helper.from_array(np.array(members, np.float32))
    return a


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_tree_ensemble_random_forests(seed, aggregate):
    rng = np.random.default_rng(seed)
    attrs = _forest(rng, n_trees=4, n_features=3, n_targets=2, depth=4)
    node = helper.make_node("TreeEnsemble", ["x"], ["y"], domain=ML, n_targets=2,
                            aggregate_function=aggregate, **attrs)
    model = _model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])], 5)
    x = rng.integers(-2, 3, (40, 3)).astype(np.float32)  # ties: ==, != and sets matter
    x[rng.random(x.shape) < 0.1] = np.nan
    _check(model, {"x": x})
