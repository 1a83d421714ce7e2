"""The Winograd conv of the blocked chains (csrc/kernels/conv_winograd.c):
3x3 stride-1 convs with at least 16 input and output channels that read
blocked channels, in the fused inference graph of an eval-mode wrapped model.

- Against torch's eval forward, and against its reference twin, the direct
  blocked tiles (``_C._set_fast_kernels(False)``), within float32's
  tolerance: channel counts that are multiples of 16 (the 16-lane products)
  or not (8-lane ones, and padding lanes: 20 channels), odd and even output
  planes (a tile's second row or column outside), pads 0, 1 and 2, planes of
  several jobs of tiles, folded BatchNorm, Relu and a residual added before
  the Relu.
- Bit for bit: the 16-lane products and the 8-lane ones (the same sums), and
  1, 2 and 3 engine threads.
"""
import pytest
import torch
from torch import nn

import aidge_interop as ai
from aidge_interop import _C

TOL = dict(rtol=1e-4, atol=1e-5)


class _Chain(nn.Module):
    """A stem (3 -> c, 3x3: the direct tiles, NCHW input), then 3x3 stride-1
    convs on blocked channels (the Winograd kernel): c -> c with a residual
    added before the Relu, c -> m with padding `pad`, m -> m with BatchNorm
    alone."""

    def __init__(self, c, m, pad):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))
        self.b = nn.Sequential(nn.Conv2d(c, m, 3, padding=pad), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(m, m, 3, padding=1, bias=False), nn.BatchNorm2d(m))

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(self.a(y) + y)
        return self.c(self.b(y))


def _chain(c, m, pad, seed=0):
    torch.manual_seed(seed)
    return random_batchnorm(_Chain(c, m, pad))


def random_batchnorm(model):
    """The model in eval mode, its BatchNorms' statistics and affine
    parameters random (not the identity they start as)."""
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return model.eval()


CASES = {  # id: (c, m, pad, input shape)
    "16-32-pad1-odd": (16, 32, 1, (3, 3, 9, 7)),
    "16-16-pad0": (16, 16, 0, (2, 3, 8, 10)),
    "20-24-pad2": (20, 24, 2, (2, 3, 5, 6)),
    "32-48-many-jobs": (32, 48, 1, (2, 3, 21, 17)),
    "64-64-pad1": (64, 64, 1, (4, 3, 8, 8)),
}


def _run(wrapped, x):
    with torch.no_grad():
        return wrapped(x).clone()


@pytest.fixture
def fast_kernels():
    """_C._set_fast_kernels for a test, on again after it."""
    yield _C._set_fast_kernels
    _C._set_fast_kernels(True)


@pytest.mark.parametrize("case", CASES)
def test_winograd_against_torch_and_the_direct_tiles(fast_kernels, case):
    c, m, pad, shape = CASES[case]
    model = _chain(c, m, pad)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    wrapped = ai.wrap(model, [shape]).eval()
    y = _run(wrapped, x)
    blocked = [n for n in wrapped._fused.nodes() if n["attrs"].get("x_blocked")]
    assert len(blocked) == 3  # a, b and c read blocked channels
    assert fast_kernels(False) is False
    direct = _run(wrapped, x)
    assert fast_kernels(True) is True
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(y, expected, **TOL)
    torch.testing.assert_close(y, direct, **TOL)
    assert not torch.equal(y, direct)  # the two kernels really ran


@pytest.mark.parametrize("case", CASES)
def test_winograd_16_lanes_match_8_lanes_and_threads_bit_for_bit(avx512, case):
    c, m, pad, shape = CASES[case]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    wrapped = ai.wrap(_chain(c, m, pad), [shape]).eval()
    assert_same_over_lanes_and_threads(wrapped, x)


def outputs_over_lanes_and_threads(run):
    """run() with 16 and 8 lanes at 1, 2 and 3 threads: {(threads, wide): result}."""
    saved = ai.get_num_threads()
    outs = {}
    try:
        for threads in (1, 2, 3):
            ai.set_num_threads(threads)
            for wide in (True, False):
                assert _C._set_avx512(wide) is wide
                outs[threads, wide] = run()
    finally:
        ai.set_num_threads(saved)
    return outs


def assert_same_over_lanes_and_threads(wrapped, x):
    """The same bits from 16 and 8 lanes at 1, 2 and 3 threads."""
    outs = outputs_over_lanes_and_threads(lambda: _run(wrapped, x))
    for key, y in outs.items():
        assert torch.equal(y, outs[1, True]), key
