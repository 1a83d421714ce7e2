"""Operator test framework: JSON benchmark configurations to pytest cases.

Each operator under test is declared once as an :class:`OperatorConfig`;
:func:`build_cases` turns it into a list of :class:`OperatorCase` (parsed
from a JSON file in one of three layouts, or given by hand), and
:func:`make_operator_fixture` into a parametrized pytest fixture that yields
the torch model, its engine twin and the shapes to feed them::

    CONV2D_CONFIG = OperatorConfig(
        name="Conv2D", op_class=Conv2DModel, json_path=CONFIG_ROOT / "conv2d.json",
        specs_to_kwargs=lambda specs: {"in_channels": specs[0]["shape"][1],
                                       "out_channels": specs[1]["shape"][0]},
    )
    conv2d_case = make_operator_fixture(CONV2D_CONFIG)

    def test_Conv2D_interop(conv2d_case):
        ...

The layouts (``benchmark_flat``, ``benchmark_ok``, ``simple``, ``manual``),
the merging rules and the test ids are specified in
``shared/spec/operator-configs.md``. In short: a *leaf* is one case; any other
object is a *group* whose keys label leaves or further groups; ids are the
operator name and the labels joined by ``_``
(``Conv2D_attributes_kernel_square``). Leaves under a group named ``shape``
are forward-only and dropped unless :attr:`OperatorConfig.forward_only_cases`
(default: the module-level :data:`INCLUDE_FORWARD_ONLY_CASES`, which the
plugin's ``--forward-only-cases`` option sets) keeps them.

A configuration that cannot be read raises :class:`ValueError` naming the
file and the JSON path of the culprit, at collection time; nothing is
silently skipped::

    ValueError: configs/conv2d.json: test_configurations.attributes.k5.attributes.kernel_dims:
    expected a list of numbers, got 5

Only pytest is imported here; torch and the engine are imported by the
fixture when a case runs.
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from .engines import DEFAULT_ENGINE, check_engine, engine_available, engine_model

__all__ = [
    "OperatorCase", "OperatorConfig", "SUPPORTED_ATTRS", "INCLUDE_FORWARD_ONLY_CASES",
    "LEARNING_RATE", "build_cases", "make_operator_fixture", "negated",
]

#: Keep forward-only cases (``shape`` sections) when an :class:`OperatorConfig`
#: does not say; read when :func:`build_cases` runs. Set it on this module
#: (``aidge_interop.testing.operators.INCLUDE_FORWARD_ONLY_CASES = True``) or
#: run pytest with ``--forward-only-cases``.
INCLUDE_FORWARD_ONLY_CASES = False

#: Learning rate of the engine SGD the fixture attaches to a training case;
#: the default ``learning_rate`` of :class:`ModelTester`.
LEARNING_RATE = 0.01


def negated(value: bool) -> bool:
    """Type of an attribute whose torch kwarg means the opposite
    (``no_bias: true`` -> ``bias=False``)."""
    return not value


#: JSON attribute name (the graph engine's) -> ``(torch kwarg, type)``. The
#: type converts the JSON value: ``tuple`` (a list of numbers), ``int``,
#: ``float``, ``bool``, ``str`` or :func:`negated` (a bool, inverted).
#: Extend it in place, or pass ``OperatorConfig(supported_attrs=...)``.
SUPPORTED_ATTRS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "kernel_dims": ("kernel_size", tuple),
    "stride_dims": ("stride", tuple),
    "dilation_dims": ("dilation", tuple),
    "padding_dims": ("padding", tuple),
    "ceil_mode": ("ceil_mode", bool),
    "count_include_pad": ("count_include_pad", bool),
    "nb_groups": ("groups", int),
    "output_padding": ("output_padding", tuple),
    "no_bias": ("bias", negated),
    "axes": ("dim", tuple),
    "axis": ("dim", int),
    "keep_dims": ("keepdim", bool),
    "alpha": ("alpha", float),
    "beta": ("beta", float),
    "negative_slope": ("negative_slope", float),
    "epsilon": ("eps", float),
    "momentum": ("momentum", float),
    "approximate": ("approximate", str),
    "pads": ("pad", tuple),
    "mode": ("mode", str),
    "value": ("value", float),
}

LEAF_KEYS = frozenset({"attributes", "input_specs", "test_backward", "output_size",
                       "expected_failure"})
SIMPLE_LEAF_KEYS = LEAF_KEYS | {"input_size"}
BASE_KEYS = frozenset({"attributes", "input_specs"})
BENCHMARK_KEYS = frozenset({"operation", "base_configuration", "test_configurations"})
SPEC_KEYS = frozenset({"name", "shape", "dtype", "data"})
FORWARD_ONLY_GROUP = "shape"


@dataclass
class OperatorCase:
    """One parametrized test case, as consumed by :func:`make_operator_fixture`.

    ``id`` is the pytest id (``Conv2D_attributes_kernel_square``);
    ``op_class(**torch_kwargs)`` builds the torch model; ``output_size`` of
    ``None`` means "whatever the torch model gives on ``input_size``";
    ``expected_failure`` registers the case as ``xfail`` with that reason.
    """

    id: str
    op_class: type
    torch_kwargs: dict
    input_size: tuple
    output_size: Optional[tuple] = None
    test_backward: bool = True
    expected_failure: Optional[str] = None


@dataclass
class OperatorConfig:
    """One operator under test: a JSON file (``json_path``) or a hand-written
    list of cases (``manual_cases``, which wins when both are given).

    ``supported_attrs`` maps JSON attribute names to torch kwargs (default:
    :data:`SUPPORTED_ATTRS`); ``ignored_attrs`` are dropped; ``skip_reasons``
    maps a case key (its id without the ``name_`` prefix) to an xfail reason;
    ``default_input_size`` serves ``simple`` cases that give no input shape;
    ``specs_to_kwargs(merged_input_specs)`` derives constructor kwargs from
    tensor shapes. ``skip_all`` / ``xfail_all`` / ``xfail_backward`` mark
    every case / every case / every training case. ``forward_only_cases``
    keeps ``shape`` sections (default: :data:`INCLUDE_FORWARD_ONLY_CASES`).
    ``backend`` is ``"cpu"`` or ``"cuda"`` (the torch side; cases skip when
    CUDA is unavailable).
    """

    name: str
    op_class: type
    json_path: Optional[Path] = None
    manual_cases: Optional[list] = None
    supported_attrs: dict = field(default_factory=lambda: SUPPORTED_ATTRS)
    ignored_attrs: frozenset = frozenset()
    skip_reasons: dict = field(default_factory=dict)
    default_input_size: Optional[tuple] = None
    specs_to_kwargs: Optional[Callable[[list], dict]] = None
    xfail_all: Optional[str] = None
    skip_all: Optional[str] = None
    xfail_backward: Optional[str] = None
    forward_only_cases: Optional[bool] = None
    backend: Optional[str] = None

    def __post_init__(self):
        where = f"OperatorConfig(name={self.name!r})"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"{where}: 'name' must be a non-empty string")
        if not isinstance(self.op_class, type):
            raise TypeError(f"{where}: 'op_class' must be a torch.nn.Module subclass, "
                            f"got {self.op_class!r}")
        if self.manual_cases is None and self.json_path is None:
            raise ValueError(f"{where}: give 'json_path' or 'manual_cases'")
        if self.backend not in (None, "cpu", "cuda"):
            raise ValueError(f"{where}: 'backend' must be 'cpu' or 'cuda', got {self.backend!r}")
        if self.json_path is not None:
            self.json_path = Path(self.json_path)
        self.ignored_attrs = frozenset(self.ignored_attrs)
        if self.default_input_size is not None:
            self.default_input_size = tuple(self.default_input_size)


def build_cases(cfg: OperatorConfig) -> list[OperatorCase]:
    """The cases of ``cfg``: its ``manual_cases`` as they are, or its JSON
    file parsed (layout detected), with forward-only cases dropped unless
    requested. Raises :class:`ValueError` naming the file and JSON path of
    anything it cannot read."""
    if cfg.manual_cases is not None:
        cases = [(case, False) for case in _check_manual(cfg)]
    else:
        cases = _Parser(cfg).cases()
    keys = {_case_key(cfg, case) for case, _ in cases}
    unknown = sorted(set(cfg.skip_reasons) - keys)
    if unknown:
        raise ValueError(f"OperatorConfig(name={cfg.name!r}): skip_reasons names no case: "
                         f"{unknown}; the case keys are {sorted(keys)}")
    keep_forward_only = (INCLUDE_FORWARD_ONLY_CASES if cfg.forward_only_cases is None
                         else cfg.forward_only_cases)
    return [case for case, in_shape_section in cases
            if case.test_backward or not in_shape_section or keep_forward_only]


def _check_manual(cfg: OperatorConfig) -> list[OperatorCase]:
    seen = set()
    for i, case in enumerate(cfg.manual_cases):
        if not isinstance(case, OperatorCase):
            raise TypeError(f"OperatorConfig(name={cfg.name!r}): manual_cases[{i}] is "
                            f"{type(case).__name__}, not an OperatorCase")
        if case.id in seen:
            raise ValueError(f"OperatorConfig(name={cfg.name!r}): duplicate case id "
                             f"{case.id!r} in manual_cases")
        seen.add(case.id)
    return list(cfg.manual_cases)


def _case_key(cfg: OperatorConfig, case: OperatorCase) -> str:
    return case.id.removeprefix(f"{cfg.name}_")


def _is_group(obj: dict, leaf_keys: frozenset) -> bool:
    """A group holds only objects; a leaf holding only ``attributes`` (an
    object of attribute values) is told apart by those values not being
    objects."""
    if not obj or not all(isinstance(v, dict) for v in obj.values()):
        return False
    attrs = obj.get("attributes")
    looks_like_leaf = set(obj) <= leaf_keys and not any(
        isinstance(v, dict) for v in (attrs or {}).values())
    return not looks_like_leaf


class _Parser:
    """Parses one JSON file; every error names the file and the JSON path."""

    def __init__(self, cfg: OperatorConfig):
        self.cfg = cfg
        self.file = cfg.json_path
        try:
            text = self.file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{self.file}: cannot read the configuration of operator "
                             f"{cfg.name!r}: {exc.strerror}") from exc
        try:
            self.data = json.loads(text, object_pairs_hook=self._unique_keys)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.file}:{exc.lineno}:{exc.colno}: not valid JSON: "
                             f"{exc.msg}") from exc
        self.ids: dict[str, str] = {}  # case id -> JSON path that produced it

    def _unique_keys(self, pairs: list) -> dict:
        """A JSON object; a key given twice is an error (json would keep the
        last silently, and a case would vanish)."""
        out = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"{self.file}: key {key!r} appears twice in one object "
                                 f"(keys: {', '.join(k for k, _ in pairs)})")
            out[key] = value
        return out

    def error(self, path: str, msg: str) -> ValueError:
        return ValueError(f"{self.file}: {path or '<top level>'}: {msg}")

    # -- layouts ---------------------------------------------------------
    def cases(self) -> list[tuple[OperatorCase, bool]]:
        """Every case, with whether it sits in a forward-only section."""
        data = self.data
        if not isinstance(data, dict):
            raise self.error("", f"expected an object, got {type(data).__name__}")
        if "base_configuration" not in data:
            self.leaf_keys = SIMPLE_LEAF_KEYS
            base = {"attributes": {}, "input_specs": []}
            return self.nonempty(self.walk(data, "", [], base, in_shape=False), "")

        self.leaf_keys = LEAF_KEYS
        for key in data:
            if key not in BENCHMARK_KEYS:
                raise self.error(key, f"unknown key; a benchmark file holds "
                                      f"{sorted(BENCHMARK_KEYS)}")
        base_obj = self.expect_dict(data["base_configuration"], "base_configuration")
        for key in base_obj:
            if key not in BASE_KEYS:
                raise self.error(f"base_configuration.{key}",
                                 f"unknown key; base_configuration holds {sorted(BASE_KEYS)}")
        base = {
            "attributes": self.attributes(base_obj.get("attributes", {}),
                                          "base_configuration.attributes"),
            "input_specs": self.specs(base_obj.get("input_specs", []),
                                      "base_configuration.input_specs"),
        }
        if "test_configurations" not in data:
            raise self.error("", "has 'base_configuration' but no 'test_configurations'")
        tests = self.expect_dict(data["test_configurations"], "test_configurations")
        if "ok" in tests:  # benchmark_ok: only "ok" is read, "ko"/"todo"/... record failures
            ok = self.expect_dict(tests["ok"], "test_configurations.ok")
            if not _is_group(ok, self.leaf_keys):
                raise self.error("test_configurations.ok", "expected groups 'attr' and/or "
                                                           "'shape', got a case")
            path = "test_configurations.ok"
            return self.nonempty(self.walk(ok, path, [], base, in_shape=False), path)
        if not _is_group(tests, self.leaf_keys):
            raise self.error("test_configurations", "expected groups of cases, got a case")
        path = "test_configurations"
        return self.nonempty(self.walk(tests, path, [], base, in_shape=False), path)

    def walk(self, group: dict, path: str, labels: list, base: dict,
             in_shape: bool) -> list[tuple[OperatorCase, bool]]:
        cases = []
        for label, node in group.items():
            sub = f"{path}.{label}" if path else label
            node = self.expect_dict(node, sub, "a case or a group of cases")
            sub_in_shape = in_shape or label == FORWARD_ONLY_GROUP
            if _is_group(node, self.leaf_keys):
                cases += self.walk(node, sub, labels + [label], base, sub_in_shape)
            else:
                case = self.leaf(node, sub, labels + [label], base, sub_in_shape)
                cases.append((case, sub_in_shape))
        return cases

    def nonempty(self, cases: list, path: str) -> list:
        if not cases:
            raise self.error(path, "defines no case")
        return cases

    # -- one case ----------------------------------------------------------
    def leaf(self, leaf: dict, path: str, labels: list, base: dict,
             in_shape: bool) -> OperatorCase:
        cfg = self.cfg
        for key in leaf:
            if key not in self.leaf_keys:
                raise self.error(f"{path}.{key}", f"unknown key; a case holds "
                                                  f"{sorted(self.leaf_keys)}")
        case_id = "_".join([cfg.name, *labels])
        if case_id in self.ids:
            raise self.error(path, f"duplicate case id {case_id!r}, also produced by "
                                   f"{self.ids[case_id]}")
        self.ids[case_id] = path

        attrs = dict(base["attributes"])
        for name, value in self.attributes(leaf.get("attributes", {}),
                                           f"{path}.attributes").items():
            if value is None:
                attrs.pop(name, None)
            else:
                attrs[name] = value
        specs = self.merge_specs(base["input_specs"],
                                 self.specs(leaf.get("input_specs", []), f"{path}.input_specs"))
        if "input_size" in leaf:
            if "input_specs" in leaf:
                raise self.error(path, "give 'input_size' or 'input_specs', not both")
            specs = [{"name": "data_input",
                      "shape": self.shape(leaf["input_size"], f"{path}.input_size")}]
        if not specs:
            if cfg.default_input_size is None:
                raise self.error(path, f"case {case_id!r} has no input shape: give "
                                       "'input_size' or 'input_specs', or "
                                       "OperatorConfig(default_input_size=...)")
            specs = [{"name": "data_input", "shape": list(cfg.default_input_size)}]
        for spec in specs:
            if "shape" not in spec:
                raise self.error(f"{path}.input_specs", f"input spec {spec['name']!r} "
                                                        "has no 'shape' (here or in the base)")

        kwargs = self.torch_kwargs(attrs, path, case_id)
        if cfg.specs_to_kwargs is not None:
            try:
                derived = cfg.specs_to_kwargs([dict(s) for s in specs])
            except Exception as exc:
                raise self.error(path, f"case {case_id!r}: specs_to_kwargs failed on input "
                                       f"specs {specs}: {type(exc).__name__}: {exc}") from exc
            both = sorted(set(derived) & set(kwargs))
            if both:
                raise self.error(path, f"case {case_id!r}: kwargs {both} come both from "
                                       "attributes and from specs_to_kwargs")
            kwargs.update(derived)

        test_backward = leaf.get("test_backward", not in_shape)
        if not isinstance(test_backward, bool):
            raise self.error(f"{path}.test_backward", f"expected true or false, got "
                                                      f"{test_backward!r}")
        expected_failure = leaf.get("expected_failure")
        if expected_failure is not None and not (isinstance(expected_failure, str)
                                                 and expected_failure):
            raise self.error(f"{path}.expected_failure", "expected a non-empty reason string")
        output_size = leaf.get("output_size")
        if output_size is not None:
            output_size = tuple(self.shape(output_size, f"{path}.output_size"))
        return OperatorCase(
            id=case_id, op_class=cfg.op_class, torch_kwargs=kwargs,
            input_size=tuple(specs[0]["shape"]), output_size=output_size,
            test_backward=test_backward, expected_failure=expected_failure,
        )

    def torch_kwargs(self, attrs: dict, path: str, case_id: str) -> dict:
        cfg = self.cfg
        kwargs, source = {}, {}
        for name, value in attrs.items():
            if name in cfg.ignored_attrs:
                continue
            if name not in cfg.supported_attrs:
                raise self.error(f"{path}.attributes", f"case {case_id!r}: attribute "
                                 f"{name!r} is not supported by operator {cfg.name!r} (add it "
                                 "to supported_attrs, or to ignored_attrs if torch has no "
                                 "equivalent)")
            kwarg, typ = cfg.supported_attrs[name]
            if kwarg in kwargs:
                raise self.error(f"{path}.attributes", f"case {case_id!r}: attributes "
                                 f"{source[kwarg]!r} and {name!r} both set torch kwarg {kwarg!r}")
            kwargs[kwarg] = self.convert(value, typ, f"{path}.attributes.{name}")
            source[kwarg] = name
        return kwargs

    # -- values --------------------------------------------------------------
    def convert(self, value, typ, path: str):
        """The JSON value as ``typ``, checked: JSON ``true`` is no int, ``5``
        is no tuple."""
        def is_number(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        if typ is tuple:
            ok = isinstance(value, list) and all(is_number(v) for v in value)
            expected = "a list of numbers"
        elif typ is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            expected = "an integer"
        elif typ is float:
            ok = is_number(value)
            expected = "a number"
        elif typ in (bool, negated):
            ok = isinstance(value, bool)
            expected = "true or false"
        elif typ is str:
            ok = isinstance(value, str)
            expected = "a string"
        else:
            try:
                return typ(value)
            except (TypeError, ValueError) as exc:
                raise self.error(path, f"cannot convert {value!r} with "
                                       f"{getattr(typ, '__name__', typ)}: {exc}") from exc
        if not ok:
            raise self.error(path, f"expected {expected}, got {json.dumps(value)}")
        return typ(value)

    def expect_dict(self, value, path: str, what: str = "an object") -> dict:
        if not isinstance(value, dict):
            raise self.error(path, f"expected {what}, got {json.dumps(value)}")
        return value

    def attributes(self, value, path: str) -> dict:
        attrs = self.expect_dict(value, path, "an object of attributes")
        for name, v in attrs.items():
            if isinstance(v, dict):
                raise self.error(f"{path}.{name}", "an attribute value cannot be an object")
        return attrs

    def shape(self, value, path: str) -> list:
        if not (isinstance(value, list) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)):
            raise self.error(path, f"expected a shape (a list of integers >= 0), "
                                   f"got {json.dumps(value)}")
        return value

    def specs(self, value, path: str) -> list:
        if not isinstance(value, list):
            raise self.error(path, f"expected a list of input specs, got {json.dumps(value)}")
        names = set()
        for i, spec in enumerate(value):
            where = f"{path}[{i}]"
            self.expect_dict(spec, where, 'an input spec {"name", "shape", "dtype"?}')
            for key in spec:
                if key not in SPEC_KEYS:
                    raise self.error(f"{where}.{key}", f"unknown key; an input spec holds "
                                                       f"{sorted(SPEC_KEYS)}")
            name = spec.get("name")
            if not isinstance(name, str) or not name:
                raise self.error(f"{where}.name", "every input spec needs a 'name' string")
            if name in names:
                raise self.error(f"{where}.name", f"duplicate input spec {name!r}")
            names.add(name)
            if "shape" in spec:
                self.shape(spec["shape"], f"{where}.shape")
            if "data" in spec:
                raise self.error(f"{where}.data", "fixed tensor values are not supported: "
                                                  "ModelTester feeds random inputs")
            if spec.get("dtype", "float32") != "float32":
                raise self.error(f"{where}.dtype", f"dtype {spec['dtype']!r} is not supported: "
                                                   "the operator cases run in float32")
        return value

    @staticmethod
    def merge_specs(base: list, case: list) -> list:
        """Case specs merged by name over the base ones (base order kept,
        new names appended)."""
        merged = {s["name"]: dict(s) for s in base}
        for spec in case:
            merged.setdefault(spec["name"], {}).update(spec)
        return list(merged.values())


# -- the fixture ----------------------------------------------------------------

def _marks(cfg: OperatorConfig, case: OperatorCase) -> list:
    """The one skip/xfail mark of a case, in the documented priority order,
    plus the plugin's informational marks."""
    marks = [pytest.mark.aidge_operator(name=cfg.name)]
    if not case.test_backward:
        marks.append(pytest.mark.forward_only)
    if cfg.backend == "cuda":
        marks.append(pytest.mark.cuda)
    reason = cfg.skip_reasons.get(_case_key(cfg, case)) or case.expected_failure
    if cfg.skip_all:
        marks.append(pytest.mark.skip(reason=cfg.skip_all))
    elif cfg.xfail_all:
        marks.append(pytest.mark.xfail(reason=cfg.xfail_all))
    elif cfg.xfail_backward and case.test_backward:
        marks.append(pytest.mark.xfail(reason=cfg.xfail_backward))
    elif reason:
        marks.append(pytest.mark.xfail(reason=reason))
    return marks


