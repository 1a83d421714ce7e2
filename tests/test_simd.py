"""The engine's AVX-512 kernels (csrc/kernels/simd.h): the direct convs'
16-lane tiles give the same values, bit for bit, as their 8-lane tiles (each
output sums its terms in the same order, with FMAs in both), and torch's
within tolerance.

- Eval-mode wrapped models run their fused convs on blocked channels (the
  blocked tiles, conv_blocked.c): 3x3 at stride 1 and 2, pointwise, with bias, folded
  BatchNorm, Relu and a residual added before the Relu; output channels a
  multiple of 16 (the wide tiles) or not (8-lane tiles whatever the CPU).
- Eval-mode depthwise convs on blocked channels (the depthwise_blocked sums): pairs of
  blocks as one 16-lane vector, channel counts that pair up or not, batches
  smaller and larger than the thread slots.
- Training steps run the NCHW plane kernel (direct_forward): forward of stride-1
  convs and the input gradient, odd block and channel-tile counts included.
- Training steps run depthwise convs on narrow NCHW planes (depthwise_narrow): the
  forward and input gradient 16 positions a vector.
- Training steps also run the NCHW pointwise kernel (pointwise_direct): 1x1 stride-1
  convs, partial channel tiles and position blocks, blocks across images;
  their backward, the input gradient by the same kernel on w^T and the
  weight gradient by its own tiles (pointwise_weight_grad: 64 or 16 columns a tile, partial
  row and column tiles).
- The direct weight gradient (direct_weight_grad) runs pairs of output channels as
  one 16-lane vector: convs whose input needs no gradient, any stride.
- Linear layers on at most 16 rows run the skinny GEMM (csrc/kernels/gemm.c):
  forward, and the input gradient in training.
- 2 x 2 max pools at stride 2 run 16 outputs of a row per vector
  (csrc/kernels/pool.c): the same maxima and positions as the generic kernel.

Skipped where the CPU or the build has no AVX-512.
"""
import pytest
import torch
from torch import nn

import aidge_interop as ai
from aidge_interop import _C
from aidge_interop.examples import ds_cnn, resnet8


@pytest.fixture
def at_threads():
    """Sets the engine's thread count for a test, restored after it."""
    saved = ai.get_num_threads()
    yield ai.set_num_threads
    ai.set_num_threads(saved)


class _Mixed(nn.Module):
    """Channel counts of 16, 24 (not a multiple of 16), 48 (a 32-wide and a
    16-wide block of packed weights), a strided conv, a pointwise conv and a
    residual branch."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(16, 24, 3, stride=2, padding=1), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(24, 48, 1), nn.BatchNorm2d(48), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(48, 48, 3, padding=(1, 2), dilation=(1, 2)),
                               nn.BatchNorm2d(48))
        self.head = nn.Conv2d(48, 32, 1)

    def forward(self, x):
        y = self.b(self.a(self.stem(x)))
        return self.head(torch.relu(self.c(y) + y))


def _with_batchnorm_statistics(m):
    """m in eval mode, its BatchNorms given statistics and affines that
    are not the identity."""
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return m.eval()


def _mixed(seed=0):
    torch.manual_seed(seed)
    return _with_batchnorm_statistics(_Mixed())


class _Depthwise(nn.Module):
    """Depthwise convs on blocked channels (the depthwise_blocked sums, two blocks at a
    time with 16 lanes): 12 channels (a pair of blocks, lanes past the
    channels), 24 (three blocks: an odd one out), 32 at stride 2 on a
    small grid, and a 5x5 with dilation 2 and asymmetric padding."""

    def __init__(self):
        super().__init__()
        def dw(c, k=3, **kw):
            return [nn.Conv2d(c, c, k, groups=c, **kw), nn.BatchNorm2d(c), nn.ReLU()]
        self.body = nn.Sequential(
            nn.Conv2d(3, 12, 3, padding=1), nn.ReLU(), *dw(12, padding=1),
            nn.Conv2d(12, 24, 1), nn.ReLU(), *dw(24, padding=1),
            nn.Conv2d(24, 32, 1), *dw(32, stride=2, padding=1),
            *dw(32, 5, padding=(4, 3), dilation=2), nn.Conv2d(32, 16, 1))

    def forward(self, x):
        return self.body(x)


def _depthwise(seed=0):
    torch.manual_seed(seed)
    return _with_batchnorm_statistics(_Depthwise())


@pytest.mark.parametrize("factory,shape", [
    (resnet8, (16, 3, 32, 32)),
    (ds_cnn, (16, 1, 49, 10)),
    (_mixed, (5, 3, 21, 19)),
    (_depthwise, (3, 3, 13, 11)),
    (_depthwise, (37, 3, 7, 6)),
], ids=["resnet8", "ds_cnn", "mixed", "depthwise", "depthwise-37-images"])
@pytest.mark.parametrize("threads", [1, 2])
def test_wide_tiles_match_the_8_lane_tiles_bit_for_bit(avx512, at_threads, factory, shape,
                                                       threads):
    at_threads(threads)
    model = factory().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    wrapped = ai.wrap(model, list(shape)).eval()
    outs = {}
    with torch.no_grad():
        for wide in (True, False):
            assert _C._set_avx512(wide) is wide
            outs[wide] = wrapped(x).clone()
        expected = model(x)
    assert torch.equal(outs[True], outs[False])
    torch.testing.assert_close(outs[True], expected, rtol=1e-4, atol=1e-4)


class _Planes(nn.Module):
    """Stride-1 convs on planes wider than 16 (the plane kernel): 5, 12 and
    20 output channels (1 to 5 channel tiles of 4), 3x3 and 5x5, a grid
    of 23 x 29 (its blocks cross rows, the last is partial)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 5, 3, padding=1)
        self.c2 = nn.Conv2d(5, 12, 5, padding=2)
        self.c3 = nn.Conv2d(12, 20, 3, padding=1)

    def forward(self, x):
        return self.c3(torch.relu(self.c2(torch.relu(self.c1(x)))))


