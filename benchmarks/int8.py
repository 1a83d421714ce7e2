"""Engine int8 forward against the engine's own float32 forward.

For each example model (LeNet, DS-CNN, ResNet-8) and the model suite's small
ViT (tests/models/zoo.py's vit_cls, its logits): the float32 engine graph
and its ``aidge_interop.quantize`` int8 graph, the same batch, timed
interleaved in one process (benchmarks/timing.py: medians of samples taken
turn by turn) at 1 and 2 engine threads; prints int8 / float32 per model
with the fast int8 kernels (the best path of the CPU) and, with --reference,
with the portable reference kernels too.

``--isa avx2`` measures as a CPU without AVX-512 would run (most laptops and
CI machines): the int8 kernels' AVX2 path, and float32 without the engine's
AVX-512 kernels and with OpenBLAS's AVX2 ("Haswell") kernels (OpenBLAS picks
them when loaded: the script restarts itself with ``OPENBLAS_CORETYPE``
set). Loops compiled with an AVX-512 clone (AI_WIDE_CLONES: activations,
softmax) keep it.

    PYTHONPATH=. python benchmarks/int8.py [--batch 16] [--budget 2] [--reference]
                                           [--isa best|avx2]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import aidge_interop  # noqa: E402
from aidge_interop import _C  # noqa: E402
from aidge_interop.examples import EXAMPLES  # noqa: E402
from aidge_interop.quant.quantization import _as_graph  # noqa: E402
from timing import interleaved_medians  # noqa: E402

PATH_NAMES = {0: "reference", 1: "plain", 2: "avx2", 3: "vnni"}


class _Logits(torch.nn.Module):
    """A transformers classifier called on its pixels, returning its logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(pixel_values=x).logits


def float_model(name):
    """The float model `name` in eval mode and its input shape (no batch):
    an example model, or "vit", the model suite's small ViT."""
    if name == "vit":
        from models.zoo import vit_cls

        return _Logits(vit_cls(no_dropout=True)[0]).eval(), (3, 32, 32)
    factory, shape, _ = EXAMPLES[name]
    return factory(seed=0).eval(), tuple(shape[1:])


def prepare(name, batch):
    """Model `name` (float_model) quantized (per-channel, the default): the
    QuantizedModel, the float32 engine graph in eval mode, a float batch and
    its int8 inputs."""
    model, shape = float_model(name)
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((64, *shape)).astype(np.float32)
    q = aidge_interop.quantize(model, calib)
    graph = _as_graph(model, [shape], "int8 benchmark")
    graph.training = False
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    return q, graph, x, q.quantize_inputs(x)


def bench(names, batch, budget, threads_list, reference, isa="best"):
    # quantize runs the torch model: its OpenMP workers would spin beside ours
    torch.set_num_threads(1)
    best = _C._set_quant_path(2 if isa == "avx2" else 3)
    _C._set_avx512(isa != "avx2")
    rows = []
    for name in names:
        q, graph, x, xq = prepare(name, batch)

        def f32():
            graph.forward([x])

        def int8():
            q.run(*xq)

        def int8_ref():
            _C._set_quant_path(0)
            q.run(*xq)
            _C._set_quant_path(best)

        for threads in threads_list:
            aidge_interop.set_num_threads(threads)
            fns = [f32, int8] + ([int8_ref] if reference else [])
            t = interleaved_medians(fns, budget_s=budget)
            row = (name, threads, t[0], t[1], t[2] if reference else None)
            rows.append(row)
            ref = f"  reference {t[2] / t[0]:6.1f}x" if reference else ""
            print(f"{name:8s} {threads} thread(s)  float32 {t[0] * 1e3:7.3f} ms  "
                  f"int8 {t[1] * 1e3:7.3f} ms  int8/float32 {t[1] / t[0]:5.2f} "
                  f"({PATH_NAMES[best]}){ref}", flush=True)
    aidge_interop.set_num_threads(1)
    _C._set_avx512(True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per measurement")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", default=["lenet", "ds_cnn", "resnet8", "vit"])
    ap.add_argument("--reference", action="store_true",
                    help="also time the portable reference kernels")
    ap.add_argument("--isa", choices=["best", "avx2"], default="best",
                    help="avx2: int8 and float32 kernels as on a CPU without AVX-512")
    args = ap.parse_args()
    if args.isa == "avx2" and os.environ.get("OPENBLAS_CORETYPE") != "Haswell":
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "OPENBLAS_CORETYPE": "Haswell"})
    bench(args.models, args.batch, args.budget, args.threads, args.reference, args.isa)


if __name__ == "__main__":
    main()
