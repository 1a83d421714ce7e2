"""The kernels of issue 47's kernel sweep (branch sweep2), each against its
reference twin, torch, and itself at 1, 2 and 3 threads:

- float32 Softmax backward along a contiguous last axis by 16 lanes
  (csrc/kernels/rows.c, AVX-512; ``_C._set_avx512(False)`` runs the 8-lane
  reference of ops/norm.c): within a few float32 ulps of the reference (its
  sum of dy y runs in float blocks, the reference's in double), bit for bit
  at any thread count, written (first gradient) and accumulated (a second
  consumer of x);
- AveragePool 2 x 2 at stride 2 with every window inside the input
  (csrc/kernels/pool_impl.h's avgpool2x2 kernels; ``_C._set_fast_kernels(False)``
  runs the generic window kernels): the same sums in the same order, so the
  same bits as the reference, forward and backward; the cases it does not
  take (padding, ceil_mode past the input, odd windows) against torch too.

Where the CPU has no AVX-512 both Softmax paths run the reference and the
comparison of the two skips.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import aidge_interop
from aidge_interop import _C
from op_harness import check_op, make_model


def _x(shape, seed=0, lo=-3.0, hi=3.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


@pytest.fixture
def switches():
    """restores the kernel switches and the thread count a test changes"""
    threads = aidge_interop.get_num_threads()
    yield
    _C._set_avx512(True)
    _C._set_fast_kernels(True)
    aidge_interop.set_num_threads(threads)


def _forward_backward(model, x, threads=1, consts=None):
    aidge_interop.set_num_threads(threads)
    g = aidge_interop.load_onnx(model, param_kinds={k: "const" for k in consts or {}})
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    go = np.random.default_rng(3).standard_normal(y.shape).astype(np.float32)
    (dx,) = g.backward([go])
    return np.array(y), np.array(dx), go


# -- Softmax backward, 16 lanes ---------------------------------------------------

LENGTHS = [1, 7, 16, 17, 33, 128, 255, 256, 257, 1000, 4099]


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("wide", [True, False], ids=["v16", "reference"])
def test_softmax_backward_against_torch(switches, wide, L):
    _C._set_avx512(wide)
    check_op("Softmax", {"x": _x((37, L))}, lambda x: torch.softmax(x, -1), attrs={"axis": -1})


def _two_softmaxes(shape):
    """y = Softmax(x) * Softmax(x, on a scaled x): x's gradient is written by
    one Softmax's backward and accumulated by the other's"""
    nodes = [helper.make_node("Softmax", ["x"], ["a"], axis=-1),
             helper.make_node("Mul", ["x", "k"], ["xk"]),
             helper.make_node("Softmax", ["xk"], ["b"], axis=-1),
             helper.make_node("Mul", ["a", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "two_softmaxes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("k", TensorProto.FLOAT, [], [0.5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _two_softmaxes_torch(x, go):
    t = torch.tensor(x, requires_grad=True)
    y = torch.softmax(t, -1) * torch.softmax(t * 0.5, -1)
    y.backward(torch.tensor(go))
    return t.grad.numpy()


@pytest.mark.parametrize("L", [16, 33, 257])
def test_softmax_backward_accumulated_against_torch(switches, L):
    x = _x((29, L))
    _, dx, go = _forward_backward(_two_softmaxes([29, L]), x)
    ref = _two_softmaxes_torch(x, go)
    np.testing.assert_allclose(dx, ref, rtol=1e-4, atol=1e-6 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("L", LENGTHS)
def test_softmax_backward_v16_within_a_few_ulp_of_the_reference(switches, avx512, L):
    x = _x((29, L))
    model = make_model("Softmax", {"x": x}, {"axis": -1})
    for m in (model, _two_softmaxes([29, L])):
        _C._set_avx512(True)
        _, dx1, _ = _forward_backward(m, x)
        _C._set_avx512(False)
        _, dx0, _ = _forward_backward(m, x)
        # s = sum(dy y) in float blocks against double lanes, then dx = y (dy - s)
        np.testing.assert_allclose(dx1, dx0, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(dx0).max()))


def test_softmax_backward_same_values_at_any_thread_count(switches):
    x = _x((300, 1000))
    for m in (make_model("Softmax", {"x": x}, {"axis": -1}), _two_softmaxes([300, 1000])):
        runs = [_forward_backward(m, x, threads=n) for n in (1, 2, 3)]
        for n, (_, dx, _) in zip((2, 3), runs[1:]):
            assert np.array_equal(dx, runs[0][1]), f"Softmax dx at {n} threads differs from 1"


# -- AveragePool 2 x 2 at stride 2 ------------------------------------------------------

# (input shape, attributes): the first ones take the 2 x 2 kernel, the rest not
POOLS = [
    ((8, 32, 32, 32), {}),
    ((2, 3, 7, 9), {}),  # odd sizes: the last row and column are in no window
    ((1, 1, 2, 2), {}),
    ((3, 5, 4, 34), {"count_include_pad": 1}),
    ((2, 3, 6, 10, 8), {"kernel_shape": [1, 2, 2], "strides": [2, 2, 2]}),  # 3-D, 1 x 2 x 2
    ((2, 3, 7, 9), {"ceil_mode": 1}),  # a window past the input: the generic kernel
    ((2, 3, 8, 8), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 8, 8), {"pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ((2, 3, 9, 9), {"kernel_shape": [3, 3]}),
    ((2, 3, 9, 9), {"strides": [1, 1]}),
]


def _pool_attrs(shape, attrs):
    nsp = len(shape) - 2
    return {"kernel_shape": [2] * nsp, "strides": [2] * nsp, **attrs}


def _torch_pool(shape, attrs):
    a = _pool_attrs(shape, attrs)
    pads = a.get("pads", [0] * (2 * (len(shape) - 2)))
    fn = F.avg_pool2d if len(shape) == 4 else F.avg_pool3d
    return lambda x: fn(x, a["kernel_shape"], a["strides"], pads[:len(shape) - 2],
                        ceil_mode=bool(a.get("ceil_mode", 0)),
                        count_include_pad=bool(a.get("count_include_pad", 0)))


@pytest.mark.parametrize("shape,attrs", POOLS, ids=str)
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
def test_avgpool_against_torch(switches, fast, shape, attrs):
    _C._set_fast_kernels(fast)
    check_op("AveragePool", {"x": _x(shape)}, _torch_pool(shape, attrs),
             attrs=_pool_attrs(shape, attrs))


@pytest.mark.parametrize("shape,attrs", POOLS, ids=str)
def test_avgpool_fast_bit_for_bit_with_the_reference(switches, shape, attrs):
    x = _x(shape)
    x.flat[::7] = -0.0
    model = make_model("AveragePool", {"x": x}, _pool_attrs(shape, attrs))
    runs = []
    for fast in (True, False):
        _C._set_fast_kernels(fast)
        runs.append(_forward_backward(model, x))
    (y1, dx1, _), (y0, dx0, _) = runs
    assert np.array_equal(y1.view(np.int32), y0.view(np.int32))
    assert np.array_equal(dx1.view(np.int32), dx0.view(np.int32))


def test_avgpool_negative_zero_window_as_reference(switches):
    x = np.full((1, 1, 2, 4), -0.0, np.float32)
    x[0, 0, :, 2:] = [[1.5, -2.25], [np.inf, 1.0]]
    model = make_model("AveragePool", {"x": x}, _pool_attrs(x.shape, {}))
    ys = []
    for fast in (True, False):
        _C._set_fast_kernels(fast)
        ys.append(_forward_backward(model, x)[0])
    for y in ys:  # +0, as torch's sum from zero gives
        assert y[0, 0, 0, 0] == 0 and not np.signbit(y[0, 0, 0, 0])
        assert y[0, 0, 0, 1] == np.inf


@pytest.mark.parametrize("shape", [(8, 32, 32, 32), (3, 5, 66, 18)], ids=str)
def test_avgpool_same_values_at_any_thread_count(switches, shape):
    x = _x(shape)
    model = make_model("AveragePool", {"x": x}, _pool_attrs(shape, {}))
    runs = [_forward_backward(model, x, threads=n) for n in (1, 2, 3)]
    for n, (y, dx, _) in zip((2, 3), runs[1:]):
        assert np.array_equal(y, runs[0][0]) and np.array_equal(dx, runs[0][1]), \
            f"AveragePool at {n} threads differs from 1 thread"


# -- Pad backward, plane by plane -----------------------------------------------------

# (input shape, pads (ONNX order: all begins, then all ends), mode); the last
# ones pad an axis before the last two: the reference runs
PADS = [
    ((8, 32, 32, 32), [0, 0, 1, 1, 0, 0, 1, 1], "reflect"),
    ((2, 3, 7, 9), [0, 0, 2, 1, 0, 0, 1, 2], "reflect"),
    ((2, 3, 7, 9), [0, 0, 2, 3, 0, 0, 1, 2], "edge"),
    ((2, 3, 7, 9), [0, 0, 2, 3, 0, 0, 1, 4], "wrap"),
    ((2, 3, 7, 9), [0, 0, 1, 2, 0, 0, 3, 1], "constant"),
    ((2, 3, 7, 9), [0, 0, -1, 2, 0, 0, 2, -3], "constant"),  # crops
    ((3, 40), [1, 2, 2, 1], "reflect"),
    ((50,), [3, 5], "reflect"),
    ((2, 4, 5, 6, 7), [0, 0, 0, 1, 2, 0, 0, 0, 2, 1], "edge"),
    ((2, 3, 7, 9), [0, 1, 1, 1, 0, 2, 1, 1], "reflect"),  # channels padded: the reference
]
_TORCH_MODE = {"reflect": "reflect", "edge": "replicate", "wrap": "circular",
               "constant": "constant"}


def _torch_pad(x, pads, mode):
    """the ONNX pads by torch: constant pads (and crops) by F.pad, the other
    modes on the axes torch pads them (all but the first two, or the last
    for inputs of rank 2)"""
    nd = x.dim()
    tp = []
    for d in reversed(range(nd)):
        tp += [pads[d], pads[nd + d]]
    if mode == "constant":
        return F.pad(x, tp)
    lead = 2 if nd > 2 else 1 if nd == 2 else 0
    if any(tp[2 * (nd - lead):]):  # a leading axis padded: one axis at a time
        for d in range(nd):
            if pads[d] or pads[nd + d]:
                moved = x.movedim(d, -1)
                flat = moved.reshape(-1, 1, moved.shape[-1])
                flat = F.pad(flat, (pads[d], pads[nd + d]), mode=_TORCH_MODE[mode])
                x = flat.reshape(*moved.shape[:-1], -1).movedim(-1, d)
        return x
    if nd == 1:
        return F.pad(x[None, None], tp[:2], mode=_TORCH_MODE[mode])[0, 0]
    if nd == 2:
        return F.pad(x[None], tp[:2], mode=_TORCH_MODE[mode])[0]
    return F.pad(x, tp[:2 * (nd - 2)], mode=_TORCH_MODE[mode])


@pytest.mark.parametrize("shape,pads,mode", PADS, ids=str)
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
def test_pad_backward_against_torch(switches, fast, shape, pads, mode):
    _C._set_fast_kernels(fast)
    check_op("Pad", {"x": _x(shape)}, lambda x, p: _torch_pad(x, pads, mode),
             attrs={"mode": mode}, consts={"pads": np.array(pads, np.int64)})


def _pad_model(x, pads, mode):
    return make_model("Pad", {"x": x}, {"mode": mode}, {"pads": np.array(pads, np.int64)})


@pytest.mark.parametrize("shape,pads,mode", PADS, ids=str)
def test_pad_backward_fast_bit_for_bit_with_the_reference(switches, shape, pads, mode):
    x = _x(shape)
    model = _pad_model(x, pads, mode)
    runs = []
    for fast in (True, False):
        _C._set_fast_kernels(fast)
        runs.append(_forward_backward(model, x, consts={"pads": 0}))
    assert np.array_equal(runs[0][1].view(np.int32), runs[1][1].view(np.int32))


@pytest.mark.parametrize("shape,pads,mode", [
    PADS[0], ((64, 16, 20, 20), [0, 0, 3, 2, 0, 0, 1, 4], "wrap"),
    ((64, 16, 20, 20), [0, 0, -2, 2, 0, 0, 3, -1], "constant")], ids=str)
def test_pad_backward_same_values_at_any_thread_count(switches, shape, pads, mode):
    x = _x(shape)
    model = _pad_model(x, pads, mode)
    runs = [_forward_backward(model, x, threads=n, consts={"pads": 0}) for n in (1, 2, 3)]
    for n, (_, dx, _) in zip((2, 3), runs[1:]):
        assert np.array_equal(dx, runs[0][1]), f"Pad dx at {n} threads differs from 1 thread"
