"""ONNX operators the engine lacks but ONNX defines by a function, imported
as their body's nodes (aidge_interop/onnx/functions.py): values against
ONNX's reference implementation on the original node, gradients of the
expanded RMSNormalization and Attention against torch, model-local
functions, the opset of a body, native operators kept, and the refusal of a
body that uses an operator the engine lacks."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import aidge_interop
from aidge_interop.onnx.functions import expand_functions
from op_harness import check_wrapped_step

R = np.random.default_rng(0)
ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
             np.dtype(np.int64): TensorProto.INT64, np.dtype(bool): TensorProto.BOOL}


def rand(*shape, dtype=np.float32):
    return R.standard_normal(shape).astype(dtype)


def single_node_model(op_type, inputs, n_outputs=1, opset=23, domain="", **attrs):
    """A model of one ``op_type`` node named 'the_node' that reads ``inputs``
    (name -> array, in order; None: an absent optional input)."""
    node = helper.make_node(op_type, [n if v is not None else "" for n, v in inputs.items()],
                            [f"y{i}" for i in range(n_outputs)], name="the_node",
                            domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, ONNX_TYPE[v.dtype], v.shape)
         for n, v in inputs.items() if v is not None],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None)
         for i in range(n_outputs)])
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets = [helper.make_opsetid("", 26), helper.make_opsetid(domain, opset)]
    return helper.make_model(graph, opset_imports=opsets)


def check_against_reference(model, inputs, rtol=1e-5, atol=1e-5):
    feeds = {n: v for n, v in inputs.items() if v is not None}
    expected = ReferenceEvaluator(model).run(None, feeds)
    g = aidge_interop.load_onnx(model)
    got = g.forward([feeds[n] for n in g.input_names])
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype, f"output {i}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return g


def attention_inputs(q_shape, kv_shape, mask=None, past=None):
    q, k, v = rand(*q_shape), rand(*kv_shape), rand(*kv_shape)
    return {"Q": q, "K": k, "V": v, "attn_mask": mask,
            "past_key": None if past is None else rand(*past),
            "past_value": None if past is None else rand(*past)}


# name: (op_type, opset, inputs, number of outputs, attributes)
CASES = {
    "rms_norm_last_axis": ("RMSNormalization", 23, {"x": rand(2, 3, 4), "scale": rand(4)}, 1,
                           {"epsilon": 1e-3}),
    "rms_norm_axis1": ("RMSNormalization", 23, {"x": rand(2, 3, 4), "scale": rand(3, 4)}, 1,
                       {"axis": 1}),
    "rms_norm_float64": ("RMSNormalization", 23,
                         {"x": rand(3, 5, dtype=np.float64), "scale": rand(5, dtype=np.float64)},
                         1, {}),
    "attention_4d": ("Attention", 23, attention_inputs((2, 3, 4, 8), (2, 3, 6, 8)), 1, {}),
    "attention_4d_causal_scaled": ("Attention", 23, attention_inputs((2, 3, 4, 8), (2, 3, 6, 8)),
                                   1, {"is_causal": 1, "scale": 0.3}),
    "attention_4d_mask_past": ("Attention", 23,
                               attention_inputs((2, 3, 4, 8), (2, 3, 6, 8), rand(4, 18),
                                                past=(2, 3, 12, 8)), 3, {}),
    "attention_3d_gqa_softcap": ("Attention", 23, attention_inputs((2, 4, 72), (2, 6, 24)), 1,
                                 {"q_num_heads": 9, "kv_num_heads": 3, "softcap": 3.0}),
    "attention_24_bool_mask": ("Attention", 24,
                               attention_inputs((1, 2, 3, 4), (1, 2, 5, 4),
                                                R.integers(0, 2, (3, 5)).astype(bool)), 1, {}),
    "rotary_embedding": ("RotaryEmbedding", 23,
                         {"x": rand(2, 4, 3, 8), "cos": rand(50, 4), "sin": rand(50, 4),
                          "pos": R.integers(0, 50, (2, 3)).astype(np.int64)}, 1, {}),
    "rotary_embedding_3d_interleaved": ("RotaryEmbedding", 23,
                                        {"x": rand(2, 3, 32), "cos": rand(50, 4),
                                         "sin": rand(50, 4),
                                         "pos": R.integers(0, 50, (2, 3)).astype(np.int64)},
                                        1, {"num_heads": 4, "interleaved": 1}),
    "group_norm": ("GroupNormalization", 21,
                   {"x": rand(2, 4, 3, 3), "scale": rand(4), "bias": rand(4)}, 1,
                   {"num_groups": 2, "epsilon": 1e-3}),
    "center_crop_pad": ("CenterCropPad", 18,
                        {"x": rand(6, 7, 3), "shape": np.array([4, 9], np.int64)}, 1,
                        {"axes": [0, 1]}),
    "affine_grid_2d": ("AffineGrid", 20,
                       {"theta": rand(2, 2, 3), "size": np.array([2, 3, 4, 5], np.int64)}, 1, {}),
    "affine_grid_3d_align_corners": ("AffineGrid", 20,
                                     {"theta": rand(2, 3, 4),
                                      "size": np.array([2, 3, 2, 4, 5], np.int64)}, 1,
                                     {"align_corners": 1}),
    "hann_window": ("HannWindow", 17, {"size": np.array(10, np.int64)}, 1, {}),
    "hamming_window_symmetric": ("HammingWindow", 17, {"size": np.array(9, np.int64)}, 1,
                                 {"periodic": 0}),
    "blackman_window_float64": ("BlackmanWindow", 23, {"size": np.array(7, np.int64)}, 1,
                                {"output_datatype": TensorProto.DOUBLE}),
    "swiglu": ("SwiGLU", 28, {"a": rand(2, 4), "b": rand(2, 4)}, 1, {"alpha": 0.5}),
    "causal_conv_with_state": ("CausalConvWithState", 27,
                               {"x": rand(2, 4, 8), "w": rand(4, 1, 4), "b": rand(4),
                                "past": rand(2, 4, 3)}, 2, {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_expanded_matches_reference(name):
    op_type, opset, inputs, n_out, attrs = CASES[name]
    check_against_reference(single_node_model(op_type, inputs, n_out, opset, **attrs), inputs)


def test_preview_domain_flex_attention():
    inputs = {"Q": rand(2, 8, 4, 16), "K": rand(2, 2, 6, 16), "V": rand(2, 2, 6, 16)}
    model = single_node_model("FlexAttention", inputs, 1, 1, domain="ai.onnx.preview")
    check_against_reference(model, inputs)


def _input_grads(model, inputs, gy):
    g = aidge_interop.load_onnx(model)
    (y,) = g.forward([inputs[n] for n in g.input_names], input_grads=True)
    return y, dict(zip(g.input_names, g.backward([gy])))


@pytest.mark.parametrize("shape, normalized", [((2, 3, 8), (8,)), ((4, 3, 5), (3, 5))])
def test_rms_norm_gradient_matches_torch(shape, normalized):
    inputs = {"x": rand(*shape), "scale": rand(*normalized)}
    model = single_node_model("RMSNormalization", inputs, axis=-len(normalized), epsilon=1e-4)
    x, scale = (torch.tensor(v, requires_grad=True) for v in inputs.values())
    ref = F.rms_norm(x, normalized, scale, eps=1e-4)
    gy = rand(*shape)
    ref.backward(torch.tensor(gy))
    y, grads = _input_grads(model, inputs, gy)
    np.testing.assert_allclose(y, ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["x"], x.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads["scale"], scale.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["plain", "causal", "mask", "gqa"])
def test_attention_gradient_matches_torch(case):
    q_heads, kv_heads = (4, 2) if case == "gqa" else (2, 2)
    inputs = {"Q": rand(2, q_heads, 5, 8), "K": rand(2, kv_heads, 7, 8),
              "V": rand(2, kv_heads, 7, 8)}
    attrs = {"is_causal": 1} if case == "causal" else {}
    if case == "mask":
        inputs["attn_mask"] = rand(5, 7)
    model = single_node_model("Attention", inputs, **attrs)
    t = {n: torch.tensor(v, requires_grad=n != "attn_mask") for n, v in inputs.items()}
    # (ONNX's causal mask is top-left aligned, as torch's is_causal)
    ref = F.scaled_dot_product_attention(t["Q"], t["K"], t["V"], attn_mask=t.get("attn_mask"),
                                         is_causal=case == "causal",
                                         enable_gqa=case == "gqa")
    gy = rand(*ref.shape)
    ref.backward(torch.tensor(gy))
    y, grads = _input_grads(model, inputs, gy)
    np.testing.assert_allclose(y, ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    for n in ("Q", "K", "V"):
        np.testing.assert_allclose(grads[n], t[n].grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=f"gradient of {n}")


class NormAttention(torch.nn.Module):
    """nn.RMSNorm, a projection, then causal attention: the dynamo exporter at
    opset 23 writes RMSNormalization and Attention."""

    def __init__(self):
        super().__init__()
        self.norm, self.proj = torch.nn.RMSNorm(8), torch.nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.proj(self.norm(x)).reshape(x.shape[0], x.shape[1], 3, 2, 4) \
            .permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.slow
def test_wrapped_module_with_function_operators_matches_torch():
    torch.manual_seed(0)
    model = NormAttention()
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [(2, 5, 8)], opset=23,
                                 exporter="dynamo")
    # (the graph kept is the expanded one: its nodes named under the two)
    expanded = {n.name.split("/")[0] for n in wrapped.onnx_model.graph.node if "/" in n.name}
    assert expanded == {"node_rms_norm", "node_scaled_dot_product_attention"}
    check_wrapped_step(model, wrapped, torch.randn(2, 5, 8))


def test_local_function_calling_a_function_operator():
    """A model-local function (inlined by onnx.inliner) whose body is an
    RMSNormalization then a Relu: both levels expanded."""
    fn = helper.make_function(
        "my.domain", "NormRelu", ["x", "s"], ["y"],
        [helper.make_node("RMSNormalization", ["x", "s"], ["n"], axis=-1),
         helper.make_node("Relu", ["n"], ["y"])],
        [helper.make_opsetid("", 23)])
    inputs = {"x": rand(3, 6), "s": rand(6)}
    graph = helper.make_graph(
        [helper.make_node("NormRelu", ["x", "s"], ["y0"], domain="my.domain", name="the_node")],
        "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape)
              for n, v in inputs.items()],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 23), helper.make_opsetid("my.domain", 1)])
    g = check_against_reference(model, inputs)
    assert "RMSNormalization" not in {n["op_type"] for n in g.nodes()}


@pytest.mark.parametrize("cond", [True, False])
def test_function_operator_in_a_subgraph(cond):
    """An RMSNormalization in an If branch, reading a value of the branch."""
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]),
         helper.make_node("RMSNormalization", ["a", "s"], ["r"], epsilon=0.01)], "then", [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "else", [],
                              [helper.make_tensor_value_info("n", TensorProto.FLOAT, None)])
    inputs = {"c": np.array(cond), "x": rand(2, 4), "s": rand(4)}
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y0"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info(n, ONNX_TYPE[v.dtype], v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    check_against_reference(model, inputs)


def test_local_function_of_an_older_opset():
    """ReduceSum's axes: an attribute in the function's opset 11, an input in
    the model's opset 18 (the function converted as it is inlined)."""
    fn = helper.make_function("my.domain", "RowSum", ["x"], ["y"],
                              [helper.make_node("ReduceSum", ["x"], ["y"], axes=[1])],
                              [helper.make_opsetid("", 11)])
    inputs = {"x": rand(3, 4)}
    graph = helper.make_graph(
        [helper.make_node("RowSum", ["x"], ["y0"], domain="my.domain")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("my.domain", 1)])
    check_against_reference(model, inputs)


