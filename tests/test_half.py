"""float16 and bfloat16 end to end: the engine against torch's CPU results at
the same dtype, forward and backward.

The engine computes a node in float32 and rounds each output once (plan.c,
"half precision"), the rule of torch's CPU kernels: both sides then differ
by the float32 summation orders, within the tolerances torch's own tests use
for these dtypes (torch.testing._comparison: float16 rtol 1e-3, bfloat16
rtol 1.6e-2, atol 1e-5 for both).
"""
import copy

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import aidge_interop
from aidge_interop import Tensor, aidge_tensor_to_torch, torch_tensor_to_aidge
from aidge_interop.onnx.backend import AidgeBackend

HALF = [torch.float16, torch.bfloat16]
TOL = {torch.float16: dict(rtol=1e-3, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5)}


def _close(actual, expected, dtype, what):
    assert actual.dtype == dtype, f"{what}: {actual.dtype}, {dtype} expected"
    torch.testing.assert_close(actual, expected, **TOL[dtype], msg=lambda m: f"{what}: {m}")


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _as_accurate(actual, expected, exact, dtype, what):
    """`actual` as close to the float64 result `exact` as torch's `expected`
    is, within the dtype's tolerance: the largest and the mean deviation."""
    assert actual.dtype == dtype, f"{what}: {actual.dtype}, {dtype} expected"
    exact = exact.double()
    ours, theirs = (actual.double() - exact).abs(), (expected.double() - exact).abs()
    tol = TOL[dtype]["atol"] + TOL[dtype]["rtol"] * exact.abs()
    for stat in (torch.amax, torch.mean):
        assert stat(ours) <= stat(theirs) + stat(tol), (
            f"{what}: {stat.__name__} deviation from float64 {stat(ours).item():.3g}, torch's "
            f"{stat(theirs).item():.3g} (+ {stat(tol).item():.3g} allowed)")


def _check(module, inputs, dtype):
    """Forward and backward of `module` (already in `dtype`) wrapped in the
    engine against torch, for the float inputs and every parameter.

    The forward against torch's result at torch's tolerance. A gradient is
    a sum of rounded terms (over several paths of a model; in torch, also
    within one backward kernel: Conv's, MaxPool's with overlapping windows
    and layer_norm's round partial results to half), so where terms cancel a
    half gradient carries an error relative to the terms, not to itself:
    two results rounded in another order then differ by more than the
    tolerance, and torch's is off the exact result by as much (layer_norm's
    input gradient in float16: 2e-3, the engine's 1e-3). Each gradient is
    held to be, as a whole, as close as torch's to the same computation in
    float64 on the same half values (largest and mean deviation), within
    the tolerance."""
    gen = torch.Generator().manual_seed(3)
    ref_in = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ours_in = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    exact_in = [x.detach().double().requires_grad_() if x.is_floating_point() else x
                for x in inputs]
    exact_module = copy.deepcopy(module).double()
    wrapped = aidge_interop.wrap(module, tuple(x.detach() for x in inputs))
    expected = module(*ref_in)
    actual = wrapped(*ours_in)
    _close(actual, expected, dtype, "forward")
    dy = torch.randn(expected.shape, generator=gen).to(dtype)
    expected.backward(dy)
    actual.backward(dy)
    exact_module(*exact_in).backward(dy.double())
    grads = [(f"gradient of input {i}", a.grad, e.grad, x.grad)
             for i, (a, e, x) in enumerate(zip(ours_in, ref_in, exact_in)) if e.grad is not None]
    grads += [(f"gradient of {name}", p.grad, q.grad, r.grad) for (name, p), q, r in
              zip(wrapped.named_parameters(), module.parameters(), exact_module.parameters())]
    assert grads
    for what, a, e, x in grads:
        _as_accurate(a, e, x, dtype, what)


