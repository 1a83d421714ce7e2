"""``python -m aidge_interop.analyze``, and the older path of
:mod:`aidge_interop.testing.analyze`: the same module object."""
import importlib
import sys

_analyze = importlib.import_module("aidge_interop.testing.analyze")
if __name__ == "__main__":
    sys.exit(_analyze.main())
sys.modules[__name__] = _analyze
