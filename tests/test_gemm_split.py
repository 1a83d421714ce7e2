"""gemm_tiles.c's products split between threads in several parts per thread
(csrc/kernels/gemm.c, tiles_split): op(B), and A^T for the weight gradient,
packed whole in pieces side by side on the pool, then C in parts of whole
6-row tiles (A op(B): the forward x W^T and the input gradient dY W) or
64-column panels (A^T B: the weight gradient dY^T X), up to four parts per
thread; the eval forward over a packed weight (csrc/packed.c) splits by rows
likewise.

- Each element of C is summed in the same order whatever the split: the same
  bits at 1 to 5 threads (parts of different sizes and boundaries each time),
  on shapes with a last tile of fewer than 6 rows, a last panel of fewer than
  64 columns, and K in several chunks whose A^T packing pieces straddle the
  chunks' boundaries.
- Values against NumPy's float64 product, within float32's rounding bound for
  a sum of K products in any order: |y - y64| <= gamma(K + 2) (|alpha| |A|
  |B| + |beta| |C|), gamma(n) = n u / (1 - n u), u = 2^-24.
- A Linear through wrap, training (forward, input and weight gradients) and
  eval over its packed weight: the same bits at 1 to 4 threads.

Timings are not asserted here (benchmarks/results/kernels-gemm.md).
"""
import copy

import numpy as np
import pytest
import torch

import aidge_interop as ai
from aidge_interop import _C
from op_harness import make_model

U = 2.0 ** -24
THREADS = (1, 2, 3, 4, 5)


def _gamma(n):
    return n * U / (1 - n * U)


@pytest.fixture
def kernel():
    """The AVX-512 tiles, where the CPU and the build have them (else the
    library, whose sums may depend on the panel: bits are not compared)."""
    saved = ai.get_num_threads()
    wide = _C._set_avx512(True)
    yield wide
    ai.set_num_threads(saved)


def _at_threads(run, threads=THREADS):
    outs = []
    for n in threads:
        ai.set_num_threads(n)
        outs.append(run())
    return outs


def _same_bits(outs, what, threads=THREADS):
    for n, o in zip(threads[1:], outs[1:]):
        np.testing.assert_array_equal(o, outs[0], err_msg=f"{what}: {n} threads against 1")


# Gemm (M, N, K, transA, transB): x W^T and dY W of transformer layers (ViT-256's
# 520 rows = 86 x 6 + 4; ViT-384's fc1 580 x 1536 x 384), 133 = 22 x 6 + 1 rows by
# 300 columns (a last panel of 44) over K = 1300 (3 chunks of 434); A^T B with
# N >= 2 M: ViT-384's fc2 weight gradient and 130 x 300 over 1300 rows (A^T's
# packing pieces of 624 rows across the chunks' boundaries at 434 and 868)
CASES = [(520, 768, 256, 0, 1), (520, 256, 1024, 0, 0), (580, 1536, 384, 0, 1),
         (133, 300, 1300, 0, 1), (133, 300, 1300, 0, 0), (384, 1536, 580, 1, 0),
         (130, 300, 1300, 1, 0)]


@pytest.mark.parametrize("M,N,K,ta,tb", CASES)
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 0.75)])
def test_split_product_same_bits_and_within_float32_rounding(kernel, M, N, K, ta, tb,
                                                              alpha, beta):
    rng = np.random.default_rng(M + N + K)
    a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
    c = rng.standard_normal((M, N), dtype=np.float32)
    inputs = {"a": a, "b": b, "c": c} if beta else {"a": a, "b": b}
    graph = ai.load_onnx(make_model("Gemm", inputs, {"transA": ta, "transB": tb,
                                                     "alpha": alpha, "beta": beta}))._g
    tensors = [ai.Tensor(v) for v in inputs.values()]
    outs = _at_threads(lambda: graph.forward(tensors)[0].numpy().copy())
    if kernel:
        _same_bits(outs, f"{M}x{N}x{K} ta={ta} tb={tb}")
    a64 = a.astype(np.float64).T if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).T if tb else b.astype(np.float64)
    c64 = c.astype(np.float64)
    ref = alpha * a64 @ b64 + beta * c64
    bound = _gamma(K + 2) * (abs(alpha) * np.abs(a64) @ np.abs(b64) + abs(beta) * np.abs(c64))
    for n, y in zip(THREADS, outs):
        err = np.abs(y.astype(np.float64) - ref)
        assert np.all(err <= bound), (f"{M}x{N}x{K} at {n} threads: error {err.max():.3g} "
                                      f"over the float32 bound")


