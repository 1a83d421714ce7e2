"""MobileNet v1, width multiplier 0.25, as in MLPerf Tiny visual wake words.

Input (B, 3, 96, 96), output (B, 2): Conv 8@3x3 stride 2 -> BN -> ReLU, then
13 depthwise-separable blocks (depthwise 3x3 -> BN -> ReLU -> pointwise 1x1 ->
BN -> ReLU), global average pool, FC 2. Spatial sizes 48, 24, 12, 6, 3.
"""
import torch

from ._seeding import build_seeded

# (pointwise output channels, depthwise stride) of the 13 blocks
BLOCKS = [(16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2),
          (128, 1), (128, 1), (128, 1), (128, 1), (128, 1), (256, 2), (256, 1)]


def _conv_bn_relu(in_ch: int, out_ch: int, kernel: int, stride: int = 1,
                  groups: int = 1) -> list[torch.nn.Module]:
    return [torch.nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2,
                            groups=groups),
            torch.nn.BatchNorm2d(out_ch),
            torch.nn.ReLU()]


class TorchMobileNetV1(torch.nn.Module):
    def __init__(self, num_classes: int = 2):
        super().__init__()
        layers = _conv_bn_relu(3, 8, 3, stride=2)
        channels = 8
        for out_ch, stride in BLOCKS:
            layers += _conv_bn_relu(channels, channels, 3, stride=stride, groups=channels)
            layers += _conv_bn_relu(channels, out_ch, 1)
            channels = out_ch
        self.features = torch.nn.Sequential(*layers)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.classifier = torch.nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v1(seed: int = 0) -> TorchMobileNetV1:
    """A :class:`TorchMobileNetV1` initialised from ``seed``."""
    return build_seeded(TorchMobileNetV1, seed)
