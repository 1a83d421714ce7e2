"""Conv2D: ``nn.Conv2d`` (ONNX Conv)."""
from torch import nn


class Conv2DModel(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=(3, 3), stride=(1, 1),
                 padding=(0, 0), dilation=(1, 1), groups=1, bias=True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=padding, dilation=dilation, groups=groups, bias=bias)

    def forward(self, x):
        return self.conv(x)
