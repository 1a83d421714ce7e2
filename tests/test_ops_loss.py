"""The loss operators (loss.c) against torch: NegativeLogLikelihoodLoss
(F.nll_loss) and SoftmaxCrossEntropyLoss (F.cross_entropy, and
F.log_softmax for its log_prob output), values and gradients, for every
reduction, with and without weights and ignore_index, at ranks 2 to 6."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aidge_interop
from op_harness import check_op, make_model

DTYPES = [np.float32, np.float64]
DT_IDS = lambda d: np.dtype(d).name  # noqa: E731
REDUCTIONS = ["none", "sum", "mean"]
SHAPES = [(5, 4), (3, 4, 6), (2, 3, 4, 5), (2, 3, 2, 3, 2, 2)]  # (N, C, d1..dk)
C_DIM = 1


def _case(shape, dtype, ignore=None, seed=0):
    """Scores, int64 targets (some set to `ignore`) and class weights."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, shape).astype(dtype)
    t = rng.integers(0, shape[C_DIM], (shape[0],) + shape[2:]).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    w = rng.uniform(0.2, 2.0, shape[C_DIM]).astype(dtype)
    return x, t, w


def _attrs(reduction, ignore):
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    return attrs


def _torch_ii(ignore):
    return -100 if ignore is None else ignore


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("weighted", [False, True], ids=["no_weight", "weight"])
@pytest.mark.parametrize("ignore", [None, 1, -1], ids=["no_ii", "ii1", "ii-1"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(reduction, ignore, weighted, shape, dtype):
    """Values and the gradient of the input (the weight a constant)."""
    x, t, w = _case(shape, dtype, ignore)
    consts = {"w": w} if weighted else None

    def ref(x_, t_, *w_):
        return F.nll_loss(x_, t_, weight=w_[0] if w_ else None, reduction=reduction,
                          ignore_index=_torch_ii(ignore))

    check_op("NegativeLogLikelihoodLoss", {"x": x, "t": t}, ref, consts=consts,
             attrs=_attrs(reduction, ignore), opset=13)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("weighted", [False, True], ids=["no_weight", "weight"])
@pytest.mark.parametrize("ignore", [None, 2], ids=["no_ii", "ii2"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_prob", [False, True], ids=["loss", "log_prob"])
def test_softmax_cross_entropy(log_prob, reduction, ignore, weighted, shape, dtype):
    """Values and the gradient of the scores; with log_prob, both outputs
    get gradients."""
    x, t, w = _case(shape, dtype, ignore, seed=1)
    consts = {"w": w} if weighted else None

    def ref(x_, t_, *w_):
        loss = F.cross_entropy(x_, t_, weight=w_[0] if w_ else None, reduction=reduction,
                               ignore_index=_torch_ii(ignore))
        return (loss, F.log_softmax(x_, C_DIM)) if log_prob else loss

    check_op("SoftmaxCrossEntropyLoss", {"x": x, "t": t}, ref, consts=consts,
             attrs=_attrs(reduction, ignore), n_outputs=2 if log_prob else 1, opset=13)


@pytest.mark.parametrize("opset", [12, 13])
def test_int32_targets_and_opset_12(opset):
    x, t, w = _case((4, 5, 3), np.float64, seed=2)
    check_op("SoftmaxCrossEntropyLoss", {"x": x, "t": t.astype(np.int32)},
             lambda x_, t_, w_: F.cross_entropy(x_, t_.long(), weight=w_), consts={"w": w},
             opset=opset)
    check_op("NegativeLogLikelihoodLoss", {"x": x, "t": t.astype(np.int32)},
             lambda x_, t_, w_: F.nll_loss(x_, t_.long(), weight=w_), consts={"w": w},
             opset=opset)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_weight_gradient(op, reduction):
    """The weight as a graph input: its gradient against torch autograd of
    the loss written with gather (F.nll_loss has no weight gradient)."""
    x, t, w = _case((3, 4, 5), np.float64, ignore=0, seed=3)

    def ref(x_, t_, w_):
        p = F.log_softmax(x_, C_DIM) if op == "SoftmaxCrossEntropyLoss" else x_
        keep = t_ != 0
        tc = torch.where(keep, t_, torch.zeros_like(t_))
        wt = w_[tc] * keep
        loss = -p.gather(C_DIM, tc.unsqueeze(C_DIM)).squeeze(C_DIM) * wt
        if reduction == "sum":
            return loss.sum()
        return loss.sum() / wt.sum() if reduction == "mean" else loss

    check_op(op, {"x": x, "t": t, "w": w}, ref, attrs=_attrs(reduction, 0), opset=13)


def _run(op, x, t, attrs=None, w=None):
    inputs = {"x": x, "t": t} if w is None else {"x": x, "t": t, "w": w}
    return aidge_interop.load_onnx(make_model(op, inputs, attrs, opset=13)).forward(
        list(inputs.values()))


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_bad_inputs(op):
    x, t, w = _case((3, 4), np.float32)
    bad = t.copy()
    bad[1] = 4
    with pytest.raises(IndexError, match=r"target 4 at flat position 1 is not a class in \[0, 4\)"):
        _run(op, x, bad)
    bad[1] = -1  # only an ignore_index may lie outside the classes
    with pytest.raises(IndexError, match="target -1"):
        _run(op, x, bad)
    (got,) = _run(op, x, bad, {"ignore_index": -1, "reduction": "sum"})
    assert np.isfinite(got)
    with pytest.raises(ValueError, match="reduction 'avg'"):
        _run(op, x, t, {"reduction": "avg"})
    with pytest.raises(ValueError, match="target's shape"):
        _run(op, x, t[:2])
    with pytest.raises(ValueError, match="1-D float32 tensor of the 4 classes"):
        _run(op, x, t, w=w[:3])
    with pytest.raises(TypeError, match="int32 or int64"):
        _run(op, x, t.astype(np.float32))


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_graph_holds_its_loss(op):
    """Gemm, (LogSoftmax,) loss: the parameter gradients of a backward from
    the loss output equal torch's."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 5))
    labels = rng.integers(0, 3, 6)
    labels[2] = -1
    w, b = rng.standard_normal((5, 3)), rng.standard_normal(3)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["logits"])]
    if op == "NegativeLogLikelihoodLoss":
        nodes.append(helper.make_node("LogSoftmax", ["logits"], ["lp"], axis=1))
    nodes.append(helper.make_node(op, [nodes[-1].output[0], "labels"], ["loss"],
                                  ignore_index=-1))
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [6, 5]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, [6])],
        [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    g = aidge_interop.load_onnx(model, param_kinds={"w": "param", "b": "param"})
    (loss,) = g.forward([x, labels], need_backward=True)
    g.backward([np.ones(())])

    tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    ref = F.cross_entropy(torch.tensor(x) @ tw + tb, torch.tensor(labels), ignore_index=-1)
    ref.backward()
    np.testing.assert_allclose(loss, ref.item(), rtol=1e-12)
    np.testing.assert_allclose(g.grads()["w"], tw.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g.grads()["b"], tb.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op,fn", [("NegativeLogLikelihoodLoss", F.nll_loss),
                                   ("SoftmaxCrossEntropyLoss", F.cross_entropy)])
def test_every_target_ignored(op, fn):
    """mean over no target: NaN, and a zero gradient, as torch."""
    x, t, _ = _case((3, 4, 2), np.float64, seed=5)
    t[:] = 1
    check_op(op, {"x": x, "t": t}, lambda x_, t_: fn(x_, t_, ignore_index=1),
             attrs={"ignore_index": 1}, opset=13)
