"""Build of the C extension aidge_interop._C (metadata lives in pyproject.toml).

Environment switches:
  AIDGE_INTEROP_WERROR=1    warnings are errors (also when CI is set)
  AIDGE_INTEROP_SANITIZE=1  AddressSanitizer + UndefinedBehaviorSanitizer build
                            (run Python with LD_PRELOAD=$(gcc -print-file-name=libasan.so))
  AIDGE_INTEROP_DEBUG=1     -O0 -g3
  AIDGE_INTEROP_NO_BLAS=1   portable reference GEMM instead of OpenBLAS
"""
import os
from glob import glob

import numpy
from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class BuildPyWithPortableKernels(build_py):
    """Ships csrc/portable (the reference kernels every C export copies) as
    package data aidge_interop/portable/."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "aidge_interop", "portable")
        self.mkpath(target)
        for path in sorted(glob("csrc/portable/*.[ch]")):
            self.copy_file(path, os.path.join(target, os.path.basename(path)))


def _flag(name):
    return os.environ.get(name, "").lower() not in ("", "0", "false", "no")


# -fno-trapping-math: no floating-point traps are enabled, so comparisons and
# selects may be vectorised (if-converted); -fno-math-errno: sqrt and friends
# need not set errno, so they vectorise. Values are unchanged (unlike
# -ffast-math, nothing is reassociated or contracted).
compile_args = ["-std=c11", "-Wall", "-Wextra", "-fvisibility=hidden", "-fno-trapping-math",
                "-fno-math-errno"]
link_args = []
if _flag("AIDGE_INTEROP_WERROR") or _flag("CI"):
    compile_args.append("-Werror")
if _flag("AIDGE_INTEROP_DEBUG"):
    compile_args += ["-O0", "-g3"]
else:
    compile_args += ["-O3", "-g0"]
if _flag("AIDGE_INTEROP_SANITIZE"):
    san = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-omit-frame-pointer"]
    compile_args += san
    link_args += san

sources = sorted(glob("csrc/*.c") + glob("csrc/ops/*.c") + glob("csrc/kernels/*.c")
                 + glob("csrc/portable/*.c") + glob("csrc/python/*.c"))

# GEMM library: OpenBLAS from the scipy-openblas32 wheel (a build and runtime
# dependency; aidge_interop/__init__.py loads it before the extension).
include_dirs = ["csrc", numpy.get_include()]
define_macros = []
library_dirs = []
libraries = ["m"]
if not _flag("AIDGE_INTEROP_NO_BLAS"):
    import scipy_openblas32

    define_macros.append(("AI_HAVE_OPENBLAS", "1"))
    library_dirs.append(scipy_openblas32.get_lib_dir())
    libraries.insert(0, scipy_openblas32.get_library())

setup(
    cmdclass={"build_py": BuildPyWithPortableKernels},
    ext_modules=[
        Extension(
            "aidge_interop._C",
            sources=sources,
            include_dirs=include_dirs,
            define_macros=define_macros,
            library_dirs=library_dirs,
            libraries=libraries,
            depends=sorted(glob("csrc/*.h") + glob("csrc/*/*.h")),
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ],
)
