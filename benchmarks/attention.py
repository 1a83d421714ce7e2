"""The attention rewrite (aidge_interop/onnx/attention.py): a wrapped
transformer's training step and eval forward, engine against torch, with
the attention blocks fused (FusedAttention) and without (the exported
MatMul, Mul, Add, Softmax, MatMul nodes), 1 thread, in one process.

    python benchmarks/attention.py [--budget 3] [--threads 1]

Models, random weights, dropout 0 (attention dropout would sit between
Softmax and the last MatMul, which the rewrite leaves alone):
nn.TransformerEncoder (d 256, 4 heads, ff 1024, 4 layers, 128 tokens),
ViT (hidden 256, 4 layers, 4 heads, ff 1024, 64x64 images, patch 8: 65
tokens), BERT (hidden 256, 4 layers, 4 heads, ff 1024, 128 tokens, a padding
mask), batch 4. Per model: torch, the unfused and the fused wrapped
module, their calls interleaved and medians kept (timing.py); printed as
engine / torch ratios.
"""
import argparse

import torch

import aidge_interop
import aidge_interop.onnx.importer as importer
from timing import interleaved_medians


def models(attn):
    import transformers as tf

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0)
    yield "TransformerEncoder", torch.nn.TransformerEncoder(
        layer, 4, enable_nested_tensor=False), (torch.randn(4, 128, 256),)
    yield f"ViT ({attn})", tf.ViTModel(tf.ViTConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        image_size=64, patch_size=8, attn_implementation=attn)), (torch.randn(4, 3, 64, 64),)
    ids = torch.randint(0, 1000, (4, 128))
    mask = torch.ones(4, 128, dtype=torch.long)
    mask[1:, 100:] = 0
    yield f"BERT ({attn})", tf.BertModel(tf.BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation=attn)), (ids, mask)


def first(out):
    return out if isinstance(out, torch.Tensor) else out[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=3.0, help="seconds per measurement")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    aidge_interop.set_num_threads(args.threads)
    rewrite = importer.fuse_attention
    print(f"{'model':24} {'mode':6} {'unfused/torch':>14} {'fused/torch':>12} "
          f"{'fused/unfused':>14}")
    for attn in ("eager", "sdpa"):
        for name, model, x in models(attn):
            if name == "TransformerEncoder" and attn == "sdpa":
                continue
            model.train()
            fused = aidge_interop.wrap(model, x)
            importer.fuse_attention = lambda proto, opset: (proto, [])
            try:
                plain = aidge_interop.wrap(model, x)
            finally:
                importer.fuse_attention = rewrite
            for mode in ("train", "eval"):
                for m in (model, fused, plain):
                    m.train(mode == "train")

                def call(m):
                    if mode == "eval":
                        def run():
                            with torch.no_grad():
                                m(*x)
                    else:
                        def run():
                            m.zero_grad()
                            first(m(*x)).sum().backward()
                    return run
                t, p, f = interleaved_medians([call(model), call(plain), call(fused)],
                                              args.budget)
                print(f"{name:24} {mode:6} {p / t:14.2f} {f / t:12.2f} {f / p:14.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
