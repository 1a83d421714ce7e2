"""``python -m aidge_interop``: the ``aidge-interop`` command
(see :mod:`aidge_interop.compare.cli`)."""
import sys

from .compare.cli import main

sys.exit(main(prog="python -m aidge_interop"))
