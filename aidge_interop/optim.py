"""Older path of :mod:`aidge_interop.bridge.optim`: the same module object."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("aidge_interop.bridge.optim")
