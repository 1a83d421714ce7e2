"""Matrix products (matmul.c) and normalisations (norm.c) against torch:
Gemm, MatMul, BatchNormalization (eval and training, with the running
statistics), LayerNormalization, InstanceNormalization, Softmax, LogSoftmax."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aidge_interop
from op_harness import check_op, check_wrapped_step, make_model

DTYPES = [np.float32, np.float64]
DT_IDS = lambda d: np.dtype(d).name  # noqa: E731


def _x(shape, dtype, seed=0, lo=-2, hi=2):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def fd_check(model, inputs, *, training=False, kinds=None, eps=1e-6, tol=1e-6):
    """Engine input gradients against central finite differences (float64):
    the scalar is sum(output_k * g_k) over every output with random g_k."""
    g = aidge_interop.load_onnx(model, param_kinds=kinds)
    g.training = training
    arrays = [np.array(a, dtype=np.float64) for a in inputs.values()]
    outs = g.forward(arrays, need_backward=True, input_grads=True)
    rng = np.random.default_rng(7)
    gos = [rng.standard_normal(o.shape) for o in outs]
    grads = g.backward(gos)

    def objective():
        return sum(float(np.sum(o * go)) for o, go in zip(g.forward(arrays), gos))

    for name, a, grad in zip(inputs, arrays, grads):
        num = np.zeros_like(a)
        flat, nflat = a.reshape(-1), num.reshape(-1)
        for i in range(flat.size):
            keep = flat[i]
            flat[i] = keep + eps
            up = objective()
            flat[i] = keep - eps
            down = objective()
            flat[i] = keep
            nflat[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grad, num, rtol=tol, atol=tol, err_msg=f"grad of '{name}'")


# ---------------------------------------------------------------- Gemm

M, K, N = 3, 4, 5
C_SHAPES = [None, (), (1,), (N,), (1, N), (M, 1), (1, 1), (M, N)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("c_shape", C_SHAPES, ids=str)
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, -1.5), (2.0, 0.0)], ids=str)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)], ids=str)
def test_gemm(ta, tb, alpha, beta, c_shape, dtype):
    a = _x((K, M) if ta else (M, K), dtype, 1)
    b = _x((N, K) if tb else (K, N), dtype, 2)
    inputs = {"a": a, "b": b}
    if c_shape is not None:
        inputs["c"] = _x(c_shape, dtype, 3)

    def ref(a, b, c=None):
        y = alpha * ((a.T if ta else a) @ (b.T if tb else b))
        return y if c is None else y + beta * c

    check_op("Gemm", inputs, ref, attrs={"transA": ta, "transB": tb, "alpha": alpha,
                                         "beta": beta})


# (16, 600, 20), (9, 257, 20) and (1, 300, 14) take the skinny kernel (gemm.c: m <= 16,
# k >= 64, n k >= 4096), with a column tail, across its K chunks of 256; (1, 9, 20) and
# (1, 70, 5) the library's matrix-vector product (one row of C)
@pytest.mark.parametrize("m,k,n", [(16, 37, 128), (19, 64, 50), (5, 3, 26), (33, 17, 40),
                                   (40, 70, 30), (16, 600, 20), (9, 257, 20), (1, 300, 14),
                                   (1, 9, 20), (1, 70, 5)],
                         ids=str)
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, -1.5), (2.0, 0.0)], ids=str)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)], ids=str)
def test_gemm_float32_register_tiles(ta, tb, alpha, beta, m, k, n):
    """float32 at sizes past the GEMM library's register tiles, with edges
    along every dimension (rows, columns, a K that is not a multiple of 8),
    forward and the gradients, against torch."""
    a = _x((k, m) if ta else (m, k), np.float32, 1)
    b = _x((n, k) if tb else (k, n), np.float32, 2)
    c = _x((m, n), np.float32, 3)

    def ref(a, b, c):
        return alpha * ((a.T if ta else a) @ (b.T if tb else b)) + beta * c

    check_op("Gemm", {"a": a, "b": b, "c": c}, ref,
             attrs={"transA": ta, "transB": tb, "alpha": alpha, "beta": beta})


@pytest.mark.parametrize("wide", [True, False], ids=["avx512", "library"])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 0.0)], ids=str)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0)], ids=str)
def test_gemm_float32_avx512_tiles(avx512, wide, ta, tb, alpha, beta):
    """float32 at sizes that take gemm_tiles.c's kernel (op(A) = A; M, N, K
    >= 128) with AVX-512, the GEMM library without: a last tile of 4 rows
    (130), a partial panel and a second block of columns (300), two chunks of
    K (700), forward and the gradients (their products transposed or not),
    against torch."""
    from aidge_interop import _C

    assert _C._set_avx512(wide) is wide
    m, k, n = 130, 700, 300
    a = _x((k, m) if ta else (m, k), np.float32, 1)
    b = _x((n, k) if tb else (k, n), np.float32, 2)
    c = _x((m, n), np.float32, 3)

    def ref(a, b, c):
        return alpha * ((a.T if ta else a) @ (b.T if tb else b)) + beta * c

    check_op("Gemm", {"a": a, "b": b, "c": c}, ref,
             attrs={"transA": ta, "transB": tb, "alpha": alpha, "beta": beta})


def test_gemm_defaults_and_odd_sizes():
    a, b, c = _x((7, 1), np.float64, 1), _x((1, 9), np.float64, 2), _x((9,), np.float64, 3)
    check_op("Gemm", {"a": a, "b": b, "c": c}, lambda a, b, c: a @ b + c)


def test_gemm_empty_inner_dimension():
    a, b, c = np.zeros((3, 0)), np.zeros((0, 2)), _x((3, 2), np.float64)
    check_op("Gemm", {"a": a, "b": b, "c": c}, lambda a, b, c: a @ b + 2 * c,
             attrs={"beta": 2.0})


def test_gemm_finite_differences():
    a, b, c = _x((4, 3), np.float64, 1), _x((5, 4), np.float64, 2), _x((3, 1), np.float64, 3)
    model = make_model("Gemm", {"a": a, "b": b, "c": c},
                       {"transA": 1, "transB": 1, "alpha": 0.7, "beta": 1.3})
    fd_check(model, {"a": a, "b": b, "c": c})


def test_gemm_errors():
    with pytest.raises(ValueError, match="Gemm node.*inner dimensions"):
        check_op("Gemm", {"a": np.ones((2, 3)), "b": np.ones((4, 5))}, None)
    with pytest.raises(ValueError, match="Gemm node.*C"):
        check_op("Gemm", {"a": np.ones((2, 3)), "b": np.ones((3, 5)), "c": np.ones((2,))},
                 None)
    with pytest.raises(TypeError, match="Gemm node"):
        check_op("Gemm", {"a": np.ones((2, 3), np.int64), "b": np.ones((3, 5), np.int64)},
                 None)


# ---------------------------------------------------------------- MatMul

MATMUL_SHAPES = [
    ((4,), (4,)), ((4,), (4, 5)), ((3, 4), (4,)), ((3, 4), (4, 5)), ((1, 1), (1, 1)),
    ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)), ((1, 3, 4), (2, 1, 4, 5)), ((4,), (2, 3, 4, 5)),
    ((2, 3, 4), (4,)), ((2, 3, 4), (1, 1, 4, 5)), ((3, 1, 2, 7), (1, 4, 7, 3)),
    ((2, 0, 4), (4, 3)), ((3, 0), (0, 5)), ((0, 3, 4), (4, 2)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=str)
def test_matmul(sa, sb, dtype):
    check_op("MatMul", {"a": _x(sa, dtype, 1), "b": _x(sb, dtype, 2)}, torch.matmul)


def test_matmul_long_reduction_float32():
    a, b = _x((8, 4096), np.float32, 1), _x((4096, 3), np.float32, 2)
    check_op("MatMul", {"a": a, "b": b}, torch.matmul)


@pytest.mark.parametrize("sa,sb", [((2, 1, 3, 2), (3, 2, 4)), ((3,), (2, 3, 2)),
                                   ((2, 3, 2), (2,))], ids=str)
def test_matmul_finite_differences(sa, sb):
    a, b = _x(sa, np.float64, 1), _x(sb, np.float64, 2)
    fd_check(make_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b})


def test_matmul_errors():
    with pytest.raises(ValueError, match="MatMul node.*inner dimensions"):
        check_op("MatMul", {"a": np.ones((2, 3)), "b": np.ones((4, 5))}, None)
    with pytest.raises(ValueError, match="MatMul node.*broadcast"):
        check_op("MatMul", {"a": np.ones((2, 2, 3)), "b": np.ones((3, 3, 5))}, None)


# ---------------------------------------------------------------- BatchNormalization

# (16, 37): X (N, C) takes the row kernels (S = 1) through their vector body and tail
BN_SHAPES = [(4, 3), (3, 2, 7), (2, 3, 4, 5), (2, 2, 3, 2, 3), (1, 3, 1, 1), (16, 37)]


def _bn_stats(c, dtype, seed=5):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, c).astype(dtype), rng.uniform(0.5, 2, c).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
@pytest.mark.parametrize("eps", [1e-5, 0.1])
def test_batchnorm_eval(shape, eps, dtype):
    c = shape[1]
    x, scale, bias = _x(shape, dtype, 1), _x((c,), dtype, 2), _x((c,), dtype, 3)
    mean, var = _bn_stats(c, dtype)
    check_op("BatchNormalization", {"x": x, "scale": scale, "bias": bias},
             lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, training=False, eps=eps),
             attrs={"epsilon": eps}, consts={"mean": mean, "var": var})


def test_batchnorm_eval_outputs_running_stats():
    x, scale, bias = _x((2, 3, 4), np.float64, 1), _x((3,), np.float64, 2), _x((3,), np.float64, 3)
    mean, var = _bn_stats(3, np.float64)
    check_op("BatchNormalization", {"x": x, "scale": scale, "bias": bias},
             # the statistics outputs carry no gradient: 0 * x keeps autograd happy
             lambda x, s, b, m, v: (F.batch_norm(x, m, v, s, b), m + 0 * x.sum(),
                                    v + 0 * x.sum()),
             consts={"mean": mean, "var": var}, n_outputs=3, opset=15)


def _bn_train_case(shape, dtype, momentum, eps, steps, n_outputs):
    """Engine vs torch over `steps` training forwards and backwards: outputs,
    gradients of X, scale, B and the running statistics after each step."""
    c = shape[1]
    scale, bias = _x((c,), dtype, 2), _x((c,), dtype, 3)
    mean, var = _bn_stats(c, dtype)
    attrs = {"epsilon": eps}
    if momentum is not None:
        attrs["momentum"] = momentum
    model = make_model("BatchNormalization", {"x": _x(shape, dtype)}, attrs,
                       {"scale": scale, "bias": bias, "mean": mean, "var": var},
                       n_outputs=n_outputs, opset=15)
    g = aidge_interop.load_onnx(model, param_kinds={"mean": "buffer", "var": "buffer"})
    g.training = True
    t_w = torch.tensor(scale, requires_grad=True)
    t_b = torch.tensor(bias, requires_grad=True)
    t_rm, t_rv = torch.tensor(mean), torch.tensor(var)
    torch_momentum = 1 - (0.9 if momentum is None else momentum)
    rt, at = (1e-4, 1e-5) if dtype == np.float32 else (1e-10, 1e-12)
    for step in range(steps):
        x = _x(shape, dtype, 10 + step, -3, 5)
        outs = g.forward([x], need_backward=True, input_grads=True)
        t_x = torch.tensor(x, requires_grad=True)
        y = F.batch_norm(t_x, t_rm, t_rv, t_w, t_b, training=True, momentum=torch_momentum,
                         eps=eps)
        np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=rt, atol=at * 3)
        gy = np.random.default_rng(step).standard_normal(shape).astype(dtype)
        g.zero_grad()
        (gx,) = g.backward([gy] + [None] * (n_outputs - 1))
        t_w.grad = t_b.grad = None
        y.backward(torch.tensor(gy))
        scale_g = max(1.0, float(np.abs(gy).sum() / c))
        np.testing.assert_allclose(gx, t_x.grad.numpy(), rtol=rt, atol=at * 10,
                                   err_msg=f"grad X, step {step}")
        grads = g.grads()
        np.testing.assert_allclose(grads["scale"], t_w.grad.numpy(), rtol=rt,
                                   atol=at * scale_g, err_msg=f"grad scale, step {step}")
        np.testing.assert_allclose(grads["bias"], t_b.grad.numpy(), rtol=rt,
                                   atol=at * scale_g, err_msg=f"grad B, step {step}")
        bufs = g.buffers()
        np.testing.assert_allclose(bufs["mean"], t_rm.numpy(), rtol=rt, atol=at,
                                   err_msg=f"running mean, step {step}")
        np.testing.assert_allclose(bufs["var"], t_rv.numpy(), rtol=rt, atol=at,
                                   err_msg=f"running var, step {step}")
        if n_outputs == 3:
            np.testing.assert_array_equal(outs[1], bufs["mean"])
            np.testing.assert_array_equal(outs[2], bufs["var"])
    return g


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
# planes under 128 values (per-position sums over groups of 16 planes: 1, 3 groups,
# the last partial), of 128 and 561 values (blocked sums: 32-lane body, chunks of 8,
# last terms, second block)
@pytest.mark.parametrize("shape", BN_SHAPES[:4] + [(2, 3, 1), (16, 37), (2, 3, 25, 5),
                                                   (37, 4, 3, 3), (18, 2, 127), (3, 2, 128),
                                                   (2, 2, 33, 17)], ids=str)
@pytest.mark.parametrize("momentum,eps", [(None, 1e-5), (0.7, 1e-3), (0.0, 1e-5)], ids=str)
def test_batchnorm_training(shape, momentum, eps, dtype):
    _bn_train_case(shape, dtype, momentum, eps, steps=2, n_outputs=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_batchnorm_training_outputs_updated_stats(dtype):
    _bn_train_case((4, 3, 5), dtype, 0.8, 1e-5, steps=2, n_outputs=3)


def test_batchnorm_training_mode_attribute_uses_batch_statistics():
    # training_mode=1 asks for batch statistics even when the graph is in eval
    x = _x((4, 2, 3), np.float64)
    scale, bias = _x((2,), np.float64, 2), _x((2,), np.float64, 3)
    mean, var = _bn_stats(2, np.float64)
    model = make_model("BatchNormalization", {"x": x}, {"training_mode": 1},
                       {"scale": scale, "bias": bias, "mean": mean, "var": var})
    g = aidge_interop.load_onnx(model, param_kinds={"mean": "buffer", "var": "buffer"})
    (y,) = g.forward([x])
    rm, rv = torch.tensor(mean), torch.tensor(var)
    ref = F.batch_norm(torch.tensor(x), rm, rv, torch.tensor(scale), torch.tensor(bias),
                       training=True, momentum=0.1)
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.buffers()["mean"], rm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.buffers()["var"], rv.numpy(), rtol=1e-12)


@pytest.mark.parametrize("shape", [(16, 3, 8, 8), (2, 3, 33, 17)], ids=str)
def test_batchnorm_training_large_mean_float32(shape):
    # float64 statistics: a large offset does not spoil the variance
    x = (_x(shape, np.float32) + 1000).astype(np.float32)
    # the reference runs in float64: torch's own float32 statistics lose digits
    # to the offset, the engine's (accumulated in double) do not
    check_op("BatchNormalization", {"x": x},
             lambda x, s, b, m, v: F.batch_norm(x.double(), m.double(), v.double(), s.double(),
                                                b.double(), training=True).float(),
             consts={"scale": np.ones(3, np.float32), "bias": np.zeros(3, np.float32),
                     "mean": np.zeros(3, np.float32), "var": np.ones(3, np.float32)},
             training=True)


ULP32 = 2.0 ** -23  # one float32 ulp, relative: where rounding, not the formula, decides


# Issue 44: at batch 2 on 1x1 maps (MobileNetV2's last layers) the batch variance
# falls to 1e-8 against eps 1e-3. Error against torch float64, relative to the
# largest value, of (y, dx, dscale, dbias) here, torch 2.13 CPU:
#   (2, 64, 1, 1), offset 0: torch f32 5.6e-8 8.9e-8 7.8e-8 3.4e-8, engine 5.1e-8 2.9e-8 3.1e-8 3.4e-8
#   (2, 64, 1, 1), offset 1: torch f32 2.2e-6 8.9e-8 1.4e-3 3.4e-8, engine 4.8e-8 2.8e-8 2.6e-8 3.4e-8
#   (2, 64, 2, 2), offset 1: torch f32 2.9e-6 6.8e-8 4.5e-4 7.0e-8, engine 4.5e-8 7.3e-8 6.1e-8 6.2e-8
# torch normalises as x a + (bias - mean a) in float32, and its dscale sums
# dy (x - mean) about the mean rounded to float32: both lose digits when
# |mean| >> std. The engine centres x first and corrects for the mean's
# rounding (statistics and sums in double): its errors stay at one float32
# rounding, where either may be ahead (dx at 2x2: 7.3e-8 against 6.8e-8).
@pytest.mark.parametrize("shape,offset", [((2, 64, 1, 1), 0.0), ((2, 64, 1, 1), 1.0),
                                          ((2, 64, 2, 2), 1.0)], ids=str)
def test_batchnorm_training_tiny_variance_float32(shape, offset):
    rng = np.random.default_rng(3)
    c = shape[1]
    x = (offset * rng.standard_normal((1, c, 1, 1)) + 1e-4 * rng.standard_normal(shape))
    x = x.astype(np.float32)
    scale, bias = (rng.standard_normal(c).astype(np.float32) for _ in range(2))
    gy = rng.standard_normal(shape).astype(np.float32)
    mean, var = np.zeros(c, np.float32), np.ones(c, np.float32)
    model = make_model("BatchNormalization", {"x": x}, {"epsilon": 1e-3},
                       {"scale": scale, "bias": bias, "mean": mean, "var": var})
    g = aidge_interop.load_onnx(model, param_kinds={"mean": "buffer", "var": "buffer"})
    g.training = True
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    (gx,) = g.backward([gy])
    engine = [y, gx, g.grads()["scale"], g.grads()["bias"]]

    def torch_step(dtype):
        t = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in (x, scale, bias)]
        out = F.batch_norm(t[0], torch.tensor(mean, dtype=dtype), torch.tensor(var, dtype=dtype),
                           t[1], t[2], training=True, eps=1e-3)
        out.backward(torch.tensor(gy, dtype=dtype))
        return [v.detach().double().numpy() for v in (out, t[0].grad, t[1].grad, t[2].grad)]

    ref, t32 = torch_step(torch.float64), torch_step(torch.float32)
    for name, e, t, r in zip(["y", "dx", "dscale", "dbias"], engine, t32, ref):
        scale_r = np.abs(r).max()
        err_e = np.abs(e.astype(np.float64) - r).max() / scale_r
        err_t = np.abs(t - r).max() / scale_r
        assert err_e <= max(err_t, ULP32), \
            f"{name}: engine {err_e:.1e} from float64, torch float32 {err_t:.1e}"


def test_batchnorm_training_finite_differences():
    x, scale, bias = _x((3, 2, 4), np.float64, 1), _x((2,), np.float64, 2), _x((2,), np.float64, 3)
    mean, var = _bn_stats(2, np.float64)
    model = make_model("BatchNormalization", {"x": x, "scale": scale, "bias": bias},
                       {"epsilon": 1e-3}, {"mean": mean, "var": var})
    fd_check(model, {"x": x, "scale": scale, "bias": bias}, training=True,
             kinds={"mean": "buffer", "var": "buffer"})


def test_batchnorm_errors():
    x = np.ones((1, 2))
    consts = {"s": np.ones(2), "b": np.zeros(2), "m": np.zeros(2), "v": np.ones(2)}
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        check_op("BatchNormalization", {"x": x}, None, consts=consts, training=True)
    consts["m"] = np.zeros(3)
    with pytest.raises(ValueError, match="input_mean must have shape"):
        check_op("BatchNormalization", {"x": np.ones((2, 2))}, None, consts=consts)


# ---------------------------------------------------------------- LayerNormalization


def _ln_ref(axis, eps, stats=False, stash=torch.float32):
    def fn(x, scale, bias=None):
        a = axis % x.dim()
        y = F.layer_norm(x, x.shape[a:], scale, bias, eps)
        if not stats:
            return y
        dims = tuple(range(a, x.dim()))
        xd = x.double()  # the engine computes statistics in double
        mean = xd.mean(dims, keepdim=True)
        invstd = torch.rsqrt(xd.var(dims, unbiased=False, keepdim=True) + eps)
        return y, mean.to(stash), invstd.to(stash)
    return fn


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((2, 3, 5), -1), ((2, 3, 5), 1),
                                        ((2, 3, 5), -2), ((2, 3, 5), 0), ((3, 2, 2, 3), 2),
                                        ((6,), 0)], ids=str)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_layernorm(shape, axis, with_bias, dtype):
    a = axis % len(shape)
    inputs = {"x": _x(shape, dtype, 1), "scale": _x(shape[a:], dtype, 2)}
    if with_bias:
        inputs["bias"] = _x(shape[a:], dtype, 3)
    check_op("LayerNormalization", inputs, _ln_ref(axis, 1e-5), attrs={"axis": axis},
             opset=17)


@pytest.mark.parametrize("dtype,stash", [(np.float32, 1), (np.float64, 1), (np.float64, 11),
                                         (np.float32, 11)], ids=str)
def test_layernorm_mean_invstd_outputs(dtype, stash):
    shape = (3, 4, 5)
    inputs = {"x": _x(shape, dtype, 1), "scale": _x((5,), dtype, 2), "bias": _x((5,), dtype, 3)}
    t_stash = torch.float32 if stash == 1 else torch.float64
    outs = check_op("LayerNormalization", inputs, _ln_ref(-1, 1e-3, True, t_stash),
                    attrs={"epsilon": 1e-3, "stash_type": stash}, n_outputs=3, opset=17)
    stash_dtype = np.float32 if stash == 1 else np.float64
    assert outs[1].dtype == outs[2].dtype == stash_dtype
    assert outs[1].shape == outs[2].shape == (3, 4, 1)


def test_layernorm_large_offset_float32():
    x = (_x((4, 256), np.float32) + 500).astype(np.float32)
    # the reference runs in float64: torch's float32 statistics lose digits to
    # the offset, the engine's (accumulated in double) do not
    ref = _ln_ref(-1, 1e-5)
    check_op("LayerNormalization", {"x": x, "scale": np.ones(256, np.float32)},
             lambda x, s: ref(x.double(), s.double()).float(), opset=17)


def test_layernorm_finite_differences():
    x, s, b = _x((2, 3, 4), np.float64, 1), _x((3, 4), np.float64, 2), _x((3, 4), np.float64, 3)
    model = make_model("LayerNormalization", {"x": x, "s": s, "b": b},
                       {"axis": 1, "epsilon": 1e-2, "stash_type": 11}, n_outputs=3, opset=17)
    fd_check(model, {"x": x, "s": s, "b": b})


def test_layernorm_errors():
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match="Scale must have the shape"):
        check_op("LayerNormalization", {"x": x, "s": np.ones(2)}, None, opset=17)
    with pytest.raises(NotImplementedError, match="stash_type"):
        check_op("LayerNormalization", {"x": x, "s": np.ones(3)}, None,
                 attrs={"stash_type": 10}, opset=17)


# ---------------------------------------------------------------- InstanceNormalization


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5), (1, 4, 2, 3, 3), (3, 2, 1, 2)],
                         ids=str)
@pytest.mark.parametrize("eps", [1e-5, 0.1])
def test_instancenorm(shape, eps, dtype):
    c = shape[1]
    x, s, b = _x(shape, dtype, 1), _x((c,), dtype, 2), _x((c,), dtype, 3)
    check_op("InstanceNormalization", {"x": x, "s": s, "b": b},
             lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=eps),
             attrs={"epsilon": eps})


def test_instancenorm_large_offset_float32():
    x = (_x((2, 3, 16, 16), np.float32) + 500).astype(np.float32)
    s, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    # float64 reference: the engine's statistics accumulate in double
    check_op("InstanceNormalization", {"x": x, "s": s, "b": b},
             lambda x, s, b: F.instance_norm(x.double(), weight=s.double(),
                                             bias=b.double()).float())


@pytest.mark.parametrize("module", ["GroupNorm", "InstanceNorm2d"])
def test_group_and_instance_norm_modules_wrapped(module):
    """torch's GroupNorm exports as Reshape, InstanceNormalization (scale 1,
    bias 0 per group), Reshape, Mul, Add; InstanceNorm2d with affine weights."""
    torch.manual_seed(0)
    norm = torch.nn.GroupNorm(2, 6) if module == "GroupNorm" else \
        torch.nn.InstanceNorm2d(6, affine=True)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), norm, torch.nn.ReLU())
    with torch.no_grad():  # parameters away from their initial ones and zeros
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    wrapped = aidge_interop.wrap(model, [(2, 3, 7, 6)])
    check_wrapped_step(model, wrapped, torch.randn(4, 3, 7, 6))


def test_instancenorm_finite_differences():
    x, s, b = _x((2, 3, 4, 2), np.float64, 1), _x((3,), np.float64, 2), _x((3,), np.float64, 3)
    model = make_model("InstanceNormalization", {"x": x, "s": s, "b": b}, {"epsilon": 1e-2})
    fd_check(model, {"x": x, "s": s, "b": b})


def test_instancenorm_errors():
    x = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match="scale must have shape"):
        check_op("InstanceNormalization", {"x": x, "s": np.ones(2), "b": np.ones(3)}, None)
    with pytest.raises(ValueError, match="rank >= 3"):
        check_op("InstanceNormalization", {"x": np.ones((2, 3)), "s": np.ones(3),
                                           "b": np.ones(3)}, None)


# ---------------------------------------------------------------- Softmax, LogSoftmax

SOFTMAX = {"Softmax": torch.softmax, "LogSoftmax": torch.log_softmax}


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axis", [((5,), -1), ((3, 7), -1), ((3, 7), 0),
                                        ((2, 3, 4), 1), ((2, 3, 4), -3), ((2, 3, 4, 5), 2),
                                        ((2, 1, 4), 1)], ids=str)
@pytest.mark.parametrize("op", list(SOFTMAX))
def test_softmax(op, shape, axis, dtype):
    check_op(op, {"x": _x(shape, dtype, 1, -5, 5)}, lambda x: SOFTMAX[op](x, axis),
             attrs={"axis": axis}, opset=13)


@pytest.mark.parametrize("op", list(SOFTMAX))
def test_softmax_default_axis(op):
    check_op(op, {"x": _x((2, 3, 4), np.float32)}, lambda x: SOFTMAX[op](x, -1), opset=13)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axis", [((2, 3, 4), 1), ((2, 3, 4), 0), ((2, 3, 4), 2),
                                        ((2, 3, 4), -2), ((3, 5), None)], ids=str)
@pytest.mark.parametrize("op", list(SOFTMAX))
def test_softmax_opset11_coerces_to_2d(op, shape, axis, dtype):
    a = 1 if axis is None else axis % len(shape)
    outer = int(np.prod(shape[:a]))

    def ref(x):
        return SOFTMAX[op](x.reshape(outer, -1), 1).reshape(shape)

    check_op(op, {"x": _x(shape, dtype, 1, -5, 5)}, ref,
             attrs={} if axis is None else {"axis": axis}, opset=11)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("op", list(SOFTMAX))
def test_softmax_large_values_are_stable(op, dtype):
    x = _x((3, 6), dtype, 1, -1000, 1000)
    check_op(op, {"x": x}, lambda x: SOFTMAX[op](x, -1))


@pytest.mark.parametrize("op", list(SOFTMAX))
def test_softmax_finite_differences(op):
    x = _x((2, 3, 4), np.float64, 1)
    fd_check(make_model(op, {"x": x}, {"axis": 1}, opset=13), {"x": x})


# ---------------------------------------------------------------- Hardmax, LpNormalization

def _hardmax(x, axis):
    return F.one_hot(torch.argmax(x, axis), x.shape[axis]).movedim(-1, axis).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axis", [((5,), -1), ((3, 7), 0), ((2, 3, 4), 1),
                                        ((2, 3, 4), -1)], ids=str)
def test_hardmax(shape, axis, dtype):
    # integer values: ties, where the first largest wins (torch.argmax)
    x = np.random.default_rng(0).integers(0, 3, shape).astype(dtype)
    check_op("Hardmax", {"x": x}, lambda x: _hardmax(x, axis), attrs={"axis": axis},
             opset=13, grad=False)


@pytest.mark.parametrize("axis", [None, 0, 2])
def test_hardmax_opset11_coerces_to_2d(axis):
    shape = (2, 3, 4)
    a = 1 if axis is None else axis
    outer = int(np.prod(shape[:a]))
    check_op("Hardmax", {"x": _x(shape, np.float32)},
             lambda x: _hardmax(x.reshape(outer, -1), 1).reshape(shape),
             attrs={} if axis is None else {"axis": axis}, opset=11, grad=False)


def test_hardmax_nan_is_the_largest():
    x = np.array([[1, np.nan, 3], [2, 5, np.nan]], np.float32)
    check_op("Hardmax", {"x": x}, lambda x: _hardmax(x, 1), attrs={"axis": 1}, opset=13,
             grad=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape,axis", [((3, 7), -1), ((3, 7), 0), ((2, 3, 4), 1)], ids=str)
def test_lp_normalization(shape, axis, p, dtype):
    check_op("LpNormalization", {"x": _x(shape, dtype, 1)},
             lambda x: F.normalize(x, p, axis, eps=0), attrs={"axis": axis, "p": p}, opset=1)


def test_lp_normalization_default_is_l2_on_the_last_axis():
    check_op("LpNormalization", {"x": _x((2, 3, 4), np.float64, 1)},
             lambda x: F.normalize(x, 2, -1, eps=0), opset=22)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_zero_norm(p):
    """A zero row gives 0 (ONNX), and a zero gradient; the other rows are
    torch's."""
    x = _x((3, 4), np.float64, 1)
    x[1] = 0
    g = aidge_interop.load_onnx(make_model("LpNormalization", {"x": x}, {"p": p}, opset=1))
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    dy = np.random.default_rng(2).standard_normal(y.shape)
    (gx,) = g.backward([dy])
    t = torch.tensor(x[[0, 2]], requires_grad=True)
    ref = F.normalize(t, p, -1, eps=0)
    ref.backward(torch.tensor(dy[[0, 2]]))
    np.testing.assert_allclose(y[[0, 2]], ref.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(gx[[0, 2]], t.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(y[1], 0)
    np.testing.assert_array_equal(gx[1], 0)


def test_lp_normalization_bad_p():
    with pytest.raises(ValueError, match="LpNormalization node.*p = 3; 1 or 2 expected"):
        check_op("LpNormalization", {"x": _x((2, 3), np.float32)}, None, attrs={"p": 3},
                 opset=1, grad=False)


# ---------------------------------------------------------------- MeanVarianceNormalization

def _mvn(x, axes):
    mean = x.mean(axes, keepdim=True)
    return (x - mean) / (x.var(axes, unbiased=False, keepdim=True).sqrt() + 1e-9)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axes", [((2, 3, 4, 5), None), ((2, 3, 4, 5), [1]),
                                        ((3, 4, 5), [0, 2]), ((3, 4), [-1]),
                                        ((2, 3, 4), [0, 1, 2])], ids=str)
