"""ConvDepthwise2D: ``nn.Conv2d`` with one group per input channel (ONNX Conv,
``group = channels``); ``out_channels`` a multiple of ``channels``."""
from torch import nn


class ConvDepthwise2DModel(nn.Module):
    def __init__(self, channels, out_channels=None, kernel_size=(3, 3), stride=(1, 1),
                 padding=(0, 0), dilation=(1, 1), bias=True):
        super().__init__()
        self.conv = nn.Conv2d(channels, out_channels or channels, kernel_size, stride=stride,
                              padding=padding, dilation=dilation, groups=channels, bias=bias)

    def forward(self, x):
        return self.conv(x)
