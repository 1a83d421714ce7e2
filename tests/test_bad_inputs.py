"""The bad-input catalogue: what users hand the package that it must refuse
(or, for NaN and Inf, compute as torch does), each with the exact exception
type and a message that names the culprit — the file, node, value, argument,
attribute, JSON path or case.

Inputs the fuzzer found crashing the engine are in test_fuzz_regressions.py.
"""
from __future__ import annotations

import json
import os
import re

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import aidge_interop as ai
from aidge_interop.testing import OperatorConfig, OperatorConfigWarning, build_cases


def model(nodes, inputs, outputs, inits=(), opset=17):
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def vi(name, shape=None, elem=TP.FLOAT):
    return oh.make_tensor_value_info(name, elem, shape)


X, X2, Y = vi("x", [2, 3]), vi("x2", [2, 3]), vi("y")
X4 = vi("x", [1, 2, 5, 5])
x23 = np.ones((2, 3), np.float32)
x4 = np.ones((1, 2, 5, 5), np.float32)


def node(op, ins, outs, name, **attrs):
    return oh.make_node(op, ins, outs, name=name, **attrs)


def init(name, array):
    return nh.from_array(np.asarray(array), name)


def relu_model():
    return model([node("Relu", ["x"], ["y"], "r")], [X], [Y])


def run(m, *inputs):
    return ai.load_onnx(m).forward(list(inputs))


def short_initializer():
    t = TP(name="c", data_type=TP.FLOAT, dims=[2, 3])
    t.float_data.extend([1.0] * 5)
    return t


W = init("W", np.ones((3, 2, 3, 3), np.float32))
conv = lambda **a: model([node("Conv", ["x", "W"], ["y"], "c", **a)], [X4], [Y], [W])  # noqa

