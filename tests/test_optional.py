"""ONNX optionals known at import (aidge_interop/onnx/optional.py): Optional,
OptionalHasElement, OptionalGetElement and optional graph inputs, against
NumPy (ONNX's reference returns Optional(x) as a list, which Relu cannot
read, and passes no empty optional to Clip) or ONNX's reference
implementation; the forms that need run-time optionals, refused by name."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import aidge_interop

F = TensorProto.FLOAT
FLOAT_TYPE = helper.make_tensor_type_proto(F, [3])


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None)
                               for n in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _check(model, feeds):
    expected = ReferenceEvaluator(model).run(None, feeds)
    g = aidge_interop.load_onnx(model)
    got = g.forward([feeds[n] for n in g.input_names])
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, np.asarray(b))
        assert a.dtype == np.asarray(b).dtype


X = helper.make_tensor_value_info("x", F, [3])


def _run(nodes, outputs, x):
    return aidge_interop.load_onnx(_model(nodes, [X], outputs)).forward([x])


def test_present_optional():
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["v"]),
             helper.make_node("Relu", ["v"], ["y"])]
    x = np.array([-1, 0, 2], np.float32)
    has, y = _run(nodes, ["has", "y"], x)
    assert has.dtype == np.bool_ and has.shape == () and has
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_empty_optional_is_false_and_an_absent_input():
    nodes = [helper.make_node("Optional", [], ["o"], type=FLOAT_TYPE),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalHasElement", [], ["none"]),
             helper.make_node("Constant", [], ["lo"], value_float=0.5),
             helper.make_node("Clip", ["x", "lo", "o"], ["y"])]  # no max: o is empty
    x = np.array([-1, 0, 2], np.float32)
    has, none, y = _run(nodes, ["has", "none", "y"], x)
    assert has.shape == () and not has and none.shape == () and not none
    np.testing.assert_array_equal(y, np.maximum(x, 0.5))


def test_optional_graph_input_is_a_present_tensor():
    inp = helper.make_value_info("x", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(F, [3])))
    nodes = [helper.make_node("OptionalHasElement", ["x"], ["has"]),
             helper.make_node("OptionalGetElement", ["x"], ["v"]),
             helper.make_node("Neg", ["v"], ["y"])]
    model = _model(nodes, [inp], ["has", "y"])
    _check(model, {"x": np.array([-1, 0, 2], np.float32)})
    with pytest.raises(TypeError, match="input 'x': None is not a tensor"):
        aidge_interop.load_onnx(model).forward([None])


def test_get_element_of_an_empty_optional_is_refused_by_name():
    nodes = [helper.make_node("Optional", [], ["o"], type=FLOAT_TYPE),
             helper.make_node("OptionalGetElement", ["o"], ["y"], name="get")]
    with pytest.raises(ValueError, match="OptionalGetElement node 'get': its input is an empty "
                                         "optional \\('o'\\)"):
        aidge_interop.load_onnx(_model(nodes, [X], ["y"]))


def test_optional_sequence_input_is_a_present_sequence():
    """Refused by name without its length; with it (as the backend gives
    it from the list it is called with), a list of tensor inputs."""
    from aidge_interop.onnx.backend import AidgeBackend

    inp = helper.make_value_info("s", helper.make_optional_type_proto(
        helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [3]))))
    model = _model([helper.make_node("OptionalGetElement", ["s"], ["t"]),
                    helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0)], [inp], ["y"])
    with pytest.raises(NotImplementedError, match="graph input 's' is a sequence; the engine "
                                                  "takes tensors"):
        aidge_interop.load_onnx(model)
    items = [np.arange(3, dtype=np.float32) + i for i in range(4)]
    (got,) = AidgeBackend.run_model(model, [items])
    np.testing.assert_array_equal(got, np.concatenate(items))


def test_optional_operators_in_a_subgraph_are_refused_by_name():
    branch = helper.make_graph([helper.make_node("OptionalHasElement", ["x"], ["h"])], "b", [],
                               [helper.make_tensor_value_info("h", TensorProto.BOOL, None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    model = _model([node], [helper.make_tensor_value_info("c", TensorProto.BOOL, []), X], ["y"])
    with pytest.raises(NotImplementedError, match="operator OptionalHasElement .* is not "
                                                  "supported by the engine"):
        aidge_interop.load_onnx(model)
