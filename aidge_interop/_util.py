"""Helpers that several parts share: atomic file writes, and what the
command-line tools have in common (usage errors, the progress line, argument
and output checks). Nothing here belongs to one part."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import uuid
from pathlib import Path

__all__ = ["write_atomic", "UsageError", "EngineUnsupported", "Progress", "int_arg",
           "check_output", "one_line", "finite"]


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to a temporary file beside ``path``, then renames it
    over ``path``: readers see the old file or the new one, never a part;
    an error or a kill leaves nothing at ``path`` that was not there."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# -- command lines ----------------------------------------------------------------------

class UsageError(Exception):
    """A mistake in the command line: reported on one line, exit status 2."""


class EngineUnsupported(RuntimeError):
    """An engine under test cannot run a model: an operator it lacks, a
    backward it does not have, an error of its own. The message is the
    engine's; the harness reports the case as skipped, not failed."""


class Progress:
    """One self-rewriting line on ``stream`` when it is a terminal; silent otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.active = self.stream.isatty()
        self._last = 0.0

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.active and (force or now - self._last >= 0.1):
            self._last = now
            self.stream.write(f"\r\x1b[K{text}")
            self.stream.flush()

    def close(self) -> None:
        if self.active:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def int_arg(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {minimum}")
    return value


def check_output(option: str, path: str | None) -> None:
    if path and not Path(path).absolute().parent.is_dir():
        raise UsageError(f"{option} {path!r}: folder {str(Path(path).absolute().parent)!r} "
                         "does not exist")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def finite(value):
    """``value`` with NaN and infinities as None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
