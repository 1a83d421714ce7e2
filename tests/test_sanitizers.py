"""The engine, tensor and export tests (and the fuzz regressions) under
AddressSanitizer and UndefinedBehaviorSanitizer: zero reports.

The extension is built again with both sanitizers (-O1; make -C csrc pyext
SANITIZE=1, see sanitized_build.py) into a temporary folder, and a chosen
subset of the suites runs in a subprocess on that copy with the ASan
runtime preloaded. Any report aborts the subprocess. Tests whose subject is
resident memory are left out (ASan's quarantine keeps freed memory), and so
are the slow ones. About two minutes on two cores, build included. The C core's own unit tests run sanitized in
test_c_core.py.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sanitized_build import build_package, can_build, sanitizer_env

TESTS = Path(__file__).resolve().parent
SUBSET = ["test_engine.py", "test_tensor.py", "test_export.py", "test_fuzz_regressions.py",
          "test_bad_inputs.py", "test_concurrency.py", "test_ops_shape_reduce.py",
          "test_ops_elementwise.py",
          # the conv kernels read rows past their end into padded slack by design
          "test_ops_conv_pool.py", "test_grad_assign.py", "test_block_channels.py",
          "test_simd.py",  # (the AVX-512 kernels, where the CPU has them)
          "test_control_flow.py", "test_ops_misc.py", "test_dtypes.py", "test_qlinear.py"]

pytestmark = pytest.mark.skipif(can_build() is not None, reason=str(can_build()))


def test_suites_under_asan_and_ubsan(tmp_path):
    dest = build_package(tmp_path / "sanitized")
    files = [str(TESTS / f) for f in SUBSET if (TESTS / f).exists()]
    env = sanitizer_env(dest)
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-m", "not slow and not cuda", "-k", "not leak", *files]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)  # not the checkout: the sanitized copy is imported
    report = proc.stdout[-20000:] + proc.stderr[-20000:]
    assert proc.returncode == 0, report
    assert "runtime error" not in report and "AddressSanitizer" not in report, report
    assert int(re.search(r"(\d+) passed", proc.stdout).group(1)) > 500, report
    assert f"{dest}{os.sep}aidge_interop" in subprocess.run(
        [sys.executable, "-c", "import aidge_interop; print(aidge_interop.__file__)"],
        env=env, cwd=tmp_path, capture_output=True, text=True).stdout
