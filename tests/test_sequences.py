"""ONNX sequence operators in their static forms, written at import as
tensor operators (aidge_interop/onnx/sequences.py): the rewritten graph and
the engine against onnx.reference on the graph as it was, and the dynamic
forms the engine refuses, named."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from aidge_interop import load_onnx
from aidge_interop.onnx.importer import _value_dims
from aidge_interop.onnx.sequences import SEQUENCE_OPERATORS, rewrite_sequences

F = TensorProto.FLOAT


def _const(name, values):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(values, dtype=np.int64)))


def _model(nodes, inputs, outputs, opset=20):
    """One graph: ``inputs``/``outputs`` as (name, shape) of float tensors
    (a shape entry may be a dim name: dynamic)."""
    graph = helper.make_graph(
        nodes, "sequences", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, None) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)  # the outputs' shapes, as exporters give


def _at(seq, position, out):
    p = f"{out}_pos"
    return [_const(p, position), helper.make_node("SequenceAt", [seq, p], [out])]


def _split_at(split, attrs, positions, shape=(3, 20, 4), opset=20):
    """x split to a sequence (``split``: None, a scalar or sizes), then the
    items at ``positions``."""
    nodes, ins = [], ["x"]
    if split is not None:
        nodes.append(_const("split", split))
        ins.append("split")
    nodes.append(helper.make_node("SplitToSequence", ins, ["seq"], **attrs))
    outs = [f"y{i}" for i in range(len(positions))]
    for p, o in zip(positions, outs):
        nodes += _at("seq", p, o)
    return _model(nodes, [("x", list(shape))], outs, opset)


def _concat(attrs, n=3, positions=None, opset=20):
    """A sequence of n inputs (built with SequenceConstruct, SequenceInsert
    and SequenceErase), concatenated by ConcatFromSequence."""
    nodes = [helper.make_node("SequenceEmpty", [], ["s0"]),
             helper.make_node("SequenceInsert", ["s0", "x0"], ["s1"])]
    nodes.append(helper.make_node("SequenceConstruct", [f"x{i}" for i in range(1, n)], ["t"]))
    nodes += [_const("front", 0), helper.make_node("SequenceInsert", ["t", "x0", "front"],
                                                   ["t2"]),
              _const("second", -2), helper.make_node("SequenceErase", ["t2", "second"], ["t3"]),
              helper.make_node("SequenceInsert", ["t3", "x1"], ["t4"]),
              # (Identity takes sequences from opset 14)
              helper.make_node("Identity" if opset >= 14 else "SequenceErase", ["t4"], ["t5"]),
              helper.make_node("ConcatFromSequence", ["t5"], ["y"], **attrs),
              helper.make_node("SequenceLength", ["t5"], ["len"]),
              helper.make_node("Cast", ["len"], ["n"], to=F)]
    return _model(nodes, [(f"x{i}", [2, 3]) for i in range(n)], ["y", "n"], opset)


def _relu_body(extra=()):
    """A SequenceMap body: b = Relu(a) (+ each of ``extra`` added)."""
    nodes = [helper.make_node("Relu", ["a"], ["b0"])]
    for i, e in enumerate(extra):
        nodes.append(helper.make_node("Add", [f"b{i}", f"{e}_in"], [f"b{i + 1}"]))
    return helper.make_graph(
        nodes, "body", [helper.make_tensor_value_info(n, F, None)
                        for n in ["a"] + [f"{e}_in" for e in extra]],
        [helper.make_tensor_value_info(f"b{len(extra)}", F, None)])


def _sequence_map(extra=()):
    """x split into rows, a SequenceMap over them (with ``extra`` tensors
    broadcast to every item), the rows concatenated again."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
             helper.make_node("SequenceMap", ["s", *extra], ["t"], body=_relu_body(extra)),
             helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0)]
    return _model(nodes, [("x", [4, 3])] + [(e, [1, 3]) for e in extra], ["y"])


