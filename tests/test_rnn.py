"""Recurrent layers (torch.nn.LSTM, GRU, RNN; ONNX LSTM, GRU, RNN, the
engine's operators of csrc/ops/rnn.c): wrapped models against torch (outputs,
input and parameter gradients, ModelTester's SGD steps), the state inputs
and outputs; ONNX's attributes (sequence_lens, peepholes, clip,
input_forget, activations, layouts, directions) against ONNX Runtime, their
gradients against float64 central differences; the cases the engine
refuses, named."""
import copy

import numpy as np
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
    "bidirectional_two_layers_batch_first": {"bidirectional": True, "num_layers": 2,
                                             "batch_first": True},
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


def test_rnn_relu_matches_torch():
    torch.manual_seed(3)
    model = nn.RNN(6, 10, nonlinearity="relu", num_layers=2, bidirectional=True)
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [(7, 4, 6)])
    check_wrapped_step(model, wrapped, torch.randn(7, 4, 6))


@pytest.mark.parametrize("cell", list(CELLS))
def test_runs_natively_at_other_sequence_lengths(cell):
    """One engine node per layer (not one per time step), at the export's
    sequence length and at others (wrap exports the model again for them)."""
    torch.manual_seed(4)
    model = Head(cell, batch_first=True, bidirectional=True)
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [(4, 7, 6)])
    for seq in (7, 1, 23):
        check_wrapped_step(model, wrapped, torch.randn(4, seq, 6))
        assert [n["op_type"] for n in wrapped._graph.nodes()].count(cell) == 1


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



# ONNX's attributes: (op, attributes, what the node is given)
_T, _B, _I, _H = 5, 3, 2, 3
FEATURES = {
    "lstm_sequence_lens_bidirectional": ("LSTM", {"direction": "bidirectional"},
                                         {"lens": [5, 2, 1], "states": True}),
    "lstm_sequence_lens_reverse_layout_1": ("LSTM", {"direction": "reverse", "layout": 1},
                                            {"lens": [3, 5, 1], "states": True}),
    "lstm_peepholes": ("LSTM", {"direction": "bidirectional"}, {"P": True, "states": True}),
    "lstm_peepholes_sequence_lens": ("LSTM", {}, {"P": True, "lens": [2, 5, 4]}),
    "lstm_clip": ("LSTM", {"clip": 0.7}, {"states": True}),
    "lstm_input_forget": ("LSTM", {"input_forget": 1, "direction": "bidirectional"},
                          {"P": True, "states": True}),
    "lstm_activations": ("LSTM", {"direction": "bidirectional",
                                  "activations": ["HardSigmoid", "LeakyRelu", "Softsign",
                                                  "Sigmoid", "ScaledTanh", "Elu"],
                                  "activation_alpha": [0.3, 0.2, 0.8, 1.1],
                                  "activation_beta": [0.4, 0.9]}, {"states": True}),
    "gru_sequence_lens_bidirectional": ("GRU", {"direction": "bidirectional"},
                                        {"lens": [5, 2, 1], "states": True}),
    "gru_linear_before_reset_sequence_lens": ("GRU", {"linear_before_reset": 1,
                                                      "direction": "bidirectional"},
                                              {"lens": [1, 5, 3], "states": True}),
    "gru_clip_layout_1": ("GRU", {"clip": 0.6, "layout": 1, "linear_before_reset": 1},
                          {"states": True}),
    "gru_activations": ("GRU", {"activations": ["Softsign", "Softplus"]}, {"states": True}),
    "rnn_relu_sequence_lens": ("RNN", {"activations": ["Relu", "Relu"],
                                       "direction": "bidirectional"}, {"lens": [4, 5, 2]}),
    "rnn_affine_layout_1": ("RNN", {"activations": ["Affine"], "activation_alpha": [0.7],
                                    "activation_beta": [0.2], "layout": 1}, {"states": True}),
    "rnn_thresholded_relu_clip": ("RNN", {"activations": ["ThresholdedRelu"],
                                          "activation_alpha": [0.1], "clip": 1.5}, {}),
}


