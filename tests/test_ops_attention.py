"""Attention and FusedAttention (csrc/ops/attention.c) against torch's
scaled_dot_product_attention: values and the gradients of Q, K, V and a
float mask, float32 and float64, bool and float masks, causal, Tq != Tk,
grouped-query heads, long rows over several row blocks; the ONNX corner
cases (a fully masked row, a mask shorter than Tk) against onnx.reference."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx.reference import ReferenceEvaluator

import aidge_interop
from op_harness import check_op, make_model

DTYPES = [np.float32, np.float64]
DT_IDS = lambda d: np.dtype(d).name  # noqa: E731

# (B, Hq, Hk, Tq, Tk, D, Dv): square, Tq != Tk both ways, Dv != D, grouped
# heads, more rows than one block (att_bind: 16 to 128 rows)
SHAPES = [(2, 3, 3, 5, 5, 4, 4), (1, 2, 2, 7, 3, 8, 5), (2, 2, 2, 3, 9, 4, 6),
          (1, 4, 2, 6, 6, 8, 8), (1, 1, 1, 300, 40, 16, 16), (1, 2, 1, 33, 700, 8, 4)]


def _qkv(shape, dtype, seed=0):
    B, Hq, Hk, Tq, Tk, D, Dv = shape
    rng = np.random.default_rng(seed)
    return {"Q": rng.standard_normal((B, Hq, Tq, D)).astype(dtype),
            "K": rng.standard_normal((B, Hk, Tk, D)).astype(dtype),
            "V": rng.standard_normal((B, Hk, Tk, Dv)).astype(dtype)}


def _sdpa(scale=None, causal=False, gqa=False):
    def fn(q, k, v, mask=None):
        if mask is not None and mask.ndim < 2:  # (torch's bool mask: 2-D at least)
            mask = mask.reshape(1, -1)
        if causal and mask is not None:  # (torch takes one or the other): both as one mask
            tril = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            mask = mask & tril if mask.dtype == torch.bool else \
                mask + torch.zeros(tril.shape, dtype=q.dtype).masked_fill(~tril, -torch.inf)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              is_causal=causal and mask is None,
                                              scale=scale, enable_gqa=gqa)
    return fn


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_vs_sdpa(shape, dtype, causal):
    inputs = _qkv(shape, dtype)
    attrs = {"is_causal": 1} if causal else {}
    check_op("Attention", inputs, _sdpa(causal=causal, gqa=shape[1] != shape[2]), attrs=attrs,
             opset=23)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("mask_shape", [(1, 1, 1, 0), (2, 1, 1, 0), (0,), (2, 3, 5, 0),
                                        (5, 0)], ids=str)
@pytest.mark.parametrize("kind", ["float", "bool"])
def test_attention_masks(dtype, mask_shape, kind):
    """A float mask (its gradient summed over its broadcast axes) and a bool
    one, broadcast from several shapes (0: Tk); with a scale and causal."""
    shape = (2, 3, 3, 5, 6, 4, 4)
    inputs = _qkv(shape, dtype, seed=1)
    dims = tuple(shape[4] if d == 0 else d for d in mask_shape)
    rng = np.random.default_rng(2)
    if kind == "bool":
        mask = rng.random(dims) > 0.3
        mask[..., 0] = True  # no fully masked row (torch gives NaN there, ONNX 0)
    else:
        mask = rng.standard_normal(dims).astype(dtype)
    inputs["mask"] = mask
    for causal in (False, True):
        check_op("Attention", inputs, _sdpa(scale=0.3, causal=causal), opset=23,
                 attrs={"scale": 0.3, "is_causal": int(causal)})


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_attention_onnx_corners(dtype):
    """A fully masked row gives 0 and a mask shorter than Tk masks the keys
    past it, as the ONNX reference does; its gradients are then finite."""
    inputs = _qkv((1, 2, 2, 4, 6, 3, 3), dtype, seed=3)
    rng = np.random.default_rng(4)
    for mask in (np.array([[True] * 6, [False] * 6, [True, False] * 3, [False] * 5 + [True]]),
                 rng.standard_normal((1, 2, 4, 4)).astype(dtype),
                 np.where(np.arange(4)[:, None] == 2, -np.inf, np.zeros((4, 6))).astype(dtype)):
        ins = dict(inputs, mask=mask)
        model = make_model("Attention", ins, opset=23)
        ref = ReferenceEvaluator(model).run(None, ins)[0]
        g = aidge_interop.load_onnx(model)
        out = g.forward(list(ins.values()), need_backward=True, input_grads=True)[0]
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
        grads = g.backward([np.ones_like(out)])
        assert all(np.isfinite(x).all() for x in grads[:3])


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("rank", [3, 4])
def test_fused_attention(dtype, rank):
    """FusedAttention: K given transposed, rank 3 or 4, an Add-broadcast
    float mask (last dim 1 or Tk), causal."""
    B, H, Tq, Tk, D, Dv = 2, 3, 5, 7, 4, 6
    lead = (B * H,) if rank == 3 else (B, H)
    rng = np.random.default_rng(5)
    inputs = {"Q": rng.standard_normal(lead + (Tq, D)).astype(dtype),
              "Kt": rng.standard_normal(lead + (D, Tk)).astype(dtype),
              "V": rng.standard_normal(lead + (Tk, Dv)).astype(dtype)}

    def ref(q, kt, v, mask=None, causal=False):
        return _sdpa(scale=0.7, causal=causal)(q, kt.transpose(-1, -2), v, mask)
    for mask_dims in (None, (Tq, 1), (1, Tk), lead[:1] + (1,) * (rank - 2) + (Tk,)):
        ins = dict(inputs)
        if mask_dims:
            ins["mask"] = rng.standard_normal(mask_dims).astype(dtype)
        for causal in (False, True):
            check_op("FusedAttention", ins, lambda *a: ref(*a, causal=causal),
                     domain="aidge_interop", opset=23,
                     attrs={"scale": 0.7, "k_transposed": 1, "is_causal": int(causal)})


def test_fused_attention_masked_row_is_nan():
    """FusedAttention stands for a Softmax: a row whose every key is -inf is
    NaN, as softmax gives, where ONNX Attention gives 0."""
    inputs = _qkv((1, 1, 1, 2, 3, 2, 2), np.float32)
    inputs["mask"] = np.array([[0, 0, 0], [-np.inf] * 3], np.float32)
    model = make_model("FusedAttention", inputs, domain="aidge_interop", opset=23)
    y = aidge_interop.load_onnx(model).forward(list(inputs.values()))[0]
    q, k, v, m = (torch.tensor(a) for a in inputs.values())
    ref = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(2) + m, -1) @ v
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isnan(y[0, 0, 1]).all() and np.isfinite(y[0, 0, 0]).all()


def test_attention_refusals():
    """Shapes that do not fit name the node and what was expected."""
    inputs = _qkv((1, 3, 2, 4, 4, 2, 2), np.float32)  # 3 query heads, 2 kv heads
    with pytest.raises(Exception, match="Hq a multiple of Hk"):
        aidge_interop.load_onnx(make_model("Attention", inputs, opset=23)).forward(
            list(inputs.values()))
    inputs = dict(_qkv((1, 2, 2, 4, 4, 2, 2), np.float32), mask=np.zeros((3, 4), np.float32))
    with pytest.raises(Exception, match="attn_mask of rank 2 does not broadcast"):
        aidge_interop.load_onnx(make_model("Attention", inputs, opset=23)).forward(
            list(inputs.values()))


def test_attention_native_or_body():
    """The 4-D form imports as the engine's Attention node; a form it does
    not take (softcap) as the ONNX function body."""
    inputs = _qkv((1, 2, 2, 3, 3, 2, 2), np.float32)
    g = aidge_interop.load_onnx(make_model("Attention", inputs, opset=23))
    assert [n["op_type"] for n in g.nodes()] == ["Attention"]
    g = aidge_interop.load_onnx(make_model("Attention", inputs, {"softcap": 2.0}, opset=23))
    assert "Attention" not in [n["op_type"] for n in g.nodes()]
    # absent optional inputs (empty names): still the native node; unnamed
    # extra outputs: the body
    model = make_model("Attention", inputs, opset=23, input_order=["Q", "K", "V", "", "", ""])
    g = aidge_interop.load_onnx(model)
    assert [n["op_type"] for n in g.nodes()] == ["Attention"]
    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    np.testing.assert_allclose(g.forward(list(inputs.values()))[0], ref, rtol=1e-5, atol=1e-6)
    model.graph.node[0].output.extend(["", ""])
    g = aidge_interop.load_onnx(model)
    assert "Attention" not in [n["op_type"] for n in g.nodes()]
    np.testing.assert_allclose(g.forward(list(inputs.values()))[0], ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the import-time rewrite

def _transformers():
    """(name, model, inputs, attention blocks) for the models whose exports the
    rewrite must recognise: nn.TransformerEncoder, and transformers' ViT,
    BERT (with a padding mask) and GPT-2 (causal) in eager and sdpa
    attention, small and with random weights, dropout 0."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    yield "encoder", torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), \
        (torch.randn(2, 9, 32),), 2
    ids = torch.randint(0, 100, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    for impl in ("eager", "sdpa"):
        yield f"vit-{impl}", tf.ViTModel(tf.ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            image_size=16, patch_size=4, attn_implementation=impl)), \
            (torch.randn(2, 3, 16, 16),), 2
        yield f"bert-{impl}", tf.BertModel(tf.BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            attn_implementation=impl)), (ids, mask), 2
        yield f"gpt2-{impl}", tf.GPT2Model(tf.GPT2Config(
            n_embd=32, n_layer=2, n_head=4, vocab_size=100, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, attn_implementation=impl)), (ids,), 2


