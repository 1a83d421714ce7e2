"""Backward's "first writer assigns" mode (AI_OP_GRAD_ASSIGN, csrc/plan.c):
the first op to write a non-parameter gradient in a backward pass overwrites
its buffer instead of zeroing and adding. Gradients must stay those of torch
(float64, tight tolerance) wherever that could go wrong: fan-out to ops that
assign and ops that accumulate, in both orders; one value in two slots of a
node (Mul(x, x)); broadcast operands; Concat/Split; residual conv blocks
through every conv dx path; a graph output also read inside the graph;
values whose gradient nobody writes; parameter gradients accumulating over
backward calls; two backward passes in a row (no stale values)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from aidge_interop import load_onnx

RTOL, ATOL = 1e-10, 1e-12


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def _node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def _i64(name, values):
    return (name, np.asarray(values, dtype=np.int64))


def _check(model, inputs, params, torch_fn, grad_seeds=(0, 1), out_grads_none=()):
    """Forward once, then one backward per seed (different output gradients):
    outputs, input gradients of every pass and the parameter gradients summed
    over the passes (they accumulate) against torch."""
    g = load_onnx(model)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s) for s in inputs]
    outs = g.forward(xs, need_backward=True, input_grads=True)
    xt = [torch.tensor(x, requires_grad=True) for x in xs]
    pt = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    touts = torch_fn(*xt, **pt)
    for o, t in zip(outs, touts):
        np.testing.assert_allclose(o, t.detach().numpy(), rtol=RTOL, atol=ATOL)
    total = {k: np.zeros_like(v) for k, v in params.items()}
    for seed in grad_seeds:
        r = np.random.default_rng(100 + seed)
        gos = [None if i in out_grads_none else r.standard_normal(o.shape)
               for i, o in enumerate(outs)]
        gx = g.backward(gos)
        pairs = [(t, torch.tensor(go)) for t, go in zip(touts, gos) if go is not None]
        tg = torch.autograd.grad([p[0] for p in pairs], xt + list(pt.values()),
                                 [p[1] for p in pairs], retain_graph=True, allow_unused=True)
        for i, (a, b) in enumerate(zip(gx, tg[:len(xt)])):
            if b is None:  # torch: no differentiable path; the engine too, unless
                # the path goes through an output given no gradient (then zeros)
                assert a is None or (out_grads_none and not np.any(a)), \
                    f"input {i}: torch gives no gradient, the engine {a}"
                continue
            np.testing.assert_allclose(a, b.numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"input {i}, backward seed {seed}")
        for k, b in zip(pt, tg[len(xt):]):
            total[k] += 0 if b is None else b.numpy()
        grads = g.grads()
        for k in params:
            np.testing.assert_allclose(grads[k], total[k], rtol=RTOL, atol=ATOL,
                                       err_msg=f"parameter {k} after backward seed {seed}")


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"], autouse=True)
def threads(request):
    saved = aidge_interop.get_num_threads()
    aidge_interop.set_num_threads(request.param)
    yield
    aidge_interop.set_num_threads(saved)


def test_fanout_to_assigning_and_accumulating_ops():
    """h feeds Relu, Tanh, ReduceMean (assign), Slice (accumulate) and a
    broadcast Mul; x (an input) feeds Sigmoid and Pad."""
    nodes = [
        _node("Sigmoid", ["x"], ["h"]),
        _node("Relu", ["h"], ["r"]),
        _node("ReduceMean", ["h", "ax"], ["m"], keepdims=1),
        _node("Tanh", ["h"], ["t"]),
        _node("Slice", ["h", "s0", "s1", "sax"], ["sl"]),
        _node("Mul", ["r", "m"], ["rm"]),
        _node("Add", ["rm", "t"], ["y"]),
        _node("Pad", ["x", "pads"], ["p"]),
        _node("Mul", ["sl", "sl"], ["z"]),
    ]
    inits = [_i64("ax", [1]), _i64("s0", [1]), _i64("s1", [3]), _i64("sax", [2]),
             _i64("pads", [0, 0, 1, 0, 0, 0, 0, 2])]
    model = _model(nodes, [("x", [3, 4, 5, 6])], ["y", "p", "z"], inits)

    def ref(x):
        h = torch.sigmoid(x)
        sl = h[:, :, 1:3]
        return (torch.relu(h) * h.mean(1, keepdim=True) + torch.tanh(h),
                F.pad(x, (0, 2, 1, 0)), sl * sl)
    _check(model, [(3, 4, 5, 6)], {}, ref)


@pytest.mark.parametrize("order", ["assign_first", "accumulate_first"])
def test_assigning_and_accumulating_consumer_in_both_orders(order):
    """Backward runs consumers in reverse: the first writer of h's gradient is
    the later node; both orders give the same sums."""
    a = _node("Relu", ["h"], ["a"])           # assigns
    b = _node("Gather", ["h", "idx"], ["b"], axis=1)  # accumulates
    nodes = [_node("Tanh", ["x"], ["h"])] + ([a, b] if order == "assign_first" else [b, a])
    nodes.append(_node("ReduceSum", ["b", "ax"], ["bs"], keepdims=1))
    nodes.append(_node("Add", ["a", "bs"], ["y"]))
    model = _model(nodes, [("x", [4, 7])], ["y"], [_i64("idx", [0, 3, 3]), _i64("ax", [1])])

    def ref(x):
        h = torch.tanh(x)
        return (torch.relu(h) + h[:, [0, 3, 3]].sum(1, keepdim=True),)
    _check(model, [(4, 7)], {}, ref)


def test_same_value_in_two_slots_of_one_node():
    """Mul(h, h), Add(h, h), Sub(h, h), MatMul(h, h), Gemm(h, h, h) and
    Concat(h, r, h) on an activation h: the second slot adds onto the
    first's write."""
    nodes = [
        _node("Tanh", ["x"], ["h"]),
        _node("Mul", ["h", "h"], ["m"]),
        _node("Tanh", ["x"], ["h2"]),
        _node("Add", ["h2", "h2"], ["a"]),
        _node("Sigmoid", ["x"], ["h3"]),
        _node("Sub", ["h3", "h3"], ["s"]),
        _node("Exp", ["x"], ["h4"]),
        _node("MatMul", ["h4", "h4"], ["mm"]),
        _node("Neg", ["x"], ["h5"]),
        _node("Gemm", ["h5", "h5", "h5"], ["gm"], transB=1),
        _node("Relu", ["x"], ["h6"]),
        _node("Softmax", ["x"], ["r"], axis=1),
        _node("Concat", ["h6", "r", "h6"], ["c"], axis=1),
    ]
    model = _model(nodes, [("x", [5, 5])], ["m", "a", "s", "mm", "gm", "c"])

    def ref(x):
        h, h3, h4, h5, h6 = torch.tanh(x), torch.sigmoid(x), torch.exp(x), -x, torch.relu(x)
        return (h * h, h + h, h3 - h3, h4 @ h4, h5 @ h5.T + h5,
                torch.cat([h6, torch.softmax(x, 1), h6], 1))
    _check(model, [(5, 5)], {}, ref)


