"""aidge_interop — prove that a second engine computes exactly what PyTorch computes.

The core is a C11 engine (``aidge_interop._C``); this package is its thin
Python face: tensors and their conversion from and to torch and NumPy
(:mod:`aidge_interop.tensor_converter`).
"""


def _avx512_cpu(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU runs, and the OS enables, the AVX-512 subset of OpenBLAS's
    SkylakeX kernels (F, CD, BW, DQ, VL); from /proc/cpuinfo, whose flags Linux
    clears where it does not save the vector state. False elsewhere."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.partition(":")[2].split())
                    return {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags
    except OSError:
        pass
    return False


def _load_gemm_library():
    """Loads OpenBLAS (scipy-openblas32 wheel) so that _C's link to it resolves.

    OpenBLAS picks its kernels from a table of CPU models, and a model newer than
    the table gets the generic AVX2 ones even where it has AVX-512 (an AMD Zen 5
    got "Haswell": GEMM at 47% of the FMA peak, 91% with "SkylakeX", the kernels
    OpenBLAS gives every AVX-512 CPU it knows). Where the CPU has AVX-512 and
    ``OPENBLAS_CORETYPE`` is not set, it is set to ``SkylakeX`` while the library
    loads (OpenBLAS reads it then) and removed after, so that neither the process
    nor its children see it. Setting ``OPENBLAS_CORETYPE`` yourself overrides this;
    ``aidge_interop._C.gemm_backend()`` names the kernels in use."""
    try:
        import scipy_openblas32
    except ImportError:  # an AIDGE_INTEROP_NO_BLAS build needs none
        return
    import ctypes
    import os

    libdir = scipy_openblas32.get_lib_dir()
    for name in sorted(os.listdir(libdir)):
        if name.startswith("libscipy_openblas") and (".so" in name or name.endswith(".dylib")):
            force = "OPENBLAS_CORETYPE" not in os.environ and _avx512_cpu()
            if force:
                os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
            try:
                ctypes.CDLL(os.path.join(libdir, name), mode=ctypes.RTLD_GLOBAL)
            finally:
                if force:
                    del os.environ["OPENBLAS_CORETYPE"]
            return


_load_gemm_library()

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
from .graph import Graph
from .onnx_import import load_onnx
from . import recipes
from .profiling import profile

# torch is imported on first use of these (the pytest plugin stays light)
_LAZY = {"SGD": ".optim", "wrap": ".wrapping", "AidgeModule": ".wrapping",
         "locate": ".divergence", "quantize": ".quantization",
         "QuantizedModel": ".quantization", "export_c": ".export"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'aidge_interop' has no attribute {name!r}")

__version__ = "0.1.0"


def supported_operators() -> dict[str, dict]:
    """Operators of the engine: ``{"Conv": {"domain": "", "backward": True}, ...}``
    (LSTM, GRU, RNN and Einsum: written as the engine's operators at import)."""
    from .onnx_import import EXPANDED

    ops = {name: {"domain": dom, "backward": bwd} for dom, name, bwd in _C.supported_operators()}
    ops.update({name: {"domain": "", "backward": True} for name in EXPANDED})
    return ops


def set_num_threads(n: int) -> None:
    """Threads of the engine's pool (kernels and GEMMs; docs/engine.md)."""
    _C.set_num_threads(int(n))


def get_num_threads() -> int:
    return _C.get_num_threads()


__all__ = [
    "DTYPES", "MAX_DIMS", "Tensor", "zeros", "tensor_converter", "Graph", "load_onnx", "recipes",
    "supported_operators", "set_num_threads", "get_num_threads", "SGD", "wrap", "AidgeModule",
    "locate", "quantize", "QuantizedModel", "export_c", "profile", "__version__",
]
