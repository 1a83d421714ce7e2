"""MLPerf Tiny ResNet-8 for CIFAR-10. Input (B, 3, 32, 32), output (B, 10).

Conv 16@3x3 -> BN -> ReLU; three stacks of one residual block (16, 32, 64
filters; stride 1, 2, 2): Conv 3x3 -> BN -> ReLU -> Conv 3x3 -> BN, plus the
shortcut (identity, or Conv 1x1 with the block's stride when the shape
changes), then ReLU; global average pool; FC 10.
"""
import torch

from ._seeding import build_seeded


class ResidualBlock(torch.nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(out_ch)
        self.conv2 = torch.nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(out_ch)
        self.shortcut = (torch.nn.Identity() if stride == 1 and in_ch == out_ch
                         else torch.nn.Conv2d(in_ch, out_ch, 1, stride=stride))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class TorchResNet8(torch.nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
        )
        self.stacks = torch.nn.Sequential(
            ResidualBlock(16, 16, stride=1),   # (B, 16, 32, 32)
            ResidualBlock(16, 32, stride=2),   # (B, 32, 16, 16)
            ResidualBlock(32, 64, stride=2),   # (B, 64, 8, 8)
        )
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.pool(self.stacks(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


def resnet8(seed: int = 0) -> TorchResNet8:
    """A :class:`TorchResNet8` initialised from ``seed``."""
    return build_seeded(TorchResNet8, seed)
