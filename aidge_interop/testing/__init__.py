"""Validation harness: ModelTester and the JSON-driven operator fixture factory.

``ModelTester`` (model_tester.py) runs a torch model and its engine twin side
by side; ``OperatorConfig`` / ``build_cases`` / ``make_operator_fixture``
(operators.py) turn per-operator JSON configurations into pytest cases;
plugin.py is the pytest plugin; analyze.py reads the results of a run
(``python -m aidge_interop.analyze``).

The names below are imported on first use: ``ModelTester`` imports torch, the
operator framework pytest, and analyze.py needs neither.
"""

_LAZY = {"ModelTester": ".model_tester", "OperatorCase": ".operators",
         "OperatorConfig": ".operators", "SUPPORTED_ATTRS": ".operators",
         "INCLUDE_FORWARD_ONLY_CASES": ".operators", "build_cases": ".operators",
         "make_operator_fixture": ".operators"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'aidge_interop.testing' has no attribute {name!r}")


__all__ = [
    "ModelTester", "OperatorCase", "OperatorConfig", "SUPPORTED_ATTRS",
    "INCLUDE_FORWARD_ONLY_CASES", "build_cases", "make_operator_fixture",
]
