"""Issue 47, a transformer's training step outside its GEMMs: FusedAttention
reading Q, K, V and writing Y in the projections' layout (B, T, H, D)
(attributes bthd and y_bthd), and the import-time rewrite that gives it the
heads' Transposes and sdpa's two scale Muls (aidge_interop/onnx/attention.py).
Values and gradients against torch and against the unrewritten graph; the
threaded kernel bit for bit at 1 and 2 threads."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aidge_interop
from op_harness import check_op

DTYPES = [np.float32, np.float64]


def _sdpa_bthd(y_bthd, scale, causal, group):
    """torch's sdpa on (B, T, H, D) operands, Y as (B, T, H, Dv) or (B, H, T, Dv)."""
    def f(q, k, v, mask=None):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if group > 1:
            k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        if causal:  # (sdpa takes a mask or is_causal: the causal bias added to the mask)
            tq, tk = q.shape[-2], k.shape[-2]
            keep = torch.ones(tq, tk, dtype=torch.bool).tril()
            mask = mask.masked_fill(~keep, float("-inf"))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return y.transpose(1, 2) if y_bthd else y
    return f


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("y_bthd", [0, 1])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 2])
def test_fused_attention_bthd(dtype, y_bthd, causal, group):
    """Q (B, Tq, Hq, D), K (B, Tk, Hk, D), V (B, Tk, Hk, Dv) with bthd; Y
    (B, Tq, Hq, Dv) with y_bthd, else (B, Hq, Tq, Dv); grouped-query heads,
    a float mask, causal (whose first block writes the keys it does not see
    as 0 in dK and dV: rows Hk D apart); the output and dQ, dK, dV, dmask
    against torch. Tq 70 rows: more than one row block of the backward."""
    B, Hk, Tq, Tk, D, Dv = 2, 2, 70, 70, 8, 6
    Hq = Hk * group
    rng = np.random.default_rng(3)
    inputs = {"Q": rng.standard_normal((B, Tq, Hq, D)).astype(dtype),
              "K": rng.standard_normal((B, Tk, Hk, D)).astype(dtype),
              "V": rng.standard_normal((B, Tk, Hk, Dv)).astype(dtype),
              "mask": rng.standard_normal((B, 1, 1, Tk)).astype(dtype)}
    check_op("FusedAttention", inputs, _sdpa_bthd(y_bthd, 0.3, causal, group),
             domain="aidge_interop", opset=23,
             attrs={"scale": 0.3, "bthd": 1, "y_bthd": y_bthd, "is_causal": int(causal)})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_fused_attention_y_bthd_alone(dtype):
    """y_bthd without bthd: Q, Kt, V as (B, H, ., .), Y as (B, Tq, Hq, Dv)."""
    B, H, T, D = 2, 3, 9, 4
    rng = np.random.default_rng(4)
    inputs = {"Q": rng.standard_normal((B, H, T, D)).astype(dtype),
              "Kt": rng.standard_normal((B, H, D, T)).astype(dtype),
              "V": rng.standard_normal((B, H, T, D)).astype(dtype)}

    def ref(q, kt, v):
        return F.scaled_dot_product_attention(q, kt.transpose(-1, -2), v).transpose(1, 2)
    check_op("FusedAttention", inputs, ref, domain="aidge_interop", opset=23,
             attrs={"k_transposed": 1, "y_bthd": 1})


def test_fused_attention_bthd_refusals():
    """bthd with k_transposed, or on rank-3 operands: a clear error naming the node."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    with pytest.raises(Exception, match="k_transposed"):
        check_op("FusedAttention", {"Q": q, "K": q, "V": q}, None, domain="aidge_interop",
                 opset=23, attrs={"bthd": 1, "k_transposed": 1})
    q3 = q[0]
    with pytest.raises(Exception, match="ranks 3, 3, 3; all 4 expected"):
        check_op("FusedAttention", {"Q": q3, "K": q3, "V": q3}, None, domain="aidge_interop",
                 opset=23, attrs={"bthd": 1})


def test_fused_attention_bthd_threads():
    """The threaded forward and backward (planes over the pool) give the same
    bits at 1 and 2 threads."""
    from op_harness import make_model

    B, H, T, D = 2, 4, 33, 8
    rng = np.random.default_rng(1)
    ins = {n: rng.standard_normal((B, T, H, D)).astype(np.float32) for n in ("Q", "K", "V")}
    model = make_model("FusedAttention", ins, {"bthd": 1, "y_bthd": 1, "is_causal": 1}, {}, 1,
                       "aidge_interop", 23, None)
    gy = rng.standard_normal((B, T, H, D)).astype(np.float32)
    runs = []
    old = aidge_interop.get_num_threads()
    try:
        for threads in (1, 2):
            aidge_interop.set_num_threads(threads)
            g = aidge_interop.load_onnx(model)
            y = g.forward(list(ins.values()), need_backward=True, input_grads=True)[0]
            runs.append([y] + list(g.backward([gy])))
    finally:
        aidge_interop.set_num_threads(old)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def _bert_vit():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    yield "bert-sdpa", tf.BertModel(tf.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa"), add_pooling_layer=False), (ids, mask)
    yield "vit-sdpa", tf.ViTModel(tf.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=16, patch_size=4, attn_implementation="sdpa"),
        add_pooling_layer=False), (torch.randn(2, 3, 16, 16),)


@pytest.mark.parametrize("case", list(_bert_vit()), ids=lambda c: c[0])
def test_rewrite_takes_head_transposes_and_scales(case, monkeypatch):
    """sdpa's export (BERT with a padding mask, ViT): the Transposes of Q, K,
    V into heads and the two Muls by sqrt(scale) are in the FusedAttention
    (bthd, one scale); no Mul is left in the attention and the Shape that
    read the transposed Q reads Q's own shape, permuted. Float64: the output
    and every parameter's gradient of a training step as the unrewritten
    graph's and torch's (assert_close's defaults)."""
    import aidge_interop.onnx.importer as importer

    name, model, x = case
    model = model.double().train()
    x = tuple(v.double() if v.is_floating_point() else v for v in x)
    fused = aidge_interop.wrap(model, x)
    nodes = fused._graph.nodes()
    att = [n for n in nodes if n["op_type"] == "FusedAttention"]
    assert len(att) == 2
    assert not [n for n in nodes if n["op_type"] == "Mul" and "attention" in n["name"]]
    # per layer only the output's Transpose stays (a Reshape sits between it and the node)
    assert sum(n["op_type"] == "Transpose" and "attention" in n["name"] and
               "proj" not in n["name"] and "query" not in n["name"] and
               "key" not in n["name"] and "value" not in n["name"] for n in nodes) == 2
    monkeypatch.setattr(importer, "fuse_attention", lambda proto, opset: (proto, []))
    plain = aidge_interop.wrap(model, x)
    out = model(*x)[0]
    g = torch.randn_like(out)
    results = []
    for m in (model, plain, fused):
        m.zero_grad()
        y = m(*x)[0]
        (y * g).sum().backward()
        results.append((y.detach(), [p.grad.clone() for p in m.parameters()
                                     if p.grad is not None]))
    (y_t, g_t), (y_p, g_p), (y_f, g_f) = results
    torch.testing.assert_close(y_f, y_p)
    torch.testing.assert_close(y_f, y_t)
    assert len(g_f) == len(g_p) == len(g_t)
    for a, b, c in zip(g_f, g_p, g_t):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)
