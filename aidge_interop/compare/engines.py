"""One model on several engines: PyTorch, ONNX Runtime, our C engine, Eclipse Aidge.

::

    from aidge_interop.compare import engines  # also aidge_interop.backends

    run = engines.get_runner("aidge_interop", model, (1, 1, 32, 32))  # numpy -> numpy
    with engines.limited_threads():                                     # THREADS thread(s)
        y = run(x)

- ``torch``: the reference, the module itself (eval mode, no autograd);
- ``onnxruntime``: ONNX Runtime's CPU provider on the exported ONNX file;
- ``aidge_interop``: this package's engine (:func:`aidge_interop.load_onnx`);
- ``aidge``: Eclipse Aidge's CPU backend (``aidge_core``, ``aidge_backend_cpu``,
  ``aidge_onnx``; sequential scheduler), when those are installed, on the
  model simplified by our constant folding (:mod:`.eclipse_aidge`).

A module is exported to ONNX once per (weights, input shape): the file goes
to the cache folder (``$AIDGE_INTEROP_CACHE``, else
``$XDG_CACHE_HOME/aidge_interop/onnx``, else ``~/.cache/aidge_interop/onnx``;
never the current directory), at most :data:`MAX_ONNX_FILES` of them, the
least recently used removed first. Prepared runners (a session, a loaded
graph) stay in an LRU of :data:`MAX_RUNNERS`. ``get_runner`` also takes the
path of an ONNX file instead of a module (every backend but ``torch``).

Timings are comparable only on the same number of threads: measure inside
:func:`limited_threads`, which pins torch, our engine and Aidge's OpenMP to
:data:`THREADS`; ONNX Runtime sessions are created with ``THREADS`` intra-op
threads.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import hashlib
import importlib
import inspect
import os
import re
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from .._util import write_atomic

if TYPE_CHECKING:
    import torch

__all__ = [
    "BACKENDS", "THREADS", "ONNX_OPSET", "MAX_RUNNERS", "MAX_ONNX_FILES", "CACHE_ENV",
    "available", "available_backends", "limited_threads", "fingerprint", "cache_folder",
    "export_onnx", "get_runner", "clear_runners",
]

#: Known engines: id -> display name, in the order the comparison lists them.
BACKENDS = {
    "torch": "PyTorch",
    "onnxruntime": "ONNX Runtime",
    "aidge_interop": "aidge_interop (C engine)",
    "aidge": "Eclipse Aidge (CPU)",
}
_REQUIRES = {
    "torch": ("torch",),
    "onnxruntime": ("onnxruntime",),
    "aidge_interop": ("aidge_interop._C",),
    "aidge": ("aidge_core", "aidge_backend_cpu", "aidge_onnx"),
}
_INSTALL = {
    "torch": "pip install torch",
    "onnxruntime": "pip install onnxruntime",
    "aidge_interop": "pip install aidge_interop",
    "aidge": "pip install aidge-core==0.10.1 aidge-backend-cpu==0.10.1 aidge-onnx==0.10.1; "
             "see docs/compare.md",
}

#: Compute threads of every timed run (all engines alike).
THREADS = 1
#: Opset of the exports (Eclipse Aidge's importer, aidge_onnx 0.10, reads it).
ONNX_OPSET = 13
#: Prepared runners kept in memory (each holds a module, a session or a graph).
MAX_RUNNERS = 8
#: ONNX files kept in the cache folder; the least recently used go first.
MAX_ONNX_FILES = 32
#: Environment variable that overrides the cache folder.
CACHE_ENV = "AIDGE_INTEROP_CACHE"
#: A temporary export file older than this (seconds) belongs to a killed export.
STALE_TEMP_S = 3600

# (backend, weights fingerprint, shape, THREADS) -> numpy -> numpy function
_runners: OrderedDict[tuple, Callable[[np.ndarray], np.ndarray]] = OrderedDict()
_FINGERPRINT_ATTR = "_aidge_interop_fingerprint"
# the files export_onnx writes, and only those, are pruned
_EXPORT_NAME = re.compile(r"[0-9a-f]{12}_[0-9]+(x[0-9]+)*_opset[0-9]+\.onnx")
# the temporary files write_atomic makes for them (a killed export leaves one)
_EXPORT_TEMP = re.compile(r"\.(" + _EXPORT_NAME.pattern + r")\.[0-9]+\.[0-9a-f]{8}\.tmp")


def _check_key(key: str) -> None:
    if key not in BACKENDS:
        raise ValueError(f"unknown backend {key!r} (known: {', '.join(BACKENDS)})")


def available(key: str) -> tuple[bool, str]:
    """Whether backend ``key`` can run here: ``(True, "")``, or ``(False,
    reason)`` with the import error and the command that installs it."""
    _check_key(key)
    for name in _REQUIRES[key]:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken binary raises more than ImportError
            return False, f"{type(exc).__name__}: {exc} ({_INSTALL[key]})"
    return True, ""


def available_backends() -> list[str]:
    """Ids of the backends that can run here, in the order of BACKENDS."""
    return [key for key in BACKENDS if available(key)[0]]


# -- threads -------------------------------------------------------------------

def _aidge_openmp():
    """The OpenMP runtime Aidge's CPU kernels use, when Aidge is imported."""
    module = sys.modules.get("aidge_backend_cpu")
    return _openmp_beside(os.path.dirname(module.__file__)) if module else None


