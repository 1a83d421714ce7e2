"""The torch bridge: :func:`wrap` exports a ``torch.nn.Module`` to ONNX and
returns it as an :class:`AidgeModule` run by the engine, with autograd
(wrap.py); :class:`SGD` steps its parameters in the engine (optim.py).
Imports torch."""
from .optim import SGD
from .wrapping import AidgeModule, export_onnx_bytes, wrap

__all__ = ["wrap", "AidgeModule", "SGD", "export_onnx_bytes"]