def _planes(seed=0):
    torch.manual_seed(seed)
    return _Planes()


class _Pointwise(nn.Module):
    """Stride-1 pointwise convs (the pointwise kernel): 20, 26 and 13 output
    channels (partial channel tiles), on 9 x 11 planes (a partial block of
    positions per image) and 4 x 5 (blocks across images)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 20, 1)
        self.c2 = nn.Conv2d(20, 26, 1)
        self.c3 = nn.Conv2d(26, 13, 1)

    def forward(self, x):
        y = self.c2(torch.relu(self.c1(x)))
        return self.c3(nn.functional.avg_pool2d(torch.relu(y), 2))


def _pointwise(seed=0):
    torch.manual_seed(seed)
    return _Pointwise()


class _Narrow(nn.Module):
    """Depthwise convs on NCHW planes under 16 wide (depthwise_narrow in conv_depthwise.c): the
    forward, and the input gradient on planes of 64 positions or more, 16
    positions a vector; the weight gradient channels-last. 12 x 12 (9
    chunks of 16), a 3 x 5 kernel dilated along rows, a 3 x 3 without row
    pads (fewer output rows), and 12 channels (a partial unit of 8 for the
    channels-last weight gradient)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 12, 1), nn.Conv2d(12, 12, 3, padding=1, groups=12), nn.ReLU(),
            nn.Conv2d(12, 12, (3, 5), padding=2, dilation=(2, 1), groups=12),
            nn.BatchNorm2d(12), nn.ReLU(), nn.Conv2d(12, 12, 3, padding=(0, 1), groups=12))

    def forward(self, x):
        return self.body(x)


def _narrow(seed=0):
    torch.manual_seed(seed)
    return _Narrow()


