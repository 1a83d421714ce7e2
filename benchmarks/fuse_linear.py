"""The recipe fuse_linear on transformers: training step and eval forward of
a ViT (transformers, random weights from a config, nothing downloaded) and
an nn.TransformerEncoder, wrapped without the recipe and with it (wrap's
default), each against torch: 1 thread, interleaved, medians, one process.

    python benchmarks/fuse_linear.py [--repeats 9]

Results: benchmarks/results/fuse-linear.md.
"""
import argparse
import statistics
import time

import torch

import aidge_interop
from aidge_interop.bridge import wrapping


def vit():
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                       intermediate_size=1024, image_size=64, patch_size=8)
    model = ViTModel(config, add_pooling_layer=False)
    model.config.return_dict = False  # tuples: the exporter's outputs

    class Hidden(torch.nn.Module):  # the last hidden state, a tensor
        def __init__(self):
            super().__init__()
            self.vit = model

        def forward(self, x):
            return self.vit(pixel_values=x)[0]

    return Hidden(), torch.randn(4, 3, 64, 64)


def encoder():
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, activation="gelu",
                                             batch_first=True, norm_first=True)
    return (torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
            torch.randn(4, 128, 256))


def step(model, x):
    model(x).square().mean().backward()


def forward(model, x):
    with torch.no_grad():
        model(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    aidge_interop.set_num_threads(1)
    for make in (vit, encoder):
        torch.manual_seed(0)
        net, x = make()
        recipes, wrapping._GRAPH_RECIPES = wrapping._GRAPH_RECIPES, ()
        try:
            before = aidge_interop.wrap(net, (x,))
        finally:
            wrapping._GRAPH_RECIPES = recipes
        models = {"torch": net, "before": before, "after": aidge_interop.wrap(net, (x,))}
        for mode, run in (("training step", step), ("eval forward", forward)):
            times = {k: [] for k in models}
            for m in models.values():
                m.train(run is step)
                run(m, x)  # warm-up
            for _ in range(args.repeats):
                for k, m in models.items():
                    t0 = time.perf_counter()
                    run(m, x)
                    times[k].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{make.__name__:8} {mode:13}: engine/torch {med['before'] / med['torch']:.2f} "
                  f"-> {med['after'] / med['torch']:.2f} (after/before "
                  f"{med['after'] / med['before']:.2f}; torch {1e3 * med['torch']:.0f} ms)",
                  flush=True)


if __name__ == "__main__":
    main()
