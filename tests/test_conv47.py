"""Winograd F(2x2, 3x3) on NCHW convs (csrc/kernels/conv_winograd.c,
winograd_forward and winograd_input_grad): the forward of a 3x3 stride-1
conv with at least 16 input and output channels (training forwards, eval
forwards outside the fused inference graph) and its input gradient (the
stride-1 conv of dy by the weights transposed and flipped).

- Against torch in float64 (the float32 tolerance of op_harness), and
  against the reference twin, the direct kernel (``_C._set_fast_kernels(False)``),
  within the same tolerance: forward values and the gradients of x, w and b;
  odd and even planes, pads 0, 1, 2 and asymmetric, channel counts that are
  not multiples of 8 or 16, batches of several groups of images, a
  128-channel conv on 6x6 planes (more taps than the blocked tiles take).
- Where Winograd does not apply (planes of too few tiles, strides,
  dilations, 5x5 kernels) the fast and reference paths give the same bits.
- Bit for bit: the 16-lane products and the 8-lane ones, at 1, 2 and 3
  engine threads (each output is summed by one job in a fixed order).
- A gradient added into an input's gradient (dx += by the Winograd path:
  a value read by two convs) and a training step of a wrapped model against
  torch.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aidge_interop as ai
from aidge_interop import _C
from op_harness import TOL, _close, check_wrapped_step, make_model
from test_conv_winograd import outputs_over_lanes_and_threads

RTOL, ATOL = TOL[np.dtype("float32")]

# id: (N, C, M, H, W, ONNX pads (h begin, w begin, h end, w end))
CASES = {
    "32-64-32x32": (2, 32, 64, 32, 32, (1, 1, 1, 1)),
    "16-20-odd-9x7": (3, 16, 20, 9, 7, (1, 1, 1, 1)),
    "24-16-pad0-11x10": (2, 24, 16, 11, 10, (0, 0, 0, 0)),
    "20-24-pad2": (2, 20, 24, 8, 9, (2, 2, 2, 2)),
    "17-33-asymmetric": (2, 17, 33, 10, 13, (2, 0, 0, 1)),
    "16-16-groups-of-images": (11, 16, 16, 32, 32, (1, 1, 1, 1)),
    "128-136-6x6": (4, 128, 136, 6, 6, (1, 1, 1, 1)),
}

# convs the Winograd path does not take: (N, C, M, H, W, pads, strides, dilations, kernel)
NOT_TAKEN = {
    "planes-of-9-tiles": (3, 64, 64, 5, 5, (1, 1, 1, 1), (1, 1), (1, 1), 3),
    "stride-2": (2, 32, 32, 16, 16, (1, 1, 1, 1), (2, 2), (1, 1), 3),
    "dilation-2": (2, 32, 32, 16, 16, (2, 2, 2, 2), (1, 1), (2, 2), 3),
    "5x5": (2, 32, 32, 16, 16, (2, 2, 2, 2), (1, 1), (1, 1), 5),
    "15-channels": (2, 15, 32, 16, 16, (1, 1, 1, 1), (1, 1), (1, 1), 3),
}


@pytest.fixture
def fast_kernels():
    """_C._set_fast_kernels for a test, on again after it."""
    yield _C._set_fast_kernels
    _C._set_fast_kernels(True)


def _arrays(n, c, m, h, w, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, c, h, w)).astype(np.float32),
            rng.standard_normal((m, c, k, k)).astype(np.float32),
            rng.standard_normal(m).astype(np.float32))


def _engine(x, w, b, pads, strides=(1, 1), dilations=(1, 1), seed=1):
    """Forward and the gradients of x, w, b of a one-node Conv (x, w, b graph
    inputs), with a random output gradient: a function of no argument that
    runs them (on the current kernel settings) and that gradient."""
    model = make_model("Conv", {"x": x, "w": w, "b": b},
                       {"pads": list(pads), "strides": list(strides),
                        "dilations": list(dilations)})
    g = ai.load_onnx(model)
    y = g.forward([x, w, b], need_backward=True, input_grads=True)[0]
    dy = np.random.default_rng(seed).standard_normal(y.shape).astype(np.float32)

    def run():
        (y,) = g.forward([x, w, b], need_backward=True, input_grads=True)
        return [np.array(y)] + [np.array(t) for t in g.backward([dy])]
    return run, dy


def _torch(x, w, b, pads, dy, strides=(1, 1), dilations=(1, 1)):
    """y, dx, dw, db by torch in float64 (ONNX pads by F.pad)."""
    t = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b)]
    xp = F.pad(t[0], (pads[1], pads[3], pads[0], pads[2]))
    y = F.conv2d(xp, t[1], t[2], stride=strides, dilation=dilations)
    grads = torch.autograd.grad(y, t, torch.tensor(dy, dtype=torch.float64))
    return [y.detach().numpy()] + [g.numpy() for g in grads]


NAMES = ("y", "dx", "dw", "db")


@pytest.mark.parametrize("case", CASES)
def test_winograd_nchw_against_torch_and_the_direct_kernel(fast_kernels, case):
    n, c, m, h, wd, pads = CASES[case]
    x, w, b = _arrays(n, c, m, h, wd)
    run, dy = _engine(x, w, b, pads)
    assert fast_kernels(True) is True
    fast = run()
    assert fast_kernels(False) is False
    reference = run()
    expected = _torch(x, w, b, pads, dy)
    for name, f, r, e in zip(NAMES, fast, reference, expected):
        _close(f"{case} {name}", f, e, RTOL, ATOL)
        _close(f"{case} {name} vs the direct kernel", f, r, RTOL, ATOL)
    assert not np.array_equal(fast[0], reference[0])  # Winograd's forward really ran
    assert not np.array_equal(fast[1], reference[1])  # and its input gradient
    # the weight gradient and bias gradient are the same kernels' either way
    assert np.array_equal(fast[2], reference[2]) and np.array_equal(fast[3], reference[3])


@pytest.mark.parametrize("case", NOT_TAKEN)
def test_convs_winograd_does_not_take_keep_their_kernels(fast_kernels, case):
    n, c, m, h, wd, pads, strides, dilations, k = NOT_TAKEN[case]
    x, w, b = _arrays(n, c, m, h, wd, k)
    run, dy = _engine(x, w, b, pads, strides, dilations)
    fast = run()
    assert fast_kernels(False) is False
    reference = run()
    expected = _torch(x, w, b, pads, dy, strides, dilations)
    for name, f, r, e in zip(NAMES, fast, reference, expected):
        _close(f"{case} {name}", f, e, RTOL, ATOL)
        assert np.array_equal(f, r), f"{case} {name}"


@pytest.mark.parametrize("case", ["32-64-32x32", "17-33-asymmetric", "16-16-groups-of-images"])
def test_winograd_nchw_lanes_and_threads_bit_for_bit(avx512, case):
    n, c, m, h, wd, pads = CASES[case]
    run, _ = _engine(*_arrays(n, c, m, h, wd), pads)
    outs = outputs_over_lanes_and_threads(run)
    for key, got in outs.items():
        for name, a, e in zip(NAMES, got, outs[1, True]):
            assert np.array_equal(a, e), (key, name)


class _Branches(nn.Module):
    """h = conv1(x) read by two 3x3 convs: h's gradient is one conv's input
    gradient written, the other's added to it."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(16, 24, 3, padding=1)
        self.conv2 = nn.Conv2d(24, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(24, 32, 3, padding=1, bias=False)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        return self.conv2(h) * self.conv3(h)


def test_training_step_with_an_added_input_gradient(fast_kernels):
    torch.manual_seed(0)
    model = _Branches()
    x = torch.randn(3, 16, 12, 10)
    wrapped = ai.wrap(model, [tuple(x.shape)])
    check_wrapped_step(model, wrapped, x)
    grads = {}
    for fast in (True, False):
        assert fast_kernels(fast) is fast
        xa = x.clone().requires_grad_()
        y = wrapped(xa)
        y.backward(torch.ones_like(y))
        grads[fast] = [xa.grad] + [p.grad.clone() for p in wrapped.parameters()]
        wrapped.zero_grad()
    for a, r in zip(grads[True], grads[False]):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)
    assert not torch.equal(grads[True][0], grads[False][0])
