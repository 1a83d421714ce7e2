"""The torch side of the engine's ShiftGELU / ShiftMax operators.

The float reference of ``shift_reference.py`` is evaluated in float64 and
rounded to the input's dtype, as the engine evaluates the formula (in
double, every intermediate an exact integer) and rounds once; its gradient
is the reference's straight-through one. A ``torch.autograd.Function`` with
a ``symbolic`` makes the ONNX exporter emit a single node of domain
``aidge``.
"""
import torch
from torch import nn


def shift_module(reference: nn.Module, op_name: str) -> type:
    """An ``nn.Module`` class computing ``reference`` that exports as ``aidge::<op_name>``."""

    class Function(torch.autograd.Function):
        @staticmethod
        def symbolic(g, x):
            return g.op(f"aidge::{op_name}", x).setType(x.type())

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return reference(x.double()).to(x.dtype)

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                x64 = x.detach().double().requires_grad_()
                (grad,) = torch.autograd.grad(reference(x64), x64, grad_output.double())
            return grad.to(x.dtype)

    class Model(nn.Module):
        def forward(self, x):
            return Function.apply(x)

    Function.__name__ = f"{op_name}Function"
    Model.__name__ = Model.__qualname__ = f"{op_name}Model"
    return Model
