"""Older path of :mod:`aidge_interop.compare.locate`: the same module object."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("aidge_interop.compare.locate")
