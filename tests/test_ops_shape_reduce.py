"""Data-movement and reduction operators of the engine (ops/movement.h, reduce.c) against
torch."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from op_harness import check_op, make_model

DTYPES = [np.float32, np.float64]
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
I64 = np.iinfo(np.int64)


def _x(shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.uniform(-3, 3, shape).astype(dtype)


def _i64(*v):
    return np.array(v, np.int64)


def _fd_check(op_type, x, consts=None, attrs=None, opset=20, eps=1e-6):
    """Engine gradient of sum(dy * op(x)) against central finite differences."""
    consts = consts or {}
    model = make_model(op_type, {"x": x}, attrs, consts, opset=opset)
    g = aidge_interop.load_onnx(model, param_kinds={n: "const" for n in consts})
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    dy = np.random.default_rng(1).standard_normal(y.shape)
    (gx,) = g.backward([dy])
    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        num[i] = (np.sum(dy * g.forward([xp])[0]) - np.sum(dy * g.forward([xm])[0])) / (2 * eps)
    np.testing.assert_allclose(gx, num, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- Reshape, Flatten

RESHAPES = [((2, 3, 4), [4, -1]), ((2, 3, 4), [0, -1]), ((2, 3, 4), [-1]),
            ((2, 3, 4), [2, 0, 2, 2]), ((5, 7), [7, 1, 5]), ((6,), [1, 2, 1, 3]),
            ((1,), [])]


@dtypes
@pytest.mark.parametrize("shape,target", RESHAPES, ids=str)
def test_reshape(shape, target, dtype):
    x = _x(shape, dtype)
    out = list(np.empty(shape).reshape([s or shape[i] for i, s in enumerate(target)]).shape)
    check_op("Reshape", {"x": x}, lambda x, s: x.reshape(out), consts={"s": _i64(*target)})


def test_reshape_allowzero():
    x = np.zeros((0, 3), np.float32)
    check_op("Reshape", {"x": x}, lambda x, s: x.reshape(3, 0),
             consts={"s": _i64(3, 0)}, attrs={"allowzero": 1})
    # without allowzero the 0 copies the input's dimension
    check_op("Reshape", {"x": x}, lambda x, s: x.reshape(0, 3),
             consts={"s": _i64(0, 3)})


def test_reshape_errors():
    x = _x((2, 3))
    with pytest.raises(ValueError, match="reshape 6 elements"):
        check_op("Reshape", {"x": x}, None, consts={"s": _i64(4, 2)})
    with pytest.raises(ValueError, match="more than one -1"):
        check_op("Reshape", {"x": x}, None, consts={"s": _i64(-1, -1)})


def test_small_integer_graph_inputs_are_plan_time_constants():
    # a shape or axes given as a graph input is read at plan time; a new value re-plans
    x = _x((2, 3))
    for s in ([3, 2], [6, 1], [-1]):
        check_op("Reshape", {"x": x, "s": _i64(*s)}, lambda x, s: x.reshape(*s.tolist()))
    for a in (0, 1):
        check_op("ReduceSum", {"x": x, "a": _i64(a)}, lambda x, a: x.sum(int(a), keepdim=True))


@dtypes
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis, dtype):
    x = _x((2, 3, 4), dtype)
    a = axis % 4 if axis >= 0 else axis + 3
    check_op("Flatten", {"x": x}, lambda x: x.reshape(int(np.prod(x.shape[:a])), -1),
             attrs={"axis": axis})


# ---------------------------------------------------------------- Transpose

PERMS = [((3, 4), None), ((2, 3, 4), None), ((2, 3, 4), [0, 2, 1]), ((2, 3, 4), [2, 0, 1]),
         ((3, 5, 2, 7), [1, 3, 0, 2]), ((3, 1, 5), [1, 0, 2]), ((4, 3, 5, 2), [0, 1, 3, 2]),
         # float32 slices of 8 x 8 and more: blocked transposes (movement.c), partial
         # blocks, several bands of rows, dimensions merged into one
         ((2, 17, 130), [0, 2, 1]), ((70, 9), None), ((4, 5, 24), [2, 0, 1]),
         ((2, 3, 9, 16), [0, 1, 3, 2])]


@dtypes
@pytest.mark.parametrize("shape,perm", PERMS, ids=str)
def test_transpose(shape, perm, dtype):
    p = perm or list(range(len(shape)))[::-1]
    check_op("Transpose", {"x": _x(shape, dtype)}, lambda x: x.permute(*p),
             attrs={"perm": perm} if perm else None)


# ---------------------------------------------------------------- Concat, Split

CONCATS = [([(2, 3), (4, 3)], 0), ([(2, 3, 4), (2, 1, 4), (2, 5, 4)], 1),
           ([(2, 3, 4), (2, 3, 2)], -1), ([(3, 2), (0, 2), (1, 2)], 0), ([(5,)], 0)]


@dtypes
@pytest.mark.parametrize("shapes,axis", CONCATS, ids=str)
def test_concat(shapes, axis, dtype):
    inputs = {f"x{i}": _x(s, dtype, i) for i, s in enumerate(shapes)}
    check_op("Concat", inputs, lambda *xs: torch.cat(xs, axis), attrs={"axis": axis})


@dtypes
@pytest.mark.parametrize("sizes,axis,dim", [([2, 3, 1], 1, 6), ([4, 0, 1], 0, 5),
                                            ([3, 3], -1, 6)], ids=str)
def test_split_sizes_input(sizes, axis, dim, dtype):
    shape = [dim, 3] if axis == 0 else [2, dim]
    check_op("Split", {"x": _x(shape, dtype)}, lambda x, s: torch.split(x, sizes, axis),
             consts={"s": _i64(*sizes)}, attrs={"axis": axis}, n_outputs=len(sizes),
             opset=13)


@dtypes
def test_split_attribute_and_even(dtype):
    x = _x((2, 9, 3), dtype)
    check_op("Split", {"x": x}, lambda x: torch.split(x, [4, 5], 1),
             attrs={"axis": 1, "split": [4, 5]}, n_outputs=2, opset=11)
    check_op("Split", {"x": x}, lambda x: torch.split(x, 3, 1), attrs={"axis": 1},
             n_outputs=3, opset=13)


@dtypes
@pytest.mark.parametrize("dim,n", [(7, 3), (8, 4), (10, 4), (5, 2)])
def test_split_num_outputs(dim, n, dtype):
    # opset 18: chunks of ceil(dim / n), the last one smaller, like torch.split
    x = _x((3, dim), dtype)
    check_op("Split", {"x": x}, lambda x: torch.split(x, -(-dim // n), 1),
             attrs={"axis": 1, "num_outputs": n}, n_outputs=n, opset=18)


def test_split_errors():
    with pytest.raises(ValueError, match="summing"):
        check_op("Split", {"x": _x((6,))}, None, consts={"s": _i64(2, 2)}, n_outputs=2)
    with pytest.raises(ValueError, match="num_outputs"):
        check_op("Split", {"x": _x((6,))}, None, attrs={"num_outputs": 3}, n_outputs=2)


# ---------------------------------------------------------------- Slice

def _torch_slice(x, starts, ends, axes, steps):
    """ONNX Slice through index_select; Python slices clamp like ONNX."""
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        idx = list(range(x.shape[a]))[slice(s, e, st)]
        x = torch.index_select(x, a, torch.tensor(idx, dtype=torch.int64))
    return x


SLICES = [
    ((5, 6), [1, 2], [4, 5], None, None),
    ((5, 6), [0], [-1], [1], None),
    ((7, 8), [1, 0], [100, I64.max], [0, 1], [2, 3]),
    ((7, 8), [-1], [I64.min], [1], [-1]),
    ((7, 8), [5, -2], [0, -100], [0, 1], [-2, -3]),
    ((4, 5, 6), [-10, 2], [10, 2], [2, 0], [1, 1]),          # empty along axis 0
    ((4, 5, 6), [3, 1, 0], [0, I64.max, 6], [-3, 1, -1], [-1, 2, 4]),
    ((9,), [20], [-20], None, [-3]),                          # clamped both ends
    ((9,), [2], [7], None, [I64.max]),
    ((3, 9), [8], [0], [1], [I64.min]),
]


@dtypes
@pytest.mark.parametrize("shape,starts,ends,axes,steps", SLICES, ids=str)
def test_slice(shape, starts, ends, axes, steps, dtype):
    consts = {"starts": _i64(*starts), "ends": _i64(*ends)}
    order = ["x", "starts", "ends"]
    if axes is not None or steps is not None:
        consts["axes"] = _i64(*(axes if axes is not None else range(len(starts))))
        order.append("axes")
    if steps is not None:
        consts["steps"] = _i64(*steps)
        order.append("steps")
    check_op("Slice", {"x": _x(shape, dtype)},
             lambda x, *_: _torch_slice(x, starts, ends, axes, steps), consts=consts,
             input_order=order)


def test_slice_int32_params_and_opset9_attributes():
    x = _x((6, 5))
    check_op("Slice", {"x": x}, lambda x, *_: x[1:5:2, -3:],
             consts={"starts": np.array([1, -3], np.int32), "ends": np.array([5, 99], np.int32),
                     "axes": np.array([0, 1], np.int32), "steps": np.array([2, 1], np.int32)})
    check_op("Slice", {"x": x}, lambda x: x[:, 1:4], opset=9,
             attrs={"starts": [1], "ends": [4], "axes": [1]})


def test_slice_step_zero_is_an_error():
    with pytest.raises(ValueError, match="steps"):
        check_op("Slice", {"x": _x((4,))}, None,
                 consts={"s": _i64(0), "e": _i64(3), "a": _i64(0), "t": _i64(0)})


# ---------------------------------------------------------------- Squeeze, Unsqueeze

@dtypes
@pytest.mark.parametrize("shape,axes", [((1, 3, 1, 4), [0]), ((1, 3, 1, 4), [-2, 0]),
                                        ((1, 3, 1, 4), None), ((2, 1), [1]), ((1,), None)],
                         ids=str)
def test_squeeze(shape, axes, dtype):
    x = _x(shape, dtype)
    out = np.squeeze(np.empty(shape), axis=None if axes is None else tuple(axes)).shape
    check_op("Squeeze", {"x": x}, lambda x, *_: x.reshape(out),
             consts=None if axes is None else {"a": _i64(*axes)})
    check_op("Squeeze", {"x": x}, lambda x: x.reshape(out), opset=11,
             attrs=None if axes is None else {"axes": axes})


def test_squeeze_non_unit_axis_is_an_error():
    with pytest.raises(ValueError, match="cannot squeeze axis 1"):
        check_op("Squeeze", {"x": _x((1, 3))}, None, consts={"a": _i64(1)})


@dtypes
@pytest.mark.parametrize("shape,axes", [((3, 4), [0]), ((3, 4), [1, -1]), ((3,), [0, 3, 1]),
                                        ((), [0]), ((2, 3), [-3])], ids=str)
def test_unsqueeze(shape, axes, dtype):
    x = _x(shape, dtype)
    out = np.expand_dims(np.empty(shape), tuple(axes)).shape
    check_op("Unsqueeze", {"x": x}, lambda x, a: x.reshape(out), consts={"a": _i64(*axes)})
    check_op("Unsqueeze", {"x": x}, lambda x: x.reshape(out), opset=11, attrs={"axes": axes})


# ---------------------------------------------------------------- Gather

def _torch_gather(x, idx, axis):
    a = axis % x.dim()
    flat = torch.index_select(x, a, (idx % x.shape[a]).reshape(-1).long())
    return flat.reshape(x.shape[:a] + idx.shape + x.shape[a + 1:])


GATHERS = [((5, 4), [0, 4, 2], 0), ((5, 4), [[1, -1], [3, 3]], 1), ((3, 4, 5), [-5, 0, 0, 2], -1),
           ((3, 4, 5), 2, 1), ((6,), [[5, 0, 5, 5]], 0), ((3, 4), [], 0)]


@dtypes
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("shape,idx,axis", GATHERS, ids=str)
def test_gather(shape, idx, axis, idx_dtype, dtype):
    # repeated indices: gradients of duplicates accumulate
    check_op("Gather", {"x": _x(shape, dtype)}, lambda x, i: _torch_gather(x, i, axis),
             consts={"i": np.array(idx, idx_dtype)}, attrs={"axis": axis})


def test_gather_runtime_indices_and_range_check():
    x = _x((4, 3))
    check_op("Gather", {"x": x, "i": _i64(3, -4, 1)}, lambda x, i: _torch_gather(x, i, 0))
    with pytest.raises(IndexError, match="out of range"):
        check_op("Gather", {"x": x, "i": _i64(0, 4)}, None)


# ---------------------------------------------------------------- GatherND, ScatterND

def _torch_gathernd(x, idx, b=0):
    """GatherND by advanced indexing: the batch index, then one index tensor per
    component of the tuples."""
    B, k = math.prod(x.shape[:b]), idx.shape[-1]
    i = idx.reshape(B, -1, k).long()
    bi = torch.arange(B)[:, None].expand(B, i.shape[1])
    y = x.reshape(B, *x.shape[b:])[(bi,) + tuple(i[..., j] for j in range(k))]
    return y.reshape(*idx.shape[:-1], *x.shape[b + k:])


def _tuples(shape, lead, k, seed=0):
    """Index tuples of shape lead + (k,) into shape[:k], negatives and repeats included."""
    rng = np.random.default_rng(seed)
    dims = np.array(shape[:k], np.int64)
    return rng.integers(-dims, dims, tuple(lead) + (k,)).astype(np.int64)


# data shape, batch_dims, indices shape without its last dim, k
GATHERNDS = [((2, 3), 0, (2,), 2), ((3, 4, 5), 0, (6,), 1), ((3, 4, 5), 0, (2, 3), 2),
             ((3, 4, 5), 0, (4,), 3), ((3, 4, 5), 0, (), 2), ((2, 3, 4), 1, (2, 5), 1),
             ((2, 3, 4), 1, (2,), 2), ((2, 3, 4, 5), 2, (2, 3, 2), 2),
             ((2, 3, 4, 5), 2, (2, 3), 1), ((3, 4), 0, (0,), 1)]


def _gathernd_case(shape, b, lead, k, idx_dtype=np.int64):
    idx = np.stack([_tuples(shape[b:], lead[b:], k, seed=s) for s in range(math.prod(shape[:b]))])
    return idx.reshape(tuple(lead) + (k,)).astype(idx_dtype)


@dtypes
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("shape,b,lead,k", GATHERNDS, ids=str)
def test_gathernd(shape, b, lead, k, idx_dtype, dtype):
    # repeated tuples: their gradients add up
    idx = _gathernd_case(shape, b, lead, k, idx_dtype)
    check_op("GatherND", {"x": _x(shape, dtype)}, lambda x, i: _torch_gathernd(x, i, b),
             consts={"i": idx}, attrs={"batch_dims": b})


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.uint8, np.int16, np.int32, np.int64,
                                   np.bool_], ids=lambda d: np.dtype(d).name)
def test_gathernd_dtypes(dtype):
    x = (_x((2, 3, 4), np.float64) * 10).astype(dtype)
    check_op("GatherND", {"x": x}, lambda x, i: _torch_gathernd(x, i, 1),
             consts={"i": _gathernd_case((2, 3, 4), 1, (2, 5), 2)}, attrs={"batch_dims": 1},
             grad=False)


def test_gathernd_runtime_indices_opset11_and_errors():
    x = _x((3, 4))
    idx = np.array([[2, -1], [0, 3]], np.int64)
    check_op("GatherND", {"x": x, "i": idx}, lambda x, i: _torch_gathernd(x, i), opset=11)
    with pytest.raises(IndexError, match="GatherND node.*index 4 is out of range for axis 1"):
        check_op("GatherND", {"x": x, "i": np.array([[0, 4]], np.int64)}, None)
    with pytest.raises(IndexError, match="GatherND node.*index -4 is out of range for axis 0"):
        check_op("GatherND", {"x": x, "i": np.array([[-4, 0]], np.int64)}, None)
    with pytest.raises(ValueError, match="GatherND node.*batch_dims is 2; 0 to 1 expected"):
        check_op("GatherND", {"x": x, "i": idx}, None, attrs={"batch_dims": 2})
    with pytest.raises(ValueError, match="GatherND node.*batch dim 0 is 2 in indices, 3 in data"):
        check_op("GatherND", {"x": x, "i": np.zeros((2, 1), np.int64)}, None,
                 attrs={"batch_dims": 1})
    with pytest.raises(ValueError, match="GatherND node.*indices' last dim is 3; at most 2"):
        check_op("GatherND", {"x": x, "i": np.zeros((1, 3), np.int64)}, None)


def test_gathernd_dynamo_mask_pattern():
    """torch's dynamo exporter writes ``mask[rows, cols]`` (two broadcast index
    tensors, as in transformers' attention-mask construction) as Expand each
    index to the broadcast shape, Unsqueeze(-1), Concat(-1), GatherND."""
    rows, cols = np.array([[1], [0], [1]], np.int64), np.array([[3, 0, -1, 2]], np.int64)
    shape = np.array([3, 4], np.int64)
    nodes = [helper.make_node("Expand", ["rows", "shape"], ["r"]),
             helper.make_node("Expand", ["cols", "shape"], ["c"]),
             helper.make_node("Unsqueeze", ["r", "last"], ["r1"]),
             helper.make_node("Unsqueeze", ["c", "last"], ["c1"]),
             helper.make_node("Concat", ["r1", "c1"], ["idx"], axis=-1),
             helper.make_node("GatherND", ["mask", "idx"], ["y"])]
    inits = [numpy_helper.from_array(v, n) for n, v in
             (("rows", rows), ("cols", cols), ("shape", shape), ("last", _i64(-1)))]
    graph = helper.make_graph(
        nodes, "mask", [helper.make_tensor_value_info("mask", TensorProto.DOUBLE, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    g = aidge_interop.load_onnx(model)
    mask = _x((2, 5))
    (y,) = g.forward([mask], need_backward=True, input_grads=True)
    t = torch.tensor(mask, requires_grad=True)
    ref = t[torch.tensor(rows), torch.tensor(cols)]
    np.testing.assert_array_equal(y, ref.detach().numpy())
    dy = np.random.default_rng(2).standard_normal(y.shape)
    (gm,) = g.backward([dy])
    ref.backward(torch.tensor(dy))
    np.testing.assert_allclose(gm, t.grad.numpy(), rtol=1e-12, atol=1e-12)


def _scatternd_ref(x, idx, u, reduction="none"):
    """ONNX's reference: a copy of the data, the updates applied in order."""
    y = x.copy()
    ops = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    lead = idx.shape[:-1]
    for t in np.ndindex(lead):
        at = tuple(idx[t])
        y[at] = u[t] if reduction == "none" else ops[reduction](y[at], u[t])
    return y


