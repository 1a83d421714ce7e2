"""LeakyReLU: ``nn.LeakyReLU`` (ONNX LeakyRelu)."""
from torch import nn


class LeakyReLUModel(nn.Module):
    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.leaky_relu = nn.LeakyReLU(negative_slope)

    def forward(self, x):
        return self.leaky_relu(x)
