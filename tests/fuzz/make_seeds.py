"""Writes the fuzzer's seed corpus, tests/fuzz/seeds/: valid models of the suites.

- ONNX's backend node tests that tests/test_onnx_backend.py expects to
  pass (every node test of the installed onnx but its exclusions: every
  operator and data type the engine has, with their attributes), and
- small torch models exported the way ``wrap`` exports them: the suites'
  perceptron and LeNet, and a few blocks (conv/BN/pool, residual add,
  LayerNorm/Softmax/GELU) that chain operators.

Only seeds the engine loads, runs forward and backward on without error are
kept (the fuzzer's mutations start from working models). Run once after the
engine gains operators: ``python tests/fuzz/make_seeds.py``.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEEDS = HERE / "seeds"
MAX_SEED_BYTES = 300_000


def _node_test_models():
    import onnx
    import warnings

    from onnx.backend.test.loader import load_model_tests

    warnings.simplefilter("ignore")  # the node-test generators' own overflow warnings

    sys.path.insert(0, str(HERE.parent))
    from test_onnx_backend import _excluded

    for t in load_model_tests(kind="node"):
        if _excluded(t.name + "_cpu"):
            continue
        model = t.model if t.model is not None else onnx.load(Path(t.model_dir) / "model.onnx")
        yield t.name, model.SerializeToString()


def _torch_models():
    import torch
    from torch import nn

    from aidge_interop.examples import lenet, perceptron
    from aidge_interop.bridge.wrapping import export_onnx_bytes

    class ConvBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.f = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                   nn.MaxPool2d(2), nn.Conv2d(4, 4, 3, groups=2),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

        def forward(self, x):
            return self.f(x)

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 3, 3, padding=1)
            self.b = nn.AvgPool2d(2)

        def forward(self, x):
            return self.b(torch.relu(self.a(x) + x)).sum(dim=(2, 3))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.qkv(self.norm(x)).split(8, dim=-1)
            a = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)
            return nn.functional.gelu(a @ v).reshape(x.shape[0], -1)

    torch.manual_seed(0)
    models = {"perceptron": (perceptron(), (2, 16)), "lenet": (lenet(), (1, 1, 32, 32)),
              "convblock": (ConvBlock(), (2, 2, 8, 8)), "residual": (Residual(), (2, 3, 6, 6)),
              "attention": (Attention(), (2, 4, 8))}
    for name, (model, shape) in models.items():
        yield name, export_onnx_bytes(model, [torch.randn(shape)])


def main():
    sys.path.insert(0, str(HERE))
    from harness import run_one

    SEEDS.mkdir(exist_ok=True)
    for old in SEEDS.glob("*.onnx"):
        old.unlink()
    kept = skipped = 0
    for source in (_node_test_models, _torch_models):
        for name, data in source():
            if len(data) > MAX_SEED_BYTES:
                skipped += 1
                continue
            try:
                run_one(data)
            except Exception as exc:  # noqa: BLE001 - a seed must run cleanly
                print(f"skipped {name}: {type(exc).__name__}: {exc}")
                skipped += 1
                continue
            digest = hashlib.sha1(data).hexdigest()[:8]
            (SEEDS / f"{name}-{digest}.onnx").write_bytes(data)
            kept += 1
    print(f"{kept} seeds in {SEEDS} ({skipped} skipped)")


if __name__ == "__main__":
    main()
