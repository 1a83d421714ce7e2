"""The engine's own speedup from its thread pool, and torch's, on whole models.

For each model of the model suite (run.py's MODELS): eval forward and a
training step (forward, MSE loss, backward, SGD step), timed at 1 thread and
at N threads (``--threads``, default 2).

The engine is timed first, alone, with torch kept at one thread (the MSE loss
of the step runs in torch: tiny); torch is timed afterwards in a block of its
own. Unlike run.py, the two libraries do not alternate: each one's idle
threads spin after a job, so alternating them at more than one thread
measures their interference rather than their speedups. Within a block the
1- and N-thread samples alternate (timing.py), so load bursts spread over
both. Speedup = 1-thread time / N-thread time (above 1: faster).

    python benchmarks/threads.py [--threads 2] [--batch 16] [--budget 1.0]
                                 [--models LeNet,ResNet8]
"""
import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

import torch  # noqa: E402

import aidge_interop  # noqa: E402
from run import LR, MODELS, build_model, train_step  # noqa: E402
from timing import interleaved_medians  # noqa: E402


def fwd(model, x):
    def run():
        with torch.no_grad():
            return model(x)
    return run


def with_threads(fn, n, engine):
    """fn run with the engine (or torch) at n threads."""
    def run():
        if engine:
            aidge_interop.set_num_threads(n)
        else:
            torch.set_num_threads(n)
        return fn()
    return run


def model_cases(name, batch, engine):
    """(eval forward, training step) callables of one model on one library."""
    shape = MODELS[name][2]
    torch.manual_seed(0)
    x = torch.randn(batch, *shape)
    tm = build_model(name).eval()
    evalm = aidge_interop.wrap(copy.deepcopy(tm), [tuple(x.shape)]) if engine else tm
    tm_train = build_model(name).train()
    with torch.no_grad():
        y = torch.randn_like(tm_train(x))
    if engine:
        trainm = aidge_interop.wrap(copy.deepcopy(tm_train), [tuple(x.shape)])
        opt = aidge_interop.SGD(trainm, lr=LR)
    else:
        trainm, opt = tm_train, torch.optim.SGD(tm_train.parameters(), lr=LR)
    return fwd(evalm, x), train_step(trainm, opt, x, y)


def measure(names, batch, n, budget, engine):
    """{model: {"fwd": (t1, tn), "train": (t1, tn)}} in seconds."""
    torch.set_num_threads(1)
    aidge_interop.set_num_threads(1)
    results = {}
    for name in names:
        cases = dict(zip(("fwd", "train"), model_cases(name, batch, engine)))
        results[name] = {
            kind: tuple(interleaved_medians([with_threads(fn, 1, engine),
                                             with_threads(fn, n, engine)], budget))
            for kind, fn in cases.items()}
    torch.set_num_threads(1)
    aidge_interop.set_num_threads(1)
    return results


def report(title, results, n):
    print(f"\n{title}")
    print(f"{'model':<11} {'pass':<6} {'1 thread ms':>12} {f'{n} threads ms':>13} "
          f"{'speedup':>8}")
    for name, kinds in results.items():
        for kind, (t1, tn) in kinds.items():
            print(f"{name:<11} {kind:<6} {t1 * 1e3:12.3f} {tn * 1e3:13.3f} {t1 / tn:8.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="N, compared with 1")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--budget", type=float, default=1.0,
                        help="seconds of samples per measurement (both counts)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, of {','.join(MODELS)}")
    args = parser.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    print(f"batch {args.batch}, 1 vs {args.threads} threads, "
          f"engine then torch in separate blocks")
    report("engine (aidge_interop)", measure(names, args.batch, args.threads, args.budget,
                                             True), args.threads)
    report("torch", measure(names, args.batch, args.threads, args.budget, False),
           args.threads)


if __name__ == "__main__":
    main()