def _torch_scatternd(x, u, idx, accumulate):
    return torch.index_put(x, tuple(idx[..., j] for j in range(idx.shape[-1])), u, accumulate)


# data shape, indices shape without its last dim, k
SCATTERNDS = [((8,), (4,), 1), ((4, 4, 4), (2,), 1), ((3, 4, 5), (2, 2), 2), ((3, 4, 5), (5,), 3),
              ((3, 4), (), 2), ((3, 4), (0,), 1)]


def _scatternd_case(shape, lead, k, dtype, unique):
    """x, indices, updates; unique: no place twice."""
    rng = np.random.default_rng(3)
    n = math.prod(lead)
    if unique:
        flat = rng.choice(math.prod(shape[:k]), n, replace=False)
        idx = np.stack(np.unravel_index(flat, shape[:k]), -1).reshape(tuple(lead) + (k,))
        idx = idx - rng.integers(0, 2, idx.shape) * np.array(shape[:k])  # some negative
    else:
        idx = _tuples(shape, lead, k, seed=4)
    u = _x(tuple(lead) + tuple(shape[k:]), dtype, seed=5)
    return _x(shape, dtype), idx.astype(np.int64), u


@dtypes
@pytest.mark.parametrize("reduction", ["none", "add"])
@pytest.mark.parametrize("shape,lead,k", SCATTERNDS, ids=str)
def test_scatternd(shape, lead, k, reduction, dtype):
    # add: repeated places add up; none: unique places (torch leaves repeats undefined)
    x, idx, u = _scatternd_case(shape, lead, k, dtype, unique=reduction == "none")
    attrs = {} if reduction == "none" else {"reduction": reduction}
    check_op("ScatterND", {"x": x, "u": u},
             lambda x, u, i: _torch_scatternd(x, u, i, reduction == "add"),
             consts={"i": idx}, attrs=attrs, input_order=["x", "i", "u"])


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint8, np.int16,
                                   np.int32, np.int64], ids=lambda d: np.dtype(d).name)
