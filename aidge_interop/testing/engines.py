"""The engines the harness checks against torch.

- ``aidge_interop``: this package's engine (:func:`aidge_interop.wrap`, :class:`aidge_interop.SGD`);
- ``aidge``: Eclipse Aidge (:class:`~aidge_interop.compare.eclipse_aidge.AidgeModel`,
  :class:`~aidge_interop.compare.eclipse_aidge.AidgeSGD`: ``aidge_core``,
  ``aidge_backend_cpu``, ``aidge_onnx``, ``aidge_learning``).

Chosen by ``pytest --engine aidge``, ``make_operator_fixture(cfg, engine=...)``
or ``ModelTester(..., engine=...)``. What Eclipse Aidge cannot run raises
:class:`~aidge_interop._util.EngineUnsupported` with its message, which the
pytest plugin reports as a skip. Nothing heavy is imported here.
"""
from __future__ import annotations

import importlib.util

__all__ = ["ENGINES", "DEFAULT_ENGINE", "check_engine", "engine_available", "engine_model"]

#: Engine id -> name in messages.
ENGINES = {"aidge_interop": "aidge_interop", "aidge": "Eclipse Aidge"}
DEFAULT_ENGINE = "aidge_interop"
_AIDGE_PACKAGES = ("aidge_core", "aidge_backend_cpu", "aidge_onnx", "aidge_learning")
AIDGE_INSTALL = ("pip install aidge-core==0.10.1 aidge-backend-cpu==0.10.1 aidge-onnx==0.10.1 "
                 "aidge-learning==0.10.1 (see docs/testing.md)")


def check_engine(engine: str, where: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"{where}: unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    return engine


def engine_available(engine: str) -> tuple[bool, str]:
    """``(True, "")``, or ``(False, reason)`` naming what is missing and how to install it."""
    if engine == "aidge":
        missing = [p for p in _AIDGE_PACKAGES if importlib.util.find_spec(p) is None]
        if missing:
            return False, f"Eclipse Aidge is not installed (no {', '.join(missing)}): " \
                          f"{AIDGE_INSTALL}"
    return True, ""


def engine_model(engine: str, torch_model, inputs, train: bool, lr: float):
    """``torch_model`` wrapped by ``engine`` for ``inputs`` (example float
    tensors, or their shapes: one per input), and its SGD of learning rate
    ``lr`` when ``train`` and the model has parameters that require grad
    (else None)."""
    check_engine(engine, "engine_model")
    if engine == "aidge":
        from ..compare.eclipse_aidge import AidgeModel as wrap, AidgeSGD as SGD
    else:
        from ..bridge import SGD, wrap
    model = wrap(torch_model, list(inputs))
    optimizer = None
    if train and any(p.requires_grad for p in model.parameters()):
        optimizer = SGD(model, lr=lr)
    return model, optimizer
