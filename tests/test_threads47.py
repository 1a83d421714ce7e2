"""Serial parts of the transformers' 2-thread training step put on the pool
(issue 47).

The gradient of a broadcast operand whose leading axes are summed (a
position embedding (1, T, C) added to (B, T, C), a (T, C) operand, (B, 1, C)
against (1, 1, C)) on the thread pool (csrc/ops/common.c ai_reduce_to), as
a bias's (N,) was: column blocks, each column added row after row. The
sums are those of the serial loop: bit for bit a NumPy sum of the rows in
order, at 1, 2 and 3 threads, and torch's values. A reduction over inner
axes (dst (1, T, 1)) stays serial: its bits at 1, 2 and 3 threads and
torch's values are checked.

Gather's forward also splits a long output row into pieces (a scalar
index on the first axis, as nn.MultiheadAttention's q, k, v = proj[0],
proj[1], proj[2] take: one row of B*T*E elements, copied by one thread
before): the same bits at 1, 2 and 3 threads, torch's values.

Sizes are above the pool's grain (csrc/parallel.h AI_GRAIN_ELEMS, 32768
elements), so that 2 and 3 threads split the work, but one Gather of short
rows (under the grain: one thread, as before)."""
import numpy as np
import pytest
import torch

from op_harness import make_model
from test_threads_scale2 import _SUM_TOL, _same_bits_at_every_thread_count, _x, restore_threads  # noqa: F401

CASES = [  # (x shape, broadcast operand shape)
    ((8, 65, 256), (1, 65, 256)),    # ViT's position embedding
    ((6, 5, 7001), (5, 7001)),       # fewer axes than x
    ((9, 1, 40003), (1, 1, 40003)),  # an axis of one element either side
    ((3, 4, 70001), (1, 4, 70001)),  # few rows, long columns: uneven blocks
    ((16, 64, 33), (1, 64, 1)),      # an inner axis summed: the serial loop
]
IDS = ["pos_embedding", "fewer_axes", "unit_axis", "few_rows", "inner_axis"]


def _rows_in_order(g, shape):
    """g summed to `shape` over its leading axes (and, for the inner-axis
    case, its last), row after row in float arithmetic of g's dtype: the
    order the engine adds in."""
    full = np.broadcast_shapes(g.shape, shape)
    lead = len(full) - len(shape)
    padded = (1,) * lead + tuple(shape)
    summed = tuple(d for d in range(len(full)) if padded[d] == 1 and full[d] != 1)
    if summed and summed[-1] == len(full) - 1:  # an inner axis: any order within a row is
        return None                             # the serial loop's; torch checks it
    rows = g.reshape(-1, int(np.prod(padded)))
    acc = np.zeros(rows.shape[1], g.dtype)
    for r in rows:
        acc += r
    return acc.reshape(shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,bs", CASES, ids=IDS)
def test_add_broadcast_grad(restore_threads, dtype, xs, bs):
    inputs = {"x": _x(xs, dtype, 1), "b": _x(bs, dtype, 2)}
    model = make_model("Add", inputs)
    outs, gos, gins, _ = _same_bits_at_every_thread_count(model, inputs)
    want = _rows_in_order(gos[0], bs)
    if want is not None:
        np.testing.assert_array_equal(gins[1], want)
    t = [torch.tensor(a, requires_grad=True) for a in inputs.values()]
    y = t[0] + t[1]
    np.testing.assert_array_equal(outs[0], y.detach().numpy())
    ref = torch.autograd.grad(y, t, torch.tensor(gos[0]))
    np.testing.assert_array_equal(gins[0], ref[0].numpy())
    np.testing.assert_allclose(gins[1], ref[1].numpy(), **_SUM_TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,bs", CASES[:3], ids=IDS[:3])
def test_mul_broadcast_grad(restore_threads, dtype, xs, bs):
    inputs = {"x": _x(xs, dtype, 3), "b": _x(bs, dtype, 4)}
    model = make_model("Mul", inputs)
    outs, gos, gins, _ = _same_bits_at_every_thread_count(model, inputs)
    t = [torch.tensor(a, requires_grad=True) for a in inputs.values()]
    y = t[0] * t[1]
    np.testing.assert_array_equal(outs[0], y.detach().numpy())
    ref = torch.autograd.grad(y, t, torch.tensor(gos[0]))
    for ours, r in zip(gins, ref):
        np.testing.assert_allclose(ours, r.numpy(), **_SUM_TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis,idx", [
    ((3, 4, 128, 256), 0, 1),            # nn.MultiheadAttention's unbind: one long row
    ((3, 70001), 0, [2, 0, 2]),          # rows in two pieces, a repeated index
    ((2, 3, 80000), 1, [-1]),            # outer 2, a negative index
    ((4, 100, 300), 1, [5, 7]),          # short rows: whole rows, as before
], ids=["unbind", "repeated", "outer", "short_rows"])
def test_gather_long_rows(restore_threads, dtype, shape, axis, idx):
    inputs = {"x": _x(shape, dtype, 5)}
    index = np.array(idx, dtype=np.int64)
    model = make_model("Gather", inputs, {"axis": axis}, consts={"i": index})
    outs, gos, (dx,), _ = _same_bits_at_every_thread_count(model, inputs)
    x = torch.tensor(inputs["x"], requires_grad=True)
    i = torch.tensor(index) % shape[axis]
    y = x.select(axis, int(i)) if index.ndim == 0 else torch.index_select(x, axis, i)
    np.testing.assert_array_equal(outs[0], y.detach().numpy())
    (ref,) = torch.autograd.grad(y, x, torch.tensor(gos[0]))
    np.testing.assert_allclose(dx, ref.numpy(), **_SUM_TOL[dtype])
