"""The patch tiles of the blocked chains (csrc/kernels/conv_blocked_impl.h,
blocked_patch_tiles): a first conv, NCHW input and blocked output, at most
64 taps, at least 32 output channels (KWS's 1 -> 64 10x4 stride 2,
MobileNet's 3 -> 32 3x3 stride 2), in the fused inference graph of an
eval-mode wrapped model.

- Against torch's eval forward (float32 tolerance), and bit for bit
  against its reference twin, the blocked tiles
  (``_C._set_fast_kernels(False)``): each lane sums the same taps in the
  same order from the bias. Cases: asymmetric padding (TensorFlow's "same",
  a ZeroPad2d before the conv), stride 1 and 2, dilation, 48 channels (a
  16-lane tile of 32 channels, then one of 16) and 40 (8 lanes only: not a
  multiple of 16), planes of several jobs, folded BatchNorm and Relu, a
  residual added in the epilogue.
- Bit for bit: the 16-lane tiles and the 8-lane ones, and 1, 2 and 3
  engine threads.
"""
import pytest
import torch
from torch import nn

import aidge_interop as ai
from test_conv_winograd import (  # noqa: F401,F811 (fast_kernels: a fixture)
    _run, assert_same_over_lanes_and_threads, fast_kernels, random_batchnorm)

TOL = dict(rtol=1e-4, atol=1e-5)


class _First(nn.Module):
    """pad -> conv (the patch tiles) -> BatchNorm -> Relu, then a depthwise
    3x3 conv that reads the blocked output."""

    def __init__(self, c, m, kernel, stride, pad, dilation):
        super().__init__()
        self.pad = nn.ZeroPad2d(pad)
        self.conv = nn.Conv2d(c, m, kernel, stride=stride, dilation=dilation)
        self.bn = nn.BatchNorm2d(m)
        self.dw = nn.Sequential(nn.Conv2d(m, m, 3, padding=1, groups=m), nn.BatchNorm2d(m))

    def forward(self, x):
        return self.dw(torch.relu(self.bn(self.conv(self.pad(x)))))


def _model(case, seed=0):
    torch.manual_seed(seed)
    return random_batchnorm(_First(*CASES[case][:6]))


CASES = {  # id: (c, m, kernel, stride, pad (left, right, top, bottom), dilation, input shape)
    "kws-1-64-10x4-s2": (1, 64, (10, 4), 2, (1, 1, 4, 5), 1, (3, 1, 49, 10)),
    "mobilenet-3-32-3x3-s2": (3, 32, 3, 2, (1, 1, 1, 1), 1, (2, 3, 24, 24)),
    "2-48-5x5-s1-many-jobs": (2, 48, 5, 1, (2, 2, 2, 2), 1, (2, 2, 17, 19)),
    "2-40-3x3-s2-dilated": (2, 40, 3, 2, (2, 1, 0, 2), 2, (2, 2, 13, 11)),
    "1-32-7x7-s3-unpadded": (1, 32, 7, 3, (0, 0, 0, 0), 1, (2, 1, 20, 23)),
}


def _input(case, seed):
    return torch.randn(*CASES[case][6], generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", CASES)
def test_patch_tiles_against_torch_and_the_blocked_tiles(fast_kernels, case):
    model = _model(case)
    x = _input(case, 1)
    wrapped = ai.wrap(model, [tuple(x.shape)]).eval()
    _check(wrapped, model, x, fast_kernels)
    first = [n for n in wrapped._fused.nodes() if n["op_type"] == "FusedConv"
             and not n["attrs"].get("x_blocked")]
    assert len(first) == 1  # the conv on NCHW input, its output blocked for the depthwise


@pytest.mark.parametrize("case", CASES)
def test_patch_tiles_16_lanes_match_8_lanes_and_threads_bit_for_bit(avx512, case):
    x = _input(case, 2)
    wrapped = ai.wrap(_model(case), [tuple(x.shape)]).eval()
    assert_same_over_lanes_and_threads(wrapped, x)


class _Residual(nn.Module):
    """Two first convs on the same NCHW input added: block_channels adds
    one's output to the other's in its epilogue (a residual, blocked)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(1, 32, (10, 4), stride=2, padding=(4, 1)),
                               nn.BatchNorm2d(32))
        self.b = nn.Sequential(nn.Conv2d(1, 32, 3, stride=2), nn.BatchNorm2d(32))
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)

    def forward(self, x):
        return self.dw(torch.relu(self.a(x) + self.b(x)))


def test_patch_tiles_add_a_residual(fast_kernels):
    torch.manual_seed(0)
    model = _Residual().eval()
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 1, 49, 11, generator=torch.Generator().manual_seed(3))
    wrapped = ai.wrap(model, [tuple(x.shape)]).eval()
    _check(wrapped, model, x, fast_kernels)
    fused = [n for n in wrapped._fused.nodes() if n["attrs"].get("residual")]
    assert len(fused) == 1 and not fused[0]["attrs"].get("x_blocked")


def _check(wrapped, model, x, fast_kernels):
    """The output against torch and, bit for bit, against the blocked tiles."""
    y = _run(wrapped, x)
    assert fast_kernels(False) is False
    reference = _run(wrapped, x)
    assert fast_kernels(True) is True
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(y, expected, **TOL)
    assert torch.equal(y, reference)
