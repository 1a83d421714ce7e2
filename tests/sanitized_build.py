"""A copy of aidge_interop whose extension is built with AddressSanitizer and
UndefinedBehaviorSanitizer, for the sanitizer test (test_sanitizers.py) and
the fuzzer (tests/fuzz/run_fuzz.py).

``build_package(dest)`` compiles ``_C`` from csrc/ (``make -C csrc pyext
SANITIZE=1``) and lays out ``dest/aidge_interop`` (the Python sources and the
sanitized extension); ``sanitizer_env(dest)`` is the environment that runs
Python on it: ``PYTHONPATH=dest``, the ASan runtime preloaded (the
interpreter itself is not instrumented), leak detection off (CPython keeps
memory until exit), every report fatal.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
PACKAGE = ROOT / "aidge_interop"

ASAN_OPTIONS = "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1:abort_on_error=1"


def can_build() -> str | None:
    """None when a sanitized build is possible here, else the reason why not."""
    if not (CSRC / "Makefile").exists():
        return "needs the source tree (csrc/)"
    if shutil.which("make") is None or shutil.which("gcc") is None:
        return "needs make and gcc"
    if not os.path.exists(asan_runtime()):
        return "gcc has no AddressSanitizer runtime (libasan)"
    return None


def build_package(dest: Path, cflags: str = "-O1 -g") -> Path:
    """Builds the sanitized package under dest; returns dest (for PYTHONPATH)."""
    dest = Path(dest)
    build = dest / "build"
    env = dict(os.environ, CFLAGS=cflags)
    proc = subprocess.run(
        ["make", "-C", str(CSRC), "pyext", "SANITIZE=1", f"BUILD={build}",
         f"PYTHON={sys.executable}"],
        env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"sanitized build failed:\n{proc.stdout}\n{proc.stderr}")
    pkg = dest / "aidge_interop"
    if pkg.exists():
        shutil.rmtree(pkg)
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    for so in build.glob("_C*"):
        shutil.copy2(so, pkg / so.name)
    # the portable kernels the C export copies, laid out as an install does
    (pkg / "portable").mkdir(exist_ok=True)
    for src in sorted((CSRC / "portable").glob("*.[ch]")):
        shutil.copy2(src, pkg / "portable" / src.name)
    return dest


def _gcc_file(name: str) -> str:
    out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True)
    return out.stdout.strip()


def asan_runtime() -> str:
    return _gcc_file("libasan.so")


def sanitizer_env(dest: Path, **extra) -> dict:
    # libstdc++ from the start too: ASan intercepts C++ throws (onnx's and
    # torch's pybind11 errors) and must find the real __cxa_throw
    preload = f"{asan_runtime()}:{_gcc_file('libstdc++.so.6')}"
    env = dict(os.environ, PYTHONPATH=str(dest), LD_PRELOAD=preload,
               ASAN_OPTIONS=ASAN_OPTIONS, UBSAN_OPTIONS=UBSAN_OPTIONS)
    env.update(extra)
    return env