def _loop_over_sequence(trips=3):
    """A Loop of ``trips`` iterations that appends x * i to a sequence of
    x, reads its item i, and scans it out."""
    i64 = TensorProto.INT64
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["s_in", "xi"], ["s_out"]),
         helper.make_node("SequenceAt", ["s_out", "i"], ["item"])], "body",
        [helper.make_tensor_value_info("i", i64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("s_in", F, [3])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("s_out", F, [3]),
         helper.make_tensor_value_info("item", F, [3])])
    nodes = [_const("m", trips),
             helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(
                 np.array(True))),
             helper.make_node("SequenceConstruct", ["x"], ["s0"]),
             helper.make_node("Loop", ["m", "go", "s0"], ["s", "scan"], body=body),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    # (1-D items: onnx.reference concatenates scan values (np.vstack) where
    # ONNX Runtime and the engine stack them on a new axis 0)
    return _model(nodes, [("x", [3])], ["y", "scan"])


def _if_over_sequences(cond):
    """An If of a constant condition whose branches build sequences."""
    def branch(name, op):
        return helper.make_graph(
            [helper.make_node(op, ["x"], ["r"]),
             helper.make_node("SequenceConstruct", ["r", "x"], ["out"])], name, [],
            [helper.make_tensor_sequence_value_info("out", F, None)])
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
                 np.array(cond))),
             helper.make_node("If", ["c"], ["s"], then_branch=branch("then", "Relu"),
                              else_branch=branch("else", "Neg")),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=1, new_axis=1)]
    return _model(nodes, [("x", [2, 3])], ["y"])


CASES = {
    "sizes": _split_at([5, 7, 8], {"axis": 1}, [0, 2, -2]),
    "scalar-remainder": _split_at(6, {"axis": -2}, [3, 0, -1]),
    "ones-keepdims": _split_at(None, {"axis": 0}, [2, -3]),
    "ones-squeezed": _split_at(None, {"axis": 2, "keepdims": 0}, [1, 3]),
    "20-pieces": _split_at(None, {"axis": 1, "keepdims": 0}, [0, 15, 16, 19]),
    "batch-dynamic": _split_at([1, 3], {"axis": -1}, [1], shape=("b", 5, 4)),
    "opset11": _split_at(2, {"axis": 1}, [1, 9], opset=11),
    "concat": _concat({"axis": 1}),
    "concat-new-axis": _concat({"axis": -1, "new_axis": 1}),
    "concat-18-items": _concat({"axis": 0}, n=18),
    "concat-opset12": _concat({"axis": 0, "new_axis": 1}, opset=12),
    "sequence-map": _sequence_map(),
    "sequence-map-with-a-tensor": _sequence_map(["bias"]),
    "loop-over-a-sequence": _loop_over_sequence(),
    "if-then": _if_over_sequences(True),
    "if-else": _if_over_sequences(False),
}


def _inputs(proto, batch=3):
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d.dim_value or batch for d in
                                         i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in proto.graph.input}


