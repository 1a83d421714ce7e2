"""aidge_interop — prove that a second engine computes exactly what PyTorch computes.

The core is a C11 engine (``aidge_interop._C``); this package is its thin
Python face: tensors and their conversion from and to torch and NumPy
(:mod:`aidge_interop.tensor_converter`).
"""
try:
    from . import _C
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "aidge_interop's C extension (aidge_interop._C) is not built or does not "
        "load. Install the package with `pip install .` (or `pip install -e .` "
        "for development) rather than importing it from a source checkout. "
        f"Cause: {exc}"
    ) from exc

from ._C import DTYPES, MAX_DIMS, Tensor, zeros
from . import tensor_converter

__version__ = "0.1.0"

__all__ = ["DTYPES", "MAX_DIMS", "Tensor", "zeros", "tensor_converter", "__version__"]