def test_scatternd_reductions_repeated_places(reduction, dtype):
    # repeated places, applied in order: with none the last write wins
    x, idx, u = _scatternd_case((3, 4, 5), (4, 2), 2, np.float64, unique=False)
    x, u = (np.round(x) * 3).astype(dtype), (np.round(u) * 3).astype(dtype)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    model = make_model("ScatterND", {"x": x, "i": idx, "u": u}, attrs)
    (y,) = aidge_interop.load_onnx(model).forward([x, idx, u])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(y, _scatternd_ref(x, idx, u, reduction))


def test_scatternd_opsets_and_dtypes():
    x, idx, u = _scatternd_case((3, 4), (2,), 1, np.float64, unique=True)
    check_op("ScatterND", {"x": x, "u": u}, lambda x, u, i: _torch_scatternd(x, u, i, False),
             consts={"i": idx}, input_order=["x", "i", "u"], opset=11)
    for dtype in (np.float16, np.bool_, np.int64):
        xd, ud = (x > 0).astype(dtype), (u > 0).astype(dtype)
        model = make_model("ScatterND", {"x": xd, "i": idx, "u": ud})
        (y,) = aidge_interop.load_onnx(model).forward([xd, idx, ud])
        np.testing.assert_array_equal(y, _scatternd_ref(xd, idx, ud))