# id -> (thunk, exception type, substrings the message must hold)
ONNX_CASES = {
    "corrupt_bytes": (lambda: ai.load_onnx(b"\x08\x07garbage\xff\xff"), ValueError,
                      ["the bytes are not a valid ONNX model"]),
    "truncated_bytes": (lambda: ai.load_onnx(relu_model().SerializeToString()[:-9]), ValueError,
                        ["the bytes are not a valid ONNX model"]),
    "not_a_model": (lambda: ai.load_onnx(3.5), TypeError,
                    ["expected a path, bytes or onnx.ModelProto, not float"]),
    "unknown_operator": (lambda: ai.load_onnx(model([node("Frobnicate", ["x"], ["y"], "f1")],
                                                    [X], [Y])),
                         NotImplementedError, ["operator Frobnicate", "node 'f1'"]),
    "unknown_domain": (lambda: ai.load_onnx(model(
        [oh.make_node("Relu", ["x"], ["y"], name="r", domain="com.example")], [X], [Y])),
        NotImplementedError, ["com.example.Relu", "node 'r'"]),
    "missing_initializer": (lambda: ai.load_onnx(model([node("MatMul", ["x", "W"], ["y"], "mm")],
                                                       [X], [Y])),
                            ValueError, ["MatMul node 'mm'", "input 'W'", "dangling value"]),
    "dangling_output": (lambda: ai.load_onnx(model([node("Relu", ["x"], ["y"], "r")], [X],
                                                   [Y, vi("z")])),
                        ValueError, ["graph output 'z'"]),
    "no_outputs": (lambda: ai.load_onnx(model([node("Relu", ["x"], ["y"], "r")], [X], [])),
                   ValueError, ["the ONNX graph has no outputs"]),
    "cycle": (lambda: ai.load_onnx(model([node("Add", ["x", "b"], ["a"], "n1"),
                                          node("Relu", ["a"], ["b"], "n2"),
                                          node("Relu", ["a"], ["y"], "n3")], [X], [Y])),
              ValueError, ["node 'n1'", "cycle"]),
    "output_defined_twice": (lambda: ai.load_onnx(model([node("Relu", ["x"], ["y"], "a"),
                                                         node("Relu", ["x"], ["y"], "b")],
                                                        [X], [Y])),
                             ValueError, ["node 'b'", "output 'y'"]),
    "empty_required_input": (lambda: ai.load_onnx(model([node("Add", ["x", ""], ["y"], "ad")],
                                                        [X], [Y])),
                             ValueError, ["Add node 'ad'", "input 1 is empty"]),
    "too_many_inputs": (lambda: ai.load_onnx(model([node("Relu", ["x", "x"], ["y"], "r")],
                                                   [X], [Y])),
                        ValueError, ["node 'r'", "has 2 inputs; Relu takes 1 to 1"]),
    "opset_out_of_range": (lambda: ai.load_onnx(model([node("Relu", ["x"], ["y"], "r")], [X],
                                                      [Y], opset=-3)),
                           ValueError, ["opset_import of domain 'ai.onnx' has version -3"]),
    "unknown_attribute": (lambda: ai.load_onnx(model([node("Softmax", ["x"], ["y"], "s",
                                                           axsi=1)], [X], [Y])),
                          ValueError, ["Softmax node 's'", "unknown attribute 'axsi'",
                                       "takes axis"]),
    "ill_typed_attribute": (lambda: run(model([node("Softmax", ["x"], ["y"], "s", axis=1.5)],
                                              [X], [Y]), x23),
                            ValueError, ["Softmax node 's'", "attribute 'axis' is a float"]),
    "attribute_out_of_range": (lambda: run(model([node("Softmax", ["x"], ["y"], "s", axis=5)],
                                                 [X], [Y]), x23),
                               ValueError, ["Softmax node 's'", "axis 5 is out of range"]),
    "negative_stride": (lambda: run(conv(strides=[-1, 1]), x4), ValueError,
                        ["Conv node 'c'", "strides[0] is -1"]),
    "huge_padding": (lambda: run(conv(pads=[2**62] * 4), x4), ValueError,
                     ["Conv node 'c'", "pads[0] is 4611686018427387904"]),
    "huge_pad_operator": (lambda: run(model([node("Pad", ["x", "p"], ["y"], "p")], [X], [Y],
                                            [init("p", np.array([0, 2**62, 0, 2**62]))]), x23),
                          ValueError, ["Pad node 'p'", "pads[1] = 4611686018427387904"]),
    "bad_permutation": (lambda: run(model([node("Transpose", ["x"], ["y"], "t", perm=[0, 0])],
                                          [X], [Y]), x23),
                        ValueError, ["Transpose node 't'", "perm"]),
    "index_out_of_range": (lambda: run(model([node("Gather", ["x", "i"], ["y"], "ga")], [X],
                                             [Y], [init("i", np.array([7]))]), x23),
                           IndexError, ["Gather node 'ga'", "index 7"]),
    "negative_dimension": (lambda: run(model([node("ConstantOfShape", ["s"], ["y"], "cos")],
                                             [], [Y], [init("s", np.array([-2, 3]))])),
                           ValueError, ["ConstantOfShape node 'cos'", "shape[0] = -2"]),
    "huge_dimensions": (lambda: run(model([node("ConstantOfShape", ["s"], ["y"], "cos")], [], [Y],
                                          [init("s", np.array([2**40, 2**40]))])),
                        ValueError, ["ConstantOfShape node 'cos'", "more than 2^63 elements"]),
    "huge_reshape": (lambda: run(model([node("Reshape", ["x", "s"], ["y"], "rs")], [X], [Y],
                                       [init("s", np.array([2**40, 2**40]))]), x23),
                     ValueError, ["Reshape node 'rs'", "more than 2^63 elements"]),
    "initializer_short_of_data": (lambda: ai.load_onnx(model(
        [node("Add", ["x", "c"], ["y"], "ad")], [X], [Y], [short_initializer()])),
        ValueError, ["tensor 'c'"]),
    "initializer_dtype": (lambda: ai.load_onnx(model(
        [node("Add", ["x", "c"], ["y"], "ad")], [X], [Y],
        [oh.make_tensor("c", TP.STRING, [1], [b"a"])])),
        TypeError, ["tensor 'c'", "STRING"]),
    "input_dtype_declared": (lambda: ai.load_onnx(model([node("Relu", ["x"], ["y"], "r")],
                                                        [vi("x", [2], TP.STRING)], [Y])),
                             TypeError, ["graph input 'x'", "STRING"]),
    # (inputs without declared dims: the node's own check speaks)
    "mismatched_shapes": (lambda: ai.load_onnx(model([node("Add", ["x", "x2"], ["y"], "add1")],
                                                     [vi("x"), vi("x2")], [Y])).forward(
        [x23, np.ones((4, 5), np.float32)]),
        ValueError, ["Add node 'add1'", "dimension 0 is 2 on one side and 4 on the other"]),
    "mismatched_matmul": (lambda: run(model([node("MatMul", ["x", "W"], ["y"], "mm")], [X], [Y],
                                            [init("W", np.ones((4, 2), np.float32))]), x23),
                          ValueError, ["MatMul node 'mm'", "A has 3 columns, B has 4 rows"]),
    "conv_channels": (lambda: run(model([node("Conv", ["x", "W"], ["y"], "c")], [X4], [Y],
                                        [init("W", np.ones((3, 4, 3, 3), np.float32))]), x4),
                      ValueError, ["Conv node 'c'", "input has 2 channels; the weight expects 4"]),
    "conv_rank": (lambda: run(model([node("Conv", ["x", "W"], ["y"], "c")], [vi("x")], [Y], [W]),
                              x23), ValueError, ["Conv node 'c'", "input has rank 2"]),
    "declared_rank": (lambda: run(conv(), x23), ValueError,
                      ["graph input 'x' has rank 2, the model declares rank 4 (?, 2, 5, 5)"]),
    "wrong_input_dtype": (lambda: run(relu_model(), x23.astype(np.float64)), TypeError,
                          ["graph input 'x' expects float32, got float64"]),
    "mixed_dtypes_in_node": (lambda: run(model([node("Add", ["x", "c"], ["y"], "ad")], [X], [Y],
                                               [init("c", np.ones(3, np.int64))]), x23),
                             TypeError, ["Add node 'ad'", "float32 and int64"]),
    "unsupported_input_dtype": (lambda: run(relu_model(), np.array([["a"]])), TypeError,
                                ["input 'x'", "unsupported dtype"]),
    "wrong_number_of_inputs": (lambda: ai.load_onnx(model([node("Add", ["x", "x2"], ["y"], "a")],
                                                          [X, X2], [Y])).forward([x23]),
                               ValueError, ["the graph takes 2 inputs (x, x2), got 1"]),
    "missing_named_input": (lambda: ai.load_onnx(relu_model()).forward({"z": x23}), ValueError,
                            ["missing inputs ['x']"]),
    "sequence_split_along_a_dynamic_axis": (lambda: ai.load_onnx(model(
        [node("SplitToSequence", ["x"], ["s"], "sts"), node("SequenceAt", ["s", "i"], ["y"], "at")],
        [vi("x", ["n", 3])], [Y], [init("i", np.array(0))])),
        NotImplementedError, ["SplitToSequence node 'sts'", "along axis 0, which is not static"]),
    "sequence_graph_input": (lambda: ai.load_onnx(model(
        [node("SequenceAt", ["s", "i"], ["y"], "at")],
        [oh.make_tensor_sequence_value_info("s", TP.FLOAT, None)], [Y],
        [init("i", np.array(0))])), NotImplementedError, ["graph input 's' is a sequence"]),
    "dropout_ratio_at_run_time": (lambda: ai.load_onnx(model(
        [node("Dropout", ["x", "r"], ["y"], "d")], [X, vi("r", [], TP.FLOAT)], [Y])).forward(
        [x23, np.float32(3.0)]), ValueError, ["Dropout node 'd'", "ratio 3 is outside [0, 1)"]),
}