@functools.cache
def _openmp_beside(package_dir: str):
    # the wheel bundles its own libgomp (auditwheel); a source build links the system's
    bundled = sorted(glob.glob(os.path.join(package_dir + ".libs", "libgomp*.so*")))
    try:
        if bundled:
            return ctypes.CDLL(bundled[0])
        return ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return None


@contextlib.contextmanager
def limited_threads():
    """Runs its body with torch, our engine and Eclipse Aidge (when imported)
    on :data:`THREADS` thread(s); the previous settings come back on exit."""
    import torch

    from .. import _C

    omp = _aidge_openmp()
    saved = (torch.get_num_threads(), _C.get_num_threads(),
             omp.omp_get_max_threads() if omp else 0)
    torch.set_num_threads(THREADS)
    _C.set_num_threads(THREADS)
    if omp:
        omp.omp_set_num_threads(THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        _C.set_num_threads(saved[1])
        if omp:
            omp.omp_set_num_threads(saved[2])


# -- fingerprints and the ONNX cache ------------------------------------------------

def _state(module) -> list[tuple[str, "torch.Tensor"]]:
    return [*module.named_parameters(), *module.named_buffers()]


def _architecture(module) -> str:
    """What besides the weights decides the computation: the module tree with
    its hyper-parameters (repr) and the source of every class not from torch."""
    parts = [repr(module)]
    classes = {type(m) for m in module.modules()}
    for cls in sorted(classes, key=lambda c: (c.__module__, c.__qualname__)):
        if cls.__module__.split(".")[0] == "torch":
            continue
        try:
            parts.append(inspect.getsource(cls))
        except (OSError, TypeError):  # defined interactively
            parts.append(f"{cls.__module__}.{cls.__qualname__}")
    return "\n".join(parts)


def fingerprint(module: "torch.nn.Module") -> str:
    """12 hex digits (truncated SHA-1) of a module's weights and buffers
    (names, dtypes, shapes, values) and architecture (repr, source of its
    own classes): a retrained model gets another ONNX file and runner.

    Cached on the module, keyed on each tensor's identity, ``data_ptr()``
    and version counter: replacing a tensor or changing it in place through
    torch (an optimizer step, ``load_state_dict``, ``p.add_()`` under
    ``no_grad``) recomputes it. Writes that bypass torch's version counter
    (through ``p.data``, a NumPy view, DLPack) are not seen.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"fingerprint: expected a torch.nn.Module, not {type(module).__name__}")
    tensors = _state(module)
    key = None
    if not any(t.is_inference() for _, t in tensors):  # inference tensors have no version
        key = tuple((n, id(t), t.data_ptr(), t._version, tuple(t.shape), t.dtype)
                    for n, t in tensors)
        cached = module.__dict__.get(_FINGERPRINT_ATTR)
        if cached is not None and cached[0] == key:
            return cached[1]
    digest = hashlib.sha1(_architecture(module).encode())
    for name, t in tensors:
        digest.update(f"\n{name} {t.dtype} {tuple(t.shape)}\n".encode())
        digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    value = digest.hexdigest()[:12]
    if key is not None:
        module.__dict__[_FINGERPRINT_ATTR] = (key, value)
    return value


def _file_fingerprint(path: str | os.PathLike) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha1").hexdigest()[:12]
    except FileNotFoundError:
        raise FileNotFoundError(f"no ONNX file at {os.fspath(path)!r}") from None


def cache_folder(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where exports go: ``cache_dir``, else ``$AIDGE_INTEROP_CACHE``, else
    ``aidge_interop/onnx`` in the user's cache directory (``$XDG_CACHE_HOME``
    when absolute, else ``~/.cache``)."""
    path = cache_dir or os.environ.get(CACHE_ENV)
    if not path:
        base = os.environ.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(base):  # the XDG spec: a relative value is ignored
            base = os.path.join(os.path.expanduser("~"), ".cache")
        if not os.path.isabs(base):
            raise RuntimeError(f"no home directory to put the ONNX cache in: set {CACHE_ENV}")
        path = os.path.join(base, "aidge_interop", "onnx")
    return Path(path).expanduser().absolute()


def _shape(shape) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        dims = ()
    if not dims or any(d <= 0 for d in dims) or any(d != s for d, s in zip(dims, shape)):
        raise ValueError(f"shape must be a tuple of positive ints, e.g. (1, 3, 32, 32); "
                         f"got {shape!r}")
    return dims


def _prune_onnx(keep: Path) -> None:
    """Removes the least recently used exports beyond MAX_ONNX_FILES (never
    ``keep``, the file just written) and temporary files left by killed
    exports. Only files named like exports are touched."""
    now = time.time()
    files = []
    for entry in os.scandir(keep.parent):
        try:
            if _EXPORT_TEMP.fullmatch(entry.name):
                if now - entry.stat().st_mtime > STALE_TEMP_S:
                    os.unlink(entry.path)
            elif _EXPORT_NAME.fullmatch(entry.name) and entry.name != keep.name:
                files.append((entry.stat().st_atime_ns, entry.path))
        except FileNotFoundError:  # another process pruned it first
            pass
    files.sort()
    for _, path in files[:max(0, len(files) + 1 - MAX_ONNX_FILES)]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def export_onnx(module: "torch.nn.Module", shape, *,
                cache_dir: str | os.PathLike | None = None) -> Path:
    """The ONNX file of ``module`` for an input of ``shape`` (fixed; opset
    ONNX_OPSET; inputs ``input_0``, output ``output_0``), exported once.

    The file is named by :func:`fingerprint` and shape, written to a
    temporary file and renamed (an interrupted export never leaves a
    truncated file), reused when present (its access time then marks it
    recently used; its content and mtime are left alone) and pruned to
    MAX_ONNX_FILES, least recently used first.
    """
    import torch

    from ..bridge.wrapping import _model_dtype, export_onnx_bytes

    shape = _shape(shape)
    folder = cache_folder(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{fingerprint(module)}_{'x'.join(map(str, shape))}_opset{ONNX_OPSET}.onnx"
    try:
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
        return path
    except FileNotFoundError:
        pass
    example = torch.zeros(shape, dtype=_model_dtype(module))
    try:
        data = export_onnx_bytes(module, [example], opset=ONNX_OPSET, dynamic_batch=False)
    except Exception as exc:
        raise RuntimeError(f"export_onnx: torch could not export {type(module).__name__} "
                           f"for an input of shape {shape}: {exc}") from exc
    write_atomic(path, data)
    _prune_onnx(path)
    return path


# -- runners --------------------------------------------------------------------------

def _single(names, what: str, where) -> str:
    if len(names) != 1:
        raise ValueError(f"{where}: the model has {len(names)} {what}s ({', '.join(names)}); "
                         f"runners take models with one input and one output")
    return names[0]


def _torch_runner(module):
    """The module itself, in eval mode (restored after the call), without autograd."""
    import torch

    def run(x: np.ndarray) -> np.ndarray:
        restore = module.training
        if restore:
            module.eval()
        try:
            with torch.no_grad():
                out = module(torch.from_numpy(np.ascontiguousarray(x)))
        finally:
            if restore:
                module.train()
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{type(module).__name__} returns {type(out).__name__}; runners "
                            "take models with one output tensor")
        return out.numpy()

    return run


def _onnxruntime_runner(path):
    """ONNX Runtime, CPU provider, THREADS intra-op thread(s), sequential."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    name = _single([i.name for i in session.get_inputs()], "input", path)
    _single([o.name for o in session.get_outputs()], "output", path)

    def run(x: np.ndarray) -> np.ndarray:
        return session.run(None, {name: x})[0]

    return run


def _engine_runner(path):
    """aidge_interop's engine on the ONNX file (eval semantics)."""
    from ..onnx.importer import load_onnx

    graph = load_onnx(path)
    graph.training = False
    _single(graph.input_names, "input", path)
    _single(graph.output_names, "output", path)

    def run(x: np.ndarray) -> np.ndarray:
        return graph.forward([x])[0]

    return run


def _aidge_runner(path, shape):
    """Eclipse Aidge (:mod:`.eclipse_aidge`): the ONNX file simplified by our
    engine's constant folding for ``shape``, ``aidge_onnx.load_onnx``,
    backend "cpu", dimensions forwarded, sequential scheduler."""
    import onnx

    from .eclipse_aidge import AidgeGraph, fold_constants

    graph = AidgeGraph(fold_constants(onnx.load(os.fspath(path)), [shape]), [shape])
    _single([f"{node.name()}:{index}" for node, index in graph.outputs], "output", path)

    def run(x: np.ndarray) -> np.ndarray:
        return graph.forward([x])[0]

    return run


def get_runner(backend: str, model, shape, *,
               cache_dir: str | os.PathLike | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """A function ``x -> y`` (NumPy arrays) that runs ``model`` on ``backend``
    for an input of ``shape``.

    ``model`` is a ``torch.nn.Module`` (exported with :func:`export_onnx`
    for the ONNX backends) or the path of an ONNX file (not for ``torch``).
    The runner is prepared once per (backend, weights, shape, THREADS) and
    kept in an LRU of MAX_RUNNERS. Call it inside :func:`limited_threads`
    to time it. Raises RuntimeError when the backend is unavailable.
    """
    _check_key(backend)
    ok, reason = available(backend)
    if not ok:
        raise RuntimeError(f"{BACKENDS[backend]} is unavailable: {reason}")
    shape = _shape(shape)
    is_file = isinstance(model, (str, os.PathLike))
    if is_file and backend == "torch":
        raise ValueError(f"the torch backend runs a torch.nn.Module, not an ONNX file "
                         f"({os.fspath(model)!r})")
    key = (backend, _file_fingerprint(model) if is_file else fingerprint(model), shape, THREADS)
    runner = _runners.get(key)
    if runner is not None:
        _runners.move_to_end(key)
        return runner
    if backend == "torch":
        runner = _torch_runner(model)
    else:
        path = model if is_file else export_onnx(model, shape, cache_dir=cache_dir)
        if backend == "onnxruntime":
            runner = _onnxruntime_runner(path)
        elif backend == "aidge_interop":
            runner = _engine_runner(path)
        else:
            runner = _aidge_runner(path, shape)
    _runners[key] = runner
    while len(_runners) > MAX_RUNNERS:
        _runners.popitem(last=False)
    return runner


def clear_runners() -> None:
    """Forgets every prepared runner (frees their modules, sessions, graphs)."""
    _runners.clear()
