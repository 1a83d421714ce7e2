"""The engine's thread pool (csrc/parallel.c): set_num_threads, results that
do not depend on the thread count, two graphs sharing the pool from two
Python threads, and a forked child that inherits a started pool.

Every operator whose kernels split their work on the pool (elementwise,
BatchNormalization, LayerNormalization's forward, Softmax, pooling,
depthwise and im2col convolution, SGD) runs at 1, 2 and 3 threads on
tensors above the grain (csrc/parallel.h AI_GRAIN_ELEMS = 32768 elements):
bit-identical results, and torch's.

Timings are not asserted here (benchmarks/run.py and peak.py show them).
"""
import multiprocessing

import numpy as np
import pytest
import torch

import aidge_interop as ai
from aidge_interop.examples import lenet, resnet8
from op_harness import check_op, make_model
from test_concurrency import forward_backward, graph_of, run_threads


@pytest.fixture
def threads():
    saved = ai.get_num_threads()
    yield
    ai.set_num_threads(saved)


def test_set_num_threads_round_trips_and_refuses_bad_counts(threads):
    for n in (1, 2, 3, 1):
        ai.set_num_threads(n)
        assert ai.get_num_threads() == n
    ai.set_num_threads(10_000)  # clamped to the pool's limit, not an error
    assert 1 < ai.get_num_threads() <= 10_000
    for bad in (0, -3):
        with pytest.raises(ValueError, match="number of threads must be >= 1"):
            ai.set_num_threads(bad)


def _case(factory, shape, seed):
    torch.manual_seed(seed)
    g = graph_of(factory, shape)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=np.float32)
    gy = rng.standard_normal(g.forward([ai.Tensor(x)])[0].shape, dtype=np.float32)
    return g, x, gy


def _run(factory, shape, seed, nthreads):
    ai.set_num_threads(nthreads)
    return forward_backward(*_case(factory, shape, seed))


@pytest.mark.parametrize("factory,shape", [(lenet, (16, 1, 32, 32)),
                                           (resnet8, (8, 3, 32, 32))], ids=["lenet", "resnet8"])
def test_results_do_not_depend_on_the_thread_count(threads, factory, shape):
    """Work is split by output elements, never inside a sum; but the GEMM
    library picks its kernels by the size of each panel, so the last bits
    of float32 sums may move: 1, 2 and 3 threads agree to float32 rounding."""
    y1, dx1 = _run(factory, shape, 0, 1)
    for n in (2, 3):
        y, dx = _run(factory, shape, 0, n)
        np.testing.assert_allclose(y, y1, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dx, dx1, rtol=1e-5, atol=1e-6)


def test_large_gemm_split_between_threads(threads):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 517), dtype=np.float32)
    b = rng.standard_normal((517, 401), dtype=np.float32)
    graph = ai.load_onnx(make_model("MatMul", {"a": a, "b": b}))._g
    outs = []
    for n in (1, 2, 4):
        ai.set_num_threads(n)
        outs.append(graph.forward([ai.Tensor(a), ai.Tensor(b)])[0].numpy().copy())
    ref = a.astype(np.float64) @ b  # entries ~ sqrt(517): float32 sums err ~1e-5
    for o in outs:
        np.testing.assert_allclose(o, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [16, 5])
def test_skinny_gemm_split_between_threads(threads, rows):
    """A Linear on a small batch (the skinny kernel of csrc/kernels/gemm.c,
    split from 0.5 MFLOP per thread): bit-identical at 1, 2 and 3 threads,
    forward (16 x 640 @ 640 x 256, B transposed) and input gradient."""
    inputs = {"a": _rand((rows, 640), np.float32), "b": _rand((256, 640), np.float32, 1)}
    check_threads("Gemm", inputs, lambda a, b: a @ b.T, attrs={"transB": 1})


@pytest.mark.parametrize("transb", [0, 1])
def test_tiled_gemm_split_between_threads(threads, transb):
    """Products that take the AVX-512 kernel of csrc/kernels/gemm_tiles.c
    (x W^T, dY W at transformer sizes; the library without AVX-512): each
    element the same sum at any split, so bit-identical at 1, 2 and 3
    threads where it runs; float32 rounding of the float64 product."""
    from aidge_interop import _C

    wide = _C._set_avx512(True)  # on unless the CPU or the build has none
    rng = np.random.default_rng(2)
    a = rng.standard_normal((260, 384), dtype=np.float32)
    b = rng.standard_normal((320, 384) if transb else (384, 320), dtype=np.float32)
    graph = ai.load_onnx(make_model("Gemm", {"a": a, "b": b}, {"transB": transb}))._g
    outs = []
    for n in (1, 2, 3):
        ai.set_num_threads(n)
        outs.append(graph.forward([ai.Tensor(a), ai.Tensor(b)])[0].numpy().copy())
    ref = a.astype(np.float64) @ (b.T if transb else b)  # entries ~ sqrt(384)
    for o in outs:
        np.testing.assert_allclose(o, ref, rtol=1e-4, atol=1e-4)
    if wide:
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])