@pytest.mark.parametrize("name", CASES)
def test_rewrite_computes_what_the_sequences_compute(name):
    proto = CASES[name]
    feeds = _inputs(proto)
    expected = ReferenceEvaluator(proto).run(None, feeds)
    onnx.checker.check_model(proto, full_check=True)
    rewritten = rewrite_sequences(proto, _value_dims, "test")
    onnx.checker.check_model(rewritten, full_check=True)
    assert not {n.op_type for n in rewritten.graph.node} & set(SEQUENCE_OPERATORS)
    assert {n.op_type for n in proto.graph.node} & set(SEQUENCE_OPERATORS)  # untouched
    for got, want in zip(ReferenceEvaluator(rewritten).run(None, feeds), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    graph = load_onnx(proto)
    for batch in (3, 5):  # a dynamic batch: one plan per size
        feeds = _inputs(proto, batch)
        expected = ReferenceEvaluator(proto).run(None, feeds)
        for got, want in zip(graph.forward(list(feeds.values())), expected, strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("model, exc_type, message", [
    (_split_at(None, {"axis": 0}, [0], shape=("b", 4)),
     NotImplementedError, "SplitToSequence node 'SplitToSequence_0': the number of pieces "
     "depends on the length of 'x' along axis 0, which is not static"),
    (_model([helper.make_node("Shape", ["x"], ["p"], start=0, end=1),
             helper.make_node("Squeeze", ["p"], ["q"]),
             helper.make_node("SplitToSequence", ["x"], ["seq"]),
             helper.make_node("SequenceAt", ["seq", "q"], ["y"])], [("x", [3, 4])], ["y"]),
     NotImplementedError, "SequenceAt node 'SequenceAt_3': its position ('q') is computed by "
     "the graph"),
    (_split_at([2, 2], {"axis": 1}, [2], shape=(3, 4)),
     ValueError, "SequenceAt node 'SequenceAt_3': position 2 is out of range for a sequence "
     "of 2"),
    (_model([helper.make_node("SplitToSequence", ["x"], ["y"])], [("x", [3, 4])], ["y"]),
     NotImplementedError, "graph output 'y' is a sequence; the engine returns tensors"),
    (_model([helper.make_node("SplitToSequence", ["x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])], [("x", [3, 4])], ["y"]),
     NotImplementedError, "Relu node 'Relu_1' takes a sequence"),
])
def test_dynamic_forms_are_refused_by_name(model, exc_type, message):
    with pytest.raises(exc_type) as info:
        load_onnx(model)
    assert type(info.value) is exc_type and message in str(info.value)


def test_the_backend_takes_a_model_with_static_sequences():
    from aidge_interop.onnx.backend import AidgeBackend

    proto = CASES["sizes"]
    assert AidgeBackend.is_compatible(proto)
    feeds = _inputs(proto)
    for got, want in zip(AidgeBackend.run_model(proto, list(feeds.values())),
                         ReferenceEvaluator(proto).run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lengths", [(2, 1), (3, 4)])
def test_the_backend_takes_sequence_inputs_and_outputs(lengths):
    """A graph of sequence inputs (lists) and outputs (lists, one length
    per call: the backend imports once per set of lengths and positions)."""
    from aidge_interop.onnx.backend import AidgeBackend

    i64 = TensorProto.INT64
    graph = helper.make_graph(
        [helper.make_node("SequenceInsert", ["a", "x", "pos"], ["s"]),
         helper.make_node("SequenceMap", ["s"], ["t"], body=_relu_body()),
         helper.make_node("ConcatFromSequence", ["b"], ["y"], axis=0)], "io",
        [helper.make_tensor_sequence_value_info("a", F, [2]),
         helper.make_tensor_sequence_value_info("b", F, [2]),
         helper.make_tensor_value_info("x", F, [2]),
         helper.make_tensor_value_info("pos", i64, [])],
        [helper.make_tensor_sequence_value_info("t", F, [2]),
         helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    rep = AidgeBackend.prepare(model)
    rng = np.random.default_rng(1)
    # (not position n, the back: onnx.reference wraps it to the front)
    for pos in (0, 1, -1, -lengths[0]):
        a = [rng.standard_normal(2).astype(np.float32) for _ in range(lengths[0])]
        b = [rng.standard_normal(2).astype(np.float32) for _ in range(lengths[1])]
        x = rng.standard_normal(2).astype(np.float32)
        feeds = {"a": a, "b": b, "x": x, "pos": np.array(pos)}
        got = rep.run(list(feeds.values()))
        want = ReferenceEvaluator(model).run(None, feeds)
        assert len(got[0]) == len(want[0]) == lengths[0] + 1
        for g, w in zip(got[0], want[0], strict=True):
            np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(got[1], want[1])
