"""The attention node's float32 tiles (csrc/kernels/attn_tiles.c) against
their reference (the node's GEMMs, ``_C._set_fast_kernels(False)``) and
against torch in float64, forward and backward, with each ISA path forced
(AVX-512: 16 lanes, AVX2: 8 lanes, the reference): head dims 8 to 128 (the
tiles take a head dim that is a multiple of the lanes, the reference the
others), T = 1, T not a multiple of the row block or of the lanes, the mask
kinds (none, float, bool, a bool mask with a fully masked row), causal,
grouped-query heads, the (B, T, H, D) and (B, H, T, D) layouts; the same
bits at 1 and 2 threads."""
import numpy as np
import pytest
import torch

import aidge_interop
from aidge_interop import _C
from op_harness import make_model

ISAS = {"avx512": (True, True, 16), "avx2": (False, True, 8), "reference": (False, False, 0)}


@pytest.fixture(params=list(ISAS))
def isa(request):
    """Forces one path of the node's float32 products; checks it is the one
    that runs (skips where the CPU or build lacks it)."""
    wide, fast, lanes = ISAS[request.param]
    _C._set_fast_kernels(fast)
    if _C._set_avx512(wide) != wide:
        _C._set_avx512(True)
        pytest.skip("no AVX-512 on this CPU or build")
    if _C._attn_lanes() != lanes:
        _C._set_avx512(True)
        _C._set_fast_kernels(True)
        pytest.skip(f"no {request.param} attention tiles on this CPU or build")
    yield lanes
    _C._set_avx512(True)
    _C._set_fast_kernels(True)


def _reference(q, k, v, mask, scale, causal, bthd, group):
    """softmax(scale Q K^T + bias) V in float64 torch, on (B, H, T, D) views."""
    if bthd:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if group > 1:
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = scale * q @ k.transpose(-1, -2)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    y = torch.softmax(s, -1) @ v
    return y.transpose(1, 2) if bthd else y


def _case(B, Hk, group, Tq, Tk, D, Dv, mask_kind, causal, bthd, seed=0):
    rng = np.random.default_rng(seed)
    Hq = Hk * group
    shp = (lambda h, t, d: (B, t, h, d)) if bthd else (lambda h, t, d: (B, h, t, d))
    ins = {"Q": rng.standard_normal(shp(Hq, Tq, D)).astype(np.float32),
           "K": rng.standard_normal(shp(Hk, Tk, D)).astype(np.float32),
           "V": rng.standard_normal(shp(Hk, Tk, Dv)).astype(np.float32)}
    if mask_kind == "float":
        ins["mask"] = rng.standard_normal((B, 1, Tq, Tk)).astype(np.float32)
    elif mask_kind == "bool":  # every row keeps its first key
        m = rng.random((B, 1, Tq, Tk)) < 0.7
        m[..., 0] = True
        ins["mask"] = m
    attrs = {"scale": 0.7 / np.sqrt(D), "is_causal": int(causal)}
    if bthd:
        attrs.update(bthd=1, y_bthd=1)
    return ins, attrs


def _run(ins, attrs, go, threads=1):
    aidge_interop.set_num_threads(threads)
    try:
        g = aidge_interop.load_onnx(make_model("FusedAttention", ins, attrs,
                                               domain="aidge_interop", opset=23))
        (y,) = g.forward(list(ins.values()), need_backward=True, input_grads=True)
        grads = g.backward([go])
    finally:
        aidge_interop.set_num_threads(1)
    return y, grads[:3] + ([grads[3]] if "mask" in ins and ins["mask"].dtype != bool else [])


def _close(name, ours, ref, tol):
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol * scale, err_msg=name)