def test_body_keeps_its_own_opset():
    """HannWindow's body is written for opset 17: its nodes run as opset 17
    in a model that imports opset 23."""
    inputs = {"size": np.array(8, np.int64)}
    model = single_node_model("HannWindow", inputs, opset=23)
    proto, opsets = expand_functions(model, {"ai.onnx": 23}, lambda d, op: op != "HannWindow",
                                     "load_onnx")
    assert [n.name for n in proto.graph.node] and \
        all(n.name.startswith("the_node/") for n in proto.graph.node)
    assert set(opsets.values()) == {17}
    check_against_reference(model, inputs)


def test_backend_is_compatible_with_function_operators():
    from aidge_interop.onnx.backend import AidgeBackend

    inputs = {"x": rand(2, 5), "scale": rand(5)}
    assert AidgeBackend.is_compatible(single_node_model("RMSNormalization", inputs))

    def calling(inner_op):  # a model-local function my.domain.F whose body is inner_op
        model = single_node_model("F", inputs, opset=1, domain="my.domain")
        model.functions.append(helper.make_function(
            "my.domain", "F", ["x", "scale"], ["y"],
            [helper.make_node(inner_op, ["x", "scale"], ["y"])], [helper.make_opsetid("", 23)]))
        return model

    assert AidgeBackend.is_compatible(calling("RMSNormalization"))
    assert not AidgeBackend.is_compatible(calling("StringConcat"))


def test_native_operator_is_not_expanded():
    """LayerNormalization has a function body too, but the engine's own wins."""
    inputs = {"x": rand(2, 5), "scale": rand(5), "bias": rand(5)}
    model = single_node_model("LayerNormalization", inputs, opset=17)
    g = check_against_reference(model, inputs)
    assert [n["op_type"] for n in g.nodes()] == ["LayerNormalization"]


def test_body_using_a_missing_operator_is_refused_by_name():
    inputs = {"x": rand(2, 5), "scale": rand(5)}
    model = single_node_model("RMSNormalization", inputs, opset=23)
    with pytest.raises(NotImplementedError) as info:
        expand_functions(model, {"ai.onnx": 23}, lambda d, op: op not in ("RMSNormalization",
                                                                             "Sqrt"), "load_onnx")
    assert str(info.value) == ("load_onnx: operator RMSNormalization (node 'the_node', opset 23): "
                               "its ONNX function body uses Sqrt, which the engine lacks")
