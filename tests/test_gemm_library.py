"""The GEMM library's kernels (aidge_interop/__init__.py): OpenBLAS is asked for
its AVX-512 kernels where the CPU has AVX-512, unless OPENBLAS_CORETYPE is set
(then that choice stands, and the variable is left as it was)."""
import os
import platform
import subprocess
import sys

import pytest

import aidge_interop as ai
from aidge_interop import _avx512_cpu

AVX512 = "avx512f avx512cd avx512bw avx512dq avx512vl"


@pytest.mark.parametrize("flags, expected", [
    (f"fpu sse2 avx avx2 fma {AVX512} avx512_vnni", True),
    ("fpu sse2 avx avx2 fma avx512f avx512cd", False),   # no BW/DQ/VL: not SkylakeX's set
    ("fpu sse2 avx avx2 fma", False),
])
def test_avx512_read_from_cpuinfo(tmp_path, flags, expected):
    f = tmp_path / "cpuinfo"
    f.write_text(f"processor\t: 0\nvendor_id\t: X\nflags\t\t: {flags}\n\n"
                 f"processor\t: 1\nflags\t\t: {flags}\n")
    assert _avx512_cpu(str(f)) is expected


def test_avx512_false_without_cpuinfo(tmp_path):
    assert _avx512_cpu(str(tmp_path / "absent")) is False


@pytest.mark.skipif(not ai._C.gemm_backend().startswith("openblas")
                    or platform.machine() not in ("x86_64", "AMD64"),
                    reason="OpenBLAS's x86 kernels only")
def test_openblas_coretype_set_by_the_user_stands(tmp_path):
    code = ("import os, numpy as np, aidge_interop as ai, torch\n"
            "print(ai._C.gemm_backend()); print(os.environ.get('OPENBLAS_CORETYPE'))\n"
            "a, b = torch.randn(70, 300), torch.randn(300, 90)\n"
            "m = ai.wrap(torch.nn.Linear(300, 90, bias=False), [(70, 300)])\n"
            "with torch.no_grad():\n"
            "    m.weight.copy_(b.t()); out = m(a)\n"
            "torch.testing.assert_close(out.double(), a.double() @ b.double(), "
            "rtol=1e-5, atol=1e-4)\n")
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)  # the installed package, not the checkout
    assert out.returncode == 0, out.stderr
    backend, variable = out.stdout.split("\n")[:2]
    assert backend == "openblas (Haswell)"
    assert variable == "Haswell"


def test_gemm_backend_names_the_kernels():
    name = ai._C.gemm_backend()
    assert name == "reference" or (name.startswith("openblas (") and name.endswith(")"))