def test_linear_training_and_packed_eval_same_bits(kernel):
    """nn.Linear(384, 1536) on (4, 145, 384) (a ViT-384's fc1): the forward,
    the input and weight gradients, and the eval forward over the packed
    weight, at 1 to 4 threads; the training forward against float64."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(384, 1536)
    x = torch.randn(4, 145, 384, requires_grad=True)
    gy = torch.randn(4, 145, 1536)
    am = ai.wrap(copy.deepcopy(lin), (x,))
    threads = (1, 2, 3, 4)

    def step():
        x.grad = None
        for p in am.parameters():
            p.grad = None
        y = am(x)
        y.backward(gy)
        return (y.detach().numpy().copy(), x.grad.numpy().copy(),
                dict(am.named_parameters())["weight"].grad.numpy().copy())

    steps = _at_threads(step, threads)
    am.eval()

    def evaluate():
        with torch.no_grad():
            am(x)  # the first eval forward after a change packs the weight
            return am(x).numpy().copy()

    evals = _at_threads(evaluate, threads)
    if kernel:
        for i, what in enumerate(("forward", "input gradient", "weight gradient")):
            _same_bits([s[i] for s in steps], what, threads)
        _same_bits(evals, "eval forward over the packed weight", threads)
        np.testing.assert_array_equal(evals[0], steps[0][0])
    x64 = x.detach().double().reshape(-1, 384).numpy()
    w64, b64 = lin.weight.detach().double().numpy(), lin.bias.detach().double().numpy()
    ref = x64 @ w64.T + b64
    bound = _gamma(384 + 3) * (np.abs(x64) @ np.abs(w64).T + np.abs(b64))
    assert np.all(np.abs(steps[0][0].reshape(-1, 1536) - ref) <= bound)


def _unbroadcast(x, shape):
    """x summed over the axes that broadcasting added to or stretched in shape."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape))))
    return x.sum(axis=tuple(i for i, s in enumerate(shape) if s == 1), keepdims=True)


# batched MatMul (B with batch dimensions): bench_ops' 8 heads of 64 x 128 x 64 (each
# product too small to split: the batch goes to the pool, whole products per part),
# an A broadcast over B's batch (its gradient sums 8 products: in batch order), both
# broadcast, and skinny products (8 rows)
BATCHED = [((8, 64, 128), (8, 128, 64)), ((1, 64, 128), (8, 128, 64)),
           ((2, 1, 48, 40), (1, 3, 40, 24)), ((16, 8, 96), (16, 96, 80))]


@pytest.mark.parametrize("sa,sb", BATCHED)
def test_batched_matmul_same_bits_and_within_float32_rounding(kernel, sa, sb):
    rng = np.random.default_rng(len(sa) + sa[-1])
    a = rng.standard_normal(sa, dtype=np.float32)
    b = rng.standard_normal(sb, dtype=np.float32)
    graph = ai.load_onnx(make_model("MatMul", {"a": a, "b": b}))
    y64 = np.matmul(a.astype(np.float64), b.astype(np.float64))
    dy = rng.standard_normal(y64.shape, dtype=np.float32)

    def run():
        (y,) = graph.forward([a, b], need_backward=True, input_grads=True)
        return [y.copy(), *(g.copy() for g in graph.backward([dy]))]

    outs = _at_threads(run)
    for i, what in enumerate(("forward", "dA", "dB")):
        _same_bits([o[i] for o in outs], f"MatMul {sa} @ {sb} {what}")
    a64, b64, dy64 = a.astype(np.float64), b.astype(np.float64), dy.astype(np.float64)
    K, N = sa[-1], sb[-1]
    reps_a = y64.size // (dy.shape[-2] * N) // (a.size // (sa[-2] * K))
    reps_b = y64.size // (dy.shape[-2] * N) // (b.size // (K * N))
    checks = [(y64, np.matmul(np.abs(a64), np.abs(b64)), K),
              (_unbroadcast(np.matmul(dy64, b64.swapaxes(-1, -2)), sa),
               _unbroadcast(np.matmul(np.abs(dy64), np.abs(b64).swapaxes(-1, -2)), sa),
               N * reps_a),
              (_unbroadcast(np.matmul(a64.swapaxes(-1, -2), dy64), sb),
               _unbroadcast(np.matmul(np.abs(a64).swapaxes(-1, -2), np.abs(dy64)), sb),
               sa[-2] * reps_b)]
    for got, (ref, mag, terms), what in zip(outs[0], checks, ("forward", "dA", "dB")):
        assert got.shape == ref.shape, what
        err = np.abs(got.astype(np.float64) - ref)
        assert np.all(err <= _gamma(terms + 2) * mag), f"MatMul {sa} @ {sb} {what}: {err.max()}"