def test_broadcast_operands_and_matmul_batches():
    """Gradients of broadcast operands are sums: Add/Mul/Div with a (C,1,1)
    activation, MatMul with a broadcast batch on either side, Gemm's bias."""
    nodes = [
        _node("Tanh", ["v"], ["b"]),
        _node("Sigmoid", ["x"], ["h"]),
        _node("Add", ["h", "b"], ["hb"]),
        _node("Mul", ["b", "hb"], ["y1"]),
        _node("Exp", ["b"], ["eb"]),
        _node("Div", ["y1", "eb"], ["y"]),
        _node("Tanh", ["a"], ["ta"]),       # (4, 5), broadcast over the batch of tb
        _node("Sigmoid", ["bm"], ["tb"]),   # (3, 5, 2)
        _node("MatMul", ["ta", "tb"], ["mm"]),
        _node("Relu", ["bm"], ["rb"]),      # (3, 5, 2) against a shared (2, 6)
        _node("Tanh", ["w"], ["tw"]),
        _node("MatMul", ["rb", "tw"], ["mm2"]),
        _node("Tanh", ["c"], ["tc"]),       # Gemm bias (6,), broadcast over rows
        _node("Gemm", ["a", "a2", "tc"], ["gm"], transB=1),
    ]
    ins = [("x", [2, 3, 4, 4]), ("v", [3, 1, 1]), ("a", [4, 5]), ("bm", [3, 5, 2]),
           ("w", [2, 6]), ("c", [6]), ("a2", [6, 5])]
    model = _model(nodes, ins, ["y", "mm", "mm2", "gm"])

    def ref(x, v, a, bm, w, c, a2):
        b = torch.tanh(v)
        y = b * (torch.sigmoid(x) + b) / torch.exp(b)
        return (y, torch.tanh(a) @ torch.sigmoid(bm), torch.relu(bm) @ torch.tanh(w),
                a @ a2.T + torch.tanh(c))
    _check(model, [s for _, s in ins], {}, ref)


