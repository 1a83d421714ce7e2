"""The transformers of run.py's ``transformers`` section: the training step
(zero_grad, forward, MSE loss, backward, SGD step), engine against torch, at
one thread, in process CPU time (``time.process_time``) rather than wall
time: on a machine other programs load, a step longer than the scheduler's
slice waits for them, and wall-clock medians spread by 0.1 and more, while
the CPU time the step itself takes moves by a few percent. Samples of the
two libraries alternate; medians of ``n`` each.

    python benchmarks/transformers_cpu_time.py [n] [name]

``name``: only the models whose name contains it (e.g. ViT).
"""
import copy
import statistics as S
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import aidge_interop  # noqa: E402
import run as R  # noqa: E402

def _train(model, optimizer, args, kwargs, y):
    def step():
        optimizer.zero_grad()
        F.mse_loss(R._main_output(model(*args, **kwargs)), y).backward()
        optimizer.step()
    return step


def main():
    R.set_threads(1)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    for name, factory in R.TRANSFORMERS.items():
        if only not in name:
            continue
        build, inputs = factory()
        torch.manual_seed(0)
        args, kwargs = inputs()
        tm = build().train()
        am = aidge_interop.wrap(copy.deepcopy(tm), args, kwargs=kwargs)
        with torch.no_grad():
            y = torch.randn_like(R._main_output(tm(*args, **kwargs)))
        steps = (_train(am, aidge_interop.SGD(am, lr=R.LR), args, kwargs, y),
                 _train(tm, torch.optim.SGD(tm.parameters(), lr=R.LR), args, kwargs, y))
        times = ([], [])
        for step in steps:  # (untimed: the first call plans)
            step()
        for _ in range(n):
            for step, acc in zip(steps, times):
                t = time.process_time()
                step()
                acc.append(time.process_time() - t)
        eng, ref = (S.median(t) for t in times)
        print(f"{name:<32} engine {1e3 * eng:7.1f} ms  torch {1e3 * ref:7.1f} ms  "
              f"ratio {eng / ref:.3f}", flush=True)


if __name__ == "__main__":
    main()