def test_scatternd_gradient_finite_differences():
    x, idx, u = _scatternd_case((3, 4, 2), (5,), 2, np.float64, unique=False)
    for reduction in ("none", "add"):
        attrs = {} if reduction == "none" else {"reduction": reduction}
        if reduction == "none":  # unique places: the gradient of a lost write is torch's choice
            x, idx, u = _scatternd_case((3, 4, 2), (5,), 2, np.float64, unique=True)
        model = make_model("ScatterND", {"x": x, "u": u}, attrs, {"i": idx},
                           input_order=["x", "i", "u"])
        g = aidge_interop.load_onnx(model, param_kinds={"i": "const"})
        (y,) = g.forward([x, u], need_backward=True, input_grads=True)
        dy = np.random.default_rng(1).standard_normal(y.shape)
        grads = g.backward([dy])
        for k, v in enumerate((x, u)):
            num = np.zeros_like(v)
            for i in np.ndindex(v.shape):
                vals = [x.copy(), u.copy()]
                vals[k][i] += 1e-6
                yp = g.forward(vals)[0]
                vals[k][i] -= 2e-6
                num[i] = np.sum(dy * (yp - g.forward(vals)[0])) / 2e-6
            np.testing.assert_allclose(grads[k], num, rtol=1e-6, atol=1e-7,
                                       err_msg=f"{reduction}: input {k}")


def test_scatternd_errors():
    x, idx, u = _scatternd_case((3, 4), (2,), 1, np.float64, unique=True)
    with pytest.raises(IndexError, match="ScatterND node.*index 3 is out of range for axis 0"):
        check_op("ScatterND", {"x": x, "i": np.array([[0], [3]], np.int64), "u": u}, None)
    with pytest.raises(ValueError, match=r"ScatterND node.*updates must have shape "
                       r"indices.shape\[:-1\] \+ data.shape\[1:\]"):
        check_op("ScatterND", {"x": x, "i": idx, "u": u[:, :3]}, None)
    with pytest.raises(TypeError, match="ScatterND node.*reduction 'add' of bool"):
        check_op("ScatterND", {"x": x > 0, "i": idx, "u": u > 0}, None,
                 attrs={"reduction": "add"})
    model = make_model("ScatterND", {"x": x, "u": u}, {"reduction": "mul"}, {"i": idx},
                       input_order=["x", "i", "u"])
    g = aidge_interop.load_onnx(model, param_kinds={"i": "const"})
    (y,) = g.forward([x, u], need_backward=True, input_grads=True)
    np.testing.assert_array_equal(y, _scatternd_ref(x, idx, u, "mul"))
    with pytest.raises(NotImplementedError,
                       match="ScatterND node.*no gradient for reduction 'mul'"):
        g.backward([np.ones_like(y)])


# ---------------------------------------------------------------- Expand

@dtypes
@pytest.mark.parametrize("shape,target", [((3, 1), [2, 3, 4]), ((1,), [5]), ((2, 1, 4), [3, 1]),
                                          ((2, 3), [1, 1]), ((), [2, 2]), ((4, 1, 1), [4, 3, 2])],
                         ids=str)
def test_expand(shape, target, dtype):
    out = np.broadcast_shapes(shape, tuple(target))
    check_op("Expand", {"x": _x(shape, dtype)}, lambda x, s: x.expand(out),
             consts={"s": _i64(*target)})


# ---------------------------------------------------------------- Pad