def test_shape_ops_concat_split_and_unwritten_gradients():
    """Reshape, Transpose, Flatten, Unsqueeze/Squeeze, Identity, Concat,
    Split; one Split output nobody reads (its gradient is zero, never
    garbage) and a value read only by a comparison (no gradient flows)."""
    nodes = [
        _node("LeakyRelu", ["x"], ["h"], alpha=0.2),
        _node("Transpose", ["h"], ["t"], perm=[0, 2, 1]),
        _node("Reshape", ["t", "shape"], ["r"]),
        _node("Unsqueeze", ["r", "ax0"], ["u"]),
        _node("Squeeze", ["u", "ax0"], ["q"]),
        _node("Identity", ["q"], ["i"]),
        _node("Flatten", ["h"], ["f"], axis=1),
        _node("Concat", ["i", "f"], ["c"], axis=1),
        _node("Split", ["c", "split"], ["s1", "s2", "s3"], axis=1),
        _node("Clip", ["s1", "lo", "hi"], ["cl"]),
        _node("Gelu", ["s3"], ["ge"]),
        _node("Greater", ["h", "thr"], ["mask"]),  # input thr: read by a comparison only
        _node("Where", ["mask", "h", "x"], ["w"]),
    ]
    inits = [_i64("shape", [3, 24]), _i64("ax0", [0]), _i64("split", [10, 20, 18]),
             ("lo", np.array(-0.3)), ("hi", np.array(0.4))]
    model = _model(nodes, [("x", [3, 4, 6]), ("thr", [3, 4, 6])], ["cl", "ge", "w"], inits)

    def ref(x, thr):
        h = F.leaky_relu(x, 0.2)
        c = torch.cat([h.transpose(1, 2).reshape(3, 24), h.flatten(1)], 1)
        s1, _, s3 = torch.split(c, [10, 20, 18], 1)
        return torch.clamp(s1, -0.3, 0.4), F.gelu(s3), torch.where(h > thr, h, x)
    _check(model, [(3, 4, 6), (3, 4, 6)], {}, ref)


def test_graph_output_read_inside_the_graph():
    """y is an output and feeds z; with and without a gradient for y."""
    nodes = [_node("Tanh", ["x"], ["y"]), _node("Sigmoid", ["y"], ["s"]),
             _node("Mul", ["s", "y"], ["z"])]
    model = _model(nodes, [("x", [4, 6])], ["y", "z"])

    def ref(x):
        y = torch.tanh(x)
        return y, torch.sigmoid(y) * y
    _check(model, [(4, 6)], {}, ref)
    _check(model, [(4, 6)], {}, ref, out_grads_none=(0,))
    _check(model, [(4, 6)], {}, ref, out_grads_none=(1,))


def _conv_block_model(n_in):
    """Residual blocks through every conv dx path: 3x3 stride 1 (shifted
    GEMMs), 1x1 (pointwise GEMM), depthwise, 3x3 stride 2 (im2col + col2im),
    ConvTranspose; BatchNorm, Relu, Softmax, Dropout (ratio 0) between."""
    rng = np.random.default_rng(1)
    C = 4
    params = {
        "w1": rng.standard_normal((C, C, 3, 3)) * 0.3, "b1": rng.standard_normal(C),
        "w2": rng.standard_normal((C, C, 1, 1)) * 0.5,
        "wd": rng.standard_normal((C, 1, 3, 3)) * 0.3,
        "w3": rng.standard_normal((C, C, 3, 3)) * 0.3,
        "wt": rng.standard_normal((C, C, 2, 2)) * 0.3,
        "g1": 1 + 0.1 * rng.standard_normal(C), "be1": 0.1 * rng.standard_normal(C),
    }
    bufs = [("rm", np.zeros(C)), ("rv", np.ones(C)), ("ratio", np.array(0.0))]
    nodes = [
        _node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        _node("BatchNormalization", ["c1", "g1", "be1", "rm", "rv"], ["n1"]),
        _node("Relu", ["n1"], ["r1"]),
        _node("Conv", ["r1", "w2"], ["c2"]),
        _node("Add", ["c2", "r1"], ["res1"]),                  # residual
        _node("Conv", ["res1", "wd"], ["cd"], group=C, pads=[1, 1, 1, 1]),
        _node("Dropout", ["cd", "ratio"], ["dr"]),
        _node("Add", ["dr", "res1"], ["res2"]),                # residual
        _node("Conv", ["res2", "w3"], ["c3"], strides=[2, 2], pads=[1, 1, 1, 1]),
        _node("ConvTranspose", ["c3", "wt"], ["ct"], strides=[2, 2]),
        _node("Softmax", ["ct"], ["sm"], axis=1),
        _node("Mul", ["sm", "res2"], ["y"]),
    ]
    model = _model(nodes, [("x", [n_in, C, 6, 6])], ["y"], list(params.items()) + bufs)

    def ref(x, w1, b1, w2, wd, w3, wt, g1, be1):
        r1 = torch.relu(F.batch_norm(F.conv2d(x, w1, b1, padding=1), torch.zeros(C, dtype=torch.float64),
                                     torch.ones(C, dtype=torch.float64), g1, be1, eps=1e-5))
        res1 = F.conv2d(r1, w2) + r1
        res2 = F.conv2d(res1, wd, groups=C, padding=1) + res1
        ct = F.conv_transpose2d(F.conv2d(res2, w3, stride=2, padding=1), wt, stride=2)
        return (torch.softmax(ct, 1) * res2,)
    return model, params, ref


