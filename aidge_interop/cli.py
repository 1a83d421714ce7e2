"""Older path of :mod:`aidge_interop.compare.cli` (the ``aidge-interop``
command): the same module object; ``python -m aidge_interop.cli`` runs it."""
import importlib
import sys

_cli = importlib.import_module("aidge_interop.compare.cli")
if __name__ == "__main__":
    sys.exit(_cli.main())
sys.modules[__name__] = _cli
