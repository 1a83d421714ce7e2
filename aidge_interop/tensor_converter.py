"""Conversion between torch tensors (or NumPy arrays) and engine tensors.

Both directions are O(1) views whenever the layout allows; see
``docs/tensors.md`` for the full contract. In short:

* ``torch_tensor_to_aidge(t)`` views ``t``'s memory through DLPack: writes on
  either side show on the other, and the engine tensor keeps ``t``'s memory
  alive. Any strided layout torch can produce (transposed, sliced,
  channels_last) stays a strided view. Tensors that require grad are
  detached first. A CUDA tensor is copied to the host (no aliasing then), and
  its device is remembered for the return trip. Overlapping layouts (from
  ``expand``) raise ``ValueError`` unless ``copy=True``.
* ``aidge_tensor_to_torch(a)`` views ``a``'s memory as a torch tensor, on the
  tensor's original device when it came from one (else the CPU). A tensor
  with negative strides (from a reversed NumPy view) cannot be viewed by
  torch: it is copied into a contiguous tensor.
* ``copy=True`` always gives independent memory.
"""
from __future__ import annotations

import numpy as np

from ._C import DTYPES, Tensor

__all__ = ["torch_tensor_to_aidge", "aidge_tensor_to_torch", "torch_dtype", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = DTYPES
_TORCH_DTYPES = None


def _torch():
    import torch
    import torch.utils.dlpack  # noqa: F401  (to_dlpack / from_dlpack on capsules)

    return torch


def _dtype_table():
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        torch = _torch()
        _TORCH_DTYPES = {getattr(torch, name): name for name in DTYPES}
    return _TORCH_DTYPES


def torch_dtype(name: str):
    """The torch dtype of an engine dtype name (``"float32"`` -> ``torch.float32``)."""
    if name not in DTYPES:
        raise TypeError(f"unknown engine dtype {name!r} (supported: {', '.join(DTYPES)})")
    return getattr(_torch(), name)


def torch_tensor_to_aidge(t, copy: bool = False) -> Tensor:
    """An engine :class:`~aidge_interop.Tensor` holding the values of ``t``.

    ``t`` is a ``torch.Tensor``; NumPy arrays and engine tensors are taken too.
    With ``copy=False`` (default) CPU memory is shared, not copied.
    """
    torch = _torch()
    if isinstance(t, (np.ndarray, Tensor)):
        return _checked(Tensor, t, copy)
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"torch_tensor_to_aidge: argument 't' must be a torch.Tensor or a "
            f"numpy.ndarray, not {type(t).__module__}.{type(t).__qualname__}"
        )
    if t.dtype not in _dtype_table():
        raise TypeError(
            f"torch_tensor_to_aidge: argument 't' has unsupported dtype {t.dtype} "
            f"(supported: {', '.join(DTYPES)})"
        )
    if t.requires_grad:
        t = t.detach()
    if t.is_conj() or t.is_neg():  # lazy flags DLPack cannot carry
        t = t.resolve_conj().resolve_neg()
    origin = None
    if t.device.type != "cpu":
        origin = str(t.device)
        t = t.to("cpu")  # a copy already: never share it twice
        copy = False
    # a capsule straight from torch's C side: an order of magnitude cheaper
    # than the Python-level t.__dlpack__() protocol
    out = _checked(Tensor.from_dlpack, torch.utils.dlpack.to_dlpack(t), copy)
    if origin is not None:
        out.origin_device = origin
    return out


def _checked(make, obj, copy):
    try:
        return make(obj, copy=copy)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"torch_tensor_to_aidge: argument 't': {exc}") from None


def aidge_tensor_to_torch(a: Tensor, device=None, copy: bool = False):
    """A torch tensor holding the values of the engine tensor ``a``.

    ``device``: where the result goes; by default the device ``a`` was
    converted from (``a.origin_device``), else the CPU. With ``copy=False``
    (default) a CPU result shares ``a``'s memory when its strides allow it.
    """
    torch = _torch()
    if not isinstance(a, Tensor):
        raise TypeError(
            f"aidge_tensor_to_torch: argument 'a' must be an aidge_interop.Tensor, "
            f"not {type(a).__module__}.{type(a).__qualname__}"
        )
    if device is None:
        device = a.origin_device
    copied = False
    if a.readonly:
        # torch tensors are always writable: never hand out a writable alias
        # of read-only memory
        a = a.clone()
        copied = True
    elif any(s < 0 for s, n in zip(a.strides, a.shape) if n > 1):
        a = a.clone()  # torch has no negative strides
        copied = True
    out = torch.utils.dlpack.from_dlpack(a.__dlpack__())
    if device is not None and torch.device(device) != out.device:
        return out.to(device, copy=True)
    if copy and not copied:
        out = out.clone(memory_format=torch.preserve_format)
    return out
