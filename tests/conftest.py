"""Wiring shared by the suites in tests/.

- ``tests/`` goes first on ``sys.path``, so that ``from utils import
  ModelTester``, ``import operators`` and ``import models`` work whether pytest
  runs from the repository root (``pytest tests/test_operators.py``) or from
  here (``pytest test_operators.py``), with any ``--import-mode``.
- Under pytest-xdist each worker runs torch and the engine's BLAS on one
  thread: n workers each starting one thread per core would oversubscribe
  the machine, and the timings that ModelTester's slowdown check compares
  would measure the contention.
- ``pytester`` is enabled for the tests of the operator framework and its
  pytest plugin (test_operator_framework.py).

The operator fixtures themselves come from ``aidge_interop.testing``
(``make_operator_fixture``), whose pytest plugin registers their marks.
"""
import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

pytest_plugins = ["pytester"]


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        import aidge_interop

        torch.set_num_threads(1)
        aidge_interop.set_num_threads(1)


@pytest.fixture
def avx512():
    """The AVX-512 kernels on (a test may turn them off), on again after it;
    skips where the CPU or the build has none: one path only there."""
    from aidge_interop import _C

    if not _C._set_avx512(True):
        pytest.skip("no AVX-512 on this CPU or in this build: one path only")
    yield
    _C._set_avx512(True)