def case_seed(case_id: str) -> int:
    """The seed a case's model is initialised with: stable across runs and
    pytest-xdist workers, independent of test order."""
    return zlib.crc32(case_id.encode())


def make_operator_fixture(cfg: OperatorConfig, engine: str | None = None):
    """A pytest fixture parametrized over :func:`build_cases(cfg) <build_cases>`.

    Assign it to a module-level name, which becomes the fixture's name::

        conv2d_case = make_operator_fixture(CONV2D_CONFIG)

    Each case yields a dict: ``name`` (the case id), ``torch_model`` (built
    with ``op_class(**torch_kwargs)`` from a seed derived from the id, in
    train mode when the case tests backward, eval mode otherwise),
    ``aidge_model`` (``aidge_interop.wrap(torch_model, [input_size])``; with
    ``engine="aidge"``, Eclipse Aidge's
    :class:`~aidge_interop.compare.eclipse_aidge.AidgeModel`), ``engine``,
    ``input_size``, ``output_size`` (inferred by running the torch model once
    when the case does not give it), ``test_backward``, ``optimizer`` (an
    engine's SGD (:class:`aidge_interop.SGD`, or
    :class:`~aidge_interop.compare.eclipse_aidge.AidgeSGD`) over ``aidge_model`` with
    :data:`LEARNING_RATE` when the case trains a model that has parameters,
    else ``None``; hand it to ``ModelTester(..., optimizer2=...)``) and
    ``cuda`` (``OperatorConfig.backend == "cuda"``, for ``ModelTester(cuda=...)``)
    and ``max_slowdown_ratio`` (the pytest option ``--max-slowdown-ratio``,
    None by default: timings recorded, not asserted).
    Marks: ``skip_all``, else ``xfail_all``, else ``xfail_backward`` (training
    cases), else ``skip_reasons[case key]`` or the case's ``expected_failure``.

    ``engine``: ``"aidge_interop"`` or ``"aidge"`` (see
    :mod:`aidge_interop.testing.engines`); by default the pytest option
    ``--engine`` (default ``aidge_interop``). A case skips when the engine
    is not installed or cannot run it (its message).
    """
    if engine is not None:
        check_engine(engine, f"make_operator_fixture({cfg.name})")
    params = [pytest.param(case, id=case.id, marks=_marks(cfg, case))
              for case in build_cases(cfg)]

    @pytest.fixture(params=params)
    def operator_case(request):
        chosen = engine or request.config.getoption("engine", None) or DEFAULT_ENGINE
        return {**_instantiate(cfg, request.param, chosen),
                "max_slowdown_ratio": max_slowdown_ratio(request.config)}

    return operator_case


