"""BatchNorm: ``nn.BatchNorm2d`` (ONNX BatchNormalization); batch statistics
in train mode, running statistics in eval mode.

The affine parameters and running statistics start random: fresh ones
(1, 0, 0, 1) would hide a swapped or ignored tensor.
"""
from torch import nn


class BatchNormModel(nn.Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features, eps=eps, momentum=momentum)
        nn.init.uniform_(self.bn.weight, 0.5, 1.5)
        nn.init.normal_(self.bn.bias, 0.0, 0.1)
        nn.init.normal_(self.bn.running_mean, 0.0, 0.1)
        nn.init.uniform_(self.bn.running_var, 0.5, 1.5)

    def forward(self, x):
        return self.bn(x)
