"""ShiftMax: the engine's integer-only softmax over the last axis, ONNX op
``aidge::ShiftMax``.

The torch side is the float reference of ``shift_reference.py`` evaluated in
float64 and rounded to the input's dtype, as the engine evaluates the
formula (in double, every intermediate an exact integer) and rounds once;
its gradient is the reference's straight-through one. A
``torch.autograd.Function`` with a ``symbolic`` makes the ONNX exporter emit
a single ``ShiftMax`` node of domain ``aidge``.
"""
import torch
from torch import nn

from .shift_reference import ShiftMax

_REFERENCE = ShiftMax()


class ShiftMaxFunction(torch.autograd.Function):
    @staticmethod
    def symbolic(g, x):
        return g.op("aidge::ShiftMax", x).setType(x.type())

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _REFERENCE(x.double()).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x64 = x.detach().double().requires_grad_()
            (grad,) = torch.autograd.grad(_REFERENCE(x64), x64, grad_output.double())
        return grad.to(x.dtype)


class ShiftMaxModel(nn.Module):
    def forward(self, x):
        return ShiftMaxFunction.apply(x)
