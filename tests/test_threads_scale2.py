"""Data movement put on the thread pool for the transformers' 2-thread
training step (issue 47): the strided walk of Concat, Split, Slice,
Expand and Transpose (and their backward) also splits one long contiguous
row into pieces (a contiguous copy merges into a single row), the copies
of Reshape, Flatten, Squeeze and Unsqueeze split the same way, and Gather
splits its rows forward and its columns backward (each column block adds
the rows of repeated indices in index order). Each gives the same bits at
1, 2 and 3 threads, forward and backward, and the values of torch.

The sizes are above the pool's grain (csrc/parallel.h AI_GRAIN_ELEMS =
32768 elements), with rows of uneven lengths, so that the pieces of a
row, of several rows, and the last short piece are all exercised."""
import numpy as np
import pytest
import torch

import aidge_interop
from op_harness import make_model

THREADS = (1, 2, 3)


@pytest.fixture
def restore_threads():
    saved = aidge_interop.get_num_threads()
    yield
    aidge_interop.set_num_threads(saved)


def _run(model, inputs, params, threads, seed=5):
    """Forward and backward of a one-node graph at `threads` threads: the
    outputs, the inputs' gradients and the parameters' gradients."""
    aidge_interop.set_num_threads(threads)
    kinds = {n: "param" for n in params}
    g = aidge_interop.load_onnx(model, param_kinds=kinds)
    outs = g.forward(list(inputs.values()), need_backward=True, input_grads=True)
    rng = np.random.default_rng(seed)
    gos = [rng.standard_normal(o.shape).astype(o.dtype) for o in outs]
    gins = g.backward(gos)
    grads = g.grads()
    return [o.copy() for o in outs], gos, [gi for gi in gins if gi is not None], \
        [grads[n].copy() for n in params]


def _same_bits_at_every_thread_count(model, inputs, params=None):
    params = params or {}
    runs = [_run(model, inputs, params, n) for n in THREADS]
    first = runs[0]
    for other in runs[1:]:
        for a, b in zip(first[0] + first[2] + first[3], other[0] + other[2] + other[3]):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
    return first


def _torch_check(result, inputs, fn, exact=True, params=None):
    """The outputs and the gradients of `inputs` (then of `params`) against
    torch's autograd of fn(*inputs, *params)."""
    outs, gos, gins, pgrads = result
    ts = [torch.tensor(a, requires_grad=True) for a in list(inputs.values()) +
          list((params or {}).values())]
    refs = fn(*ts)
    refs = list(refs) if isinstance(refs, (tuple, list)) else [refs]
    assert len(refs) == len(outs)
    for o, r in zip(outs, refs):
        np.testing.assert_array_equal(o, r.detach().numpy())  # copies: exact
    grads = torch.autograd.grad(refs, ts, [torch.tensor(g) for g in gos])
    tol = dict(rtol=0, atol=0) if exact else _SUM_TOL[gins[0].dtype.type]
    for ours, ref in zip(gins + pgrads, grads):
        np.testing.assert_allclose(ours, ref.numpy(), **tol)