def _mlp(seed=0):
    """Linear layers of 640 -> 96 -> 640 (the skinny GEMM's K >= 64), the
    96 columns not a multiple of its 8-column tile."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(640, 96), nn.ReLU(), nn.Linear(96, 640))


@pytest.mark.parametrize("factory,shape", [
    (resnet8, (4, 3, 32, 32)),
    (_planes, (3, 3, 23, 29)),
    (ds_cnn, (4, 1, 49, 10)),
    (_narrow, (3, 3, 12, 12)),
    (_pointwise, (3, 3, 9, 11)),
    (_mlp, (16, 640)),
    (_mlp, (5, 640)),
], ids=["resnet8", "planes", "ds_cnn", "narrow", "pointwise", "mlp-16-rows", "mlp-5-rows"])
@pytest.mark.parametrize("threads", [1, 2])
def test_wide_kernels_match_the_8_lane_ones_in_training(avx512, at_threads, factory, shape,
                                                      threads):
    at_threads(threads)
    model = factory().train()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    wrapped = ai.wrap(model, list(shape)).train()
    results = {}
    for wide in (True, False):
        assert _C._set_avx512(wide) is wide
        xi = x.clone().requires_grad_(True)
        out = wrapped(xi)
        out.backward(torch.ones_like(out))
        results[wide] = [out.detach().clone(), xi.grad.clone()] + [
            p.grad.clone() for p in wrapped.parameters()]
        wrapped.zero_grad()
    xt = x.clone().requires_grad_(True)
    expected = model(xt)
    expected.backward(torch.ones_like(expected))
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)
    torch.testing.assert_close(results[True][0], expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(results[True][1], xt.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_wide_weight_gradient_of_convs_without_input_gradient(avx512, at_threads, threads):
    """The direct weight-gradient kernel (direct_weight_grad: a model's first convs,
    whose input needs no gradient; strided ones too) with 16 lanes on pairs
    of output channels: odd channel counts (a pair with one row), 5x5 (taps
    in passes of 9, 9 and 7) and 3x3 at stride 2, 10x4 (40 taps)."""
    at_threads(threads)
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 7, 5, stride=2, padding=2), nn.ReLU(),
                          nn.Conv2d(7, 9, 3, stride=2), nn.ReLU(),
                          nn.Conv2d(9, 6, (10, 4), padding=(4, 1))).train()
    x = torch.randn(5, 3, 45, 41, generator=torch.Generator().manual_seed(2))
    wrapped = ai.wrap(model, list(x.shape)).train()
    results = {}
    for wide in (True, False):
        assert _C._set_avx512(wide) is wide
        out = wrapped(x)
        out.backward(torch.ones_like(out))
        results[wide] = [out.detach().clone()] + [p.grad.clone() for p in wrapped.parameters()]
        wrapped.zero_grad()
    expected = model(x)
    expected.backward(torch.ones_like(expected))
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)
    for got, p in zip(results[True][1:], model.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-3)

class _Pools(nn.Module):
    """2 x 2 max pools at stride 2 on rows of 17 outputs (a full vector and a
    partial one), odd sizes (the last row and column unused), and a 3-d pool
    of (1, 2, 2) windows."""

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.pool3 = nn.MaxPool3d((1, 2, 2))

    def forward(self, x):
        y = self.pool(x)
        return torch.cat([y.flatten(1), self.pool(y[:, :, :5, :7]).flatten(1),
                          self.pool3(x[:, None]).flatten(1)], 1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("special", ["ties", "nan", "-inf"])
def test_wide_maxpool_matches_the_generic_kernel(avx512, at_threads, threads, special):
    """The 16-lane 2 x 2 max pool (csrc/kernels/pool.c) against the generic
    kernel bit for bit, forward in eval (maxima only) and in training (the
    gradient goes to the positions kept), and against torch. Values drawn
    from a few levels (ties in most windows), with NaN or -inf planted."""
    at_threads(threads)
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-2, 3, (3, 5, 11, 35), generator=g).float()
    if special != "ties":
        value = float("nan") if special == "nan" else float("-inf")
        x.view(-1)[torch.randperm(x.numel(), generator=g)[:40]] = value
        x[0, 0, :2, :2] = value  # a whole window
    model = _Pools()
    wrapped = ai.wrap(model, [tuple(x.shape)])
    gy = torch.rand(model(x).shape, generator=g)
    results = {}
    for wide in (True, False):
        assert _C._set_avx512(wide) is wide
        with torch.no_grad():
            evals = wrapped.eval()(x)
        xi = x.clone().requires_grad_(True)
        out = wrapped.train()(xi)
        out.backward(gy)
        results[wide] = [evals, out.detach(), xi.grad]
    xt = x.clone().requires_grad_(True)
    expected = model(xt)
    expected.backward(gy)
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b) or (special == "nan" and torch.equal(a.isnan(), b.isnan())
                                     and torch.equal(a.nan_to_num(), b.nan_to_num()))
    for got in results[True][:2]:
        torch.testing.assert_close(got, expected.detach(), equal_nan=True)
    torch.testing.assert_close(results[True][2], xt.grad, equal_nan=True)


def test_set_avx512_off_stays_off_until_turned_on(avx512):
    assert _C._set_avx512(False) is False
    assert _C._set_avx512(False) is False
    assert _C._set_avx512(True) is True
