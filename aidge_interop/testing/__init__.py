"""Validation harness: ModelTester and the JSON-driven operator fixture factory.

``ModelTester`` (model_tester.py) runs a torch model and its engine twin side
by side; ``OperatorConfig`` / ``build_cases`` / ``make_operator_fixture``
(operators.py) turn per-operator JSON configurations into pytest cases;
plugin.py is the pytest plugin; analyze.py reads the results of a run
(``python -m aidge_interop.analyze``).

The names below are imported on first use: ``ModelTester`` imports torch,
``make_operator_fixture`` pytest when it is called; nothing here needs pytest
otherwise, and analyze.py needs neither.

``INCLUDE_FORWARD_ONLY_CASES`` is one toggle under two names: reading or
setting ``aidge_interop.testing.INCLUDE_FORWARD_ONLY_CASES`` reads or sets
``aidge_interop.testing.operators.INCLUDE_FORWARD_ONLY_CASES``, the one
:func:`build_cases` reads.
"""
import sys
import types

_LAZY = {"ModelTester": ".model_tester", "OperatorCase": ".operators",
         "OperatorConfig": ".operators", "OperatorConfigWarning": ".operators",
         "SUPPORTED_ATTRS": ".operators", "INCLUDE_FORWARD_ONLY_CASES": ".operators",
         "build_cases": ".operators", "make_operator_fixture": ".operators"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'aidge_interop.testing' has no attribute {name!r}")


class _Testing(types.ModuleType):
    """This package's type: setting the toggle sets the operators module's."""

    def __setattr__(self, name, value):
        if name == "INCLUDE_FORWARD_ONLY_CASES":
            from . import operators

            operators.INCLUDE_FORWARD_ONLY_CASES = value
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Testing

__all__ = [
    "ModelTester", "OperatorCase", "OperatorConfig", "OperatorConfigWarning",
    "SUPPORTED_ATTRS", "INCLUDE_FORWARD_ONLY_CASES", "build_cases", "make_operator_fixture",
]