@pytest.mark.parametrize("case", list(ONNX_CASES))
def test_bad_model_or_input(case):
    thunk, exc_type, parts = ONNX_CASES[case]
    with pytest.raises(Exception) as info:
        thunk()
    assert type(info.value) is exc_type, f"{case}: {type(info.value).__name__}: {info.value}"
    for part in parts:
        assert part in str(info.value), f"{case}: {part!r} not in {str(info.value)!r}"


def backward_ready_relu():
    g = ai.load_onnx(relu_model())
    g.forward([x23], input_grads=True)
    return g


@pytest.mark.parametrize("grads, exc_type, part", [
    ([x23, x23], ValueError, "expected 1 tensors, got 2"),
    ([np.ones((3, 3), np.float32)], ValueError, "gradient of output 'y' must be float32"),
    ([x23.astype(np.float64)], ValueError, "gradient of output 'y' must be float32"),
], ids=["count", "shape", "dtype"])
def test_bad_output_gradients(grads, exc_type, part):
    for graph_needs_grads in (True, False):  # checked even where no gradient is needed
        g = backward_ready_relu() if graph_needs_grads else ai.load_onnx(relu_model())
        if not graph_needs_grads:
            g.forward([x23], need_backward=True)
        with pytest.raises(exc_type, match=re.escape(part)):
            g.backward(grads)