def _feature_model(case, dtype, attrs=None):
    """The node of FEATURES[case] (its attributes replaced by ``attrs``) with
    every operand a graph input, and random values for them."""
    op, case_attrs, given = FEATURES[case]
    attrs = case_attrs if attrs is None else attrs
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    D = 2 if attrs.get("direction") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    state = (_B, D, _H) if layout else (D, _B, _H)
    shapes = {"X": (_B, _T, _I) if layout else (_T, _B, _I), "W": (D, G * _H, _I),
              "R": (D, G * _H, _H), "B": (D, 2 * G * _H)}
    if "lens" in given:
        shapes["lens"] = (_B,)
    if given.get("states"):
        shapes["h0"] = state
        if op == "LSTM":
            shapes["c0"] = state
    if given.get("P"):
        shapes["P"] = (D, 3 * _H)
    slots = ["X", "W", "R", "B", "lens", "h0", "c0", "P"][:8 if op == "LSTM" else 6]
    ins = [n if n in shapes else "" for n in slots]
    while not ins[-1]:
        ins.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ins, outs, name=f"the_{op.lower()}", hidden_size=_H, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "lens" else elem, s)
         for n, s in shapes.items()],
        [helper.make_tensor_value_info(n, elem, None) for n in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    rng = np.random.default_rng(abs(hash(case)) % 2**32)
    values = {n: (np.array(given["lens"], np.int32) if n == "lens"
                  else (rng.standard_normal(s) * (1.5 if "clip" in attrs else 0.7)).astype(dtype))
              for n, s in shapes.items()}
    return model, values


@pytest.mark.parametrize("case", list(FEATURES))
def test_onnx_attributes_match_onnxruntime(case):
    """ONNX Runtime has no layout 1: its layout 0 model runs the same values
    transposed, its outputs transposed back."""
    ort = pytest.importorskip("onnxruntime")
    model, values = _feature_model(case, np.float32)
    got = aidge_interop.load_onnx(model).forward(list(values.values()))
    attrs = dict(FEATURES[case][1])
    layout = attrs.pop("layout", 0)
    ort_model, _ = _feature_model(case, np.float32, attrs)
    ort_values = {n: v.swapaxes(0, 1) if layout and n in ("X", "h0", "c0") else v
                  for n, v in values.items()}
    sess = ort.InferenceSession(ort_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    expected = sess.run(None, ort_values)
    if layout:  # Y (T, D, B, H) -> (B, T, D, H); Y_h, Y_c (D, B, H) -> (B, D, H)
        expected = [e.transpose(2, 0, 1, 3) if e.ndim == 4 else e.swapaxes(0, 1)
                    for e in expected]
    for name, g, e in zip(["Y", "Y_h", "Y_c"], got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=f"output {name}")


@pytest.mark.parametrize("case", list(FEATURES))
def test_onnx_attributes_gradients_match_finite_differences(case):
    """Every float operand's gradient, float64, against central differences
    of sum(outputs * random weights)."""
    model, values = _feature_model(case, np.float64)
    g = aidge_interop.load_onnx(model)
    names = list(values)
    rng = np.random.default_rng(7)
    outs = g.forward(list(values.values()))
    weights = [rng.standard_normal(o.shape) for o in outs]

    def loss(vals):
        return sum(float((o * w).sum()) for o, w in zip(g.forward(vals), weights))

    g.forward(list(values.values()), input_grads=True)
    grads = g.backward(weights)
    eps = 1e-6
    for k, name in enumerate(names):
        if name == "lens":
            continue
        num = np.zeros_like(values[name])
        for i in np.ndindex(values[name].shape):
            vals = [v.copy() for v in values.values()]
            vals[k][i] += eps
            up = loss(vals)
            vals[k][i] -= 2 * eps
            num[i] = (up - loss(vals)) / (2 * eps)
        np.testing.assert_allclose(grads[k], num, rtol=1e-5, atol=1e-7,
                                   err_msg=f"gradient of {name}")


def test_sequence_lens_past_the_sequence_is_refused_by_name():
    model, values = _feature_model("lstm_peepholes_sequence_lens", np.float32)
    values["lens"] = np.array([2, 6, 4], np.int32)
    with pytest.raises(ValueError, match=r"LSTM node 'the_lstm': sequence_lens\[1\] = 6 is "
                                         r"outside \[0, 5\]"):
        aidge_interop.load_onnx(model).forward(list(values.values()))


@pytest.mark.parametrize("attrs, error, message", [
    ({"activations": ["Sigmoid", "Swish", "Tanh"]}, NotImplementedError,
     "the_lstm': activation 'Swish' is not one of ONNX's recurrent activations"),
    ({"activations": ["Sigmoid", "Tanh"]}, ValueError,
     "the_lstm': activations 'Sigmoid,Tanh' names 2 functions; LSTM with 1 direction takes 3"),
    ({"direction": "sideways"}, ValueError,
     "the_lstm': direction 'sideways' is not forward, reverse or bidirectional"),
    ({"layout": 2}, ValueError, "the_lstm': layout 2 is not 0 or 1"),
    ({"clip": -1.0}, ValueError, "the_lstm': clip -1 is not positive"),
])
def test_bad_attributes_are_refused_by_name(attrs, error, message):
    with pytest.raises(error, match=message):
        aidge_interop.load_onnx(_lstm_model(**attrs))


def test_unknown_sequence_length_runs():
    """A symbolic sequence length (the dynamo exporter leaves it so): any
    length runs, against ONNX's reference."""
    from onnx.reference import ReferenceEvaluator

    model = _lstm_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    g = aidge_interop.load_onnx(model)
    for seq in (1, 3, 8):
        x = np.random.default_rng(seq).standard_normal((seq, 1, 2)).astype(np.float32)
        (expected,) = ReferenceEvaluator(model).run(None, {"X": x})
        np.testing.assert_allclose(g.forward([x])[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_empty_dimensions(op):
    """No steps: Y_h is initial_h. No features: as zero features. No
    entries: empty outputs. Backward runs on each."""
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    node = helper.make_node(op, ["X", "W", "R", "B", "", "h0"], ["Y", "Y_h"], name="n",
                            hidden_size=3)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                      for n in ("X", "W", "R", "B", "h0")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")])
    g = aidge_interop.load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 14)]))
    rng = np.random.default_rng(5)

    def run(T, B, I, x=None):
        vals = [rng.standard_normal((T, B, I)) if x is None else x,
                rng.standard_normal((1, G * 3, I)), R, bias, h0[:, :B]]
        outs = g.forward([v.astype(np.float32) for v in vals], input_grads=True)
        grads = g.backward([np.ones_like(o) for o in outs])
        assert [a.shape for a in grads] == [v.shape for v in vals]
        return outs

    R, bias = rng.standard_normal((1, G * 3, 3)), rng.standard_normal((1, 6 * G))
    h0 = rng.standard_normal((1, 2, 3))
    y, yh = run(0, 2, 4)
    assert y.shape == (0, 1, 2, 3)
    np.testing.assert_array_equal(yh, h0.astype(np.float32))
    y, yh = run(3, 0, 4)
    assert y.shape == (3, 1, 0, 3) and yh.shape == (1, 0, 3)
    for got, want in zip(run(3, 2, 0), run(3, 2, 1, x=np.zeros((3, 2, 1)))):
        np.testing.assert_allclose(got, want, rtol=1e-6)
