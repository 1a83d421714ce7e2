"""Accuracy of int8 quantization with per-tensor and per-channel weight
scales, against the float model, on scikit-learn's digits (8x8 images, no
download; 1437 training, 360 test images as in examples/quantized_lenet_export.py):

- ``lenet``: the LeNet of examples/quantized_lenet_export.py;
- ``mobilenet``: a small depthwise-separable (MobileNet-style) CNN with
  BatchNorm after every convolution, folded into the weights at quantization.

Both train a few seconds on one thread (seeded), calibrate on 200 training
images and evaluate on the test split, in both rescaling modes. Besides the
accuracy (360 images: one image is 0.28 point) it prints the int8 model's
top-1 agreement with the float model and its logit error (RMS of the
difference over the RMS of the float logits), which measure the
quantization itself. ``ds_cnn`` is the DS-CNN of aidge_interop.examples
(seeded weights, random BatchNorm statistics: widely different per-channel
ranges after folding) on normal random inputs, which has no labels:



    python benchmarks/quant_per_channel.py [--epochs 30] [--seeds 0 1 2]

The table of docs/quantization.md comes from this script.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

from aidge_interop import examples, wrap
from aidge_interop.quant import accuracy, quantize


def digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    return train_test_split(x, d.target.astype(np.int64), test_size=0.2, random_state=0,
                            stratify=d.target)


def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


def mobilenet(width=32):
    def ds(c_in, c_out, stride):
        return [nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False),
                nn.BatchNorm2d(c_in), nn.ReLU(),
                nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
    return nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                         nn.ReLU(), *ds(width, width, 1), *ds(width, 2 * width, 2),
                         *ds(2 * width, 2 * width, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(2 * width, 10))


def train(factory, x, y, epochs, seed):
    torch.manual_seed(seed)
    model = factory()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    for _ in range(epochs):
        for i in torch.randperm(len(xt)).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[i]), yt[i]).backward()
            opt.step()
    return model.eval()


def compare(model, x_cal, x, y, single_shift):
    """(float acc, [(acc, agreement, logit error)] per-tensor then per-channel)."""
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    engine = wrap(model, [(1, *x.shape[1:])]).eval()
    f = float(np.mean(ref.argmax(1) == y)) if y is not None else float("nan")
    rows = []
    for pc in (False, True):
        q = quantize(engine, x_cal, single_shift=single_shift, per_channel=pc)
        out = q(x)[0]
        acc = float(np.mean(out.argmax(1) == y)) if y is not None else float("nan")
        agree = float(np.mean(out.argmax(1) == ref.argmax(1)))
        err = float(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref ** 2)))
        rows.append((acc, agree, err))
    return f, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    torch.set_num_threads(1)
    x_train, x_test, y_train, y_test = digits()
    print(f"{'model':<10} {'seed':>4} {'rescale':<12} {'float':>6}  per-tensor: acc agree "
          "err     per-channel: acc agree err")
    cases = []
    for name, factory in (("lenet", lenet), ("mobilenet", mobilenet)):
        for seed in args.seeds:
            model = train(factory, x_train, y_train, args.epochs, seed)
            cases.append((name, seed, model, x_train[:200], x_test, y_test))
    for seed in args.seeds:
        model = examples.ds_cnn(seed).eval()
        x = np.random.default_rng(seed).standard_normal((320, 1, 49, 10)).astype(np.float32)
        cases.append(("ds_cnn", seed, model, x[:64], x[64:], None))
    for name, seed, model, x_cal, x, y in cases:
        for single_shift in (True, False):
            f, rows = compare(model, x_cal, x, y, single_shift)
            mode = "single shift" if single_shift else "fixed point"
            cells = "   ".join(f"{100 * a:6.2f}% {100 * g:6.2f}% {e:.4f}" for a, g, e in rows)
            print(f"{name:<10} {seed:>4} {mode:<12} {100 * f:6.2f}%  {cells}", flush=True)


if __name__ == "__main__":
    main()
