"""Sigmoid: ``nn.Sigmoid`` (ONNX Sigmoid)."""
from torch import nn


class SigmoidModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        return self.sigmoid(x)