def test_backward_without_forward_is_refused():
    g = ai.load_onnx(relu_model())
    with pytest.raises(ValueError, match="backward needs a forward first"):
        g.backward([x23])


@pytest.mark.parametrize("shape, exc_type, part", [
    ((2, -3), ValueError, "dimension 1 is negative (-3)"),
    ((2**40, 2**40), MemoryError, "more than 2^63 elements"),
    ((2**62,), MemoryError, "shape needs more than"),
])
def test_bad_tensor_shapes(shape, exc_type, part):
    with pytest.raises(exc_type, match=re.escape(part)):
        ai.zeros(shape)


# -- files ---------------------------------------------------------------------------

def test_missing_and_corrupt_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "absent.onnx"))):
        ai.load_onnx(tmp_path / "absent.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage\xff\xff")
    with pytest.raises(ValueError, match=re.escape(f"{str(bad)!r} is not a valid ONNX model")):
        ai.load_onnx(bad)


def test_truncated_file_is_named(tmp_path):
    m = model([node("Add", ["x", "c"], ["y"], "ad")], [X], [Y],
              [init("c", np.arange(6, dtype=np.float32).reshape(2, 3))])
    data = m.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: data.index(nh.from_array(np.arange(6, dtype=np.float32)).raw_data)
                          + 5])  # cut inside the initializer's data
    with pytest.raises(ValueError, match=re.escape(f"{str(path)!r} is not a valid ONNX model")):
        ai.load_onnx(path)


def external_model(folder, location):
    """A model whose initializer 'c' reads its data from `location`."""
    m = model([node("Add", ["x", "c"], ["y"], "ad")], [X], [Y],
              [init("c", np.ones((2, 3), np.float32))])
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TP.EXTERNAL
    t.external_data.add(key="location", value=location)
    path = folder / "model.onnx"
    onnx.save(m, path)
    return path


def test_external_data_inside_the_folder_loads(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.full((2, 3), 2, np.float32).tobytes())
    out, = ai.load_onnx(external_model(tmp_path, "weights.bin")).forward([x23])
    np.testing.assert_array_equal(out, np.full((2, 3), 3, np.float32))


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_external_data_leaving_the_folder_is_refused(tmp_path, where):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full((2, 3), 7, np.float32).tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    if where == "parent":
        location = "../secret.bin"
    elif where == "absolute":
        location = str(secret)
    else:
        os.symlink(secret, folder / "link.bin")
        location = "link.bin"
    with pytest.raises(ValueError, match=re.escape(
            f"initializer 'c' points to external data {location!r} outside the model's "
            "folder; refused")):
        ai.load_onnx(external_model(folder, location))


def test_external_data_without_a_folder_is_refused(tmp_path):
    path = external_model(tmp_path, "weights.bin")
    with pytest.raises(ValueError, match="initializer 'c' has external data .* not loaded "
                                         "from a file"):
        ai.load_onnx(path.read_bytes())


# -- NaN and Inf: computed as torch computes them, not refused ------------------------

class NanModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.pool = torch.nn.MaxPool1d(2)

    def forward(self, x):
        y = torch.relu(self.fc(x)) + torch.sigmoid(x) * torch.tanh(x) + x.mean(-1, keepdim=True)
        return torch.softmax(self.pool(y.unsqueeze(1)).squeeze(1), dim=-1)


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_propagate_as_in_torch(special):
    torch.manual_seed(0)
    ref = NanModel()
    wrapped = ai.wrap(ref, [(3, 4)])
    x = torch.randn(3, 4)
    x[1, 2] = float(special)
    xr, xw = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yw = ref(xr), wrapped(xw)
    torch.testing.assert_close(yw, yr, equal_nan=True)
    (yr * torch.arange(1.0, 3.0)).sum().backward()
    (yw * torch.arange(1.0, 3.0)).sum().backward()
    torch.testing.assert_close(xw.grad, xr.grad, equal_nan=True)
    assert not (torch.isfinite(yr).all() and torch.isfinite(xr.grad).all())  # it did propagate
    for (name, pr), pw in zip(ref.named_parameters(), wrapped.parameters()):
        torch.testing.assert_close(pw.grad, pr.grad, equal_nan=True, msg=name)