def test_residual_conv_blocks_and_parameter_gradients_accumulate():
    """Two backward passes after one forward: input gradients are each
    pass's, parameter gradients their sum (no zero_grad in between)."""
    model, params, ref = _conv_block_model(2)
    _check(model, [(2, 4, 6, 6)], params, ref, grad_seeds=(0, 1))


def test_same_output_gradient_twice_doubles_parameter_gradients():
    model, params, ref = _conv_block_model(3)
    g = load_onnx(model)
    x = np.random.default_rng(2).standard_normal((3, 4, 6, 6))
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    gy = np.random.default_rng(3).standard_normal(y.shape)
    (gx1,) = g.backward([gy])
    once = {k: v.copy() for k, v in g.grads().items()}
    (gx2,) = g.backward([gy])
    np.testing.assert_allclose(gx2, gx1, rtol=1e-13, atol=1e-14)  # fresh, not added
    for k, v in g.grads().items():
        np.testing.assert_allclose(v, 2 * once[k], rtol=1e-13, atol=1e-14, err_msg=k)


def test_training_batchnorm_with_activation_scale_and_bias():
    """BatchNorm in training mode whose scale and bias are activations (they
    get assigned gradients too), both from one value (slot 2 adds onto
    slot 1's write)."""
    nodes = [
        _node("Tanh", ["x"], ["h"]),
        _node("Sigmoid", ["s"], ["sc"]),
        _node("BatchNormalization", ["h", "sc", "sc", "rm", "rv"], ["n"],
              training_mode=1),
        _node("LogSoftmax", ["n"], ["y"], axis=1),
    ]
    C = 5
    model = _model(nodes, [("x", [4, C, 3]), ("s", [C])], ["y"],
                   [("rm", np.zeros(C)), ("rv", np.ones(C))])

    def ref(x, s):
        sc = torch.sigmoid(s)
        n = F.batch_norm(torch.tanh(x), None, None, sc, sc, training=True, eps=1e-5)
        return (torch.log_softmax(n, 1),)
    g = load_onnx(model)
    g.training = True
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((4, C, 3)), rng.standard_normal(C)]
    (y,) = g.forward(xs, need_backward=True, input_grads=True)
    xt = [torch.tensor(v, requires_grad=True) for v in xs]
    (yt,) = ref(*xt)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=RTOL, atol=ATOL)
    for seed in (0, 1):
        gy = np.random.default_rng(seed).standard_normal(y.shape)
        gx = g.backward([gy])
        tg = torch.autograd.grad(yt, xt, torch.tensor(gy), retain_graph=True)
        for a, b in zip(gx, tg):
            np.testing.assert_allclose(a, b.numpy(), rtol=RTOL, atol=ATOL)


def test_layernorm_with_activation_input_scale_and_bias():
    """LayerNormalization of an activation, scale and bias one activation
    (slot 2 adds onto slot 1's write)."""
    nodes = [
        _node("Sigmoid", ["x"], ["h"]),
        _node("Tanh", ["s"], ["sc"]),
        _node("LayerNormalization", ["h", "sc", "sc"], ["n"], axis=-1),
        _node("Mul", ["n", "h"], ["y"]),
    ]
    model = _model(nodes, [("x", [4, 3, 6]), ("s", [6])], ["y"])

    def ref(x, s):
        h, sc = torch.sigmoid(x), torch.tanh(s)
        return (F.layer_norm(h, (6,), sc, sc, eps=1e-5) * h,)
    _check(model, [(4, 3, 6), (6,)], {}, ref)


