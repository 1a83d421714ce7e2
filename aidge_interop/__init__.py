"""aidge_interop — prove that a second engine computes exactly what PyTorch computes.

The core is a C11 engine (``aidge_interop._C``); this package is its Python
face, in layers (a module imports only from its own layer and those listed
before it, lazily or not):

1. ``_C``, ``_util`` (helpers the parts share);
2. ``tensor_converter``, ``graph``, ``recipes``, ``profiling``, ``visualize``,
   ``explorer``, ``examples``: tensors across torch / NumPy / engine, the
   engine's graph, its rewrites, per-node timings, pictures, the graph in
   Google's Model Explorer, the example models;
3. ``onnx``: ONNX import (:func:`load_onnx`) and ONNX's backend API;
4. ``bridge``: the torch bridge (:func:`wrap`, :class:`AidgeModule`, :class:`SGD`);
5. ``compare``: one model on several engines, :func:`locate`, the
   ``aidge-interop`` command; ``quant``: int8 quantization and the C export;
6. ``testing``: the validation harness and its pytest plugin.

``backends``, ``backend``, ``cli``, ``analyze``, ``export``, ``quantization``,
``layers``, ``divergence`` and ``onnx_import`` are older paths of modules now
in the parts: each is the module itself.
"""
import numbers


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
from .tensor_converter import aidge_tensor_to_torch, convert_tensor, torch_tensor_to_aidge
from .graph import Graph
from .onnx import load_onnx, supported_operators
from . import recipes, explorer
from .profiling import profile

# torch is imported on first use of these (the pytest plugin stays light)
_LAZY = {"SGD": ".bridge", "wrap": ".bridge", "AidgeModule": ".bridge",
         "locate": ".compare.locate", "quantize": ".quant", "QuantizedModel": ".quant",
         "export_c": ".quant"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'aidge_interop' has no attribute {name!r}")

__version__ = "0.1.0"


def set_num_threads(n: int) -> None:
    """Threads of the engine's pool (kernels and GEMMs; docs/engine.md)."""
    _C.set_num_threads(int(n))


def get_num_threads() -> int:
    return _C.get_num_threads()


def set_memory_limit(limit: int | None) -> None:
    """Bytes a graph's plan may need (docs/engine.md): a graph whose plan needs
    more is refused with a MemoryError naming the node, before anything is
    allocated. None lifts the limit; the default is 80% of physical memory."""
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral):
            raise TypeError(f"memory limit must be an int (bytes) or None, "
                            f"got {type(limit).__name__}")
        if limit < 1:
            raise ValueError(f"memory limit must be >= 1 byte, got {limit}")
        limit = None if limit >= 2**64 - 1 else int(limit)
    _C.set_memory_limit(limit)


def get_memory_limit() -> int | None:
    """The plans' memory limit in bytes, None when there is none."""
    return _C.get_memory_limit()


__all__ = [
    "DTYPES", "MAX_DIMS", "Tensor", "zeros", "tensor_converter", "torch_tensor_to_aidge",
    "aidge_tensor_to_torch", "convert_tensor", "Graph", "load_onnx", "recipes", "explorer",
    "supported_operators", "set_num_threads", "get_num_threads", "set_memory_limit",
    "get_memory_limit", "SGD", "wrap", "AidgeModule",
    "locate", "quantize", "QuantizedModel", "export_c", "profile", "__version__",
]
