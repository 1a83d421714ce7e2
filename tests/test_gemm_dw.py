"""The weight-gradient product dW = dY^T X (op(A) transposed, B as it is,
N >= 2 M, M, N, K >= 128) on the AVX-512 kernel of csrc/kernels/gemm_tiles.c, and its
twin: the library (OpenBLAS, or the portable reference kernel) where the CPU
or the build has no AVX-512 and where the wide kernels are switched off.

- Values of both against NumPy's float64 product, within float32's
  rounding bound for a sum of K products in any order and by any FMAs:
  |y - y64| <= gamma(K + 2) (|alpha| |A|^T |B| + |beta| |C|), gamma(n) =
  n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability, 3.1).
- The kernel's sums are the same whatever part of C a call computes: the
  same bits at 1, 2 and 3 threads (the pool splits C into row or column
  panels) where it runs.
- A Linear's weight gradient through wrap (FusedMatMul's backward: dY^T X
  over batch x tokens rows) against the float64 product, the same bits at
  1, 2 and 3 threads.
- Products with N = M and M > N, which stay with the library, within the
  same bound.

Timings are not asserted here (benchmarks/results/kernels-gemm.md).
"""
import numpy as np
import pytest
import torch

import aidge_interop as ai
from aidge_interop import _C
from op_harness import make_model

U = 2.0 ** -24


def _gamma(n):
    return n * U / (1 - n * U)


@pytest.fixture
def threads():
    saved = ai.get_num_threads()
    yield
    ai.set_num_threads(saved)


@pytest.fixture(params=[True, False], ids=["kernel", "library"])
def path(request):
    """The AVX-512 kernel (where the CPU and the build have it) or the library:
    yields whether the kernel runs."""
    wide = _C._set_avx512(request.param)
    yield wide
    _C._set_avx512(True)


def _within_rounding(y, ref64, bound, what):
    err = np.abs(y.astype(np.float64) - ref64)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (
        f"{what}: error {err[worst]:.3g} at {worst} over the float32 bound {bound[worst]:.3g}")


# (K, M, N): a ViT-384 fc2 (580 = 4 x 145 tokens), BERT's (1024 rows); 133 =
# 22 x 6 + 1 rows (a last tile of one row), 300 columns (blocks of 128,
# 128, 44: a partial panel), K = 1300 in 3 chunks of 434; N = M and M > N
# (the library)
SHAPES = [(580, 384, 1536), (1024, 256, 1024), (1300, 133, 300), (1024, 256, 256),
          (580, 1536, 384)]


@pytest.mark.parametrize("K,M,N", SHAPES)
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 0.75)])
def test_weight_gradient_product_within_float32_rounding(path, threads, K, M, N, alpha, beta):
    """Gemm(transA=1): Y = alpha A^T B + beta C, A (K, M), B (K, N), C (M, N)."""
    rng = np.random.default_rng(K + M)
    a = rng.standard_normal((K, M), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = rng.standard_normal((M, N), dtype=np.float32)
    inputs = {"a": a, "b": b, "c": c} if beta else {"a": a, "b": b}
    graph = ai.load_onnx(make_model("Gemm", inputs, {"transA": 1, "alpha": alpha,
                                                     "beta": beta}))._g
    ai.set_num_threads(1)
    y = graph.forward([ai.Tensor(v) for v in inputs.values()])[0].numpy()
    a64, b64, c64 = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)
    ref = alpha * a64.T @ b64 + beta * c64
    bound = _gamma(K + 2) * (abs(alpha) * np.abs(a64).T @ np.abs(b64) + abs(beta) * np.abs(c64))
    _within_rounding(y, ref, bound, f"{'kernel' if path else 'library'} {M}x{N}x{K}")


@pytest.mark.parametrize("K,M,N", [(580, 384, 1536), (1300, 133, 300), (1024, 256, 1024)])
def test_weight_gradient_product_same_bits_at_any_thread_count(threads, K, M, N):
    """Column panels (N > M) on 2 and 3 threads."""
    wide = _C._set_avx512(True)
    if not wide:
        pytest.skip("no AVX-512 kernel on this CPU or build: the library's sums may "
                    "depend on the panel")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((K, M), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    graph = ai.load_onnx(make_model("Gemm", {"a": a, "b": b}, {"transA": 1}))._g
    outs = []
    for n in (1, 2, 3):
        ai.set_num_threads(n)
        outs.append(graph.forward([ai.Tensor(a), ai.Tensor(b)])[0].numpy().copy())
    for n, o in zip((2, 3), outs[1:]):
        np.testing.assert_array_equal(o, outs[0], err_msg=f"{n} threads against 1")


def test_linear_weight_gradient_through_wrap(path, threads):
    """nn.Linear(1536, 384) on (4, 145, 1536) (a ViT-384's fc2): its weight
    gradient dY^T X (384 x 1536 over 580 rows), against float64; the same
    bits at 1, 2 and 3 threads where the kernel runs."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(1536, 384)
    x = torch.randn(4, 145, 1536)
    gy = torch.randn(4, 145, 384)
    am = ai.wrap(lin, (x,))
    grads = []
    for n in (1, 2, 3):
        ai.set_num_threads(n)
        for p in am.parameters():
            p.grad = None
        am(x).backward(gy)
        grads.append(dict(am.named_parameters())["weight"].grad.numpy().copy())
    x64, g64 = x.double().reshape(-1, 1536).numpy(), gy.double().reshape(-1, 384).numpy()
    bound = _gamma(580 + 2) * np.abs(g64).T @ np.abs(x64)
    _within_rounding(grads[0], g64.T @ x64, bound, "weight gradient")
    if path:
        for n, g in zip((2, 3), grads[1:]):
            np.testing.assert_array_equal(g, grads[0], err_msg=f"{n} threads against 1")
