"""FC: ``nn.Linear`` (ONNX Gemm, or MatMul + Add on more than two dimensions)."""
from torch import nn


class FCModel(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x):
        return self.fc(x)
