"""Conversion time of torch <-> engine tensors: 4 KiB and 64 MiB float32.

Conversion is a view (O(1)), so both sizes must cost the same: the target is
a large/small ratio of at most 2 and both under 10 us, in both directions.

    python benchmarks/bench_tensor.py [--repeat 20000]
"""
import argparse
import statistics
import time

import torch

from aidge_interop.tensor_converter import aidge_tensor_to_torch, torch_tensor_to_aidge


def _median_us(fn, repeat):
    for _ in range(min(1000, repeat)):
        fn()
    samples = []
    batch = 100
    for _ in range(max(1, repeat // batch)):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch * 1e6)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20000)
    args = parser.parse_args()

    sizes = {"4 KiB": 1024, "64 MiB": 16 * 1024 * 1024}
    rows = {}
    for label, n in sizes.items():
        t = torch.randn(n)
        a = torch_tensor_to_aidge(t)
        rows[label] = (
            _median_us(lambda: torch_tensor_to_aidge(t), args.repeat),
            _median_us(lambda: aidge_tensor_to_torch(a), args.repeat),
        )
    print(f"{'size':>8} | {'torch->aidge (us)':>18} | {'aidge->torch (us)':>18}")
    for label, (to_a, to_t) in rows.items():
        print(f"{label:>8} | {to_a:18.2f} | {to_t:18.2f}")
    small, large = rows["4 KiB"], rows["64 MiB"]
    r_a, r_t = large[0] / small[0], large[1] / small[1]
    print(f"{'ratio':>8} | {r_a:18.2f} | {r_t:18.2f}   (64 MiB / 4 KiB; target <= 2)")
    worst = max(max(v) for v in rows.values())
    ok = max(r_a, r_t) <= 2 and worst < 10
    print(f"target (ratio <= 2, every conversion < 10 us): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