def max_slowdown_ratio(config) -> float | None:
    """``--max-slowdown-ratio``, else ``$AIDGE_INTEROP_MAX_SLOWDOWN``, else None."""
    value = config.getoption("max_slowdown_ratio", None)
    if value is None and os.environ.get("AIDGE_INTEROP_MAX_SLOWDOWN"):
        value = float(os.environ["AIDGE_INTEROP_MAX_SLOWDOWN"])
    return value


def _instantiate(cfg: OperatorConfig, case: OperatorCase, engine: str) -> dict:
    """The fixture's dict for one case (torch and the engine imported here,
    when a case runs, not when a suite is collected)."""
    import torch

    from .._util import EngineUnsupported

    ok, reason = engine_available(engine)
    if not ok:
        pytest.skip(reason)
    if cfg.backend == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"{cfg.name}: backend 'cuda' but CUDA is not available")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case_seed(case.id))
        try:
            torch_model = case.op_class(**case.torch_kwargs)
            output_size = case.output_size
            if output_size is None:  # in eval mode: a BatchNorm keeps its statistics
                with torch.no_grad():
                    output_size = tuple(torch_model.eval()(torch.randn(case.input_size)).shape)
        except Exception as exc:
            exc.add_note(f"while building case {case.id}: {case.op_class.__name__}"
                         f"(**{case.torch_kwargs!r}) on an input of shape {case.input_size}")
            raise
    torch_model.train(case.test_backward)
    try:
        aidge_model, optimizer = engine_model(engine, torch_model, [case.input_size],
                                              case.test_backward, LEARNING_RATE)
    except EngineUnsupported as exc:
        pytest.skip(str(exc))
    return {
        "name": case.id,
        "torch_model": torch_model,
        "aidge_model": aidge_model,
        "engine": engine,
        "input_size": tuple(case.input_size),
        "output_size": tuple(output_size),
        "test_backward": case.test_backward,
        "optimizer": optimizer,
        "cuda": cfg.backend == "cuda",
    }
