"""AvgPooling2D: ``nn.AvgPool2d`` (ONNX AveragePool)."""
from torch import nn


class AvgPoolingModel(nn.Module):
    def __init__(self, kernel_size=(3, 3), stride=(2, 2), padding=(0, 0), ceil_mode=False,
                 count_include_pad=True):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=kernel_size, stride=stride, padding=padding,
                                 ceil_mode=ceil_mode, count_include_pad=count_include_pad)

    def forward(self, x):
        return self.pool(x)
