"""Softmax: ``nn.Softmax`` (ONNX Softmax) over one axis."""
from torch import nn


class SoftmaxModel(nn.Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.softmax = nn.Softmax(dim=dim)

    def forward(self, x):
        return self.softmax(x)
