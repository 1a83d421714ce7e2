"""``python -m aidge_interop``: the ``aidge-interop`` command (see :mod:`aidge_interop.cli`)."""
import sys

from .cli import main

sys.exit(main(prog="python -m aidge_interop"))
