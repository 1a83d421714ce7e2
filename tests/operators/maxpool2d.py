"""MaxPool2D: ``nn.MaxPool2d`` (ONNX MaxPool)."""
from torch import nn


class MaxPool2DModel(nn.Module):
    def __init__(self, kernel_size=(2, 2), stride=None, padding=(0, 0), dilation=(1, 1),
                 ceil_mode=False):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size, stride=stride, padding=padding,
                                 dilation=dilation, ceil_mode=ceil_mode)

    def forward(self, x):
        return self.pool(x)