def test_two_graphs_share_the_pool_from_two_python_threads(threads):
    """One Python thread gets the pool, the other computes alone meanwhile:
    both results equal the sequential ones."""
    ai.set_num_threads(2)
    cases = [_case(lenet, (16, 1, 32, 32), k) for k in range(2)]
    expected = [forward_backward(*case) for case in cases]

    def job(k):
        for _ in range(10):
            for a, b in zip(forward_backward(*cases[k]), expected[k]):
                np.testing.assert_array_equal(a, b)

    run_threads([lambda: job(0), lambda: job(1)])


def _child(queue, case):
    try:
        y, dx = forward_backward(*case)
        queue.put(("ok", y.tobytes(), dx.tobytes()))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent
        queue.put(("error", repr(exc)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="no fork on this platform")
def test_forked_child_runs_with_a_fresh_pool(threads):
    """The child only runs the engine (torch's OpenMP is not fork-safe)."""
    ai.set_num_threads(2)
    case = _case(lenet, (16, 1, 32, 32), 0)
    y, dx = forward_backward(*case)  # the parent's workers are started
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, case))
    proc.start()
    try:  # read before joining: the child waits for its results to be read
        result = queue.get(timeout=60)
    except Exception:  # noqa: BLE001 - queue.Empty
        result = None
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
    assert result is not None, "the forked child hangs in the engine's thread pool"
    assert result == ("ok", y.tobytes(), dx.tobytes())


# ---------------------------------------------------------------- operators split on the pool

def _op_results(op, inputs, attrs, consts, training):
    """Outputs and input gradients of a one-node graph at 1, 2 and 3 threads."""
    g = ai.load_onnx(make_model(op, inputs, attrs, consts),
                     param_kinds={n: "const" for n in consts})
    g.training = training
    runs = []
    for n in (1, 2, 3):
        ai.set_num_threads(n)
        outs = [o.copy() for o in g.forward(list(inputs.values()), need_backward=True,
                                             input_grads=True)]
        gos = [np.random.default_rng(7).standard_normal(o.shape).astype(o.dtype)
               for o in outs]
        runs.append(outs + [d.copy() for d in g.backward(gos) if d is not None])
    return runs


def check_threads(op, inputs, torch_fn, attrs=None, consts=None, training=False):
    """Bit-identical at 1, 2 and 3 threads; agrees with torch (op_harness) at 2."""
    consts = consts or {}
    runs = _op_results(op, inputs, attrs, consts, training)
    for run in runs[1:]:
        assert len(run) == len(runs[0])
        for a, b in zip(run, runs[0]):
            np.testing.assert_array_equal(a, b)
    ai.set_num_threads(2)
    check_op(op, inputs, torch_fn, attrs=attrs, consts=consts, training=training)


def _rand(shape, dtype, seed=0, positive=False):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.abs(x) + 0.5 if positive else x


DTYPES = [np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op,fn", [("Relu", torch.relu), ("Sigmoid", torch.sigmoid),
                                   ("Tanh", torch.tanh),
                                   ("Gelu", torch.nn.functional.gelu)],
                         ids=["relu", "sigmoid", "tanh", "gelu"])
def test_unary_split_between_threads(threads, op, fn, dtype):
    check_threads(op, {"x": _rand((100_003,), dtype)}, fn)  # odd: ranges cut vectors


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_clip_split_between_threads(threads, dtype):
    """ReLU6: bounds as constant inputs."""
    check_threads("Clip", {"x": 4 * _rand((100_003,), dtype)},
                  lambda x, lo, hi: torch.clamp(x, lo, hi),
                  consts={"min": np.array(0, dtype), "max": np.array(6, dtype)})


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op,fn,b_shape", [
    ("Add", torch.add, (4, 64, 20, 20)), ("Mul", torch.mul, (64, 1, 1)),
    ("Sub", torch.sub, (1, 1, 20)), ("Div", torch.div, (64, 1, 20)),
    ("Max", torch.maximum, (4, 64, 20, 20)), ("Mul", torch.mul, (4, 64, 20, 1))],
    ids=["add", "mul-bcast", "sub-bcast", "div-bcast", "max", "mul-column"])
