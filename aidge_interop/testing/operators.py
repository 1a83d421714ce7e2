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
the merging rules and the test ids are described in docs/testing.md ("The
JSON format"). In short: a *leaf* is one case; any other object is a *group*
whose keys label leaves, further groups or *sweeps* (lists: of cases, or of
values of the attribute or input shape the label names); ids are the
operator name and the labels joined by ``_``
(``Conv2D_attributes_kernel_square``). Leaves under a group named ``shape``
are forward-only and dropped unless :attr:`OperatorConfig.forward_only_cases`
(default: the module-level :data:`INCLUDE_FORWARD_ONLY_CASES`, which the
plugin's ``--forward-only-cases`` option sets) keeps them.

A key the harness does not read is ignored with an
:class:`OperatorConfigWarning` naming the file and the key. A configuration
that cannot be used raises :class:`ValueError` naming the file and the JSON
path of the culprit, at collection time; nothing is silently skipped::

    ValueError: configs/conv2d.json: test_configurations.attributes.k5.attributes.kernel_dims:
    expected a list of numbers, got 5

Nothing heavy is imported here: pytest when :func:`make_operator_fixture`
runs (:func:`build_cases` works without it), torch and the engine by the
fixture when a case runs.
"""
from __future__ import annotations

import json
import os
import re
import sys
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .engines import DEFAULT_ENGINE, check_engine, engine_available, engine_model

__all__ = [
    "OperatorCase", "OperatorConfig", "OperatorConfigWarning", "SUPPORTED_ATTRS",
    "INCLUDE_FORWARD_ONLY_CASES", "LEARNING_RATE", "build_cases", "make_operator_fixture",
    "negated",
]


def _pytest(what: str):
    """pytest, imported by the functions that build pytest objects; the
    rest of the harness runs without it."""
    try:
        import pytest
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"{what} needs pytest, which is not installed "
                                  "(pip install pytest)", name="pytest") from exc
    return pytest


#: Keep forward-only cases (``shape`` sections) when an :class:`OperatorConfig`
#: does not say; read when :func:`build_cases` runs. Set it here or on
#: ``aidge_interop.testing`` (the same toggle), at module level in a
#: ``conftest.py`` (the plugin reads it there, as upstream's conftest held it),
#: or run pytest with ``--forward-only-cases`` (which wins).
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

LEAF_KEYS = frozenset({"attributes", "input_specs", "input_size", "test_backward",
                       "output_size", "expected_failure"})
BASE_KEYS = frozenset({"attributes", "input_specs"})
BENCHMARK_KEYS = frozenset({"operation", "base_configuration", "test_configurations"})
SPEC_KEYS = frozenset({"name", "shape", "dtype", "data"})
FORWARD_ONLY_GROUP = "shape"
#: dtypes an input spec may name; the data input (the first spec), which the
#: cases feed random floats, takes the first two
SPEC_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32",
               "int64", "uint8", "bool")
CASE_DTYPES = SPEC_DTYPES[:2]


class OperatorConfigWarning(UserWarning):
    """A key of an operator configuration that names nothing the harness
    reads: a JSON key (the message names the file and the key's JSON path)
    or a ``skip_reasons`` key that is no case's; the key is ignored. Also
    ``data`` on a data input, which the cases feed random values."""


@dataclass
class OperatorCase:
    """One parametrized test case, as consumed by :func:`make_operator_fixture`.

    ``id`` is the pytest id (``Conv2D_attributes_kernel_square``);
    ``op_class(**torch_kwargs)`` builds the torch model; ``output_size`` of
    ``None`` means "whatever the torch model gives on ``input_size``";
    ``expected_failure`` registers the case as ``xfail`` with that reason;
    ``dtype`` (``"float32"`` or ``"float64"``) is the float dtype the case
    runs in (model and inputs); ``input_specs`` the merged input specs of a
    JSON case (``name``, ``shape``, ``dtype``?, ``data``?), as
    ``specs_to_kwargs`` saw them.
    """

    id: str
    op_class: type
    torch_kwargs: dict
    input_size: tuple
    output_size: Optional[tuple] = None
    test_backward: bool = True
    expected_failure: Optional[str] = None
    dtype: str = "float32"
    input_specs: Optional[list] = None


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
    anything it cannot use; warns (:class:`OperatorConfigWarning`) of keys
    that name nothing it reads."""
    if cfg.manual_cases is not None:
        cases = [(case, False) for case in _check_manual(cfg)]
    else:
        cases = _Parser(cfg).cases()
    keys = {_case_key(cfg, case) for case, _ in cases}
    unknown = sorted(set(cfg.skip_reasons) - keys)
    if unknown:
        warnings.warn(OperatorConfigWarning(
            f"OperatorConfig(name={cfg.name!r}): skip_reasons names no case: {unknown} "
            f"(ignored); the case keys are {sorted(keys)}"), stacklevel=_caller_level())
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
        if case.dtype not in CASE_DTYPES:
            raise ValueError(f"OperatorConfig(name={cfg.name!r}): case {case.id!r} has dtype "
                             f"{case.dtype!r}; a case runs in one of {list(CASE_DTYPES)}")
        seen.add(case.id)
    return list(cfg.manual_cases)


def _case_key(cfg: OperatorConfig, case: OperatorCase) -> str:
    return case.id.removeprefix(f"{cfg.name}_")


def _is_group(node: dict) -> bool:
    """Whether ``node`` is a group, not a case. A group holds, under labels,
    cases and groups (objects) and sweeps (lists); a case holds case keys.
    A node is a case when it is empty or has a case key holding a case's
    kind of value: anything but an object, or for ``attributes`` anything
    but an object of objects (a group may be labelled ``attributes``: it
    holds cases)."""
    if not node:
        return False
    for key, value in node.items():
        if key == "attributes":
            if not (isinstance(value, dict) and value
                    and all(isinstance(v, dict) for v in value.values())):
                return False
        elif key in LEAF_KEYS and not isinstance(value, dict):
            return False
    return True


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this module: a warning
    points at the suite that declared the configuration."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


def _label(value) -> str:
    """A swept value as an id label: ``[3, 3]`` -> ``3_3``, ``0.5`` ->
    ``0.5``, ``"tanh"`` -> ``tanh``."""
    return re.sub(r"[^\w.+-]+", "_", json.dumps(value)).strip("_") or "empty"


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
        self.fed_random = set()  # data inputs with 'data' warned of

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

    def unknown_keys(self, obj: dict, known: frozenset, path: str, what: str) -> None:
        """Warns of each key of ``obj`` not in ``known``: files written for
        other tools (upstream's harness, the engine's benchmarks) carry keys
        of their own, which the cases do not need."""
        for key in obj:
            if key not in known:
                where = f"{path}.{key}" if path else key
                warnings.warn(OperatorConfigWarning(
                    f"{self.file}: {where}: unknown key {key!r} ignored ({what} holds "
                    f"{sorted(known)})"), stacklevel=_caller_level())

    # -- layouts ---------------------------------------------------------
    def cases(self) -> list[tuple[OperatorCase, bool]]:
        """Every case, with whether it sits in a forward-only section."""
        data = self.data
        if not isinstance(data, dict):
            raise self.error("", f"expected an object, got {type(data).__name__}")
        if "base_configuration" not in data:
            base = {"attributes": {}, "input_specs": []}
            return self.nonempty(self.walk(data, "", [], base, in_shape=False), "")

        self.unknown_keys(data, BENCHMARK_KEYS, "", "a benchmark file")
        base_obj = self.expect_dict(data["base_configuration"], "base_configuration")
        self.unknown_keys(base_obj, BASE_KEYS, "base_configuration", "base_configuration")
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
            if not _is_group(ok):
                raise self.error("test_configurations.ok", "expected groups 'attr' and/or "
                                                           "'shape', got a case")
            path = "test_configurations.ok"
            return self.nonempty(self.walk(ok, path, [], base, in_shape=False), path)
        if not _is_group(tests):
            raise self.error("test_configurations", "expected groups of cases, got a case")
        path = "test_configurations"
        return self.nonempty(self.walk(tests, path, [], base, in_shape=False), path)

    def walk(self, group: dict, path: str, labels: list, base: dict,
             in_shape: bool) -> list[tuple[OperatorCase, bool]]:
        cases = []
        for label, node in group.items():
            sub = f"{path}.{label}" if path else label
            sub_in_shape = in_shape or label == FORWARD_ONLY_GROUP
            if isinstance(node, list):
                cases += self.sweep(node, sub, labels + [label], base, sub_in_shape)
            elif isinstance(node, dict):
                cases += self.node(node, sub, labels + [label], base, sub_in_shape)
            else:
                warnings.warn(OperatorConfigWarning(
                    f"{self.file}: {sub}: unknown key {label!r} ignored (a group holds cases, "
                    f"groups and sweeps; this is {json.dumps(node)})"),
                    stacklevel=_caller_level())
        return cases

    def node(self, node: dict, path: str, labels: list, base: dict,
             in_shape: bool) -> list[tuple[OperatorCase, bool]]:
        if _is_group(node):
            return self.walk(node, path, labels, base, in_shape)
        return [(self.leaf(node, path, labels, base, in_shape), in_shape)]

    def sweep(self, items: list, path: str, labels: list, base: dict,
              in_shape: bool) -> list[tuple[OperatorCase, bool]]:
        """A list under a label: cases or groups (objects), labelled by their
        position; or values of what the label names, one case each, labelled
        by the value: an attribute (``"kernel_dims": [[1, 1], [3, 3]]``) or
        the shape of a base input spec (``"data_input": [[1, 8], [4, 8]]``)."""
        if not items:
            raise self.error(path, "an empty sweep defines no case")
        if all(isinstance(item, dict) for item in items):
            return [case for i, item in enumerate(items)
                    for case in self.node(item, f"{path}[{i}]", labels + [str(i)], base,
                                          in_shape)]
        if any(isinstance(item, dict) for item in items):
            raise self.error(path, "a sweep holds cases (objects) or values, not both")
        name = labels[-1]
        spec_names = [spec["name"] for spec in base["input_specs"]]
        if name in self.cfg.supported_attrs or name in self.cfg.ignored_attrs:
            leaves = [{"attributes": {name: value}} for value in items]
        elif name in spec_names:
            leaves = [{"input_specs": [{"name": name, "shape": value}]} for value in items]
        else:
            raise self.error(path, f"a sweep of values needs a label that names an attribute "
                                   f"of operator {self.cfg.name!r} or a base input spec "
                                   f"{spec_names}; {name!r} is neither")
        return [(self.leaf(leaf, f"{path}[{i}]", labels + [_label(value)], base, in_shape),
                 in_shape) for i, (leaf, value) in enumerate(zip(leaves, items))]

    def nonempty(self, cases: list, path: str) -> list:
        if not cases:
            raise self.error(path, "defines no case")
        return cases

    # -- one case ----------------------------------------------------------
    def leaf(self, leaf: dict, path: str, labels: list, base: dict,
             in_shape: bool) -> OperatorCase:
        cfg = self.cfg
        self.unknown_keys(leaf, LEAF_KEYS, path, "a case")
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
            if "data" in spec and self.data_shape(spec["data"], "") != spec["shape"]:
                raise self.error(f"{path}.input_specs", f"input spec {spec['name']!r}: its "
                                 f"'data' has shape {self.data_shape(spec['data'], '')}, "
                                 f"its 'shape' is {spec['shape']}")
        dtype = specs[0].get("dtype", "float32")
        if dtype not in CASE_DTYPES:
            raise self.error(f"{path}.input_specs", f"case {case_id!r}: the data input "
                             f"{specs[0]['name']!r} has dtype {dtype!r}; the cases feed it "
                             f"random floats: one of {list(CASE_DTYPES)}")
        if "data" in specs[0] and specs[0]["name"] not in self.fed_random:
            self.fed_random.add(specs[0]["name"])
            warnings.warn(OperatorConfigWarning(
                f"{self.file}: {path}: the 'data' of the data input {specs[0]['name']!r} is "
                "not what the models are fed: ModelTester feeds random inputs of its shape "
                "(the values reach specs_to_kwargs and the fixture's input_specs)"),
                stacklevel=_caller_level())

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
            dtype=dtype, input_specs=[dict(s) for s in specs],
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
        """The input specs, checked; a spec with ``data`` and no ``shape``
        gets the data's shape."""
        if not isinstance(value, list):
            raise self.error(path, f"expected a list of input specs, got {json.dumps(value)}")
        names, specs = set(), []
        for i, spec in enumerate(value):
            where = f"{path}[{i}]"
            spec = dict(self.expect_dict(spec, where, 'an input spec {"name", "shape", '
                                                      '"dtype"?, "data"?}'))
            self.unknown_keys(spec, SPEC_KEYS, where, "an input spec")
            name = spec.get("name")
            if not isinstance(name, str) or not name:
                raise self.error(f"{where}.name", "every input spec needs a 'name' string")
            if name in names:
                raise self.error(f"{where}.name", f"duplicate input spec {name!r}")
            names.add(name)
            if "shape" in spec:
                self.shape(spec["shape"], f"{where}.shape")
            if "data" in spec:
                shape = self.data_shape(spec["data"], f"{where}.data")
                if spec.setdefault("shape", shape) != shape:
                    raise self.error(f"{where}.data", f"has shape {shape}, the spec's "
                                                      f"'shape' is {spec['shape']}")
            if "dtype" in spec and spec["dtype"] not in SPEC_DTYPES:
                raise self.error(f"{where}.dtype", f"unknown dtype {spec['dtype']!r}; "
                                                   f"one of {list(SPEC_DTYPES)}")
            specs.append({k: v for k, v in spec.items() if k in SPEC_KEYS})
        return specs

    def data_shape(self, value, path: str) -> list:
        """The shape of ``data``, a number or nested lists of numbers
        (``true``/``false`` count, for bool inputs)."""
        if isinstance(value, (int, float)):
            return []
        if not isinstance(value, list):
            raise self.error(path, f"expected numbers or lists of numbers, got "
                                   f"{json.dumps(value)}")
        shapes = [self.data_shape(v, f"{path}[{i}]") for i, v in enumerate(value)]
        for i, shape in enumerate(shapes):
            if shape != shapes[0]:
                raise self.error(f"{path}[{i}]", f"ragged data: shape {shape}, but "
                                                 f"{path}[0] has shape {shapes[0]}")
        return [len(value), *(shapes[0] if shapes else [])]

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
    import pytest  # make_operator_fixture checked that it is there

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
    with ``op_class(**torch_kwargs)`` from a seed derived from the id, in the
    case's ``dtype``, in train mode when the case tests backward, eval mode
    otherwise), ``aidge_model`` (``aidge_interop.wrap(torch_model,
    [example])``, an example input of ``input_size`` in that dtype; with
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
    None by default: timings recorded, not asserted), ``dtype`` (the torch
    dtype of the case) and ``input_specs`` (the JSON case's merged input
    specs, ``None`` for a manual case). :class:`ModelTester` feeds both
    models random inputs of the models' dtype.
    Marks: ``skip_all``, else ``xfail_all``, else ``xfail_backward`` (training
    cases), else ``skip_reasons[case key]`` or the case's ``expected_failure``.

    ``engine``: ``"aidge_interop"`` or ``"aidge"`` (see
    :mod:`aidge_interop.testing.engines`); by default the pytest option
    ``--engine`` (default ``aidge_interop``). A case skips when the engine
    is not installed or cannot run it (its message).
    """
    pytest = _pytest("make_operator_fixture")
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
    import pytest
    import torch

    from .._util import EngineUnsupported

    ok, reason = engine_available(engine)
    if not ok:
        pytest.skip(reason)
    if cfg.backend == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"{cfg.name}: backend 'cuda' but CUDA is not available")
    dtype = getattr(torch, case.dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case_seed(case.id))
        try:
            torch_model = case.op_class(**case.torch_kwargs).to(dtype)
            output_size = case.output_size
            if output_size is None:  # in eval mode: a BatchNorm keeps its statistics
                with torch.no_grad():
                    x = torch.randn(case.input_size, dtype=dtype)
                    output_size = tuple(torch_model.eval()(x).shape)
        except Exception as exc:
            exc.add_note(f"while building case {case.id}: {case.op_class.__name__}"
                         f"(**{case.torch_kwargs!r}) on an input of shape {case.input_size}")
            raise
    torch_model.train(case.test_backward)
    # the example wrap() makes from a shape, in the case's dtype (a model
    # without parameters does not tell it)
    example = torch.randn(case.input_size, dtype=dtype,
                          generator=torch.Generator().manual_seed(0))
    try:
        aidge_model, optimizer = engine_model(engine, torch_model, [example],
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
        "dtype": dtype,
        "input_specs": case.input_specs,
    }
