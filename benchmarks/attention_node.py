"""The FusedAttention node alone against torch's scaled_dot_product_attention,
1 thread, process CPU time (steadier than wall time on a shared machine):
forward (keeping P for the backward) and forward + backward, at the
attention shapes of run.py's transformers (head dim 64, Q, K, V in the
projections' layout (B, T, H, D), as the rewrite gives them: bthd, y_bthd).
Engine and torch samples alternate; medians of ``n``. GF/s counts the two
products of the forward and the four of the backward. The engine runs
twice, on its float32 tiles (kernels/attn_tiles.c) and on their reference
(the GEMMs of kernels/gemm.h: ``_C._set_fast_kernels(False)``), alternating
with torch in the same rounds; "ref/tiles" is the ratio of their forward +
backward times.

    python benchmarks/attention_node.py [n]
"""
import statistics as S
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import aidge_interop  # noqa: E402
from aidge_interop import _C  # noqa: E402
from op_harness import make_model  # noqa: E402

SHAPES = {  # name: (B, T, H, D)
    "ViT-256 (65 tokens, b8)": (8, 65, 4, 64),
    "ViT-384 (145 tokens, b4)": (4, 145, 6, 64),
    "BERT/GPT-2/encoder (128 tokens, b8)": (8, 128, 4, 64),
}


def _cpu(fn, calls):
    t = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t) / calls


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    torch.set_num_threads(1)
    aidge_interop.set_num_threads(1)
    print(f"{'shape':<38}{'engine fwd':>11}{'fwd+bwd':>9}{'GF/s':>6}"
          f"{'ref fwd':>9}{'fwd+bwd':>9}{'GF/s':>6}"
          f"{'torch fwd':>11}{'fwd+bwd':>9}{'GF/s':>6}{'ratio':>7}{'ref/tiles':>10}")
    for name, (B, T, H, D) in SHAPES.items():
        rng = np.random.default_rng(0)
        ins = {k: rng.standard_normal((B, T, H, D)).astype(np.float32) for k in "QKV"}
        go = rng.standard_normal((B, T, H, D)).astype(np.float32)
        g = aidge_interop.load_onnx(make_model("FusedAttention", ins, {"bthd": 1, "y_bthd": 1},
                                               domain="aidge_interop", opset=23))
        ts = [torch.tensor(a, requires_grad=True) for a in ins.values()]
        tgo = torch.tensor(go)

        def e_fwd():
            g.forward(list(ins.values()), need_backward=True, input_grads=True)

        def e_step():
            e_fwd()
            g.backward([go])

        def t_fwd():
            q, k, v = (t.transpose(1, 2) for t in ts)
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2)

        def t_step():
            for t in ts:
                t.grad = None
            t_fwd().backward(tgo)

        def ref(f):
            def run():
                _C._set_fast_kernels(False)
                try:
                    f()
                finally:
                    _C._set_fast_kernels(True)
            return run

        r_fwd, r_step = ref(e_fwd), ref(e_step)
        samples = {f: [] for f in (e_fwd, e_step, r_fwd, r_step, t_fwd, t_step)}
        for f in samples:
            f()
        for _ in range(n):
            for f, acc in samples.items():
                acc.append(_cpu(f, 5))
        ef, es, rf, rs, tf, tst = (S.median(samples[f]) for f in samples)
        flop = 3 * 2 * 2 * B * H * T * T * D
        print(f"{name:<38}{ef * 1e3:9.3f}ms{es * 1e3:7.3f}ms{flop / es / 1e9:6.0f}"
              f"{rf * 1e3:7.3f}ms{rs * 1e3:7.3f}ms{flop / rs / 1e9:6.0f}"
              f"{tf * 1e3:9.3f}ms{tst * 1e3:7.3f}ms{flop / tst / 1e9:6.0f}{es / tst:7.2f}"
              f"{rs / es:10.2f}", flush=True)


if __name__ == "__main__":
    main()
