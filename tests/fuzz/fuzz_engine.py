"""atheris entry point: fuzzes load_onnx + forward + backward (harness.run_one)
with the structure-aware mutator (harness.mutate).

Run through run_fuzz.py, which builds the sanitized extension, lays out the
corpus and logs executions and crashes; directly (libFuzzer flags pass
through): ``python tests/fuzz/fuzz_engine.py -max_total_time=60 CORPUS_DIR``.
"""
import hashlib
import os
import sys
from pathlib import Path

import atheris
import numpy  # noqa: F401  (imported before instrumentation: not ours to cover)
import onnx  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parent))

with atheris.instrument_imports(include=["aidge_interop"]):
    import aidge_interop  # noqa: F401
    import aidge_interop.graph  # noqa: F401
    import aidge_interop.onnx.importer  # noqa: F401

from harness import mutate, run_one  # noqa: E402


def test_one_input(data):
    """run_one; an unexpected Python exception also saves its input to
    $AIDGE_FUZZ_CRASHES (libFuzzer saves those of native crashes itself)."""
    try:
        run_one(data)
    except Exception:
        crashes = os.environ.get("AIDGE_FUZZ_CRASHES")
        if crashes:
            name = "pycrash-" + hashlib.sha1(data).hexdigest()
            Path(crashes, name).write_bytes(data)
            print(f"Test unit written to {Path(crashes, name)}", file=sys.stderr)
        raise


def custom_mutator(data, max_size, seed):
    return mutate(data, max_size, seed, atheris.Mutate)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