def test_binary_split_between_threads(threads, op, fn, b_shape, dtype):
    """Ranges start inside broadcast rows; gradients reduce over broadcast axes."""
    check_threads(op, {"a": _rand((4, 64, 20, 20), dtype, 1),
                       "b": _rand(b_shape, dtype, 2, positive=op == "Div")}, fn)


def _bn(x, scale, bias, mean, var, training):
    return torch.nn.functional.batch_norm(x, mean.clone(), var.clone(), scale, bias,
                                          training=training, eps=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batchnorm_split_between_threads(threads, training, dtype):
    C = 32
    inputs = {"x": _rand((8, C, 24, 24), dtype), "scale": _rand((C,), dtype, 1),
              "bias": _rand((C,), dtype, 2)}
    stats = {"mean": _rand((C,), dtype, 3), "var": _rand((C,), dtype, 4, positive=True)}
    check_threads("BatchNormalization", inputs,
                  lambda x, s, b, m, v: _bn(x, s, b, m, v, training), consts=stats,
                  training=training)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_layernorm_split_between_threads(threads, dtype):
    """The forward's rows split between threads, each with its own statistics."""
    H = 130
    inputs = {"x": _rand((1000, H), dtype), "scale": _rand((H,), dtype, 1),
              "bias": _rand((H,), dtype, 2)}
    check_threads("LayerNormalization", inputs,
                  lambda x, s, b: torch.nn.functional.layer_norm(x, (H,), s, b, eps=1e-5),
                  {"axis": -1})


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op,fn", [("Softmax", torch.softmax),
                                   ("LogSoftmax", torch.log_softmax)], ids=["sm", "logsm"])
@pytest.mark.parametrize("shape,axis", [((1000, 100), -1), ((4, 100, 300), 1)],
                         ids=["rows", "columns"])
def test_softmax_split_between_threads(threads, op, fn, shape, axis, dtype):
    check_threads(op, {"x": _rand(shape, dtype)}, lambda x: fn(x, axis), {"axis": axis})


F = torch.nn.functional


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op,axes,keepdims,fn", [
    ("ReduceSum", [1], 0, lambda x, a: x.sum(1)),
    ("ReduceSum", [0, 2], 1, lambda x, a: x.sum((0, 2), keepdim=True)),
    ("ReduceMean", [2], 1, lambda x, a: x.mean(2, keepdim=True)),
    ("ReduceMean", [0], 0, lambda x, a: x.mean(0))],
    ids=["sum-middle", "sum-outer-inner", "mean-last", "mean-first"])
def test_reduce_split_between_threads(threads, op, axes, keepdims, fn, dtype):
    """float32 sums split along the outermost kept row axis (sum-middle,
    sum-outer-inner, mean-last) or the columns of kept rows (mean-first),
    each output summed on one thread; the backward broadcasts dy over input
    rows split between threads (ranges start inside the kept axes)."""
    check_threads(op, {"x": _rand((30, 70, 130), dtype)}, fn, {"keepdims": keepdims},
                  {"axes": np.array(axes, np.int64)})


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op,inputs,attrs,fn", [
    ("Transpose", {"x": (30, 70, 130)}, {"perm": [0, 2, 1]}, lambda x: x.permute(0, 2, 1)),
    ("Transpose", {"x": (9, 70, 13, 11)}, {"perm": [3, 1, 0, 2]},
     lambda x: x.permute(3, 1, 0, 2)),
    ("Concat", {"a": (30, 70, 64), "b": (30, 19, 64)}, {"axis": 1},
     lambda a, b: torch.cat([a, b], 1))],
    ids=["transpose-last-two", "transpose-4d", "concat-middle"])
def test_strided_copies_split_between_threads(threads, op, inputs, attrs, fn, dtype):
    """Copies along strided walks (forward) and their adds back (backward),
    rows split between threads; ranges start inside the outer axes."""
    check_threads(op, {k: _rand(v, dtype, i) for i, (k, v) in enumerate(inputs.items())}, fn,
                  attrs)


@pytest.mark.parametrize("mode,torch_mode", [("reflect", "reflect"), ("edge", "replicate"),
                                             ("constant", "constant")])
def test_pad_split_between_threads(threads, mode, torch_mode):
    """Output rows split between threads, the edges from one column table."""
    check_threads("Pad", {"x": _rand((6, 32, 24, 24), np.float32)},
                  lambda x, p: F.pad(x, (2, 1, 1, 3), mode=torch_mode), {"mode": mode},
                  {"pads": np.array([0, 0, 1, 2, 0, 0, 3, 1], np.int64)})



