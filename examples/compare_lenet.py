"""Main job: LeNet on PyTorch and on the aidge_interop engine, side by side.

Wraps a LeNet (random weights, fixed seed), then for a few SGD steps feeds
both the same batch and compares outputs, loss, input gradients and every
parameter gradient; prints the greatest differences and the time of each
side.

    python examples/compare_lenet.py [--steps 5] [--batch 8] [--dtype float64]
"""
import argparse
import time

import torch
import torch.nn as nn

import aidge_interop


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def max_rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    aidge_interop.set_num_threads(1)

    model = LeNet().to(dtype)
    engine = aidge_interop.wrap(model, [(1, 1, 32, 32)])
    opt_t = torch.optim.SGD(model.parameters(), lr=0.01)
    opt_e = aidge_interop.SGD(engine, lr=0.01)
    print(f"LeNet, batch {args.batch}, {args.dtype}, {args.steps} SGD steps; "
          f"engine GEMM: {aidge_interop._C.gemm_backend()}")
    print(f"{'step':>4} {'output':>10} {'loss':>10} {'input grad':>11} {'worst param grad':>28}"
          f" {'torch ms':>9} {'engine ms':>10}")
    for step in range(args.steps):
        x = torch.randn(args.batch, 1, 32, 32, dtype=dtype)
        label = torch.ones(args.batch, 10, dtype=dtype)
        results, times = [], []
        for m, opt in ((model, opt_t), (engine, opt_e)):
            xi = x.clone().requires_grad_(True)
            opt.zero_grad()
            t0 = time.perf_counter()
            out = m(xi)
            loss = nn.functional.mse_loss(out, label)
            loss.backward()
            times.append((time.perf_counter() - t0) * 1e3)
            results.append((out.detach(), loss.detach(), xi.grad,
                            {n: p.grad.clone() for n, p in m.named_parameters()}))
            opt.step()
        (o1, l1, g1, p1), (o2, l2, g2, p2) = results
        worst = max(((max_rel(p2[n], p1[n]), n) for n in p1))
        print(f"{step:>4} {max_rel(o2, o1):10.2e} {max_rel(l2, l1):10.2e} {max_rel(g2, g1):11.2e}"
              f" {worst[0]:10.2e} ({worst[1]:>15}) {times[0]:9.2f} {times[1]:10.2f}")
    print("(relative differences: max |engine - torch| / max |torch|)")


if __name__ == "__main__":
    main()