# -- wrap ----------------------------------------------------------------------------

class Unexportable(torch.nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).real


def test_wrap_of_a_model_torch_cannot_export_chains_torchs_error(capfd):
    with pytest.raises(RuntimeError, match="wrap: torch could not export Unexportable") as info:
        ai.wrap(Unexportable(), [(2, 4)])
    cause = info.value.__cause__
    assert cause is not None and type(cause).__module__.startswith("torch")
    assert "fft" in str(cause)


@pytest.mark.parametrize("arg, exc_type, part", [
    ("x", TypeError, "argument 'torch_model' must be a torch.nn.Module, not str"),
    (torch.nn.Linear(4, 2), TypeError, "input_dims[1] = (2, -4) is not a shape"),
])
def test_wrap_arguments(arg, exc_type, part):
    with pytest.raises(exc_type, match=re.escape(part)):
        ai.wrap(arg, [(2, 4), (2, -4)] if not isinstance(arg, str) else [(2, 4)])


# -- JSON operator configurations ------------------------------------------------------

class Op:
    """Stand-in op_class: build_cases never instantiates it."""


def config_cases(tmp_path, text):
    path = tmp_path / "op.json"
    path.write_text(text if isinstance(text, str) else json.dumps(text))
    return build_cases(OperatorConfig(name="Op", op_class=Op, json_path=path))


@pytest.mark.parametrize("text, part", [
    ('{"a": {"input_size": [1]},}', "op.json:1:27: not valid JSON"),
    ({"a": {"input_size": "2x3"}}, 'op.json: a.input_size: expected a shape (a list of integers '
                                   '>= 0), got "2x3"'),
    ({"a": {"input_size": [2, -3]}}, "op.json: a.input_size: expected a shape"),
    ({"a": {"input_size": [1], "attributes": {"kernel_dims": 3}}},
     "op.json: a.attributes.kernel_dims: expected a list of numbers, got 3"),
    ({"a": {"input_size": [1], "attributes": {"no_such": 3}}},
     "op.json: a.attributes: case 'Op_a': attribute 'no_such' is not supported by operator"),
    ({"a_b": {"input_size": [1]}, "a": {"b": {"input_size": [2]}}},
     "op.json: a.b: duplicate case id 'Op_a_b', also produced by a_b"),
    ('{"a": {"input_size": [1]}, "a": {"input_size": [2]}}',
     "op.json: key 'a' appears twice in one object"),
], ids=["invalid_json", "ill_typed_shape", "negative_dim", "ill_typed_attribute",
        "unknown_attribute", "duplicate_case_id", "duplicate_key"])
def test_bad_json_configuration_names_file_and_path(tmp_path, text, part):
    with pytest.raises(ValueError) as info:
        config_cases(tmp_path, text)
    assert type(info.value) is ValueError
    assert part in str(info.value) and str(tmp_path) in str(info.value), str(info.value)


def test_unknown_json_key_is_a_warning_naming_file_and_path(tmp_path):
    with pytest.warns(OperatorConfigWarning, match=re.escape(
            f"{tmp_path / 'op.json'}: a.colour: unknown key 'colour' ignored")):
        (case,) = config_cases(tmp_path, {"a": {"input_size": [1], "colour": 3}})
    assert case.input_size == (1,)


def _relu_model(dims):
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "relu",
                          [oh.make_tensor_value_info("x", TP.FLOAT, dims)],
                          [oh.make_tensor_value_info("y", TP.FLOAT, None)])
    return oh.make_model(graph)


@pytest.mark.parametrize("shape,part", [
    ((1, 3, 5, 5), "dim 3 is 5, 2 expected"), ((1, 3, 2), "has rank 3, the model declares rank 4"),
    ((2, 4, 1, 2), "dim 1 is 4, 3 expected")], ids=str)
def test_inputs_contradicting_the_declared_dims_are_refused(shape, part):
    # as ONNX Runtime refuses them; a symbolic dim is free, and so is dim 0
    # (a batch size other than the exported one keeps working)
    g = ai.load_onnx(_relu_model([1, 3, "h", 2]))
    for ok in ((1, 3, 5, 2), (4, 3, 7, 2)):
        x = np.random.default_rng(0).standard_normal(ok).astype(np.float32)
        np.testing.assert_array_equal(g.forward([x])[0], np.maximum(x, 0))
    with pytest.raises(ValueError, match=re.escape(f"graph input 'x' has ")) as info:
        g.forward([np.ones(shape, np.float32)])
    assert part in str(info.value) and "(?, 3, ?, 2)" in str(info.value)


