"""Built-in example models of ``aidge-interop compare`` (copies of networks of
the test suite, ``tests/models/``, with the same seeded initialisation).

``EXAMPLES`` maps a name to ``(factory, input shape, description)``; every
factory takes a ``seed`` and builds the same weights on every call, without
touching torch's global random state. BatchNorm layers get random affine
parameters and running statistics, so that an eval-mode comparison exercises
every one of them.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["EXAMPLES", "perceptron", "lenet", "ds_cnn", "resnet8"]


def _seeded(cls, seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls()
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.normal_(0.0, 0.1)
                    m.running_mean.normal_(0.0, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
    return model


class Perceptron(nn.Module):
    """Linear(16, 32) -> ReLU -> Linear(32, 4). Input (B, 16)."""

    def __init__(self):
        super().__init__()
        self.sequence = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.sequence(x)


class LeNet(nn.Module):
    """LeNet-5. Input (B, 1, 32, 32), output (B, 10)."""

    def __init__(self):
        super().__init__()
        self.sequence = nn.Sequential(
            nn.Conv2d(1, 6, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, 10),
        )

    def forward(self, x):
        return self.sequence(x)


class DSCNN(nn.Module):
    """MLPerf Tiny keyword spotting DS-CNN. Input (B, 1, 49, 10) MFCCs, output (B, 12)."""

    def __init__(self, filters: int = 64, num_classes: int = 12):
        super().__init__()
        layers = [nn.ZeroPad2d((1, 1, 4, 5)),  # TensorFlow's "same" for a 10x4 kernel, stride 2
                  nn.Conv2d(1, filters, kernel_size=(10, 4), stride=2),
                  nn.BatchNorm2d(filters), nn.ReLU()]
        for _ in range(4):
            layers += [nn.Conv2d(filters, filters, kernel_size=3, padding=1, groups=filters),
                       nn.BatchNorm2d(filters), nn.ReLU(),
                       nn.Conv2d(filters, filters, kernel_size=1),
                       nn.BatchNorm2d(filters), nn.ReLU()]
        layers += [nn.AvgPool2d(kernel_size=(25, 5)), nn.Flatten(),
                   nn.Linear(filters, num_classes)]
        self.sequence = nn.Sequential(*layers)

    def forward(self, x):
        return self.sequence(x)


class ResidualBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = (nn.Identity() if stride == 1 and in_ch == out_ch
                         else nn.Conv2d(in_ch, out_ch, 1, stride=stride))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class ResNet8(nn.Module):
    """MLPerf Tiny ResNet-8 for CIFAR-10. Input (B, 3, 32, 32), output (B, 10)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.stacks = nn.Sequential(ResidualBlock(16, 16, stride=1),
                                    ResidualBlock(16, 32, stride=2),
                                    ResidualBlock(32, 64, stride=2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.pool(self.stacks(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


def perceptron(seed: int = 0) -> Perceptron:
    return _seeded(Perceptron, seed)


def lenet(seed: int = 0) -> LeNet:
    return _seeded(LeNet, seed)


def ds_cnn(seed: int = 0) -> DSCNN:
    return _seeded(DSCNN, seed)


def resnet8(seed: int = 0) -> ResNet8:
    return _seeded(ResNet8, seed)


EXAMPLES = {
    "perceptron": (perceptron, (1, 16), "Linear-ReLU-Linear, 16 -> 4"),
    "lenet": (lenet, (1, 1, 32, 32), "LeNet-5, 1x32x32 -> 10"),
    "ds_cnn": (ds_cnn, (1, 1, 49, 10), "MLPerf Tiny keyword spotting DS-CNN, 1x49x10 -> 12"),
    "resnet8": (resnet8, (1, 3, 32, 32), "MLPerf Tiny ResNet-8, 3x32x32 -> 10"),
}