def _onnx_pads(torch_pad, rank):
    """torch (last_begin, last_end, prev_begin, ...) -> ONNX [begins..., ends...]."""
    b, e = [0] * rank, [0] * rank
    for k in range(len(torch_pad) // 2):
        b[rank - 1 - k], e[rank - 1 - k] = torch_pad[2 * k], torch_pad[2 * k + 1]
    return b + e


PADS = [((2, 3, 5), (1, 2)), ((2, 3, 5), (4, 0)), ((2, 3, 4, 5), (1, 2, 2, 1)),
        ((1, 2, 4, 6), (3, 3, 0, 3)), ((2, 3, 5), (-1, 2)), ((2, 3, 4, 5), (-2, 1, 1, -1))]


@dtypes
@pytest.mark.parametrize("mode,torch_mode", [("constant", "constant"), ("reflect", "reflect"),
                                             ("edge", "replicate"), ("wrap", "circular")])
@pytest.mark.parametrize("shape,pad", PADS, ids=str)
def test_pad(shape, pad, mode, torch_mode, dtype):
    x = _x(shape, dtype)
    consts = {"pads": _i64(*_onnx_pads(pad, len(shape)))}
    kw = {}
    if mode == "constant":
        consts["value"] = np.array(1.5, dtype)
        kw = {"value": 1.5}
    check_op("Pad", {"x": x}, lambda x, *_: F.pad(x, pad, mode=torch_mode, **kw),
             consts=consts, attrs={"mode": mode})


@dtypes
def test_pad_constant_crop_and_axes(dtype):
    x = _x((3, 4, 5), dtype)
    # constant pads on every axis, incl. the first, and crops
    check_op("Pad", {"x": x}, lambda x, p: F.pad(x, (2, -1, 0, 1, -1, 2)),
             consts={"pads": _i64(-1, 0, 2, 2, 1, -1)})
    # opset 18 axes input: pads only the listed axes
    check_op("Pad", {"x": x}, lambda x, *_: F.pad(x, (0, 0, 1, 0, 2, 3), mode="constant"),
             consts={"pads": _i64(2, 1, 3, 0), "value": np.array(0, dtype),
                     "axes": _i64(0, -2)}, opset=18)
    # opset 10: pads and value as attributes
    check_op("Pad", {"x": x}, lambda x: F.pad(x, (1, 1, 0, 2), value=-2.0), opset=10,
             attrs={"pads": [0, 0, 1, 0, 2, 1], "value": -2.0})


@pytest.mark.parametrize("mode", ["reflect", "wrap"])
def test_pad_wider_than_axis_repeats_like_numpy(mode):
    x = _x((2, 3))
    out = check_op("Pad", {"x": x}, lambda x, p: torch.tensor(
        np.pad(x.detach().numpy(), ((0, 0), (5, 7)), mode=mode)),
        consts={"pads": _i64(0, 5, 0, 7)}, attrs={"mode": mode}, grad=False)
    assert out[0].shape == (2, 15)


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.int32, np.float32, np.int64,
                                   np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_every_element_size_on_the_pool(mode, dtype):
    """The forward copies whole rows (the interior in one piece, the edges
    from a column table) for elements of 1, 2, 4 and 8 bytes, rows split
    between 1 to 3 threads: against numpy.pad, with pads on every axis and a
    crop of the last one (ONNX pads then crops, except wrap: torch's circular
    crops first)."""
    x = np.random.default_rng(3).integers(0, 100, (3, 5, 40, 70)).astype(dtype)
    begin, end = [1, 0, 3, 2], [0, 2, 1, -3]
    kw = {"constant_values": 7} if mode == "constant" else {}
    if mode == "wrap":
        ref = np.pad(x[..., :-3], list(zip(begin, [0, 2, 1, 0])), mode="wrap")
    else:
        ref = np.pad(x, list(zip(begin, [0, 2, 1, 0])), mode=mode, **kw)[..., :-3]
    consts = {"pads": _i64(*begin, *end)}
    if mode == "constant":
        consts["value"] = np.array(7, dtype)
    g = aidge_interop.load_onnx(make_model("Pad", {"x": x}, {"mode": mode}, consts),
                                param_kinds={n: "const" for n in consts})
    saved = aidge_interop.get_num_threads()
    try:
        for n in (1, 2, 3):
            aidge_interop.set_num_threads(n)
            (y,) = g.forward([x])
            np.testing.assert_array_equal(y, ref, err_msg=f"{n} thread(s)")
    finally:
        aidge_interop.set_num_threads(saved)


# ---------------------------------------------------------------- Shape, ConstantOfShape

@pytest.mark.parametrize("start,end", [(None, None), (1, None), (1, -1), (-2, None), (-9, 9),
                                       (3, 1)], ids=str)
def test_shape(start, end):
    x = _x((2, 3, 4, 5))
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    dims = list(x.shape)[slice(start, end)]
    check_op("Shape", {"x": x}, lambda x: torch.tensor(dims, dtype=torch.int64), attrs=attrs,
             grad=False)


@pytest.mark.parametrize("value", [None, np.array([5], np.int64), np.array([-1.5], np.float64),
                                   np.array([True])], ids=str)
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    dt = torch.float32 if value is None else torch.from_numpy(value).dtype
    fill = 0 if value is None else value[0].item()
    check_op("ConstantOfShape", {}, lambda s: torch.full((2, 3), fill, dtype=dt),
             consts={"s": _i64(2, 3)}, attrs=attrs, grad=False)
    check_op("ConstantOfShape", {}, lambda s: torch.full((), fill, dtype=dt),
             consts={"s": np.zeros(0, np.int64)}, attrs=attrs, grad=False)


@pytest.mark.parametrize("k", [0, 1, -2, 5, -4])
@pytest.mark.parametrize("shape", [(3, 5), (4, 2), (0, 3)], ids=str)
@pytest.mark.parametrize("in_dtype,dtype", [(np.float32, None), (np.int32, None),
                                            (np.float64, 7), (np.int64, 11), (np.float32, 9)],
                         ids=str)
def test_eye_like(shape, k, in_dtype, dtype):
    want = np.eye(*shape, k, dtype=helper.tensor_dtype_to_np_dtype(dtype) if dtype else in_dtype)
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check_op("EyeLike", {"x": np.ones(shape, in_dtype)}, lambda x: torch.from_numpy(want),
             attrs=attrs, grad=False)


def test_eye_like_bad_input():
    with pytest.raises(ValueError, match="EyeLike node.*rank 3; 2 expected"):
        check_op("EyeLike", {"x": _x((2, 3, 4))}, None, grad=False)
    with pytest.raises(NotImplementedError, match="EyeLike node.*dtype 8 is not an engine"):
        check_op("EyeLike", {"x": _x((2, 3))}, None, attrs={"dtype": 8}, grad=False)


# ---------------------------------------------------------------- OneHot

def _onehot_ref(indices, depth, values, axis):
    """ONNX's reference, which takes neither a one-element 1-D depth nor bool
    values (it subtracts them): a scalar depth and int32 values for it."""
    from onnx.reference import ReferenceEvaluator

    feeds = {"i": indices, "d": depth.reshape(()), "v": values.astype(np.int32)}
    model = make_model("OneHot", feeds, {} if axis is None else {"axis": axis}, opset=11)
    return ReferenceEvaluator(model).run(None, feeds)[0].astype(values.dtype)


@pytest.mark.parametrize("axis", [None, 0, 1, -2, 2])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32, np.float32])
def test_onehot_values_gradient(axis, idx_dtype):
    """Against torch: F.one_hot's float mask scaled into the values, which
    get the gradient."""
    idx = np.random.default_rng(0).integers(0, 5, (3, 4)).astype(idx_dtype)
    values = np.array([-0.5, 2.0])
    a = -1 if axis is None else axis

    def ref(v, i, d):
        mask = F.one_hot(i.long(), 5).to(v.dtype).movedim(-1, a)
        return mask * (v[1] - v[0]) + v[0]

    check_op("OneHot", {"v": values}, ref, consts={"i": idx, "d": np.array(5, np.int64)},
             attrs={} if axis is None else {"axis": axis}, input_order=["i", "d", "v"], opset=11)


@pytest.mark.parametrize("values", [np.array([0, 1], np.int32), np.array([3.0, -1.0], np.float32),
                                    np.array([False, True])], ids=lambda v: v.dtype.name)
@pytest.mark.parametrize("depth", [np.array(6, np.int64), np.array([6.0], np.float32)],
                         ids=["int64", "float32[1]"])
def test_onehot_negative_and_out_of_range_indices(depth, values):
    """Against ONNX's reference: negative indices count from depth, those
    still outside [0, depth) give a line of off values."""
    idx = np.array([[0, -1, 5, 7], [-6, -7, 2, 3]], np.int64)
    for axis in (None, 1):
        got = _run_onehot(idx, depth, values, axis)  # depth: a graph input
        np.testing.assert_array_equal(got, _onehot_ref(idx, depth, values, axis))


def _run_onehot(idx, depth, values, axis):
    model = make_model("OneHot", {"i": idx, "d": depth, "v": values},
                       {} if axis is None else {"axis": axis}, opset=11)
    (y,) = aidge_interop.load_onnx(model).forward([idx, depth, values])
    assert y.dtype == values.dtype
    return y


def test_onehot_bad_inputs():
    idx = np.array([0, 1], np.int64)
    with pytest.raises(ValueError, match="OneHot node.*values has 3 elements"):
        _run_onehot(idx, np.array(3, np.int64), np.zeros(3, np.float32), None)
    with pytest.raises(ValueError, match="OneHot node.*depth is -2"):
        _run_onehot(idx, np.array(-2, np.int64), np.zeros(2, np.float32), None)
    with pytest.raises(ValueError, match="OneHot node"):
        _run_onehot(idx, np.array(3, np.int64), np.zeros(2, np.float32), 2)


# ---------------------------------------------------------------- Range

RANGE_CASES = [(1, 10, 3), (10, 1, -3), (0, 1, 0.1), (5, 5, 1), (5, 2, 1), (-3.5, 2.25, 0.75),
               (0, 7, 2)]


@pytest.mark.parametrize("start,limit,delta,dtype", [
    pytest.param(*case, dtype, id=f"{case}-{np.dtype(dtype).name}") for case in RANGE_CASES
    for dtype in (np.float32, np.float64, np.int16, np.int32, np.int64)
    if np.dtype(dtype).kind == "f" or all(v == int(v) for v in case)])
def test_range(start, limit, delta, dtype):
    # ONNX defines Range by numpy.arange in the inputs' dtype (its reference);
    # torch.arange computes float32 in double, so numpy is the reference here
    args = [np.array(v, dtype) for v in (start, limit, delta)]
    want = np.arange(*args).astype(dtype)
    # scalars as constants and as graph inputs (read when the graph is planned)
    (got,) = aidge_interop.load_onnx(make_model(
        "Range", {}, consts=dict(zip("sld", args)))).forward([])
    assert got.dtype == want.dtype and np.array_equal(got, want)
    g = aidge_interop.load_onnx(make_model("Range", dict(zip("sld", args))))
    (got,) = g.forward(args)
    assert np.array_equal(got, want)
    # a new value re-plans
    (got,) = g.forward([args[0], args[1] + dtype(4), args[2]])
    assert np.array_equal(got, np.arange(args[0], args[1] + dtype(4), args[2]).astype(dtype))


