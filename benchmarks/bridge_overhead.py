"""Where a wrapped one-node model's backward time goes (the autograd bridge).

A wrapped Relu on 16 floats against torch's, and against floors that leave
parts out, all in one process, interleaved (timing.py), 1 thread:

- ``torch``: torch's Relu, its backward.
- ``floor``: a Python ``torch.autograd.Function`` whose backward returns a
  tensor made beforehand (the node shortcut of bridge/wrapping.py applied):
  torch's cost of a Python autograd node, nothing of ours.
- ``floor + saved output``: the same saving its output (what the bridge does
  when the graph's backward reads its outputs, as Relu's does).
- ``wrapped, no engine call``: the bridge's node, its backward returning a
  tensor made beforehand instead of calling the engine.
- ``wrapped``: the bridge as it is.

Per call (µs) of the backward alone (``out.backward(g, retain_graph=True)``)
and of a forward + backward.

    python benchmarks/bridge_overhead.py [--budget 2]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import aidge_interop  # noqa: E402
from aidge_interop.bridge import wrapping  # noqa: E402
from timing import interleaved_medians  # noqa: E402

PREMADE = torch.randn(16)


def python_function(save):
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.relu()
            if save:
                ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            if save:
                ctx.saved_tensors  # noqa: B018
            return PREMADE

    Fn._backward_cls.apply = Fn.backward  # the bridge's node shortcut
    return Fn.apply


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    aidge_interop.set_num_threads(1)
    wrapped = [aidge_interop.wrap(torch.nn.ReLU(), [(16,)]) for _ in range(2)]
    node = wrapping._NODE_CLS
    bridge_backward = node.apply

    def premade_backward(ctx, *grads):
        return (None, None, PREMADE)

    contenders = {  # name: (callable giving the output, the node's backward or None)
        "torch": (torch.relu, None),
        "floor": (python_function(False), None),
        "floor + saved output": (python_function(True), None),
        "wrapped, no engine call": (wrapped[0], premade_backward),
        "wrapped": (wrapped[1], bridge_backward),
    }
    x, g = torch.randn(16), torch.randn(16)
    print(f"{'per call (us)':<26}{'backward':>10}{'fwd + bwd':>11}")
    results = {}
    for kind in ("backward", "fwd + bwd"):
        fns = []
        for fn, backward in contenders.values():
            xg = x.clone().requires_grad_(True)

            def run(fn=fn, backward=backward, xg=xg, out=[None]):
                if backward is not None:
                    node.apply = backward
                if kind == "backward":
                    if out[0] is None:
                        out[0] = fn(xg)
                    out[0].backward(g, retain_graph=True)
                else:
                    fn(xg).backward(g)
            fns.append(run)
        results[kind] = interleaved_medians(fns, args.budget, max_samples=500)
    node.apply = bridge_backward
    for i, name in enumerate(contenders):
        print(f"{name:<26}{results['backward'][i] * 1e6:10.2f}{results['fwd + bwd'][i] * 1e6:11.2f}")


if __name__ == "__main__":
    main()
