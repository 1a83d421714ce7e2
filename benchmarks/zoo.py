"""The model zoo of tests/models/zoo.py (transformers models from tiny
configs, ordinary torch modules) wrapped as users call them: eval forward
and a training step (forward, a sum-of-squares loss over the float outputs,
backward), engine against torch at the same thread count, interleaved
medians (timing.py), ratios engine / torch.

With ``--errors``, also how far the engine is from torch per model: the
eval outputs, every parameter gradient of a training step, and the eval
outputs after one SGD step (lr 0.01) on each side; each the largest
absolute difference over the leaf's (or parameter's) largest magnitude. A
gradient that is zero in exact arithmetic (attention's key bias: softmax
ignores a constant) is rounding noise on both sides, so a parameter's
gradient error is relative to at least 1/1000 of the model's largest
gradient.

    python benchmarks/zoo.py [--threads 1] [--models bert_cls_mask,vit_cls] [--budget 0.3]
                             [--errors]
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


def _rel(a, b, floor=1e-30) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(floor)).item()


def _out_error(engine, model, args, kwargs) -> float:
    with torch.no_grad():
        outs = [t for t in flatten(engine(*args, **kwargs))[0] if t.is_floating_point()]
        refs = [t for t in flatten(model(*args, **kwargs))[0] if t.is_floating_point()]
    return max((_rel(a, b) for a, b in zip(outs, refs)), default=0.0)


def errors(engine, model, args, kwargs) -> tuple[float, float, float]:
    """(eval, gradients, after one SGD step) largest relative errors of the
    engine against torch; both are stepped."""
    engine.eval(), model.eval()
    ev = _out_error(engine, model, args, kwargs)
    engine.train(), model.train()
    ps = dict(model.named_parameters())
    for m in (engine, model):
        m.zero_grad(set_to_none=True)
        _loss(m(*args, **kwargs)).backward()
    pairs = [(p.grad, ps[n].grad) for n, p in engine.named_parameters()
             if p.grad is not None and ps[n].grad is not None]
    floor = 1e-3 * max((g.abs().max().item() for _, g in pairs), default=0.0)
    gr = max((_rel(a, b, floor) for a, b in pairs), default=0.0)
    for m in (engine, model):
        torch.optim.SGD([p for p in m.parameters() if p.grad is not None], lr=0.01).step()
    engine.eval(), model.eval()
    return ev, gr, _out_error(engine, model, args, kwargs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--budget", type=float, default=0.3, help="timing seconds per case")
    ap.add_argument("--errors", action="store_true",
                    help="also the eval, gradient and after-SGD errors against torch")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    aidge_interop.set_num_threads(args.threads)
    names = [n for n in args.models.split(",") if n] or list(ZOO)
    print(f"{'model':28s} {'eng fwd':>9s} {'torch fwd':>9s} {'ratio':>6s}   "
          f"{'eng train':>9s} {'torch train':>11s} {'ratio':>6s}"
          + (f"   {'err eval':>8s} {'err grad':>8s} {'err SGD':>8s}" if args.errors else "")
          + f"   (ms, {args.threads} thread(s))")
    ratios = {"eval": [], "train": []}
    for name in names:
        model, inputs = ZOO[name](no_dropout=True)
        call_args, call_kwargs = inputs(2)[:2]
        try:
            engine = aidge_interop.wrap(model, call_args, kwargs=call_kwargs)
        except Exception as exc:  # the zoo's known limitations (tests/test_zoo.py)
            print(f"{name:28s} does not wrap: {str(exc).splitlines()[0][:90]}")
            continue
        # errors first: the timing loops run each side a different number of
        # times, which moves BatchNorm's running statistics apart
        errs = errors(engine, model, call_args, call_kwargs) if args.errors else ()
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
        line = (f"{name:28s} {ef * 1e3:9.3f} {tf * 1e3:9.3f} {ef / tf:6.2f}   "
                f"{et * 1e3:9.3f} {tt * 1e3:11.3f} {et / tt:6.2f}")
        if errs:
            line += "   " + " ".join(f"{e:8.1e}" for e in errs)
        print(line)
    for mode, rs in ratios.items():
        if rs:
            geo = math.exp(sum(map(math.log, rs)) / len(rs))
            print(f"{mode}: geomean ratio {geo:.2f}, max {max(rs):.2f} over {len(rs)} models")


if __name__ == "__main__":
    main()