def test_range_from_a_dynamic_shape():
    # positions torch.arange(x.shape[1]) of a model exported with a dynamic
    # sequence length: Shape -> Gather -> Range, folded when the graph is planned
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "posf"], ["y"])]
    graph = helper.make_graph(
        nodes, "positions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t"])],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array(1, np.int64), "one")])
    g = aidge_interop.load_onnx(helper.make_model(graph))
    for shape in ((2, 3), (4, 7), (1, 1)):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        (y,) = g.forward([x], need_backward=True, input_grads=True)
        np.testing.assert_array_equal(y, x + np.arange(shape[1], dtype=np.float32))
        (gx,) = g.backward([np.ones_like(x)])
        np.testing.assert_array_equal(gx, np.ones_like(x))


@pytest.mark.parametrize("start,limit,delta,message", [
    (0, 5, 0, "delta is zero"), (0.0, np.inf, 1.0, "no finite length"),
    (0.0, 1.0, np.nan, "delta is zero")], ids=str)
def test_range_errors(start, limit, delta, message):
    dtype = np.float64 if isinstance(start, float) else np.int64
    model = make_model("Range", {}, consts={k: np.array(v, dtype)
                                            for k, v in zip("sld", (start, limit, delta))})
    with pytest.raises(ValueError, match=message):
        aidge_interop.load_onnx(model).forward([])


def test_range_mixed_dtypes_are_refused():
    model = make_model("Range", {}, consts={"s": np.array(0, np.int64),
                                            "l": np.array(5, np.int32),
                                            "d": np.array(1, np.int64)})
    with pytest.raises(TypeError, match="Range's limit is int32, start is int64"):
        aidge_interop.load_onnx(model).forward([])


# ---------------------------------------------------------------- integer data (shape arithmetic)

INT_CASES = [
    ("Reshape", lambda x, s: x.reshape(2, 6), {"s": _i64(2, -1)}, {}),
    ("Flatten", lambda x: x.reshape(3, 4), {}, {"axis": 1}),
    ("Transpose", lambda x: x.t(), {}, {}),
    ("Concat", lambda x, c: torch.cat([x, c], 0), {"c": np.ones((1, 4), np.int64)}, {"axis": 0}),
    ("Slice", lambda x, *_: x.flip(0)[::2, 1:3], {"s": _i64(-1, 1), "e": _i64(I64.min, 3),
                                            "a": _i64(0, 1), "t": _i64(-2, 1)}, {}),
    ("Squeeze", lambda x, a: x, {"a": np.zeros(0, np.int64)}, {}),
    ("Unsqueeze", lambda x, a: x[None], {"a": _i64(0)}, {}),
    ("Gather", lambda x, i: x[:, [2, 0]], {"i": _i64(-2, 0)}, {"axis": 1}),
    ("Expand", lambda x, s: x.expand(2, 3, 4), {"s": _i64(2, 1, 1)}, {}),
    ("Pad", lambda x, *_: F.pad(x, (1, 2), value=7), {"p": _i64(0, 1, 0, 2),
                                                       "v": np.array(7, np.int64)}, {}),
    ("Pad", lambda x, p: F.pad(x[None].double(), (1, 2), mode="reflect")[0].long(),
     {"p": _i64(0, 1, 0, 2)}, {"mode": "reflect"}),
]


@pytest.mark.parametrize("op,fn,consts,attrs", INT_CASES, ids=[c[0] for c in INT_CASES])
def test_int64_forward(op, fn, consts, attrs):
    x = _x((3, 4), np.int64)
    check_op(op, {"x": x}, fn, consts=consts, attrs=attrs, grad=False)


def test_int64_split_and_bool_data():
    x = _x((5,), np.int64)
    check_op("Split", {"x": x}, lambda x, s: torch.split(x, [2, 3]), consts={"s": _i64(2, 3)},
             n_outputs=2, grad=False)
    b = np.array([[True, False, True], [False, False, True]])
    check_op("Transpose", {"b": b}, lambda b: b.t(), grad=False)
    check_op("Concat", {"b": b, "c": ~b}, lambda b, c: torch.cat([b, c], 1), attrs={"axis": 1},
             grad=False)


def _shape_subgraph_model():
    """y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): (N, 3, 4) -> (N, 12)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(_i64(0), "axes0"),
             numpy_helper.from_array(_i64(-1), "minus1")]
    graph = helper.make_graph(
        nodes, "shape_subgraph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 12])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_shape_subgraph_is_folded_per_batch_size():
    g = aidge_interop.load_onnx(_shape_subgraph_model())
    for n in (2, 5, 2):
        x = _x((n, 3, 4), np.float32, n)
        (y,) = g.forward([x], need_backward=True, input_grads=True)
        np.testing.assert_array_equal(y, x.reshape(n, 12))
        assert g.memory_stats()["planned_nodes"] == 1  # only Reshape runs; the rest folded
        dy = _x((n, 12), np.float32, 7)
        (gx,) = g.backward([dy])
        np.testing.assert_array_equal(gx, dy.reshape(n, 3, 4))


# ---------------------------------------------------------------- reductions

def _prod(x, dim, keepdim):
    for d in sorted((d % x.dim() for d in dim), reverse=True):
        x = x.prod(d, keepdim=keepdim)
    return x


REDUCE = {"ReduceMean": torch.mean, "ReduceSum": torch.sum, "ReduceMax": torch.amax,
          "ReduceMin": torch.amin, "ReduceProd": _prod,
          "ReduceL1": lambda x, dim, keepdim: torch.linalg.vector_norm(x, 1, dim, keepdim),
          "ReduceL2": lambda x, dim, keepdim: torch.linalg.vector_norm(x, 2, dim, keepdim),
          "ReduceSumSquare": lambda x, dim, keepdim: (x * x).sum(dim, keepdim),
          "ReduceLogSum": lambda x, dim, keepdim: x.sum(dim, keepdim).log(),
          "ReduceLogSumExp": torch.logsumexp}
AXES = [[1], [0, 2], [-1], [2, 0, 1], [1, 3], None]


def _torch_reduce(op, x, axes, keepdims):
    dims = list(range(x.dim())) if axes is None else axes
    return REDUCE[op](x, dim=dims, keepdim=bool(keepdims))


@dtypes
@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("op", list(REDUCE))
def test_reduce(op, axes, keepdims, dtype):
    x = _x((3, 4, 5, 2) if axes == [1, 3] else (3, 4, 5), dtype)
    consts = {} if axes is None else {"axes": _i64(*axes)}
    check_op(op, {"x": x}, lambda x, *_: _torch_reduce(op, x, axes, keepdims),
             consts=consts, attrs={"keepdims": keepdims})
    # the same through the axes attribute of the previous opset
    attrs = {"keepdims": keepdims}
    if axes is not None:
        attrs["axes"] = axes
    check_op(op, {"x": x}, lambda x: _torch_reduce(op, x, axes, keepdims), attrs=attrs,
             opset=11 if op == "ReduceSum" else 13)


@dtypes
@pytest.mark.parametrize("op", ["ReduceProd", "ReduceL1", "ReduceL2"])
def test_reduce_gradients_at_zeros(op, dtype):
    """Prod: one zero in a row gets the product of the others, two zeros
    none; L1: sign(0) = 0; L2: a zero norm passes no gradient (torch)."""
    x = _x((4, 5), dtype)
    x[0, 1] = 0
    x[1, [0, 3]] = 0
    x[2] = 0
    check_op(op, {"x": x}, lambda x, a: _torch_reduce(op, x, [1], 0), consts={"a": _i64(1)},
             attrs={"keepdims": 0})


@dtypes
def test_reduce_log_sum_of_a_negative_sum(dtype):
    """log of a negative sum is NaN, its gradient 1 / sum as torch's."""
    x = -np.abs(_x((3, 4), dtype)) - 0.1
    check_op("ReduceLogSum", {"x": x}, lambda x, a: _torch_reduce("ReduceLogSum", x, [1], 1),
             consts={"a": _i64(1)})


