"""Time to draw the engine's graph (layout + SVG), against the 1 s target.

For each model of the suite (as imported, and after the recipes) and for a
deep residual graph of about 300 nodes (tests/graph_builders.py), the median
time of :func:`aidge_interop.visualize.render` and of writing the file.

    python benchmarks/bench_visualize.py [--repeat 5] [--nodes 300]
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from aidge_interop import load_onnx, recipes  # noqa: E402
from aidge_interop.compare.locate import torch_graph  # noqa: E402
from aidge_interop.visualize import render  # noqa: E402
from graph_builders import residual_chain  # noqa: E402
from models import SAMPLE_SHAPES  # noqa: E402


def median_ms(fn, repeat):
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=300, help="size of the residual graph")
    args = parser.parse_args()
    graphs = []
    for name, (factory, shape) in SAMPLE_SHAPES.items():
        x = torch.zeros((1,) + shape)
        for fused in (False, True):
            graph, _, _ = torch_graph(factory().eval(), [x], "bench")
            graph.forward(x.numpy())
            if fused:
                for r in ("constant_fold", "fuse_batchnorm", "remove_flatten", "fuse_activation"):
                    recipes.RECIPES[r](graph)
            graphs.append((name + (" (recipes)" if fused else ""), graph))
    big = load_onnx(residual_chain(max(args.nodes // 5, 1)))
    big.forward(np.zeros((1, 4, 6, 6), np.float32))
    graphs.append((f"residual chain", big))
    print(f"{'graph':24s} {'nodes':>6s} {'render ms':>10s} {'write ms':>9s}  (target: < 1000 ms)")
    with tempfile.TemporaryDirectory() as tmp:
        for name, graph in graphs:
            t_render = median_ms(lambda: render(graph), args.repeat)
            t_write = median_ms(lambda: graph.visualize(Path(tmp) / "g.svg"), args.repeat)
            print(f"{name:24s} {len(graph.nodes()):6d} {t_render:10.1f} {t_write:9.1f}")


if __name__ == "__main__":
    main()
