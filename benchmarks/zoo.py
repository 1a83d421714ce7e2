"""The model zoo of tests/models/zoo.py (transformers models from tiny
configs, ordinary torch modules) wrapped as users call them: eval forward
and a training step (forward, a sum-of-squares loss over the float outputs,
backward), engine against torch at the same thread count, interleaved
medians (timing.py), ratios engine / torch.

    python benchmarks/zoo.py [--threads 1] [--models bert_cls_mask,vit_cls] [--budget 0.3]
"""
import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

import aidge_interop  # noqa: E402
from aidge_interop.bridge.structure import flatten  # noqa: E402
from models.zoo import ZOO  # noqa: E402
from timing import interleaved_medians  # noqa: E402


def _loss(out):
    return sum(t.float().square().sum() for t in flatten(out)[0] if t.is_floating_point())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--budget", type=float, default=0.3, help="timing seconds per case")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    aidge_interop.set_num_threads(args.threads)
    names = [n for n in args.models.split(",") if n] or list(ZOO)
    print(f"{'model':28s} {'eng fwd':>9s} {'torch fwd':>9s} {'ratio':>6s}   "
          f"{'eng train':>9s} {'torch train':>11s} {'ratio':>6s}   (ms, {args.threads} thread(s))")
    ratios = {"eval": [], "train": []}
    for name in names:
        model, inputs = ZOO[name](no_dropout=True)
        call_args, call_kwargs = inputs(2)[:2]
        try:
            engine = aidge_interop.wrap(model, call_args, kwargs=call_kwargs)
        except Exception as exc:  # the zoo's known limitations (tests/test_zoo.py)
            print(f"{name:28s} does not wrap: {str(exc).splitlines()[0][:90]}")
            continue
        row = {}
        for mode in ("eval", "train"):
            fns = []
            for m in (engine, model):
                if mode == "eval":
                    m.eval()

                    def fn(m=m):
                        with torch.no_grad():
                            m(*call_args, **call_kwargs)
                else:
                    m.train()

                    def fn(m=m):
                        m.zero_grad(set_to_none=False)
                        _loss(m(*call_args, **call_kwargs)).backward()
                fns.append(fn)
            row[mode] = interleaved_medians(fns, budget_s=args.budget)
            ratios[mode].append(row[mode][0] / row[mode][1])
        (ef, tf), (et, tt) = row["eval"], row["train"]
        print(f"{name:28s} {ef * 1e3:9.3f} {tf * 1e3:9.3f} {ef / tf:6.2f}   "
              f"{et * 1e3:9.3f} {tt * 1e3:11.3f} {et / tt:6.2f}")
    for mode, rs in ratios.items():
        if rs:
            geo = math.exp(sum(map(math.log, rs)) / len(rs))
            print(f"{mode}: geomean ratio {geo:.2f}, max {max(rs):.2f} over {len(rs)} models")


if __name__ == "__main__":
    main()