@dtypes
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_ties_split_the_gradient(op, dtype):
    # integers in a small range: many tied maxima/minima per row
    x = np.random.default_rng(3).integers(0, 3, (4, 6, 5)).astype(dtype)
    for axes in ([1], [0, 2], None):
        check_op(op, {"x": x}, lambda x, *_: _torch_reduce(op, x, axes, 1),
                 consts={} if axes is None else {"a": _i64(*axes)})


@pytest.mark.parametrize("op", list(REDUCE))
def test_reduce_noop_with_empty_axes(op):
    x = _x((3, 4))
    check_op(op, {"x": x}, lambda x, a: x * 1, consts={"a": np.zeros(0, np.int64)},
             attrs={"noop_with_empty_axes": 1})
    check_op(op, {"x": x}, lambda x: x * 1, attrs={"noop_with_empty_axes": 1})
    # without the flag, empty axes reduce everything
    check_op(op, {"x": x}, lambda x, a: _torch_reduce(op, x, None, 1),
             consts={"a": np.zeros(0, np.int64)})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_reduce_integers(op, dtype):
    x = _x((4, 5, 3), dtype) % 7 - 3  # products within int32
    check_op(op, {"x": x}, lambda x, a: _torch_reduce(op, x, [0, 2], 0),
             consts={"a": _i64(0, 2)}, attrs={"keepdims": 0}, grad=False)


def test_reduce_max_min_of_bool_are_any_all():
    x = np.random.default_rng(0).integers(0, 2, (3, 4, 5)).astype(bool)
    x[0] = False
    x[1] = True
    for op, fn in (("ReduceMax", torch.any), ("ReduceMin", torch.all)):
        check_op(op, {"x": x}, lambda x, a: fn(x, 2), consts={"a": _i64(2)},
                 attrs={"keepdims": 0}, grad=False)


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-7), (np.float64, 1e-15)],
                         ids=["float32", "float64"])
def test_reduce_sum_error_does_not_grow_with_length(dtype, rtol):
    # within a few roundings of the exact sum over 2M elements: a plain
    # float64 running sum drifts ~1e-13 here, a float32 one ~1e-4
    n = 1 << 21
    x = np.random.default_rng(0).uniform(0, 1, (2, n)).astype(dtype)
    exact = np.array([math.fsum(r) for r in x.astype(np.float64)])
    for axes, data in (([1], x), ([0], np.ascontiguousarray(x.T))):
        (y,) = aidge_interop.load_onnx(
            make_model("ReduceSum", {"x": data}, {"keepdims": 0}, {"a": _i64(*axes)}),
            param_kinds={"a": "const"}).forward([data])
        np.testing.assert_allclose(y, exact, rtol=rtol)
    (m,) = aidge_interop.load_onnx(make_model("ReduceMean", {"x": x})).forward([x])
    np.testing.assert_allclose(m, [[exact.sum() / (2 * n)]], rtol=rtol)


# ---------------------------------------------------------------- finite differences

FD_CASES = [
    ("Pad", (2, 3, 4), {"p": _i64(0, 2, -1, 0, 1, 3)}, {"mode": "reflect"}),
    ("Pad", (2, 4), {"p": _i64(1, 3, 2, 0)}, {"mode": "edge"}),
    ("Pad", (2, 5), {"p": _i64(0, -1, 1, 4)}, {"mode": "wrap"}),
    ("Slice", (5, 6), {"s": _i64(4, 5), "e": _i64(0, -7), "a": _i64(0, 1), "t": _i64(-2, -2)}, {}),
    ("Gather", (4, 3), {"i": _i64(1, -3, 1, 2)}, {"axis": 0}),
    ("GatherND", (3, 4, 2), {"i": np.array([[1, -1], [0, 2], [1, 3]], np.int64)}, {}),
    ("GatherND", (2, 3, 4), {"i": np.array([[[2], [0], [2]], [[1], [-3], [0]]], np.int64)},
     {"batch_dims": 1}),
    ("Expand", (3, 1), {"s": _i64(2, 3, 4)}, {}),
    ("Transpose", (2, 3, 4), {}, {"perm": [1, 2, 0]}),
    ("ReduceMax", (3, 4, 5), {"a": _i64(0, 2)}, {}),
    ("ReduceMean", (3, 4, 5), {"a": _i64(1)}, {"keepdims": 0}),
]


@pytest.mark.parametrize("op,shape,consts,attrs", FD_CASES, ids=[c[0] for c in FD_CASES])
def test_gradient_finite_differences(op, shape, consts, attrs):
    _fd_check(op, _x(shape, np.float64, 5), consts, attrs)


# ---------------------------------------------------------------- Tile, DepthToSpace, SpaceToDepth

@dtypes
@pytest.mark.parametrize("shape,reps", [((2, 3), (1, 2)), ((2, 3, 4), (3, 1, 2)),
                                        ((4,), (5,)), ((2, 1, 3), (2, 4, 1)), ((2, 3), (0, 2))],
                         ids=str)
def test_tile(shape, reps, dtype):
    check_op("Tile", {"x": _x(shape, dtype)}, lambda x, r: x.repeat(*reps),
             consts={"r": _i64(*reps)})


