"""The engine's thread pool (csrc/parallel.c): set_num_threads, results that
do not depend on the thread count, two graphs sharing the pool from two
Python threads, and a forked child that inherits a started pool.

Timings are not asserted here (benchmarks/run.py and peak.py show them).
"""
import multiprocessing
import threading

import numpy as np
import pytest
import torch

import aidge_interop as ai
from aidge_interop.examples import lenet, resnet8
from op_harness import make_model
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
