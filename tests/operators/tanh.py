"""Tanh: ``nn.Tanh`` (ONNX Tanh)."""
from torch import nn


class TanhModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.tanh = nn.Tanh()

    def forward(self, x):
        return self.tanh(x)
