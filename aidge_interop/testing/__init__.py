"""Validation harness: ModelTester and the JSON-driven operator fixture factory.

``ModelTester`` (model_tester.py) runs a torch model and its engine twin side
by side; ``OperatorConfig`` / ``build_cases`` / ``make_operator_fixture``
(operators.py) turn per-operator JSON configurations into pytest cases.
"""
from .operators import (
    INCLUDE_FORWARD_ONLY_CASES,
    SUPPORTED_ATTRS,
    OperatorCase,
    OperatorConfig,
    build_cases,
    make_operator_fixture,
)



def __getattr__(name):
    if name == "ModelTester":  # imports torch: only when asked for
        from .model_tester import ModelTester

        return ModelTester
    raise AttributeError(f"module 'aidge_interop.testing' has no attribute {name!r}")


__all__ = [
    "ModelTester", "OperatorCase", "OperatorConfig", "SUPPORTED_ATTRS",
    "INCLUDE_FORWARD_ONLY_CASES", "build_cases", "make_operator_fixture",
]
