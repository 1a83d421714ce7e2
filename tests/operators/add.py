"""Add: ``x + other`` (ONNX Add), ``other`` a trainable parameter whose
shape broadcasts against the input (either side may be broadcast)."""
import torch
from torch import nn


class AddModel(nn.Module):
    def __init__(self, other_shape):
        super().__init__()
        self.other = nn.Parameter(torch.randn(other_shape))

    def forward(self, x):
        return x + self.other
