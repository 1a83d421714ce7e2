"""Float torch references of the engine's ShiftGELU and ShiftMax (domain "aidge").

They compute the formulas of shift-ops.md (I-ViT's IntGELU / IntSoftmax) in
the tensor's dtype: every ``floor`` is floor in the forward pass and the
identity in the backward pass (straight-through), the per-tensor scale
``S = max|x| / 127`` and ``x0 = floor(-1 / S)`` are constants without
gradient, reductions run over the last axis with keepdim. When ``S == 0``
ShiftGELU gives 0 and ShiftMax the uniform softmax, both with zero gradient.

Run them in float64 (``ShiftGELU()(x.double())``) to compare with the
engine, which evaluates the formulas in double for float32 tensors too. In
float32, 2^31 - 1 rounds to 2^31 and the formula's large integers to 24
bits, so floors move by one step in many elements, and ShiftGELU's
2^(N - q) overflows for rows far below the tensor's maximum (NaN outputs).

Only torch is imported, so the file can be copied next to a model.
"""
import torch
from torch import nn

N = 15                # shift precision of int_exp_shift
OUTPUT_BITS = 8       # b
INT32_MAX = 2**31 - 1


def floor_ste(x):
    """floor(x) forward (exactly, for finite x), identity backward."""
    return x + (torch.floor(x) - x).detach()


def per_tensor_scale(x):
    """S = max|x| / 127 (no gradient), and a safe stand-in 1 where S == 0 so
    that the unused branch of the S == 0 case stays finite."""
    s = x.abs().max().detach() / 127
    return s, torch.where(s > 0, s, torch.ones_like(s))


def int_exp_shift(x, s):
    """Shift-based exp of x (x * S is the real argument): (e, S / 2**N)."""
    x = x + floor_ste(x / 2) - floor_ste(x / 2**4)      # x * log2(e)
    x0 = torch.floor(-1.0 / s)                           # s is detached
    x = torch.max(x, N * x0)
    q = floor_ste(x / x0)
    r = x - x0 * q
    e = torch.clamp(floor_ste((r / 2 - x0) * 2 ** (N - q)), min=0)
    return e, s / 2**N


def _reciprocal_floor(total):
    """floor((2**31 - 1) / min(total, 2**31 - 1)), true division."""
    total = torch.clamp(total, max=INT32_MAX)
    return floor_ste(total.new_tensor(INT32_MAX) / total)


class ShiftMax(nn.Module):
    """Integer-only softmax approximation over the last axis."""

    def forward(self, x):
        s, s_safe = per_tensor_scale(x)
        p = x / s_safe
        p = p - torch.max(p, dim=-1, keepdim=True).values
        e, _ = int_exp_shift(p, s_safe)
        f = _reciprocal_floor(e.sum(dim=-1, keepdim=True))
        y = floor_ste(e * f / 2 ** (31 - OUTPUT_BITS + 1)) * 2.0 ** -(OUTPUT_BITS - 1)
        uniform = x * 0 + 1.0 / x.shape[-1]
        return torch.where(s > 0, y, uniform)


class ShiftGELU(nn.Module):
    """Integer-only GELU approximation, x * sigmoid(1.702 x)."""

    def forward(self, x):
        s, s_safe = per_tensor_scale(x)
        p = x / s_safe
        s_sig = s_safe * 1.702
        m = torch.max(p, dim=-1, keepdim=True).values
        e, _ = int_exp_shift(p - m, s_sig)
        em, _ = int_exp_shift(-m, s_sig)
        f = _reciprocal_floor(e + em)
        sig = floor_ste(e * f / 2 ** (31 - OUTPUT_BITS + 1))
        y = p * sig * s_safe * 2.0 ** -(OUTPUT_BITS - 1)
        return torch.where(s > 0, y, x * 0)


__all__ = ["ShiftGELU", "ShiftMax", "int_exp_shift", "floor_ste"]
