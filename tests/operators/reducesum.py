"""ReduceSum: ``torch.sum`` over some axes (ONNX ReduceSum); ``dim=None`` reduces every axis."""
from torch import nn


class ReduceSumModel(nn.Module):
    def __init__(self, dim=None, keepdim=True):
        super().__init__()
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, x):
        # every axis named: torch's ONNX exporter drops keepdim when dim is None
        dim = tuple(range(x.dim())) if self.dim is None else self.dim
        return x.sum(dim=dim, keepdim=self.keepdim)