class _ConvFanout(torch.nn.Module):
    """x read by a float32 direct-kernel Conv (3x3, stride 1: its input
    gradient is written or added by the register-tiled kernel) and by Relu,
    in either order; Conv output read twice."""

    def __init__(self, conv_first, k=3, groups=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(5, 5, k, padding=k // 2, groups=groups)
        self.conv_first = conv_first

    def forward(self, x):
        if self.conv_first:
            c = self.conv(x)
            return c * torch.relu(x) + c
        r = torch.relu(x)
        return r * self.conv(x) + self.conv(r)


@pytest.mark.parametrize("width", [9, 40])  # 40: blocks inside a row, stored whole
@pytest.mark.parametrize("conv_first", [True, False])
# k=1: pointwise; 7x9 planes: the whole batch in one GEMM per gradient, dx scattered
@pytest.mark.parametrize("k", [3, 1])
def test_float32_direct_conv_input_gradient_assigns_and_accumulates(conv_first, width, k):
    torch.manual_seed(4)
    model = _ConvFanout(conv_first, k)
    wrapped = aidge_interop.wrap(model, [(2, 5, 7, width)])
    x = torch.randn(2, 5, 7, width, requires_grad=True)
    xe = x.detach().clone().requires_grad_(True)
    gy = torch.randn(2, 5, 7, width)
    model(x).backward(gy)
    for _ in range(2):  # a second pass: nothing left over from the first
        xe.grad = None
        wrapped(xe).backward(gy)
        torch.testing.assert_close(xe.grad, x.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("plane", [(25, 5), (12, 12)])
@pytest.mark.parametrize("conv_first", [True, False])
def test_float32_narrow_depthwise_input_gradient_assigns_and_accumulates(conv_first, plane):
    """The depthwise conv's input gradient on narrow planes (depthwise_narrow in conv_depthwise.c,
    where the CPU has AVX-512), written or added."""
    torch.manual_seed(5)
    model = _ConvFanout(conv_first, groups=5)
    wrapped = aidge_interop.wrap(model, [(3, 5, *plane)])
    x = torch.randn(3, 5, *plane, requires_grad=True)
    xe = x.detach().clone().requires_grad_(True)
    gy = torch.randn(3, 5, *plane)
    model(x).backward(gy)
    for _ in range(2):
        xe.grad = None
        wrapped(xe).backward(gy)
        torch.testing.assert_close(xe.grad, x.grad, rtol=1e-4, atol=1e-5)


def test_output_gradients_read_in_place_are_never_written():
    """An output no node reads, listed once, has its gradient read from the
    caller's array (no copy into the arena); an output read by a node, or
    listed twice, is copied. The caller's gradients stay as they were, every
    input gradient is torch's, and a later backward whose gradients are
    strided (copied) writes the arena, not an earlier caller's array."""
    nodes = [_node("Relu", ["x"], ["r"]), _node("Neg", ["r"], ["y"]),
             _node("Exp", ["x"], ["z"])]
    model = _model(nodes, [("x", [5, 7])], ["y", "r", "z", "z"])
    g = load_onnx(model)
    x = np.random.default_rng(3).standard_normal((5, 7))
    g.forward([x], need_backward=True, input_grads=True)
    xt = torch.tensor(x, requires_grad=True)
    r = torch.relu(xt)
    outs = (-r, r, torch.exp(xt), torch.exp(xt))

    def expected(gos):
        return torch.autograd.grad(outs, xt, [torch.tensor(a) for a in gos],
                                   retain_graph=True)[0].numpy()

    rng = np.random.default_rng(4)
    first = [rng.standard_normal((5, 7)) for _ in range(4)]
    kept = [a.copy() for a in first]
    (gx,) = g.backward(first)
    np.testing.assert_allclose(gx, expected(kept), rtol=RTOL, atol=ATOL)
    for a, b in zip(first, kept):
        np.testing.assert_array_equal(a, b)
    strided = [rng.standard_normal((7, 5)).T for _ in range(4)]
    assert not strided[0].flags.c_contiguous
    (gx,) = g.backward(strided)
    np.testing.assert_allclose(gx, expected(strided), rtol=RTOL, atol=ATOL)
    for a, b in zip(first, kept):
        np.testing.assert_array_equal(a, b)
    (gx,) = g.backward([None, first[1], None, first[3]])
    np.testing.assert_allclose(gx, expected([np.zeros((5, 7)), kept[1], np.zeros((5, 7)),
                                             kept[3]]), rtol=RTOL, atol=ATOL)