# sums whose order may differ from torch's in the last bits
_SUM_TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _x(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes,axis", [
    ([(1, 70001), (2, 70001)], 0),      # each part one contiguous row after merging
    ([(3, 70001), (3, 5)], 1),          # long rows cut into pieces, and short ones
    ([(2, 4, 100, 64), (2, 4, 28, 64)], 2),  # key/value caches (GPT-2's present)
], ids=["rows", "long_and_short", "kv"])
def test_concat(restore_threads, dtype, shapes, axis):
    inputs = {f"x{i}": _x(s, dtype, i) for i, s in enumerate(shapes)}
    model = make_model("Concat", inputs, {"axis": axis})
    res = _same_bits_at_every_thread_count(model, inputs)
    _torch_check(res, inputs, lambda *xs: torch.cat(xs, axis))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,sizes,axis", [
    ((300000,), [100003, 199997], 0),
    ((4, 90000), [1, 3], 0),
    ((1024, 768), [256, 256, 256], 1),  # GPT-2's c_attn output into q, k, v
], ids=["flat", "rows", "qkv"])
def test_split(restore_threads, dtype, shape, sizes, axis):
    inputs = {"x": _x(shape, dtype)}
    model = make_model("Split", inputs, {"axis": axis}, consts={"s": np.array(sizes)},
                       n_outputs=len(sizes), opset=18)
    res = _same_bits_at_every_thread_count(model, inputs)
    _torch_check(res, inputs, lambda x: torch.split(x, sizes, axis))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1], [4], [0], [1]),          # a contiguous block: one row
    ([1], [200000], [1], [3]),     # long strided rows, cut into pieces
    ([0, 7], [2, -3], [0, 1], [1, 1]),
], ids=["block", "strided", "two_axes"])
def test_slice(restore_threads, dtype, starts, ends, axes, steps):
    inputs = {"x": _x((5, 200000), dtype)}
    consts = {n: np.array(v) for n, v in zip(("starts", "ends", "axes", "steps"),
                                             (starts, ends, axes, steps))}
    model = make_model("Slice", inputs, consts=consts)
    res = _same_bits_at_every_thread_count(model, inputs)

    def ref(x):
        idx = [slice(None)] * x.dim()
        for s, e, a, st in zip(starts, ends, axes, steps):
            idx[a] = slice(s, e, st)
        return x[tuple(idx)]
    _torch_check(res, inputs, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_expand(restore_threads, dtype):
    inputs = {"x": _x((1, 100001), dtype)}
    model = make_model("Expand", inputs, consts={"shape": np.array([3, 100001])})
    res = _same_bits_at_every_thread_count(model, inputs)
    # backward sums over the copies: torch's order may differ in the last bit
    _torch_check(res, inputs, lambda x: x.expand(3, 100001), exact=False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,perm", [((2, 3, 70000), (1, 0, 2)),
                                        ((8, 128, 4, 64), (0, 2, 1, 3))],
                         ids=["long_rows", "heads"])
def test_transpose(restore_threads, dtype, shape, perm):
    inputs = {"x": _x(shape, dtype)}
    model = make_model("Transpose", inputs, {"perm": list(perm)})
    res = _same_bits_at_every_thread_count(model, inputs)
    _torch_check(res, inputs, lambda x: x.permute(*perm))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reshape_of_a_graph_output(restore_threads, dtype):
    """A graph output is a fresh tensor, so a Reshape that makes one copies."""
    inputs = {"x": _x((300006,), dtype)}
    model = make_model("Reshape", inputs, consts={"shape": np.array([7, -1, 1])})
    res = _same_bits_at_every_thread_count(model, inputs)
    _torch_check(res, inputs, lambda x: x.reshape(7, -1, 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_embedding_with_repeated_indices(restore_threads, dtype):
    """An embedding table (a parameter) read at 1024 tokens drawn from 50
    rows: many repeats, whose gradients add in index order."""
    table = _x((5000, 200), dtype)
    ids = np.random.default_rng(1).integers(0, 50, (8, 128)).astype(np.int64)
    ids[0, :5] = [-1, -5000, 4999, 7, 7]  # negative indices count from the end
    inputs = {"ids": ids}
    model = make_model("Gather", inputs, {"axis": 0}, consts={"table": table},
                       input_order=["table", "ids"])
    res = _same_bits_at_every_thread_count(model, inputs, {"table": table})
    outs, gos, _, (dtable,) = res
    np.testing.assert_array_equal(outs[0], table[ids])
    t = torch.tensor(table, requires_grad=True)
    (ref,) = torch.autograd.grad(torch.nn.functional.embedding(torch.tensor(ids) % 5000, t), t,
                                 torch.tensor(gos[0]))
    np.testing.assert_allclose(dtable, ref.numpy(), **_SUM_TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_inner_axis(restore_threads, dtype):
    """axis 1 of (6, 1000, 70): outer 6, repeated indices, the input's gradient."""
    idx = np.random.default_rng(2).integers(-1000, 1000, (700,)).astype(np.int64)
    inputs = {"x": _x((6, 1000, 70), dtype), "idx": idx}
    model = make_model("Gather", inputs, {"axis": 1})
    res = _same_bits_at_every_thread_count(model, inputs)
    outs, gos, (dx,), _ = res
    x = torch.tensor(inputs["x"], requires_grad=True)
    y = torch.index_select(x, 1, torch.tensor(idx) % 1000)
    np.testing.assert_array_equal(outs[0], y.detach().numpy())
    (ref,) = torch.autograd.grad(y, x, torch.tensor(gos[0]))
    np.testing.assert_allclose(dx, ref.numpy(), **_SUM_TOL[dtype])