def _check(isa, B, Hk, group, Tq, Tk, D, Dv, mask_kind, causal, bthd):
    ins, attrs = _case(B, Hk, group, Tq, Tk, D, Dv, mask_kind, causal, bthd)
    y_shape = (B, Tq, Hk * group, Dv) if bthd else (B, Hk * group, Tq, Dv)
    go = np.random.default_rng(1).standard_normal(y_shape).astype(np.float32)
    y, grads = _run(ins, attrs, go)
    # torch, float64
    t_in = {n: torch.tensor(a if a.dtype == bool else a.astype(np.float64),
                            requires_grad=a.dtype != bool) for n, a in ins.items()}
    ref = _reference(t_in["Q"], t_in["K"], t_in["V"], t_in.get("mask"), attrs["scale"],
                     causal, bthd, group)
    wrt = [t for t in t_in.values() if t.requires_grad]
    t_grads = torch.autograd.grad(ref, wrt, torch.tensor(go, dtype=torch.float64))
    _close("Y vs torch", y, ref.detach().numpy(), 2e-5)
    for name, ours, tg in zip(["dQ", "dK", "dV", "dmask"], grads, t_grads):
        _close(f"{name} vs torch", ours, tg.numpy(), 5e-5)
    if isa:  # the tiles against their reference, same float32 inputs
        _C._set_fast_kernels(False)
        try:
            y_ref, g_ref = _run(ins, attrs, go)
        finally:
            _C._set_fast_kernels(True)
        _close("Y vs reference", y, y_ref, 1e-5)
        for name, ours, r in zip(["dQ", "dK", "dV", "dmask"], grads, g_ref):
            _close(f"{name} vs reference", ours, r, 2e-5)


@pytest.mark.parametrize("D", [8, 48, 64, 80, 128])
@pytest.mark.parametrize("T", [1, 37, 145])
def test_head_dims_and_lengths(isa, D, T):
    """No mask, (B, T, H, D): every head dim (8 and 48 on the 16-lane path
    go to the reference, 48 and 80 take partial tile rows), T = 1, T prime,
    T = 145 (ViT-384: the scratch's rows padded to the lanes)."""
    _check(isa, 2, 2, 1, T, T, D, D, None, False, True)


@pytest.mark.parametrize("mask_kind", [None, "float", "bool"])
@pytest.mark.parametrize("causal", [False, True])
def test_masks_and_causal(isa, mask_kind, causal):
    """The mask kinds with and without causal (blocks stopping at the last
    key their last row sees: scores to kmax rounded up to the lanes), 130
    rows (more than one row block forward and backward), Tq != Tk."""
    _check(isa, 2, 2, 1, 130, 150, 64, 64, mask_kind, causal, True)


@pytest.mark.parametrize("bthd", [False, True])
def test_grouped_heads_and_layouts(isa, bthd):
    """Grouped-query heads (two query heads per key/value head: dK, dV
    written by the first, added to by the second), Dv != D, both layouts."""
    _check(isa, 2, 2, 2, 70, 70, 32, 48, "float", False, bthd)


def test_fully_masked_row(isa):
    """A bool mask with a row whose every key is masked: NaN (masked_zero 0)
    or 0 (masked_zero 1), as the reference gives."""
    ins, attrs = _case(1, 2, 1, 20, 20, 64, 64, "bool", False, True)
    ins["mask"][0, 0, 3] = False
    go = np.ones((1, 20, 2, 64), np.float32)
    for mz in (0, 1):
        y, _ = _run(ins, dict(attrs, masked_zero=mz), go)
        assert np.isnan(y[0, 3]).all() if mz == 0 else (y[0, 3] == 0).all()
        others = np.delete(y, 3, axis=1)
        assert np.isfinite(others).all()


def test_threads_same_bits(isa):
    """The same bits at 1 and 2 threads (the forward's blocks and the
    backward's key/value planes are split between threads, never a sum)."""
    ins, attrs = _case(2, 3, 1, 145, 145, 64, 64, "float", True, True)
    go = np.random.default_rng(2).standard_normal((2, 145, 3, 64)).astype(np.float32)
    y1, g1 = _run(ins, attrs, go, 1)
    y2, g2 = _run(ins, attrs, go, 2)
    assert np.array_equal(y1, y2)
    for a, b in zip(g1, g2):
        assert np.array_equal(a, b)
