"""Helpers of the suites: ``from utils import ModelTester`` (the name the
harness documentation uses); the class lives in :mod:`aidge_interop.testing`."""
from aidge_interop.testing import ModelTester

__all__ = ["ModelTester"]
