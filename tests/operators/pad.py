"""Pad: ``torch.nn.functional.pad`` (ONNX Pad). ``pad`` is in torch's order,
last axis first: ``(left, right, top, bottom)`` for the two spatial axes;
``mode`` is ``"constant"`` (filled with ``value``, default 0), ``"reflect"``
or ``"replicate"``."""
from torch import nn
from torch.nn import functional as F


class PadModel(nn.Module):
    def __init__(self, pad=(1, 1, 1, 1), mode="constant", value=None):
        super().__init__()
        self.pad = tuple(pad)
        self.mode = mode
        self.value = value

    def forward(self, x):
        return F.pad(x, self.pad, mode=self.mode, value=self.value)
