"""GELU: ``nn.GELU`` (ONNX Gelu), exact or tanh approximation."""
from torch import nn


class GELUModel(nn.Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.gelu = nn.GELU(approximate=approximate)

    def forward(self, x):
        return self.gelu(x)