def _randn(*shape, dtype, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


# ---------------------------------------------------------------- operators

# one operator each (inputs as the function needs them: positive for log)
ELEMENTWISE = {
    "add": (torch.add, 2), "sub": (torch.sub, 2), "mul": (torch.mul, 2), "div": (torch.div, 2),
    "max": (torch.maximum, 2), "pow": (torch.pow, 2), "sigmoid": (torch.sigmoid, 1),
    "tanh": (torch.tanh, 1), "exp": (torch.exp, 1), "log": (torch.log, 1),
    "sqrt": (torch.sqrt, 1), "gelu": (torch.nn.functional.gelu, 1), "relu": (torch.relu, 1),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise(name, dtype):
    fn, arity = ELEMENTWISE[name]
    xs = [_randn(4, 33, dtype=dtype, seed=i) for i in range(arity)]
    if name in ("div", "pow", "log", "sqrt"):  # positive, away from 0
        xs[-1] = (xs[-1].float().abs() + 0.5).to(dtype)
    if name in ("pow", "log", "sqrt"):
        xs[0] = (xs[0].float().abs() + 0.5).to(dtype)
    _check(Fn(fn), xs, dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_elementwise_composite(dtype):
    """Inputs read by several operators: their gradients are sums."""
    def fn(x, y):
        return (x - y) / (y.abs() + 1) + torch.sigmoid(x) * torch.tanh(y) * x
    _check(Fn(fn), [_randn(4, 33, dtype=dtype), _randn(4, 33, dtype=dtype, seed=1)], dtype)


REDUCTIONS = {
    "sum": lambda x: x.sum(dim=1),
    "mean": lambda x: x.mean(dim=(0, 2), keepdim=True),
    "amax": lambda x: x.amax(dim=-1),
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=1),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (64,)),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_and_normalizations(name, dtype):
    _check(Fn(REDUCTIONS[name]), [_randn(3, 5, 64, dtype=dtype)], dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_matmul(dtype):
    _check(Fn(torch.matmul), [_randn(2, 8, 48, dtype=dtype), _randn(48, 16, dtype=dtype, seed=1)],
           dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", ["conv", "depthwise", "linear", "layernorm"])
def test_layers_with_parameters(kind, dtype):
    torch.manual_seed(0)
    if kind == "conv":
        m, x = torch.nn.Conv2d(3, 8, 3, padding=1), _randn(2, 3, 10, 10, dtype=dtype)
    elif kind == "depthwise":
        m, x = torch.nn.Conv2d(6, 6, 3, stride=2, groups=6), _randn(2, 6, 9, 9, dtype=dtype)
    elif kind == "linear":
        m, x = torch.nn.Linear(40, 12), _randn(5, 40, dtype=dtype)
    else:
        m, x = torch.nn.LayerNorm(32), _randn(4, 7, 32, dtype=dtype)
    _check(m.to(dtype), [x], dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("pool", ["max", "avg", "global"])
def test_pooling(pool, dtype):
    fn = {"max": lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1),
          "avg": lambda x: torch.nn.functional.avg_pool2d(x, 2),
          "global": lambda x: x.mean(dim=(2, 3))}[pool]
    _check(Fn(fn), [_randn(2, 4, 12, 12, dtype=dtype)], dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_movement_ops_keep_the_bytes(dtype):
    """Reshape, Transpose, Concat, Slice, Gather run on the half bytes
    (AI_OP_HALF): exact, and their gradients flow in the half type."""
    def fn(x):
        y = torch.cat([x.transpose(1, 2), x.transpose(1, 2) * 2], dim=1)
        return y.reshape(2, -1)[:, 3:40][:, [0, 5, 5, 7]]
    x = _randn(2, 4, 6, dtype=dtype)
    _check(Fn(fn), [x], dtype)


# ---------------------------------------------------------------- models

class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2)
        self.fc = torch.nn.Linear(16 * 3 * 3, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.GELU(),
                                       torch.nn.Linear(64, 32), torch.nn.Tanh(),
                                       torch.nn.Linear(32, 5))

    def forward(self, x):
        return torch.log_softmax(self.net(x), dim=-1)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("model", [SmallCNN, MLP])
def test_wrap_half_model(model, dtype):
    torch.manual_seed(0)
    m = model().eval()
    m = m.half() if dtype == torch.float16 else m.bfloat16()
    x = _randn(4, 3, 14, 14, dtype=dtype) if model is SmallCNN else _randn(8, 20, dtype=dtype)
    _check(m, [x], dtype)
    # an eval forward without gradients runs the fused graph (Conv + BatchNorm
    # + Relu one node, rounded once): as close as torch to float64
    wrapped = aidge_interop.wrap(m, (x,))
    with torch.no_grad():
        actual, expected = wrapped(x), m(x)
        exact = copy.deepcopy(m).double()(x.double())
    _as_accurate(actual, expected, exact, dtype, "eval forward")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("config", [dict(), dict(momentum=0.9, weight_decay=1e-2),
                                    dict(momentum=0.9, nesterov=True)], ids=str)
def test_sgd_step_on_half_parameters(config, dtype):
    """SGD on half parameters, three steps with the same gradients as
    torch.optim.SGD: the engine computes a step in float32 and rounds the
    parameter and the momentum once, torch rounds after each operation; each
    as close as torch to the same steps in float64."""
    start = _randn(300, dtype=dtype, seed=1)
    ours, ref = start.clone().requires_grad_(), start.clone().requires_grad_()
    exact = start.double().requires_grad_()
    params = (ours, ref, exact)
    opts = [aidge_interop.SGD([ours], lr=0.1, **config)] + \
        [torch.optim.SGD([p], lr=0.1, **config) for p in (ref, exact)]
    for step in range(3):
        grad = _randn(300, dtype=dtype, seed=10 + step)
        for p, opt in zip(params, opts):
            p.grad = grad.to(p.dtype)
            opt.step()
        _as_accurate(ours.detach(), ref.detach(), exact.detach(), dtype, f"step {step}")


# ---------------------------------------------------------------- tensors and ONNX

def test_bfloat16_conversion_round_to_nearest_even_nan_kept():
    bits = np.arange(0, 1 << 16, 7, dtype=np.uint32) << 16
    x = np.concatenate([bits.view(np.float32),
                        np.float32([1 + 2**-8, 1 + 3 * 2**-8, 3.4e38, np.nan, -np.nan, np.inf]),
                        np.random.default_rng(0).standard_normal(1000).astype(np.float32)])
    ours = Tensor(x).astype("bfloat16")
    assert ours.dtype == "bfloat16"
    expected = x.astype(ml_dtypes.bfloat16)
    got = ours.numpy()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(x)],
                                  expected.view(np.uint16)[~np.isnan(x)])
    assert np.isnan(got.astype(np.float32)[np.isnan(x)]).all()
    back = Tensor(got).astype("float32").numpy()
    np.testing.assert_array_equal(back, expected.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(ours).view(np.uint16), got.view(np.uint16))


def test_bfloat16_torch_round_trip_without_copy():
    t = torch.randn(3, 5).to(torch.bfloat16)
    a = torch_tensor_to_aidge(t)
    assert a.dtype == "bfloat16" and a.data_ptr == t.data_ptr()
    back = aidge_tensor_to_torch(a)
    assert back.dtype == torch.bfloat16 and back.data_ptr() == t.data_ptr()
    torch.testing.assert_close(back, t, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.BFLOAT16], ids=["f16", "bf16"])
def test_onnx_model_against_the_reference(dtype):
    """An ONNX model in half: Cast to and from the half type, the float32
    kernels between, against onnx.reference (which runs each operator in
    NumPy in the half type, rounding its steps): as close as it to the same
    computation in float64."""
    np_dt = np.float16 if dtype == TensorProto.FLOAT16 else ml_dtypes.bfloat16
    x = np.random.default_rng(0).standard_normal((3, 17)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=dtype),
             helper.make_node("Softmax", ["h"], ["s"], axis=-1),
             helper.make_node("Mul", ["s", "h"], ["m"]),
             helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", 1, x.shape),
                               helper.make_tensor_value_info("m", dtype, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    expected = ReferenceEvaluator(model).run(None, {"x": x})
    actual = AidgeBackend.prepare(model).run([x])
    assert actual[0].dtype == np.float32 and actual[1].dtype == np_dt
    np.testing.assert_array_equal(actual[0], actual[1].astype(np.float32))
    h = x.astype(np_dt).astype(np.float64)
    exact = np.exp(h) / np.exp(h).sum(-1, keepdims=True) * h
    torch_dt = torch.float16 if dtype == TensorProto.FLOAT16 else torch.bfloat16
    _as_accurate(torch.from_numpy(actual[0]).to(torch_dt),
                 torch.from_numpy(expected[0]).to(torch_dt), torch.from_numpy(exact), torch_dt, "m")


def test_half_constant_reads_its_float32_copy():
    """A float16 constant feeding a converted node (Clip's bounds, Pow's
    exponent) is read as float32 at plan and run time."""
    x = np.linspace(-3, 3, 25, dtype=np.float16).reshape(5, 5)
    nodes = [helper.make_node("Clip", ["x", "lo", ""], ["c"]),
             helper.make_node("Pow", ["c", "e"], ["y"])]
    e = onnx.numpy_helper.from_array(np.float16(2.0).reshape(()), "e")
    lo = onnx.numpy_helper.from_array(np.float16(-1.5).reshape(()), "lo")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 10, x.shape)],
                              [helper.make_tensor_value_info("y", 10, x.shape)],
                              initializer=[lo, e])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    actual = AidgeBackend.prepare(model).run([x])[0]
    assert actual.dtype == np.float16
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_fuse_batchnorm_rescales_half_weights(dtype):
    """The fuse_batchnorm recipe on a float16/bfloat16 Conv + BatchNorm: the
    rescaled weights are written in the half type (and the fused graph is as
    close to the float64 result as the unfused one)."""
    np_dt = np.float16 if dtype == torch.float16 else ml_dtypes.bfloat16
    code = TensorProto.FLOAT16 if dtype == torch.float16 else TensorProto.BFLOAT16
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal(s).astype(np.float32).astype(np_dt)
              for n, s in (("w", (4, 3, 3, 3)), ("b", (4,)), ("g", (4,)), ("be", (4,)),
                           ("m", (4,)))}
    values["v"] = (rng.random(4) + 0.5).astype(np.float32).astype(np_dt)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "g", "be", "m", "v"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", code, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", code, None)],
                              [onnx.numpy_helper.from_array(a, n) for n, a in values.items()])
    g = aidge_interop.load_onnx(helper.make_model(graph,
                                                  opset_imports=[helper.make_opsetid("", 15)]))
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32).astype(np_dt)
    before = g.forward([x])[0]
    assert len(aidge_interop.recipes.fuse_batchnorm(g)) == 1
    after = g.forward([x])[0]
    t = {n: torch.from_numpy(a.astype(np.float64)) for n, a in values.items()}
    exact = torch.nn.functional.batch_norm(
        torch.nn.functional.conv2d(torch.from_numpy(x.astype(np.float64)), t["w"], t["b"]),
        t["m"], t["v"], t["g"], t["be"], eps=1e-5)
    _as_accurate(torch.from_numpy(after.astype(np.float32)).to(dtype),
                 torch.from_numpy(before.astype(np.float32)).to(dtype), exact, dtype, "fused")
