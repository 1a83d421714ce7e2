"""Packed conv weights (csrc/packed.c, ops/fused.c): the blocked convs of the
fused inference graph (FusedConv with y_blocked) read their weights packed
once, in their kernel's layout (the direct and patch tiles' blocks of output
channels, Winograd's transform U), and keep the copy while the weights'
version holds. The sums are the same, bit for bit, as packing at every
call; every way of writing a conv's weight between two eval forwards shows
in the next one, as in torch (tests/test_packed_weights.py does the same
for the Linear weights)."""

import copy

import numpy as np
import pytest
import torch

import aidge_interop
from aidge_interop import SGD, wrap
from aidge_interop import _C
from aidge_interop.bridge.wrapping import _graph_call
from test_packed_weights import WEIGHT_WRITES


class ConvChain(torch.nn.Module):
    """One conv of each blocked kernel that packs: the stem (NCHW input, 27
    taps, 32 outputs: the patch tiles), a 3x3 stride-1 on 32 blocked channels
    with a residual (Winograd), a depthwise (reads w as it is), a pointwise
    to 40 channels (the tiles, one 8-lane block past the 16-lane ones) and a
    strided 3x3 to 64 (the direct tiles)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(32)
        self.conv = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(32)
        self.dw = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
        self.pw = torch.nn.Conv2d(32, 40, 1)
        self.bn2 = torch.nn.BatchNorm2d(40)
        self.down = torch.nn.Conv2d(40, 64, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        h = torch.relu(self.bn0(self.stem(x)))
        h = torch.relu(self.bn1(self.conv(h)) + h)
        h = torch.relu(self.bn2(self.pw(torch.relu(self.dw(h)))))
        h = torch.relu(self.down(h))
        return self.head(h.mean(dim=(2, 3)))


SHAPE = (4, 3, 20, 20)


def _pair():
    torch.manual_seed(0)
    model = ConvChain()
    for m in model.modules():  # BatchNorm statistics not the identity's
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    model.eval()
    return model, wrap(copy.deepcopy(model), [SHAPE])


def _x(seed=1):
    return torch.randn(*SHAPE, generator=torch.Generator().manual_seed(seed))


def _eval(m, x):
    with torch.no_grad():
        return m(x)


def _assert_matches(wrapped, model, x):
    torch.testing.assert_close(_eval(wrapped, x), _eval(model, x), rtol=1e-4, atol=1e-4)


def _packed_bytes(wrapped):
    stats = wrapped.memory_stats()
    assert stats["last_graph"] == "inference"  # the fused graph ran
    return stats["inference"]["packed_weights_bytes"]


def _m8(m):
    return -(-m // 8) * 8


@pytest.fixture(params=["avx512", "avx2"])
def isa(request):
    """The 16-lane tiles (AVX-512) and the 8-lane ones; the packed layout is
    the same, the kernels reading it differ. AVX-512 on again after."""
    if request.param == "avx512" and not _C._set_avx512(True):
        pytest.skip("no AVX-512 on this CPU or build")
    _C._set_avx512(request.param == "avx512")
    yield request.param
    _C._set_avx512(True)


@pytest.fixture(params=[True, False], ids=["fast", "reference"])
def fast(request):
    """The fast kernels (Winograd, the patch tiles) or their references (the
    direct tiles): different layouts of the same weights. On again after."""
    _C._set_fast_kernels(request.param)
    yield request.param
    _C._set_fast_kernels(True)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_packed_convs_are_bit_for_bit_the_per_call_ones(isa, fast, threads):
    model, wrapped = _pair()
    x = _x()
    before = aidge_interop.get_num_threads()
    aidge_interop.set_num_threads(threads)
    try:
        first = _eval(wrapped, x)  # builds the fused graph; no version yet
        fused = wrapped._fused
        assert fused and fused.weights_packable
        fused.weights_version = -1  # packed at the call, as before
        per_call = _graph_call(fused.forward, [x])[0]
        assert fused.memory_stats()["packed_weights_bytes"] == 0
        kept = [_eval(wrapped, x) for _ in range(3)]  # packed once, then read
    finally:
        aidge_interop.set_num_threads(before)
    for y in [first] + kept:
        assert torch.equal(y, per_call)
    # the copies: the stem, pointwise and strided conv in the tiles' layout
    # (taps x output channels rounded up to 8); the 3x3 stride-1 conv as
    # Winograd's U (16 x input channels x outputs) or, with the fast kernels
    # off, in the tiles' layout too; no copy of the depthwise weights
    m = wrapped
    tiles = [m.stem.weight, m.pw.weight, m.down.weight] + ([] if fast else [m.conv.weight])
    floats = sum(w[0].numel() * _m8(w.shape[0]) for w in tiles)
    if fast:
        floats += 16 * 32 * _m8(32)
    assert _packed_bytes(wrapped) == 4 * floats
    torch.testing.assert_close(per_call, _eval(model, x), rtol=1e-4, atol=1e-4)


def test_switching_the_kernels_reads_each_ones_copy():
    """The fast kernels switched between eval forwards: each layout has its
    own copy, read at the same version, and the values are each kernel's."""
    model, wrapped = _pair()
    x = _x()
    try:
        outs = {}
        for on in (True, False, True, False):
            _C._set_fast_kernels(on)
            y = _eval(wrapped, x)
            assert torch.equal(outs.setdefault(on, y), y)
            torch.testing.assert_close(y, _eval(model, x), rtol=1e-4, atol=1e-4)
    finally:
        _C._set_fast_kernels(True)


@pytest.mark.parametrize("change, layer",
                         zip(WEIGHT_WRITES, ["pw", "conv", "stem", "pw", "down", "conv", "pw",
                                             "stem"]))
def test_a_change_between_two_eval_forwards_shows(change, layer):
    model, wrapped = _pair()
    x = _x()
    for _ in range(2):  # the second forward reads packed weights
        _assert_matches(wrapped, model, x)
    assert _packed_bytes(wrapped) > 0
    change(wrapped, model, layer)
    _assert_matches(wrapped, model, x)
    _assert_matches(wrapped, model, x)


@pytest.mark.parametrize("optimizer", ["torch", "ours"])
def test_training_then_eval_reads_the_stepped_weights(optimizer):
    model, wrapped = _pair()
    x, target = _x(), torch.randn(SHAPE[0], 10)
    for m in (model, wrapped):
        _eval(m, x), _eval(m, x)  # packed
    opts = [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            (torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
             if optimizer == "torch" else SGD(wrapped, lr=0.05, momentum=0.9))]
    for m, opt in zip((model, wrapped), opts):
        m.train()
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), target).backward()
            opt.step()
        m.eval()
    _assert_matches(wrapped, model, x)
    for m, opt in zip((model, wrapped), opts):  # a step between two eval forwards
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), target).backward()
        opt.step()
    _assert_matches(wrapped, model, x)


def test_values_against_float64():
    """The packed forward against the model in float64 (not only against the
    engine's own per-call path)."""
    model, wrapped = _pair()
    x = _x()
    for _ in range(2):
        y = _eval(wrapped, x)
    ref = _eval(copy.deepcopy(model).double(), x.double())
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
