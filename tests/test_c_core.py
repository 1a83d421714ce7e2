"""The engine core's own C unit tests (csrc/tests), built without Python.

Runs them twice: a plain -Werror build, and an AddressSanitizer +
UndefinedBehaviorSanitizer build that must report nothing.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parent.parent / "csrc"

pytestmark = [
    pytest.mark.skipif(not (CSRC / "Makefile").exists(), reason="needs the source tree (csrc/)"),
    pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None,
                       reason="needs make and a C compiler"),
]


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "asan-ubsan"])
def test_c_core(sanitize, tmp_path):
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    cmd = ["make", "-C", str(CSRC), "test", f"BUILD={tmp_path}", f"SANITIZE={int(sanitize)}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert " 0 failed" in proc.stdout, report
    assert "runtime error" not in report and "AddressSanitizer" not in report, report
