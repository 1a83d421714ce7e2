"""LayerNorm: ``nn.LayerNorm`` over the trailing ``normalized_shape`` axes
(ONNX LayerNormalization). Weight and bias start random so that a swapped or
ignored one shows."""
from torch import nn


class LayerNormModel(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, bias=True):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape, eps=eps, bias=bias)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        if bias:
            nn.init.normal_(self.norm.bias, 0.0, 0.1)

    def forward(self, x):
        return self.norm(x)
