"""Threads: two graphs at once compute what they compute alone (the GIL is
released while C computes), and one graph used from two threads at once
either runs the call or raises a clear RuntimeError, never mixes results.

(Processes appending to one benchmarks.jsonl: test_model_tester.py,
test_concurrent_writers_never_tear_or_lose_a_record.)
"""
import threading
import time

import numpy as np
import pytest
import torch

import aidge_interop as ai
from aidge_interop.examples import lenet, perceptron

BUSY = "this graph is being used by another thread"


def run_threads(targets):
    errors = []

    def guard(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not [t for t in threads if t.is_alive()], "a thread hangs"
    if errors:
        raise errors[0]


def graph_of(factory, shape):
    return ai.wrap(factory(), [shape])._graph


def forward_backward(graph, x, gy):
    graph.need_backward = graph.input_grads = True
    y, = graph.forward([ai.Tensor(x)])
    dx, = graph.backward([ai.Tensor(gy)])
    return y.numpy().copy(), dx.numpy().copy()


def test_two_graphs_in_two_threads_agree_with_sequential_runs():
    rng = np.random.default_rng(0)
    jobs = []
    for factory, shape in ((lenet, (4, 1, 32, 32)), (perceptron, (8, 16))):
        g = graph_of(factory, shape)
        xs = [rng.standard_normal(shape, dtype=np.float32) for _ in range(20)]
        out_shape = g.forward([ai.Tensor(xs[0])])[0].shape
        gys = [rng.standard_normal(out_shape, dtype=np.float32) for _ in range(20)]
        expected = [forward_backward(g, x, gy) for x, gy in zip(xs, gys)]
        jobs.append((g, xs, gys, expected))
    results = [[], []]

    def worker(k):
        g, xs, gys, _ = jobs[k]
        for _ in range(5):
            results[k] += [forward_backward(g, x, gy) for x, gy in zip(xs, gys)]

    run_threads([lambda: worker(0), lambda: worker(1)])
    for (_, _, _, expected), got in zip(jobs, results):
        assert len(got) == 5 * len(expected)
        for i, (y, dx) in enumerate(got):
            np.testing.assert_array_equal(y, expected[i % len(expected)][0])
            np.testing.assert_array_equal(dx, expected[i % len(expected)][1])


def test_the_gil_is_released_while_a_graph_runs():
    """Another Python thread makes progress during one long forward call."""
    g = graph_of(lenet, (256, 1, 32, 32))
    x = ai.Tensor(np.ones((256, 1, 32, 32), np.float32))
    g.need_backward = False
    g.forward([x])  # plan once
    ticks, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())

    t = threading.Thread(target=ticker)
    t.start()
    try:
        while not ticks:
            time.sleep(0.001)
        for _ in range(20):  # the ticker may miss one call; not twenty
            start = time.perf_counter()
            g.forward([x])
            end = time.perf_counter()
            if any(start < s < end for s in ticks[-5000:]):
                break
        else:
            pytest.fail("no other thread ran during any of 20 forward calls")
    finally:
        stop.set()
        t.join()


def test_one_graph_from_two_threads_runs_or_refuses_clearly():
    g = graph_of(perceptron, (8, 16))
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((8, 16), dtype=np.float32) for _ in range(8)]
    g.need_backward = g.input_grads = False
    expected = [g.forward([ai.Tensor(x)])[0].numpy().copy() for x in xs]
    outcome = {"ran": 0, "refused": 0}
    lock = threading.Lock()

    def worker(seed):
        order = np.random.default_rng(seed).permutation(len(xs) * 50) % len(xs)
        for i in order:
            try:
                y, = g.forward([ai.Tensor(xs[i])])
            except RuntimeError as exc:
                assert BUSY in str(exc)
                with lock:
                    outcome["refused"] += 1
                continue
            np.testing.assert_array_equal(y.numpy(), expected[i])
            with lock:
                outcome["ran"] += 1

    run_threads([lambda: worker(2), lambda: worker(3)])
    assert outcome["ran"] + outcome["refused"] == 2 * 50 * len(xs)
    assert outcome["ran"] > 0


def test_flags_and_state_cannot_change_under_a_running_call():
    g = graph_of(lenet, (128, 1, 32, 32))
    x = ai.Tensor(np.ones((128, 1, 32, 32), np.float32))
    g.need_backward = False
    running = threading.Event()
    seen = []

    def poke():
        running.wait()
        for _ in range(2000):
            for call in (lambda: setattr(g, "training", True), lambda: g.memory_stats(),
                         lambda: g.values(), lambda: g.intermediate("output_0"),
                         lambda: g.value("sequence.0.weight")):
                try:
                    call()
                except RuntimeError as exc:
                    assert BUSY in str(exc)
                    seen.append(exc)
                except ValueError:  # intermediate() between calls: not kept
                    pass
            if len(seen) >= 5:
                return

    def run():
        for _ in range(50):
            running.set()
            g.forward([x])
            if len(seen) >= 5:
                return

    run_threads([run, poke])
    assert seen, "no call overlapped a running forward"


def test_backward_after_another_threads_forward_is_refused():
    g = graph_of(perceptron, (2, 16))
    g.need_backward = g.input_grads = True
    x = ai.Tensor(np.ones((2, 16), np.float32))
    g.forward([x])
    run_threads([lambda: g.forward([x])])
    with pytest.raises(RuntimeError, match="backward in another thread than the latest forward"):
        g.backward([ai.Tensor(np.ones((2, 4), np.float32))])
    g.forward([x])  # the same thread again: fine
    g.backward([ai.Tensor(np.ones((2, 4), np.float32))])


def test_wrapped_modules_in_threads_train_like_sequentially():
    torch.manual_seed(0)
    models = [perceptron(seed=s) for s in (0, 1)]
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(10)]

    def train(model):
        m = ai.wrap(model, [(8, 16)])
        opt = ai.SGD(m, lr=0.05)
        for x, t in data:
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), t).backward()
            opt.step()
        return {n: p.detach().clone() for n, p in m.named_parameters()}

    expected = [train(m) for m in models]
    got = [None, None]

    def job(k):
        got[k] = train(models[k])

    run_threads([lambda: job(0), lambda: job(1)])
    for e, g in zip(expected, got):
        for name in e:
            torch.testing.assert_close(g[name], e[name], rtol=0, atol=0, msg=name)