def test_mean_variance_normalization(shape, axes, dtype):
    check_op("MeanVarianceNormalization", {"x": _x(shape, dtype, 1)},
             lambda x: _mvn(x, [0, 2, 3] if axes is None else axes),
             attrs={} if axes is None else {"axes": axes}, opset=13)


def test_mean_variance_normalization_constant_group():
    """A group of equal values gives 0 and the mean's part of the gradient
    (its variance's part is 0 there; torch's sqrt would give NaN)."""
    x = _x((3, 4), np.float64, 1)
    x[1] = 0.5
    g = aidge_interop.load_onnx(make_model("MeanVarianceNormalization", {"x": x},
                                           {"axes": [1]}, opset=13))
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    dy = np.random.default_rng(2).standard_normal(y.shape)
    (gx,) = g.backward([dy])
    np.testing.assert_array_equal(y[1], 0)
    np.testing.assert_allclose(gx[1], (dy[1] - dy[1].mean()) / 1e-9, rtol=1e-12)
    t = torch.tensor(x[[0, 2]], requires_grad=True)
    _mvn(t, [1]).backward(torch.tensor(dy[[0, 2]]))
    np.testing.assert_allclose(gx[[0, 2]], t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_mean_variance_normalization_bad_axes():
    with pytest.raises(ValueError, match="MeanVarianceNormalization node.*axis 1 appears twice"):
        check_op("MeanVarianceNormalization", {"x": _x((2, 3), np.float32)}, None,
                 attrs={"axes": [1, -1]}, opset=13, grad=False)
    with pytest.raises(ValueError, match="MeanVarianceNormalization node"):
        check_op("MeanVarianceNormalization", {"x": _x((2, 3), np.float32)}, None,
                 opset=13, grad=False)  # the default axes 0, 2, 3 need rank 4
