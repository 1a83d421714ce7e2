"""Checks one engine operator against torch: forward values and gradients.

    check_op("Relu", {"x": x}, lambda x: torch.relu(x))

builds a one-node ONNX model (inputs are graph inputs; ``consts`` become
constant initializers), runs the engine's forward and backward with a random
output gradient, and compares outputs and input gradients with what
``torch_fn`` and torch autograd give on the same values. Float64 runs use a
tight tolerance; float32 rtol 1e-4 / atol 1e-5 scaled by the result's
magnitude.
"""
from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import aidge_interop

_NP_TO_ONNX = {
    np.dtype("float32"): TensorProto.FLOAT, np.dtype("float64"): TensorProto.DOUBLE,
    np.dtype("int64"): TensorProto.INT64, np.dtype("int32"): TensorProto.INT32,
    np.dtype("bool"): TensorProto.BOOL, np.dtype("float16"): TensorProto.FLOAT16,
    np.dtype("int8"): TensorProto.INT8, np.dtype("uint8"): TensorProto.UINT8,
    np.dtype("int16"): TensorProto.INT16,
}

TOL = {np.dtype("float64"): (1e-10, 1e-12), np.dtype("float32"): (1e-4, 1e-5)}


def make_model(op_type, inputs, attrs=None, consts=None, n_outputs=1, domain="",
               opset=20, input_order=None):
    """A one-node ONNX model; input order follows ``input_order`` (names,
    "" for an absent optional input) or inputs then consts."""
    consts = consts or {}
    order = input_order or list(inputs) + list(consts)
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, order, outs, domain=domain or None, **(attrs or {}))
    g_inputs = [helper.make_tensor_value_info(n, _NP_TO_ONNX[a.dtype], list(a.shape))
                for n, a in inputs.items()]
    g_outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()]
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    graph = helper.make_graph([node], op_type.lower(), g_inputs, g_outputs, inits)
    return helper.make_model(graph, opset_imports=imports)


def _close(name, ours, ref, rtol, atol):
    ref = np.asarray(ref)
    assert ours.shape == ref.shape, f"{name}: shape {ours.shape} != torch {ref.shape}"
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol * scale, err_msg=name,
                               equal_nan=True)


def check_op(op_type, inputs, torch_fn, *, attrs=None, consts=None, n_outputs=1,
             grad=True, domain="", opset=20, input_order=None, training=False,
             rtol=None, atol=None, seed=0):
    """Compares the engine with torch_fn(*inputs as tensors, *consts as tensors).

    Returns the engine's outputs. ``grad`` checks input gradients of the
    float inputs (torch_fn must be differentiable in them).
    """
    consts = consts or {}
    model = make_model(op_type, inputs, attrs, consts, n_outputs, domain, opset, input_order)
    kinds = {n: "const" for n in consts}
    g = aidge_interop.load_onnx(model, param_kinds=kinds)
    g.training = training
    float_inputs = [n for n, a in inputs.items() if a.dtype.kind == "f"]
    outs = g.forward([inputs[n] for n in inputs], need_backward=grad,
                     input_grads=grad and bool(float_inputs))

    t_in = {n: torch.tensor(a, requires_grad=grad and a.dtype.kind == "f")
            for n, a in inputs.items()}
    t_consts = [torch.tensor(np.asarray(v)) for v in consts.values()]
    ref = torch_fn(*t_in.values(), *t_consts)
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    assert len(refs) == len(outs), f"{op_type}: {len(outs)} outputs, torch gives {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        dt = o.dtype
        rt, at = TOL.get(dt, (0, 0))
        _close(f"{op_type} output {i}", o, r.detach().numpy(), rtol or rt, atol or at)
    if not grad or not float_inputs:
        return outs
    rng = np.random.default_rng(seed)
    gos = [rng.standard_normal(o.shape).astype(o.dtype) if o.dtype.kind == "f" else None
           for o in outs]
    gins = g.backward(gos)
    diff = [(r, torch.tensor(go)) for r, go in zip(refs, gos) if go is not None]
    t_grads = torch.autograd.grad([r for r, _ in diff], [t_in[n] for n in float_inputs],
                                  [go for _, go in diff], allow_unused=True)
    for n, tg in zip(float_inputs, t_grads):
        ours = gins[list(inputs).index(n)]
        dt = inputs[n].dtype
        rt, at = TOL[dt]
        expected = np.zeros_like(inputs[n]) if tg is None else tg.numpy()
        _close(f"{op_type} grad of input '{n}'", ours, expected, rtol or rt, atol or at)
    return outs


def check_wrapped_step(model, wrapped, x, *, rtol=1e-5, atol=1e-5, grad_rtol=1e-4,
                       grad_atol=1e-5):
    """One forward and backward of a torch model and of its wrap() on input x
    (a tensor, or a list of them; random output gradients): outputs, input
    and parameter gradients; the gradients are zeroed afterwards."""
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    xt = [v.detach().clone().requires_grad_() for v in xs]
    xa = [v.detach().clone().requires_grad_() for v in xs]
    yt, ya = model(*xt), wrapped(*xa)
    yt, ya = (list(yt), list(ya)) if isinstance(yt, tuple) else ([yt], [ya])
    for a, t in zip(ya, yt, strict=True):
        torch.testing.assert_close(a, t, rtol=rtol, atol=atol)
    g = [torch.randn_like(t) for t in yt]
    torch.autograd.backward(yt, g)
    torch.autograd.backward(ya, g)
    for a, t in zip(xa, xt):
        torch.testing.assert_close(a.grad, t.grad, rtol=grad_rtol, atol=grad_atol)
    for (n, p), q in zip(model.named_parameters(), wrapped.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=grad_rtol, atol=grad_atol, msg=n)
    model.zero_grad()
    wrapped.zero_grad()
