"""ReduceMean: ``torch.mean`` over some axes (ONNX ReduceMean); ``dim=None`` reduces every axis."""
from torch import nn


class ReduceMeanModel(nn.Module):
    def __init__(self, dim=None, keepdim=True):
        super().__init__()
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, x):
        # every axis named: torch's ONNX exporter drops keepdim when dim is None
        dim = tuple(range(x.dim())) if self.dim is None else self.dim
        return x.mean(dim=dim, keepdim=self.keepdim)
