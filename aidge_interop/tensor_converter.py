"""Conversion between torch tensors (or NumPy arrays) and engine tensors.

Both directions are O(1) views whenever the layout allows; see
``docs/tensors.md`` for the full contract. In short:

* ``torch_tensor_to_aidge(t)`` views ``t``'s memory through DLPack: writes on
  either side show on the other, and the engine tensor keeps ``t``'s memory
  alive. Any strided layout torch can produce (transposed, sliced,
  channels_last) stays a strided view. Tensors that require grad are
  detached first. A CUDA tensor is copied to the host (no aliasing then), and
  its device is remembered for the return trip. An overlapping layout (from
  ``expand``), which no engine view can hold, is copied.
* ``aidge_tensor_to_torch(a)`` views ``a``'s memory as a torch tensor, on the
  tensor's original device when it came from one (else the CPU). A tensor
  with negative strides (from a reversed NumPy view) cannot be viewed by
  torch: it is copied into a contiguous tensor.
* ``convert_tensor(x)``: either direction, by the type of ``x``
  (``aidge_interop_torch``'s name).
* ``copy``: ``None`` (default) views when it can and copies when it must,
  ``True`` always gives independent memory, ``False`` demands a view and
  raises ``ValueError`` where there can be none.
"""
from __future__ import annotations

import numpy as np

from ._C import DTYPES, Tensor

__all__ = ["torch_tensor_to_aidge", "aidge_tensor_to_torch", "convert_tensor", "torch_dtype",
           "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = DTYPES
# kept one element a byte here, packed in torch (and DLPack): NumPy (ml_dtypes) only
_NUMPY_ONLY = frozenset({"int4", "uint4", "int2", "uint2", "float4_e2m1fn"})
_TORCH_DTYPES = None


def _torch():
    import torch
    import torch.utils.dlpack  # noqa: F401  (to_dlpack / from_dlpack on capsules)

    return torch


def _dtype_table():
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        torch = _torch()
        _TORCH_DTYPES = {getattr(torch, name): name for name in DTYPES
                         if name not in _NUMPY_ONLY and hasattr(torch, name)}
    return _TORCH_DTYPES


def torch_dtype(name: str):
    """The torch dtype of an engine dtype name (``"float32"`` -> ``torch.float32``)."""
    if name not in DTYPES:
        raise TypeError(f"unknown engine dtype {name!r} (supported: {', '.join(DTYPES)})")
    if name in _NUMPY_ONLY or not hasattr(_torch(), name):
        raise TypeError(f"engine dtype {name!r} has no torch dtype (torch packs the sub-byte "
                        "types); use Tensor.numpy(), an ml_dtypes array")
    return getattr(_torch(), name)


def torch_tensor_to_aidge(torch_tensor, copy: bool | None = None) -> Tensor:
    """An engine :class:`~aidge_interop.Tensor` holding the values of
    ``torch_tensor`` (the argument's name is aidge_interop_torch's).

    ``torch_tensor`` is a ``torch.Tensor``; NumPy arrays and engine tensors are taken too.
    ``copy=None`` (default): CPU memory is shared, not copied, except where no
    view can hold it (an overlapping layout from ``expand``, a CUDA tensor):
    then a copy. ``copy=True``: always a copy. ``copy=False``: a view, or
    ``ValueError``.
    """
    t = torch_tensor
    torch = _torch()
    if isinstance(t, (np.ndarray, Tensor)):
        return _converted(lambda c: Tensor(t, copy=c), copy)
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"torch_tensor_to_aidge: argument 'torch_tensor' must be a torch.Tensor or a "
            f"numpy.ndarray, not {type(t).__module__}.{type(t).__qualname__}"
        )
    if t.dtype not in _dtype_table():
        raise TypeError(
            f"torch_tensor_to_aidge: argument 'torch_tensor' has unsupported dtype {t.dtype} "
            f"(supported: {', '.join(_dtype_table().values())})"
        )
    if t.requires_grad:
        t = t.detach()
    if t.is_conj() or t.is_neg():  # lazy flags DLPack cannot carry
        t = t.resolve_conj().resolve_neg()
    origin = None
    if t.device.type != "cpu":
        if copy is False:
            raise ValueError(f"torch_tensor_to_aidge: argument 'torch_tensor' is on {t.device}, the "
                             "engine's memory on the host: it cannot be viewed (copy=False); "
                             "leave copy=None to copy it")
        origin = str(t.device)
        t = t.to("cpu")  # a copy already: never copy it twice
        copy = None
    # a capsule straight from torch's C side: an order of magnitude cheaper
    # than the Python-level t.__dlpack__() protocol
    out = _converted(lambda c: Tensor.from_dlpack(torch.utils.dlpack.to_dlpack(t), copy=c),
                     copy)
    if origin is not None:
        out.origin_device = origin
    return out


