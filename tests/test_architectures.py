"""Architectures outside the model suite, each built from operators a user's
model brings (HardSwish and squeeze-excitation, GroupNorm, bilinear
upsampling and concatenation, attention with a class token, PReLU and
dilated 1-D convolutions, transposed convolutions, PixelShuffle, L2
normalisation): wrapped, then ModelTester's SGD steps against torch in
train and eval mode (outputs, loss, input and parameter gradients), and the
fused inference graph of eval mode against torch's outputs."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import aidge_interop
from aidge_interop.testing import ModelTester


class SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.f1, self.f2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x):
        w = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.f2(F.relu(self.f1(w))))


class InvertedResidual(nn.Module):
    def __init__(self, c, e):
        super().__init__()
        self.pw = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False),
                                nn.BatchNorm2d(e), nn.Hardswish())
        self.se = SqueezeExcite(e)
        self.pj = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.pj(self.se(self.dw(self.pw(x))))


class MobileNetV3ish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.Hardswish())
        self.blocks = nn.Sequential(InvertedResidual(16, 32), InvertedResidual(16, 48))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 32),
                                  nn.Hardswish(), nn.Linear(32, 10))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


class TinyUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU())
        self.e2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.d1 = nn.Sequential(nn.Conv2d(24, 8, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(F.max_pool2d(a, 2))
        return self.out(self.d1(torch.cat([a, self.up(b)], 1)))


class TinyViT(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, 4)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 5, d))
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 5)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), p], 1) + self.pos
        return self.head(self.norm(self.enc(t))[:, 0])


class DilatedTCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 8, 3, padding=2, dilation=2)
        self.c2 = nn.Conv1d(8, 8, 3, padding=4, dilation=4)
        self.prelu, self.fc = nn.PReLU(8), nn.Linear(8, 3)

    def forward(self, x):
        y = self.prelu(self.c1(x))
        return self.fc((y + F.elu(self.c2(y))).mean(-1))


class ConvAutoencoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.LeakyReLU(0.1),
                                 nn.Conv2d(8, 16, 3, 2, 1), nn.SiLU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.ReLU(),
                                 nn.ConvTranspose2d(8, 1, 4, 2, 1), nn.Sigmoid())

    def forward(self, x):
        return self.dec(self.enc(x))


class PixelShuffleSR(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 12, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        y = self.c2(F.pixel_shuffle(F.relu(self.c1(x)), 2))
        return y + F.interpolate(x, scale_factor=2, mode="nearest")


class CosineSimilarity(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x):
        e = F.normalize(self.f(x), dim=1)
        return e @ e.t()


ARCHITECTURES = {
    "MobileNetV3ish": (MobileNetV3ish, (4, 3, 32, 32)),
    "TinyUNet": (TinyUNet, (2, 3, 16, 16)),
    "TinyViT": (TinyViT, (2, 3, 8, 8)),
    "DilatedTCN": (DilatedTCN, (3, 4, 20)),
    "ConvAutoencoder": (ConvAutoencoder, (2, 1, 16, 16)),
    "PixelShuffleSR": (PixelShuffleSR, (2, 3, 8, 8)),
    "CosineSimilarity": (CosineSimilarity, (5, 16)),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_architecture_matches_torch(name, mode):
    torch.manual_seed(0)
    cls, shape = ARCHITECTURES[name]
    model = cls().train(mode == "train")
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [shape])
    with torch.no_grad():
        out = model(torch.randn(shape))
    ModelTester(model, wrapped, name=name, epochs=3, benchmark=False) \
        .test_multiple_step(input_sizes=shape, label_sizes=tuple(out.shape))
    if mode == "eval":  # the fused inference graph (no gradient needed)
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(wrapped(x), model(x), rtol=1e-4, atol=1e-5)
