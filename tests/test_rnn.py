"""Recurrent layers (torch.nn.LSTM, GRU, RNN; ONNX LSTM, GRU, RNN, unrolled
at import by aidge_interop/onnx/rnn.py): wrapped models against torch (outputs,
input and parameter gradients, ModelTester's SGD steps), the state inputs
and outputs, and the cases the engine refuses, named."""
import copy

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper

import aidge_interop
from aidge_interop.testing import ModelTester
from op_harness import check_wrapped_step

CELLS = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN": nn.RNN}
CONFIGS = {
    "plain": {},
    "batch_first": {"batch_first": True},
    "bidirectional": {"bidirectional": True, "batch_first": True},
    "two_layers": {"num_layers": 2},
    "no_bias": {"bias": False},
}


class Head(nn.Module):
    """A recurrent layer and a Linear on its last time step's output."""

    def __init__(self, cell, features=6, hidden=10, **kw):
        super().__init__()
        self.batch_first = kw.get("batch_first", False)
        self.rnn = CELLS[cell](features, hidden, **kw)
        self.fc = nn.Linear(hidden * (2 if kw.get("bidirectional") else 1), 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y[:, -1] if self.batch_first else y[-1])


def _input(config, batch=4, seq=7, features=6):
    return (batch, seq, features) if CONFIGS[config].get("batch_first") else (seq, batch, features)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("cell", list(CELLS))
def test_recurrent_layer_matches_torch(cell, config):
    torch.manual_seed(0)
    model = Head(cell, **CONFIGS[config])
    shape = _input(config)
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [shape])
    check_wrapped_step(model, wrapped, torch.randn(shape))
    with torch.no_grad():
        out = model(torch.randn(shape))
    ModelTester(model, wrapped, name=f"{cell}-{config}", epochs=3, benchmark=False) \
        .test_multiple_step(input_sizes=shape, label_sizes=tuple(out.shape))


class States(nn.Module):
    """Every output of the layer, from given initial states (model inputs)."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell
        self.rnn = CELLS[cell](5, 8, num_layers=2, bidirectional=True)

    def forward(self, x, h0, c0):
        if self.cell == "LSTM":
            y, (h, c) = self.rnn(x, (h0, c0))
            return y, h, c
        y, h = self.rnn(x, h0)
        return y, h, h0 * c0  # c0 still an input, its gradient defined


@pytest.mark.parametrize("cell", list(CELLS))
def test_states_in_and_out(cell):
    torch.manual_seed(1)
    model = States(cell)
    shapes = [(6, 3, 5), (4, 3, 8), (4, 3, 8)]
    wrapped = aidge_interop.wrap(copy.deepcopy(model), shapes)
    check_wrapped_step(model, wrapped, [torch.randn(s) for s in shapes], atol=1e-6)


def test_dynamic_batch_runs_other_batch_sizes():
    torch.manual_seed(2)
    model = Head("GRU", batch_first=True)
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [(4, 7, 6)])
    for batch in (1, 9):
        x = torch.randn(batch, 7, 6)
        with torch.no_grad():
            torch.testing.assert_close(wrapped(x), model(x), rtol=1e-5, atol=1e-6)


def test_other_sequence_length_is_refused_by_name():
    model = Head("LSTM")
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [(7, 4, 6)])
    for shape in ((9, 4, 6), (5, 4, 6)):
        with pytest.raises(ValueError, match="LSTM/sequence_length_must_be_7"):
            wrapped(torch.randn(shape))


def test_listed_as_supported():
    ops = aidge_interop.supported_operators()
    assert all(ops[name]["backward"] for name in ("LSTM", "GRU", "RNN"))


def _lstm_model(seq=3, **attrs):
    """One ONNX LSTM node (2 features, hidden 4) with random weights."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, (1, 16, 2), rng.standard_normal(32))
    r = helper.make_tensor("R", TensorProto.FLOAT, (1, 16, 4), rng.standard_normal(64))
    node = helper.make_node("LSTM", ["X", "W", "R"], ["Y"], name="the_lstm", hidden_size=4,
                            **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, 1, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [w, r])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_onnx_layout_1_with_initial_states_matches_reference(op):
    """layout 1: X (batch, seq, input), initial and final states (batch,
    directions, hidden); bidirectional, with a bias."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(4)
    G, H, I, B, T = {"LSTM": 4, "GRU": 3, "RNN": 1}[op], 3, 2, 2, 4
    inits = [helper.make_tensor(n, TensorProto.FLOAT, s, rng.standard_normal(np.prod(s)))
             for n, s in (("W", (2, G * H, I)), ("R", (2, G * H, H)), ("B", (2, 2 * G * H)))]
    ins = ["X", "W", "R", "B", "", "h0"] + (["c0"] if op == "LSTM" else [])
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ins, outs, hidden_size=H, layout=1, direction="bidirectional")
    feeds = {"X": (B, T, I), "h0": (B, 2, H), "c0": (B, 2, H)}
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, feeds[n])
                      for n in ins if n in feeds],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    values = {n: rng.standard_normal(feeds[n]).astype(np.float32) for n in ins if n in feeds}
    expected = ReferenceEvaluator(model).run(None, values)
    got = aidge_interop.load_onnx(model).forward([values[n] for n in ins if n in feeds])
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-5, atol=1e-6)


def test_onnx_lstm_without_states_or_bias_matches_reference():
    from onnx.reference import ReferenceEvaluator

    model = _lstm_model(direction="reverse")
    x = np.random.default_rng(3).standard_normal((3, 1, 2)).astype(np.float32)
    (expected,) = ReferenceEvaluator(model).run(None, {"X": x})
    (got,) = aidge_interop.load_onnx(model).forward([x])
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs, message", [
    ({"clip": 1.0}, "clip"),
    ({"input_forget": 1}, "input_forget"),
    ({"activations": ["Relu", "Tanh", "Tanh"]}, "activations"),
])
def test_unsupported_attributes_are_refused_by_name(attrs, message):
    with pytest.raises(NotImplementedError, match=rf"the_lstm.*{message}"):
        aidge_interop.load_onnx(_lstm_model(**attrs))


def test_unknown_sequence_length_is_refused():
    model = _lstm_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    with pytest.raises(NotImplementedError, match="the_lstm.*sequence length"):
        aidge_interop.load_onnx(model)


def test_sequence_lens_is_refused():
    model = _lstm_model()
    node = model.graph.node[0]
    node.input.extend(["", "lens"])
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [1]))
    with pytest.raises(NotImplementedError, match="the_lstm.*sequence_lens"):
        aidge_interop.load_onnx(onnx.load_from_string(model.SerializeToString()))