def _converted(make, copy):
    """``make(copy)``; with ``copy=None``, a copy where the view is refused (an
    overlapping layout: no engine view holds it)."""
    try:
        try:
            return make(bool(copy))
        except ValueError:
            if copy is not None:
                raise
        return make(True)  # (where the copy fails too, its error is the one to see)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"torch_tensor_to_aidge: argument 'torch_tensor': {exc}") from None


def aidge_tensor_to_torch(aidge_tensor: Tensor, device=None, copy: bool | None = None):
    """A torch tensor holding the values of the engine tensor ``aidge_tensor``
    (the argument's name is aidge_interop_torch's).

    ``device``: where the result goes; by default the device the tensor was
    converted from (``aidge_tensor.origin_device``), else the CPU. ``copy=None``
    (default): a CPU result shares the tensor's memory, except where torch cannot
    view it (read-only memory, negative strides) or the result goes to
    another device: then a copy. ``copy=True``: always a copy.
    ``copy=False``: a view, or ``ValueError``.
    """
    a = aidge_tensor
    torch = _torch()
    if not isinstance(a, Tensor):
        raise TypeError(
            f"aidge_tensor_to_torch: argument 'aidge_tensor' must be an aidge_interop.Tensor, "
            f"not {type(a).__module__}.{type(a).__qualname__}"
        )
    if a.dtype in _NUMPY_ONLY:
        raise TypeError(f"aidge_tensor_to_torch: argument 'aidge_tensor' is {a.dtype}, which "
                        "torch packs (no view of one element a byte); use its numpy()")
    if device is None:
        device = a.origin_device
    moved = device is not None and torch.device(device).type != "cpu"
    # torch tensors are always writable (never a writable alias of read-only
    # memory) and have no negative strides
    unviewable = ("it is read-only" if a.readonly else "it has negative strides"
                  if any(s < 0 for s, n in zip(a.strides, a.shape) if n > 1) else None)
    if copy is False and (unviewable or moved):
        raise ValueError(f"aidge_tensor_to_torch: argument 'aidge_tensor' cannot be viewed by torch "
                         f"(copy=False): {unviewable or f'the result goes to {device}'}; "
                         "leave copy=None to copy it")
    if unviewable:
        a = a.clone()
    out = torch.utils.dlpack.from_dlpack(a.__dlpack__())
    if moved:
        return out.to(device, copy=True)
    if copy and not unviewable:
        out = out.clone(memory_format=torch.preserve_format)
    return out


def convert_tensor(tensor, copy: bool | None = None):
    """``tensor`` in the other framework: a torch tensor as an engine
    :class:`~aidge_interop.Tensor` (:func:`torch_tensor_to_aidge`), an engine
    tensor as a torch tensor (:func:`aidge_tensor_to_torch`); ``copy`` as
    there. The name and argument of ``aidge_interop_torch.convert_tensor``."""
    if isinstance(tensor, Tensor):
        return aidge_tensor_to_torch(tensor, copy=copy)
    if isinstance(tensor, _torch().Tensor):
        return torch_tensor_to_aidge(tensor, copy=copy)
    raise TypeError(f"convert_tensor: argument 'tensor' must be a torch.Tensor or an "
                    f"aidge_interop.Tensor, not {type(tensor).__module__}."
                    f"{type(tensor).__qualname__}")
