"""The engine core's own C unit tests (csrc/tests), built without Python.

Runs them three times: a plain -Werror build, an AddressSanitizer +
UndefinedBehaviorSanitizer build and a ThreadSanitizer build (the thread
pool's lock-free job hand-off), which must report nothing.
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


@pytest.mark.parametrize("sanitize", ["0", "1", "thread"], ids=["plain", "asan-ubsan", "tsan"])
def test_c_core(sanitize, tmp_path):
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
               TSAN_OPTIONS="halt_on_error=1:exitcode=66")
    cmd = ["make", "-C", str(CSRC), "test", f"BUILD={tmp_path}", f"SANITIZE={sanitize}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    report = proc.stdout + proc.stderr
    if sanitize == "thread" and proc.returncode != 0 and "unexpected memory mapping" in report:
        pytest.skip("ThreadSanitizer cannot run on this kernel's address layout")
    assert proc.returncode == 0, report
    assert " 0 failed" in proc.stdout, report
    assert "runtime error" not in report and "Sanitizer" not in report, report