def test_inputs_without_declared_dims_are_free():
    g = ai.load_onnx(_relu_model(None))
    for shape in ((2,), (1, 5, 3)):
        assert g.forward([np.ones(shape, np.float32)])[0].shape == shape


# ---------------------------------------------------------------- the memory limit

@pytest.fixture
def memory_limit():
    """Sets the plans' memory limit for one test, and restores it after."""
    saved = ai.get_memory_limit()
    yield ai.set_memory_limit
    ai.set_memory_limit(saved)


def test_default_memory_limit_is_most_of_physical_memory():
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert ai.get_memory_limit() == physical // 5 * 4


def _conv_transpose_blowup():
    # from the fuzzer (issue 46): strides [40954, 3] on a 1x1x3x1000 input
    # make a 1x2x81910x2999 output (1.97 GB) where the model declares 1x2x10x8
    w = np.random.default_rng(0).standard_normal((1, 2, 2, 2)).astype(np.float32)
    return model([node("ConvTranspose", ["x", "w"], ["y"], "up", strides=[40954, 3])],
                 [vi("x", [1, 1, 3, 1000])], [vi("y", [1, 2, 10, 8])], [init("w", w)])


def test_a_plan_over_the_memory_limit_is_refused_naming_node_and_bytes(memory_limit):
    memory_limit(2**30)
    g = ai.load_onnx(_conv_transpose_blowup())
    before = ai._C._debug_counters()["owned_bytes"]
    with pytest.raises(MemoryError) as info:
        g.forward([np.ones((1, 1, 3, 1000), np.float32)])
    needed = 2 * 81910 * 2999 * 4
    assert str(info.value) == (
        f"ConvTranspose node 'up': its output 'y' needs {needed} bytes, over the memory "
        f"limit of {2**30} bytes (aidge_interop.set_memory_limit)")
    assert ai._C._debug_counters()["owned_bytes"] == before  # refused before allocating
    # the same node with an output that fits runs, and matches torch
    x = np.random.default_rng(1).standard_normal((1, 1, 3, 4)).astype(np.float32)
    w = nh.to_array(_conv_transpose_blowup().graph.initializer[0]).copy()
    small = model([node("ConvTranspose", ["x", "w"], ["y"], "up", strides=[5, 3])],
                  [vi("x", [1, 1, 3, 4])], [vi("y")], [init("w", w)])
    expected = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w),
                                                    stride=(5, 3))
    np.testing.assert_allclose(ai.load_onnx(small).forward([x])[0], expected.numpy(),
                               rtol=1e-6, atol=1e-6)


def test_the_whole_plan_counts_against_the_memory_limit(memory_limit):
    # two values of 4 MB each: either fits a 6 MB limit, both together do not
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    m = model([node("Relu", ["x"], ["a"], "first"), node("Neg", ["a"], ["y"], "second")],
              [vi("x", [1024, 1024])], [Y])
    memory_limit(6 * 2**20)
    with pytest.raises(MemoryError, match=re.escape(
            "Neg node 'second': its output 'y' needs 4194304 bytes, which brings the plan to "
            f"8388608 bytes, over the memory limit of {6 * 2**20} bytes")):
        run(m, x)
    memory_limit(9 * 2**20)
    np.testing.assert_array_equal(run(m, x)[0], -np.maximum(x, 0))
    memory_limit(None)
    assert ai.get_memory_limit() is None
    np.testing.assert_array_equal(run(m, x)[0], -np.maximum(x, 0))


@pytest.mark.parametrize("limit,exc_type,part", [
    (0, ValueError, "memory limit must be >= 1 byte, got 0"),
    (-5, ValueError, "memory limit must be >= 1 byte, got -5"),
    (1.5, TypeError, "memory limit must be an int (bytes) or None, got float"),
    (True, TypeError, "got bool")], ids=str)
def test_bad_memory_limits(memory_limit, limit, exc_type, part):
    with pytest.raises(exc_type, match=re.escape(part)):
        memory_limit(limit)