def _d2s_dcr(x, b):
    n, c, h, w = x.shape
    return x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2) \
        .reshape(n, c // (b * b), h * b, w * b)


def _s2d_dcr(x, b):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4) \
        .reshape(n, c * b * b, h // b, w // b)


@dtypes
@pytest.mark.parametrize("b", [2, 3])
def test_depth_to_space_and_back(b, dtype):
    x = _x((2, 2 * b * b, 3, 4), dtype)
    check_op("DepthToSpace", {"x": x}, lambda x: F.pixel_shuffle(x, b),
             attrs={"blocksize": b, "mode": "CRD"})
    check_op("DepthToSpace", {"x": x}, lambda x: _d2s_dcr(x, b), attrs={"blocksize": b})
    y = _x((2, 3, 2 * b, 3 * b), dtype)
    check_op("SpaceToDepth", {"x": y}, lambda x: _s2d_dcr(x, b), attrs={"blocksize": b})
    check_op("SpaceToDepth", {"x": y}, lambda x: F.pixel_unshuffle(x, b),
             attrs={"blocksize": b, "mode": "CRD"}, opset=28)


def test_depth_to_space_errors():
    with pytest.raises(ValueError, match="DepthToSpace node.*multiple of blocksize"):
        check_op("DepthToSpace", {"x": _x((1, 6, 2, 2))}, None, attrs={"blocksize": 2})
    with pytest.raises(ValueError, match="SpaceToDepth node.*multiples of blocksize"):
        check_op("SpaceToDepth", {"x": _x((1, 2, 3, 4))}, None, attrs={"blocksize": 2})
    with pytest.raises(ValueError, match="Tile node.*repeats has 1 values for rank 2"):
        check_op("Tile", {"x": _x((2, 3))}, None, consts={"r": _i64(2)})


# ---------------------------------------------------------------- ArgMax, ArgMin, CumSum, CumProd

@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims", [(0, 1), (1, 0), (-1, 1)])
def test_argmax_argmin(op, axis, keepdims):
    fn = torch.argmax if op == "ArgMax" else torch.argmin
    x = np.random.default_rng(0).integers(0, 4, (3, 5, 4)).astype(np.float32)  # ties
    check_op(op, {"x": x}, lambda x: fn(x, axis, bool(keepdims)),
             attrs={"axis": axis, "keepdims": keepdims}, grad=False)
    check_op(op, {"x": x.astype(np.int64)}, lambda x: fn(x, axis, bool(keepdims)),
             attrs={"axis": axis, "keepdims": keepdims}, grad=False)
    # the last of tied extremes: torch's on the flipped axis
    n = x.shape[axis]
    check_op(op, {"x": x}, lambda x: n - 1 - fn(x.flip(axis), axis, bool(keepdims)),
             attrs={"axis": axis, "keepdims": keepdims, "select_last_index": 1}, grad=False)


def test_argmax_nan_is_the_largest():
    x = np.array([[1, np.nan, 3, np.nan], [2, 5, 1, 0]], np.float32)
    check_op("ArgMax", {"x": x}, lambda x: torch.argmax(x, 1, True), attrs={"axis": 1},
             grad=False)


def _cumsum(x, axis, exclusive, reverse):
    if reverse:
        x = x.flip(axis)
    y = torch.cumsum(x, axis)
    if exclusive:
        y = y - x
    return y.flip(axis) if reverse else y


@dtypes
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum(axis, reverse, exclusive, dtype):
    x = _x((3, 4, 5), dtype)
    check_op("CumSum", {"x": x}, lambda x, a: _cumsum(x, axis, exclusive, reverse),
             consts={"a": np.array(axis, np.int64)},
             attrs={"exclusive": exclusive, "reverse": reverse})


def test_cumsum_integers():
    x = _x((4, 5), np.int64)
    check_op("CumSum", {"x": x}, lambda x, a: torch.cumsum(x, 1),
             consts={"a": np.array([1], np.int32)}, grad=False)


def _cumprod(x, axis, exclusive, reverse):
    if reverse:
        x = x.flip(axis)
    if exclusive:  # 1, then the products of all but the last
        ones = torch.ones_like(x.narrow(axis, 0, 1))
        x = torch.cat([ones, x.narrow(axis, 0, x.shape[axis] - 1)], axis)
    y = torch.cumprod(x, axis)
    return y.flip(axis) if reverse else y


@dtypes
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumprod(axis, reverse, exclusive, dtype):
    x = _x((3, 4, 5), dtype)
    check_op("CumProd", {"x": x}, lambda x, a: _cumprod(x, axis, exclusive, reverse),
             consts={"a": np.array(axis, np.int64)},
             attrs={"exclusive": exclusive, "reverse": reverse}, opset=26)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod_gradient_with_zeros(exclusive, reverse):
    """One zero, two zeros and a zero at either end of a line: the gradient
    is torch.cumprod's, not a division by x."""
    x = _x((4, 6), np.float64)
    x[0, 2] = 0
    x[1, 1] = x[1, 4] = 0
    x[2, 0] = 0
    x[3, 5] = 0
    check_op("CumProd", {"x": x}, lambda x, a: _cumprod(x, 1, exclusive, reverse),
             consts={"a": np.array(1, np.int64)},
             attrs={"exclusive": exclusive, "reverse": reverse}, opset=26)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_cumprod_integers(dtype):
    x = np.random.default_rng(0).integers(-3, 4, (4, 5)).astype(dtype)
    check_op("CumProd", {"x": x}, lambda x, a: torch.cumprod(x, 0),
             consts={"a": np.array([0], np.int32)}, grad=False, opset=26)


def test_cumprod_bad_input():
    with pytest.raises(TypeError, match="CumProd node.*input is bool"):
        check_op("CumProd", {"x": np.ones((2, 3), bool)}, None,
                 consts={"a": np.array(0, np.int64)}, grad=False, opset=26)
    with pytest.raises(ValueError, match="CumProd node"):
        check_op("CumProd", {"x": _x((2, 3))}, None, consts={"a": np.array(2, np.int64)},
                 grad=False, opset=26)


# ---------------------------------------------------------------- Trilu, GatherElements

@dtypes
@pytest.mark.parametrize("upper", [1, 0])
@pytest.mark.parametrize("k", [0, 2, -1])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5, 4)], ids=str)
def test_trilu(shape, k, upper, dtype):
    fn = torch.triu if upper else torch.tril
    check_op("Trilu", {"x": _x(shape, dtype)}, lambda x, k_: fn(x, k),
             consts={"k": np.array(k, np.int64)}, attrs={"upper": upper})


@dtypes
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis, dtype):
    x = _x((3, 4, 5), dtype)
    shape = [2, 3, 4]
    shape[axis] = 6  # repeated indices: their gradients add up
    idx = np.random.default_rng(1).integers(0, x.shape[axis], shape).astype(np.int64)
    check_op("GatherElements", {"x": x}, lambda x, i: torch.gather(x, axis, i),
             consts={"i": idx}, attrs={"axis": axis})
    # negative indices count from the end
    check_op("GatherElements", {"x": x},
             lambda x, i: torch.gather(x, axis, i + x.shape[axis]),
             consts={"i": idx - x.shape[axis]}, attrs={"axis": axis})


def test_gather_elements_index_out_of_range():
    with pytest.raises(ValueError, match="GatherElements node.*index 3 is out of range"):
        check_op("GatherElements", {"x": _x((2, 3))}, None,
                 consts={"i": np.array([[0, 3]], np.int64)}, attrs={"axis": 1})


# ---------------------------------------------------------------- TopK

@dtypes
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis,k", [(-1, 3), (0, 2), (1, 4), (1, 0)])
def test_topk(axis, k, largest, dtype):
    x = np.random.default_rng(2).permutation(60).reshape(3, 4, 5).astype(dtype) / 7  # distinct
    check_op("TopK", {"x": x}, lambda x, k_: torch.topk(x, k, axis, bool(largest)),
             consts={"k": _i64(k)}, attrs={"axis": axis, "largest": largest}, n_outputs=2)


def test_topk_ties_by_index_and_nan_largest():
    x = np.array([[1, 3, 3, np.nan, 0, 3]], np.float32)
    g = aidge_interop.load_onnx(make_model("TopK", {"x": x}, {}, {"k": _i64(4)}, n_outputs=2),
                                param_kinds={"k": "const"})
    vals, idx = g.forward([x])
    np.testing.assert_array_equal(idx, [[3, 1, 2, 5]])
    np.testing.assert_array_equal(vals[:, 1:], [[3, 3, 3]])
    assert np.isnan(vals[0, 0])


def test_topk_k_larger_than_the_axis():
    with pytest.raises(ValueError, match="TopK node.*K = 6 for an axis of 5"):
        check_op("TopK", {"x": _x((2, 5))}, None, consts={"k": _i64(6)}, n_outputs=2)
