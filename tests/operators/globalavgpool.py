"""GlobalAvgPool: ``nn.AdaptiveAvgPool2d(1)`` (ONNX GlobalAveragePool)."""
from torch import nn


class GlobalAvgPoolModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(x)
