"""ReLU: ``nn.ReLU`` (ONNX Relu)."""
from torch import nn


class ReLUModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(x)