def _step(module, x, g):
    """The first output and the parameters' gradients of sum(out * g)."""
    module.zero_grad()
    out = module(*x)
    out = out if isinstance(out, torch.Tensor) else out[0]
    (out * g).sum().backward()
    return out.detach(), [p.grad.clone() for p in module.parameters() if p.grad is not None]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", list(_transformers()), ids=lambda c: c[0])
def test_attention_rewrite(case, dtype, monkeypatch):
    """Each attention block of the exported model becomes one FusedAttention
    (no Softmax left), and a training step (the output, every parameter's
    gradient) matches the unrewritten graph's and torch's. In float64 within
    torch.testing.assert_close's defaults (rtol 1e-7, atol 1e-7): the math
    is the same. In float32 the outputs within 1e-5 (op_harness's wrapped
    training step), and the gradients against the same step in float64,
    each at most a few times as far from it as torch's float32 gradient
    (see below): the fused node sums in another order (the scale in the
    GEMM, row blocks, the softmax's sums) and a parameter gradient summed
    over every position carries the difference of thousands of roundings."""
    import aidge_interop.onnx.importer as importer

    name, model, x, blocks = case
    model = model.to(dtype).train()
    x = tuple(v.to(dtype) if v.is_floating_point() else v for v in x)
    fused = aidge_interop.wrap(model, x)
    ops = [n["op_type"] for n in fused._graph.nodes()]
    softmax32 = name == "vit-eager" and dtype == torch.float64
    if softmax32:
        # softmax(dtype=float32).to(float64): a Softmax in float32 between two
        # Casts that change the type, not an attention block in float64
        assert ops.count("Softmax") == blocks and "FusedAttention" not in ops
    else:
        assert ops.count("FusedAttention") == blocks and "Softmax" not in ops, name
    monkeypatch.setattr(importer, "fuse_attention", lambda proto, opset: (proto, []))
    plain = aidge_interop.wrap(model, x)
    assert "FusedAttention" not in [n["op_type"] for n in plain._graph.nodes()]
    out = model(*x)
    g = torch.randn_like(out if isinstance(out, torch.Tensor) else out[0])
    y_t, g_t = _step(model, x, g)
    y_p, g_p = _step(plain, x, g)
    y_f, g_f = _step(fused, x, g)
    exact = dtype == torch.float64 and not softmax32  # (else float32 roundings inside)
    tol = {} if exact else {"rtol": 1e-5, "atol": 1e-5}
    gtol = {} if exact else {"rtol": 1e-4, "atol": 1e-5}
    for y in (y_p, y_t):
        torch.testing.assert_close(y_f, y, **tol)
    assert len(g_f) == len(g_p) == len(g_t)
    if exact:
        for a, b, c in zip(g_f, g_p, g_t):
            torch.testing.assert_close(a, b)
            torch.testing.assert_close(a, c)
        return
    if softmax32:  # (no float64 truth: torch's own softmax is in float32)
        for a, b, c in zip(g_f, g_p, g_t):
            torch.testing.assert_close(a, b, **gtol)
            torch.testing.assert_close(a, c, **gtol)
        return
    # float32: element by element, the fused, the unrewritten and torch's
    # gradients differ by more than any fixed tolerance now and then (an
    # element summed over every position with cancellation, e.g. a position
    # embedding's, carries ~1e-7 of the tensor's largest value, whatever
    # its own size). So each is measured against the truth, the same step in
    # float64: the fused graph's gradient may be at most 4x as far from it
    # as torch's (the sums' roundings are a random walk: torch's own error
    # is sometimes lucky), with a floor of 1e-6 of the tensor's largest value
    # and 1e-8 (a gradient 0 in exact arithmetic, a key bias's: softmax does
    # not change when a row is shifted, is rounding noise in both).
    _, g_64 = _step(copy.deepcopy(model).double(), tuple(
        v.double() if v.is_floating_point() else v for v in x), g.double())
    for a, b, c, d in zip(g_f, g_p, g_t, g_64):
        bound = 4 * (c.double() - d).abs().max() + 1e-6 * d.abs().max() + 1e-8
        for what, v in (("fused", a), ("unrewritten", b)):
            err = (v.double() - d).abs().max()
            assert err <= bound, (name, what, err.item(), bound.item())
