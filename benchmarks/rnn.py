"""Recurrent layers: import time against sequence length, and an LSTM's
forward + backward time, engine (wrap) against torch, 1 thread.

    python benchmarks/rnn.py [--import-steps 1000] [--budget 2]

1. ``load_onnx`` of an nn.LSTM(64, 128) exported (TorchScript) for
   ``--import-steps`` time steps, batch 8: best of 3 (an engine that unrolls
   the layer over time imports in time and size growing with the length).
2. nn.LSTM(64, 128), 100 steps, batch 8: one forward + backward (gradients
   of the input and every weight) of the wrapped module and of torch, the
   calls interleaved and medians kept (timing.py).
"""
import argparse
import copy
import io
import time

import torch
import torch.nn as nn

import aidge_interop
from timing import interleaved_medians


def import_seconds(steps, batch=8):
    lstm = nn.LSTM(64, 128)
    buf = io.BytesIO()
    torch.onnx.export(lstm, (torch.randn(steps, batch, 64),), buf, dynamo=False)
    data = buf.getvalue()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        g = aidge_interop.load_onnx(data)
        best = min(best, time.perf_counter() - t0)
    return best, len(g.nodes())


def step_seconds(budget, steps=100, batch=8):
    torch.manual_seed(0)
    model = nn.LSTM(64, 128)
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [(steps, batch, 64)])
    x = torch.randn(steps, batch, 64)
    dy = torch.randn(steps, batch, 128)

    def step(m):
        xi = x.clone().requires_grad_()
        y, _ = m(xi)
        y.backward(dy)
    return interleaved_medians([lambda: step(wrapped), lambda: step(model)], budget_s=budget)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--import-steps", type=int, default=1000)
    ap.add_argument("--budget", type=float, default=2.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    aidge_interop.set_num_threads(1)
    seconds, nodes = import_seconds(args.import_steps)
    print(f"load_onnx, nn.LSTM(64, 128) over {args.import_steps} steps: {seconds:.3f} s, "
          f"{nodes} engine nodes")
    engine, ref = step_seconds(args.budget)
    print(f"forward + backward, nn.LSTM(64, 128), 100 steps, batch 8, 1 thread: "
          f"engine {engine * 1e3:.2f} ms, torch {ref * 1e3:.2f} ms, "
          f"ratio {engine / ref:.2f}")


if __name__ == "__main__":
    main()