@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op,attrs,fn", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
     lambda x: F.max_pool2d(x, 3, 2, 1)),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}, lambda x: F.max_pool2d(x, 2)),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
     lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
    ("GlobalAveragePool", {}, lambda x: F.adaptive_avg_pool2d(x, 1)),
    ("GlobalMaxPool", {}, lambda x: F.adaptive_max_pool2d(x, 1))],
    ids=["max-pad", "max-inside", "avg", "global-avg", "global-max"])
def test_pooling_split_between_threads(threads, op, attrs, fn, dtype):
    check_threads(op, {"x": _rand((6, 32, 24, 24), dtype)}, fn, attrs)


def _conv(group, stride, pad):
    return lambda x, w, b: F.conv2d(x, w, b, stride, pad, groups=group)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("x_shape,w_shape,stride,group", [
    ((4, 32, 40, 40), (32, 1, 3, 3), 1, 32),   # depthwise plane by plane
    ((3, 16, 40, 40), (32, 1, 3, 3), 2, 16),   # depthwise, 2 outputs per channel
    ((8, 40, 12, 12), (40, 1, 3, 3), 1, 40),   # depthwise channels-last, 16+16+8
    ((11, 24, 9, 10), (24, 1, 3, 3), 1, 24),   # the same, 11 images in 8 slots
    ((3, 40, 12, 12), (40, 1, 3, 3), 1, 40),   # the same, fewer images than slots
    ((2, 16, 55, 55), (2, 16, 3, 3), 2, 1),    # im2col/col2im (GEMMs too small to split)
    ((11, 16, 16, 16), (32, 16, 3, 3), 2, 1),  # backward: 11 images in 8 groups
    ((10, 16, 16, 16), (32, 16, 1, 1), 2, 1),  # the same, strided 1x1 (a shortcut)
    ((9, 3, 20, 18), (10, 3, 3, 3), 1, 1),     # direct conv, whole images per thread
    ((7, 4, 21, 20), (6, 4, 3, 3), 2, 1),      # the same, strided
    ((9, 16, 12, 11), (24, 16, 1, 1), 1, 1),   # pointwise, an image's GEMM per thread
    ((6, 32, 9, 10), (80, 32, 1, 1), 1, 1),    # the same, weight gradient's row panels
    ((12, 32, 6, 6), (48, 32, 1, 1), 1, 1)],   # pointwise, the batch in one GEMM
    ids=["dw-planes", "dw-multiplier", "dw-channels-last", "dw-channels-last-images",
         "dw-channels-last-units", "im2col", "im2col-groups",
         "im2col-groups-1x1", "direct-images",
         "direct-images-s2", "pointwise-images", "pointwise-panels", "pointwise-batched"])
def test_conv_split_between_threads(threads, x_shape, w_shape, stride, group, dtype):
    inputs = {"x": _rand(x_shape, dtype), "w": _rand(w_shape, dtype, 1),
              "b": _rand((w_shape[0],), dtype, 2)}
    k, pad = w_shape[2], w_shape[2] // 2
    attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [pad] * 4,
             "group": group}
    check_threads("Conv", inputs, _conv(group, stride, pad), attrs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_sgd_split_between_threads(threads, dtype):
    """Each parameter's update split by elements: the same bits as one thread,
    and torch.optim.SGD's."""
    gen = torch.Generator().manual_seed(0)
    p0 = [torch.randn(s, generator=gen, dtype=dtype) for s in ((300, 400), (17,))]
    grads = [[torch.randn(p.shape, generator=gen, dtype=dtype) for p in p0]
             for _ in range(3)]

    def run(opt_class, n):
        ai.set_num_threads(n)
        ps = [p.clone().requires_grad_(True) for p in p0]
        opt = opt_class(ps, lr=0.1, momentum=0.9, weight_decay=1e-2, nesterov=True)
        for step in grads:
            for p, g in zip(ps, step):
                p.grad = g.clone()
            opt.step()
        return [p.detach().numpy().copy() for p in ps]

    one = run(ai.SGD, 1)
    for n in (2, 3):
        for a, b in zip(run(ai.SGD, n), one):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(run(torch.optim.SGD, 1), one):
        np.testing.assert_allclose(a, b, rtol=1e-6 if dtype == torch.float32 else 1e-14,
                                   atol=1e-7 if dtype == torch.float32 else 1e-15)
