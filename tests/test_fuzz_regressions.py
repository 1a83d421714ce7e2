"""Regression tests of what the fuzzer (tests/fuzz/) found.

Every input that crashed the engine is kept in tests/fuzz/regressions/ and
replayed through the fuzz target (load_onnx + forward + backward): only the
engine's documented exceptions may come out. The sanitizer test runs this
file on the ASan+UBSan build too, where an out-of-bounds access or undefined
behaviour that does not crash is a failure as well. Each crash also has a
named test below, checking the result, not only the absence of a crash.
"""
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import aidge_interop as ai

FUZZ = Path(__file__).resolve().parent / "fuzz"
sys.path.insert(0, str(FUZZ))
from harness import run_one  # noqa: E402

REGRESSIONS = sorted((FUZZ / "regressions").glob("*.onnx"))
SEEDS = sorted((FUZZ / "seeds").glob("*.onnx"))


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_crash_input_is_refused_or_run_cleanly(path):
    run_one(path.read_bytes())


def test_seed_corpus_runs_cleanly():
    """The fuzzer starts from models that load, run forward and backward."""
    assert len(SEEDS) > 100
    for path in SEEDS[::7]:
        run_one(path.read_bytes())


def model(nodes, inputs, outputs, inits=(), opset=17):
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def vi(name, shape, elem=TP.FLOAT):
    return oh.make_tensor_value_info(name, elem, shape)


def test_castlike_of_a_constant_backward():
    """CastLike(c, x) needs no gradient for c: its backward read a NULL gradient."""
    m = model([oh.make_node("CastLike", ["c", "x"], ["cx"], name="cl"),
               oh.make_node("Mul", ["cx", "x"], ["y"], name="mul")],
              [vi("x", [3])], [vi("y", None)], [nh.from_array(np.array(0.5, np.float32), "c")])
    g = ai.load_onnx(m)
    x = np.array([1.0, -2.0, 3.0], np.float32)
    y, = g.forward([x], input_grads=True)
    np.testing.assert_array_equal(y, 0.5 * x)
    dx, = g.backward([np.ones(3, np.float32)])
    np.testing.assert_array_equal(dx, np.full(3, 0.5, np.float32))


def dropout_graph():
    return ai.load_onnx(model([oh.make_node("Dropout", ["x", "r"], ["y"], name="d")],
                              [vi("x", [4]), vi("r", None)], [vi("y", None)]))


def test_dropout_ratio_given_at_run_time_is_checked():
    """A run-time ratio was used unchecked (a float-to-uint64 overflow for 3.0) and,
    when empty, read at index 0 (a division by zero)."""
    x = np.arange(4, dtype=np.float32)
    g = dropout_graph()
    g.training = True
    np.testing.assert_array_equal(g.forward([x, np.float32(0.0)])[0], x)
    with pytest.raises(ValueError, match=r"Dropout node 'd': ratio 3 is outside \[0, 1\)"):
        g.forward([x, np.float32(3.0)])
    with pytest.raises(ValueError, match="Dropout node 'd': ratio must be a scalar, got 0 values"):
        dropout_graph().forward([x, np.zeros(0, np.float32)])


@pytest.mark.parametrize("op, inputs", [("Add", ["x", ""]), ("Sum", ["x", ""]),
                                        ("Concat", ["", "x"])])
def test_empty_name_for_a_required_input_is_refused(op, inputs):
    """A required input left empty ("") reached the kernels as a NULL tensor."""
    attrs = {"axis": 0} if op == "Concat" else {}
    m = model([oh.make_node(op, inputs, ["y"], name="n", **attrs)], [vi("x", [2])],
              [vi("y", None)])
    with pytest.raises(ValueError, match=rf"{op} node 'n': input {inputs.index('')} is empty"):
        ai.load_onnx(m)


def test_reduce_max_backward_on_an_empty_output():
    """The backward of ReduceMax/Min zeroed a workspace that an empty output does not have."""
    m = model([oh.make_node("ReduceMax", ["x"], ["y"], name="rm", axes=[1], keepdims=0)],
              [vi("x", [0, 3])], [vi("y", None)], opset=17)
    g = ai.load_onnx(m)
    y, = g.forward([np.zeros((0, 3), np.float32)], input_grads=True)
    assert y.shape == (0,)
    dx, = g.backward([np.zeros(0, np.float32)])
    assert dx.shape == (0, 3)


def test_negative_step_slice_of_an_empty_axis():
    """Slicing an empty axis backwards gave one element (read from no memory)."""
    m = model([oh.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"], name="sl")],
              [vi("x", [2, 0])], [vi("y", None)],
              [nh.from_array(np.array([v]), n) for v, n in
               ((-1, "s"), (2, "e"), (-1, "a"), (-1, "t"))])
    x = np.zeros((2, 0), np.float32)
    y, = ai.load_onnx(m).forward([x])
    assert y.shape == x[:, -1:2:-1].shape == (2, 0)


def test_memory_blow_ups_are_failures_and_plan_refusals_are_not():
    """The fuzz target runs under harness.MEMORY_LIMIT (and restores the
    caller's limit): a plan past it is an expected refusal (the ConvTranspose
    of convtranspose-huge-strides.onnx, 1.97 GB), an allocation that fails is
    a memory blow-up, reported as a crash is."""
    import harness

    saved = ai.get_memory_limit()
    run_one((FUZZ / "regressions" / "convtranspose-huge-strides.onnx").read_bytes())
    assert ai.get_memory_limit() == saved
    harness._refusal(MemoryError("ConvTranspose node 'up': its output 'y' needs 1965184720 "
                                 "bytes, over the memory limit of 1073741824 bytes"))
    with pytest.raises(AssertionError, match="memory blow-up"):
        harness._refusal(MemoryError("out of memory allocating 3000000000 bytes"))


def lstm_model(steps, features):
    """An LSTM (hidden 4) over X declared (steps, 1, features)."""
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((1, 16, features)).astype(np.float32), "W")
    r = nh.from_array(rng.standard_normal((1, 16, 4)).astype(np.float32), "R")
    return model([oh.make_node("LSTM", ["X", "W", "R"], ["Y", "Y_h"], name="lstm",
                               hidden_size=4)],
                 [vi("X", [steps, 1, features])], [vi("Y_h", None)], [w, r], opset=14)


def test_lstm_of_2_to_the_40_steps_is_refused_quickly():
    """An LSTM declaring 2^40 time steps hung the loader (it unrolled the
    steps at import, lstm-2e40-steps.onnx). The LSTM is one node now: the
    model loads at once, and a run of that length (an empty X: no features)
    is refused by the plan's memory limit, naming the node, before anything
    is allocated."""
    import time

    start = time.perf_counter()
    run_one((FUZZ / "regressions" / "lstm-2e40-steps.onnx").read_bytes())
    g = ai.load_onnx(lstm_model(2**40, 0))
    saved = ai.get_memory_limit()
    ai.set_memory_limit(1 << 30)
    try:
        with pytest.raises(MemoryError, match=r"LSTM node 'lstm': its output 'Y' needs "
                                              r"17592186044416 bytes, over the memory limit"):
            g.forward([np.zeros((2**40, 1, 0), np.float32)])
    finally:
        ai.set_memory_limit(saved)
    assert time.perf_counter() - start < 5
