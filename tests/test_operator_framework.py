"""The operator test framework (aidge_interop.testing.operators) and its pytest
plugin: JSON layouts, ids, merging, forward-only sections, errors that name
the file and the JSON path, and — through ``pytester`` — the fixture it
builds, the marks in their priority order and the plugin's markers and
option."""
import importlib.metadata
import json
import re

import pytest

from aidge_interop.testing import OperatorCase, OperatorConfig, build_cases
from aidge_interop.testing import operators as framework


class Op:
    """Stand-in op_class: build_cases never instantiates it."""


def write(tmp_path, data, name="op.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def cases_of(tmp_path, data, name="Op", **kw):
    return build_cases(OperatorConfig(name=name, op_class=Op, json_path=write(tmp_path, data),
                                      **kw))


def conv_kwargs(specs):
    return {"in_channels": specs[0]["shape"][1], "out_channels": specs[1]["shape"][0]}


# the benchmark_flat example of shared/spec/operator-configs.md
CONV2D_FLAT = {
    "operation": "Conv2D",
    "base_configuration": {
        "attributes": {"kernel_dims": [3, 3], "stride_dims": [1, 1], "dilation_dims": [1, 1]},
        "input_specs": [
            {"name": "data_input", "shape": [4, 8, 16, 16], "dtype": "float32"},
            {"name": "weight", "shape": [16, 8, 3, 3]},
            {"name": "bias", "shape": [16]},
        ],
    },
    "test_configurations": {
        "attributes": {
            "kernel_square": {"attributes": {"kernel_dims": [5, 5]},
                              "input_specs": [{"name": "weight", "shape": [32, 8, 5, 5]}]},
            "stride_2": {"attributes": {"stride_dims": [2, 2]}},
        },
        "shape": {
            "batch_1": {"input_specs": [{"name": "data_input", "shape": [1, 8, 16, 16]}]},
        },
        "sweeps": {
            "dilation": {
                "d2": {"attributes": {"dilation_dims": [2, 2]}},
                "d3": {"attributes": {"dilation_dims": [3, 3]}},
            },
        },
    },
}

AVGPOOL_OK = {
    "operation": "AvgPooling2D",
    "base_configuration": {
        "attributes": {"kernel_dims": [2, 2], "stride_dims": [2, 2]},
        "input_specs": [{"name": "data_input", "shape": [2, 4, 12, 12]}],
    },
    "test_configurations": {
        "ok": {
            "attr": {"kernel_3": {"attributes": {"kernel_dims": [3, 3]}}},
            "shape": {"wide": {"input_specs": [{"name": "data_input", "shape": [2, 4, 8, 20]}]}},
        },
        "ko": {"attr": {"rounding_floor": {"attributes": {"rounding_mode": "floor"}}}},
    },
}

REDUCEMEAN_SIMPLE = {
    "axes_1_dim": {"attributes": {"axes": [1], "keep_dims": True}, "input_size": [2, 3, 4, 5]},
    "axes_2_dims": {"attributes": {"axes": [1, 2], "keep_dims": False}},
}


# -- layouts -----------------------------------------------------------------------

def test_benchmark_flat_ids_attributes_and_derived_kwargs(tmp_path):
    cases = cases_of(tmp_path, CONV2D_FLAT, name="Conv2D", specs_to_kwargs=conv_kwargs)
    assert [c.id for c in cases] == [
        "Conv2D_attributes_kernel_square", "Conv2D_attributes_stride_2",
        "Conv2D_sweeps_dilation_d2", "Conv2D_sweeps_dilation_d3",
    ]
    kernel_square = cases[0]
    assert kernel_square.torch_kwargs == {
        "kernel_size": (5, 5), "stride": (1, 1), "dilation": (1, 1),
        "in_channels": 8, "out_channels": 32,  # from the merged weight spec
    }
    assert kernel_square.input_size == (4, 8, 16, 16)
    assert kernel_square.output_size is None
    assert kernel_square.test_backward is True
    assert kernel_square.op_class is Op
    assert cases[1].torch_kwargs["stride"] == (2, 2)
    assert cases[1].torch_kwargs["out_channels"] == 16  # base weight untouched by case 0
    assert cases[3].torch_kwargs["dilation"] == (3, 3)


def test_forward_only_sections_are_dropped_unless_requested(tmp_path, monkeypatch):
    ids = lambda **kw: [c.id for c in cases_of(tmp_path, CONV2D_FLAT, name="Conv2D", **kw)]
    assert "Conv2D_shape_batch_1" not in ids()

    kept = cases_of(tmp_path, CONV2D_FLAT, name="Conv2D", forward_only_cases=True)
    batch_1 = next(c for c in kept if c.id == "Conv2D_shape_batch_1")
    assert batch_1.test_backward is False
    assert batch_1.input_size == (1, 8, 16, 16)

    monkeypatch.setattr(framework, "INCLUDE_FORWARD_ONLY_CASES", True)
    assert "Conv2D_shape_batch_1" in ids()
    assert "Conv2D_shape_batch_1" not in ids(forward_only_cases=False)  # the config decides


def test_the_toggle_set_on_the_package_is_the_one_read(tmp_path, monkeypatch):
    import aidge_interop.testing as testing

    monkeypatch.setattr(testing, "INCLUDE_FORWARD_ONLY_CASES", True)
    assert framework.INCLUDE_FORWARD_ONLY_CASES is True
    assert "Conv2D_shape_batch_1" in [c.id for c in cases_of(tmp_path, CONV2D_FLAT,
                                                              name="Conv2D")]
    testing.INCLUDE_FORWARD_ONLY_CASES = False
    assert framework.INCLUDE_FORWARD_ONLY_CASES is testing.INCLUDE_FORWARD_ONLY_CASES is False
    assert "Conv2D_shape_batch_1" not in [c.id for c in cases_of(tmp_path, CONV2D_FLAT,
                                                                  name="Conv2D")]


def test_a_shape_leaf_that_trains_is_kept(tmp_path):
    data = {"base_configuration": {"input_specs": [{"name": "x", "shape": [2, 3]}]},
            "test_configurations": {"deep": {"shape": {"big": {"test_backward": True},
                                                       "small": {}}}}}
    (case,) = cases_of(tmp_path, data)
    assert (case.id, case.test_backward) == ("Op_deep_shape_big", True)


def test_benchmark_ok_reads_only_ok_and_hides_it_from_ids(tmp_path):
    cases = cases_of(tmp_path, AVGPOOL_OK, name="AvgPooling2D", forward_only_cases=True)
    assert [(c.id, c.test_backward) for c in cases] == [
        ("AvgPooling2D_attr_kernel_3", True), ("AvgPooling2D_shape_wide", False)]
    assert cases[0].torch_kwargs == {"kernel_size": (3, 3), "stride": (2, 2)}
    assert cases[1].input_size == (2, 4, 8, 20)


def test_simple_layout_with_input_size_and_default_input_size(tmp_path):
    cases = cases_of(tmp_path, REDUCEMEAN_SIMPLE, name="ReduceMean",
                     default_input_size=(6, 7))
    assert [c.id for c in cases] == ["ReduceMean_axes_1_dim", "ReduceMean_axes_2_dims"]
    assert cases[0].torch_kwargs == {"dim": (1,), "keepdim": True}
    assert cases[0].input_size == (2, 3, 4, 5)
    assert cases[1].torch_kwargs == {"dim": (1, 2), "keepdim": False}
    assert cases[1].input_size == (6, 7)


def test_leaf_keys_output_size_expected_failure_and_null_attributes(tmp_path):
    data = {
        "base_configuration": {"attributes": {"axes": [1], "keep_dims": True},
                               "input_specs": [{"name": "x", "shape": [2, 3]}]},
        "test_configurations": {"all": {"attributes": {"axes": None}, "output_size": [1, 1],
                                        "expected_failure": "engine lacks it"}},
    }
    (case,) = cases_of(tmp_path, data)
    assert case.torch_kwargs == {"keepdim": True}
    assert case.output_size == (1, 1)
    assert case.expected_failure == "engine lacks it"


def test_input_specs_merge_by_name_keeping_base_order(tmp_path):
    seen = []
    data = {
        "base_configuration": {"input_specs": [
            {"name": "x", "shape": [2, 3], "dtype": "float32"}, {"name": "w", "shape": [4, 3]}]},
        "test_configurations": {"t": {"input_specs": [
            {"name": "extra", "shape": [5]}, {"name": "x", "shape": [7, 3]}]}},
    }
    (case,) = cases_of(tmp_path, data, specs_to_kwargs=lambda specs: seen.append(specs) or {})
    assert seen == [[{"name": "x", "shape": [7, 3], "dtype": "float32"},
                     {"name": "w", "shape": [4, 3]}, {"name": "extra", "shape": [5]}]]
    assert case.input_size == (7, 3)


def test_attribute_types_and_ignored_attributes(tmp_path):
    data = {"c": {"input_size": [1, 2], "attributes": {
        "no_bias": True, "nb_groups": 2, "epsilon": 1, "approximate": "tanh",
        "count_include_pad": False, "rounding_mode": "floor"}}}
    (case,) = cases_of(tmp_path, data, ignored_attrs={"rounding_mode"})
    assert case.torch_kwargs == {"bias": False, "groups": 2, "eps": 1.0, "approximate": "tanh",
                                 "count_include_pad": False}
    assert type(case.torch_kwargs["eps"]) is float


def test_supported_attrs_can_be_replaced(tmp_path):
    data = {"c": {"input_size": [1], "attributes": {"slope": 0.5}}}
    (case,) = cases_of(tmp_path, data, supported_attrs={"slope": ("negative_slope", float)})
    assert case.torch_kwargs == {"negative_slope": 0.5}


def test_sweeps_of_values_and_of_cases(tmp_path):
    data = {
        "base_configuration": {"attributes": {"kernel_dims": [3, 3]},
                               "input_specs": [{"name": "data_input", "shape": [2, 4, 9, 9]},
                                               {"name": "weight", "shape": [8, 4, 3, 3]}]},
        "test_configurations": {"sweeps": {
            "kernel_dims": [[1, 1], [5, 5]],          # an attribute: one case per value
            "nb_groups": [1, 2],
            "data_input": [[1, 4, 9, 9], [3, 4, 5, 7]],  # a base spec: one case per shape
            "dilation": [{"attributes": {"dilation_dims": [2, 2]}},  # cases, by position
                         {"big": {"attributes": {"dilation_dims": [3, 3]}}}],
        }},
    }
    cases = cases_of(tmp_path, data, name="Conv2D", specs_to_kwargs=conv_kwargs)
    assert [c.id for c in cases] == [
        "Conv2D_sweeps_kernel_dims_1_1", "Conv2D_sweeps_kernel_dims_5_5",
        "Conv2D_sweeps_nb_groups_1", "Conv2D_sweeps_nb_groups_2",
        "Conv2D_sweeps_data_input_1_4_9_9", "Conv2D_sweeps_data_input_3_4_5_7",
        "Conv2D_sweeps_dilation_0", "Conv2D_sweeps_dilation_1_big",
    ]
    assert cases[1].torch_kwargs == {"kernel_size": (5, 5), "in_channels": 4,
                                     "out_channels": 8}
    assert cases[3].torch_kwargs["groups"] == 2
    assert [c.input_size for c in cases[4:6]] == [(1, 4, 9, 9), (3, 4, 5, 7)]
    assert cases[6].torch_kwargs["dilation"] == (2, 2)
    assert cases[7].torch_kwargs["dilation"] == (3, 3)


def test_float64_data_input_and_data_values(tmp_path):
    data = {
        "base_configuration": {"input_specs": [
            {"name": "data_input", "shape": [2, 3], "dtype": "float64"},
            {"name": "shape", "dtype": "int64", "data": [3, 2]},       # shape from data
            {"name": "table", "shape": [2, 2], "data": [[0.5, 1], [2, 3]]}]},
        "test_configurations": {"g": {"plain": {},
                                      "single": {"input_specs": [
                                          {"name": "data_input", "dtype": "float32"}]}}},
    }
    seen = []
    plain, single = cases_of(tmp_path, data, specs_to_kwargs=lambda s: seen.append(s) or {})
    assert (plain.dtype, single.dtype) == ("float64", "float32")
    data["base_configuration"]["input_specs"][0]["data"] = [[0, 1, 2], [3, 4, 5]]
    with pytest.warns(framework.OperatorConfigWarning) as record:  # once for the file
        cases_of(tmp_path, data)
    assert [str(w.message) for w in record] == [
        f"{tmp_path / 'op.json'}: test_configurations.g.plain: the 'data' of the data input "
        "'data_input' is not what the models are fed: ModelTester feeds random inputs of its "
        "shape (the values reach specs_to_kwargs and the fixture's input_specs)"]
    assert plain.input_specs == seen[0] == [
        {"name": "data_input", "shape": [2, 3], "dtype": "float64"},
        {"name": "shape", "dtype": "int64", "data": [3, 2], "shape": [2]},
        {"name": "table", "shape": [2, 2], "data": [[0.5, 1], [2, 3]]}]


def test_unknown_keys_are_warnings_naming_file_and_key(tmp_path):
    data = {
        "operator": "Conv", "opset_version": 21,
        "base_configuration": {"input_specs": [{"name": "x", "shape": [2, 3], "layout": "nc"}],
                               "notes": "from the engine's benchmarks"},
        "test_configurations": {"g": {"c": {"attributes": {"axes": [1]}, "comment": "x"}},
                                "about": "reductions"},
    }
    with pytest.warns(framework.OperatorConfigWarning) as record:
        (case,) = cases_of(tmp_path, data)
    messages = [str(w.message) for w in record]
    file = str(tmp_path / "op.json")
    assert messages == [
        f"{file}: operator: unknown key 'operator' ignored (a benchmark file holds "
        "['base_configuration', 'operation', 'test_configurations'])",
        f"{file}: opset_version: unknown key 'opset_version' ignored (a benchmark file holds "
        "['base_configuration', 'operation', 'test_configurations'])",
        f"{file}: base_configuration.notes: unknown key 'notes' ignored (base_configuration "
        "holds ['attributes', 'input_specs'])",
        f"{file}: base_configuration.input_specs[0].layout: unknown key 'layout' ignored (an "
        "input spec holds ['data', 'dtype', 'name', 'shape'])",
        f"{file}: test_configurations.g.c.comment: unknown key 'comment' ignored (a case "
        "holds ['attributes', 'expected_failure', 'input_size', 'input_specs', "
        "'output_size', 'test_backward'])",
        f"{file}: test_configurations.about: unknown key 'about' ignored (a group holds "
        'cases, groups and sweeps; this is "reductions")',
    ]
    assert record[0].filename == __file__  # points at the suite, not the framework
    assert case.torch_kwargs == {"dim": (1,)}
    assert case.input_specs == [{"name": "x", "shape": [2, 3]}]


def test_manual_cases_are_used_as_given(tmp_path):
    manual = [OperatorCase("Op_a", Op, {"k": 1}, (2, 3)),
              OperatorCase("Op_b", Op, {}, (4,), test_backward=False)]
    cfg = OperatorConfig(name="Op", op_class=Op, manual_cases=manual,
                         json_path=tmp_path / "never_read.json")
    assert build_cases(cfg) == manual


# -- errors ------------------------------------------------------------------------

def flat(case: dict, base_attrs=None) -> dict:
    return {"base_configuration": {"attributes": base_attrs or {},
                                   "input_specs": [{"name": "x", "shape": [2, 3]}]},
            "test_configurations": {"group": {"case": case}}}


@pytest.mark.parametrize("data, message", [
    ('{"a": [1, 2,}', "op.json:1:13: not valid JSON"),
    ([1, 2], "op.json: <top level>: expected an object, got list"),
    ({"base_configuration": {}}, "has 'base_configuration' but no 'test_configurations'"),
    (flat({"attributes": {"kernel_dims": 5}}),
     "op.json: test_configurations.group.case.attributes.kernel_dims: expected a list of "
     "numbers, got 5"),
    (flat({"attributes": {"keep_dims": 1}}),
     "test_configurations.group.case.attributes.keep_dims: expected true or false, got 1"),
    (flat({"attributes": {"nb_groups": 2.5}}),
     "test_configurations.group.case.attributes.nb_groups: expected an integer, got 2.5"),
    (flat({"attributes": {"nb_groups": True}}),
     "test_configurations.group.case.attributes.nb_groups: expected an integer, got true"),
    (flat({"test_backward": "yes"}),
     "test_configurations.group.case.test_backward: expected true or false"),
    (flat({"output_size": [2, -1]}),
     "test_configurations.group.case.output_size: expected a shape"),
    (flat({"input_specs": [{"shape": [1]}]}),
     "test_configurations.group.case.input_specs[0].name: every input spec needs a 'name'"),
    (flat({"input_specs": [{"name": "x", "shape": [1], "dtype": "flaot32"}]}),
     "input_specs[0].dtype: unknown dtype 'flaot32'; one of ['float32', 'float64', "),
    (flat({"input_specs": [{"name": "x", "shape": [1], "dtype": "int64"}]}),
     "test_configurations.group.case.input_specs: case 'Op_group_case': the data input 'x' "
     "has dtype 'int64'; the cases feed it random floats: one of ['float32', 'float64']"),
    (flat({"input_specs": [{"name": "w"}]}),
     "test_configurations.group.case.input_specs: input spec 'w' has no 'shape'"),
    (flat({"attributes": {"axis": 1}}, base_attrs={"axes": [1]}),
     "attributes 'axes' and 'axis' both set torch kwarg 'dim'"),
    ({"c": {}}, "op.json: c: case 'Op_c' has no input shape"),
    ({"c": {"input_size": [1], "input_specs": [{"name": "x", "shape": [1]}]}},
     "op.json: c: give 'input_size' or 'input_specs', not both"),
    ({}, "op.json: <top level>: defines no case"),
    ({"base_configuration": {}, "test_configurations": {"ok": {}}},
     "op.json: test_configurations.ok: expected groups 'attr' and/or 'shape'"),
    (flat({"input_specs": [{"name": "x", "shape": [2], "data": [0.5]}]}),
     "input_specs[0].data: has shape [1], the spec's 'shape' is [2]"),
    (flat({"input_specs": [{"name": "x", "data": [[1, 2], [3]]}]}),
     "input_specs[0].data[1]: ragged data: shape [1], but "),
    (flat({"input_specs": [{"name": "x", "data": [1, "a"]}]}),
     "input_specs[0].data[1]: expected numbers or lists of numbers, got \"a\""),
    ({"base_configuration": {"input_specs": [{"name": "x", "shape": [2, 3],
                                              "data": [[1, 2, 3], [4, 5, 6]]}]},
      "test_configurations": {"g": {"c": {"input_specs": [{"name": "x", "shape": [3, 2]}]}}}},
     "test_configurations.g.c.input_specs: input spec 'x': its 'data' has shape [2, 3], "
     "its 'shape' is [3, 2]"),
    (flat({}) | {"test_configurations": {"s": {"kernel_dims": []}}},
     "op.json: test_configurations.s.kernel_dims: an empty sweep defines no case"),
    (flat({}) | {"test_configurations": {"s": {"kernel_dims": [[1], {}]}}},
     "test_configurations.s.kernel_dims: a sweep holds cases (objects) or values, not both"),
    (flat({}) | {"test_configurations": {"s": {"kernel": [[1], [2]]}}},
     "test_configurations.s.kernel: a sweep of values needs a label that names an attribute "
     "of operator 'Op' or a base input spec ['x']; 'kernel' is neither"),
    (flat({}) | {"test_configurations": {"s": {"nb_groups": [1, 2.5]}}},
     "test_configurations.s.nb_groups[1].attributes.nb_groups: expected an integer, got 2.5"),
], ids=["invalid_json", "not_an_object", "no_test_configurations",
        "tuple_type", "bool_type", "int_type", "bool_is_no_int",
        "test_backward_type", "negative_dim", "spec_without_name", "spec_dtype",
        "data_input_dtype", "spec_without_shape", "two_attributes_one_kwarg", "no_input_shape",
        "input_size_and_specs", "no_case", "empty_ok", "data_vs_shape",
        "ragged_data", "data_not_numbers", "merged_shape_vs_base_data", "empty_sweep",
        "mixed_sweep", "sweep_of_unknown_name", "sweep_value_type"])
def test_bad_configuration_names_file_and_json_path(tmp_path, data, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cases_of(tmp_path, data)


def test_unknown_attribute_names_file_case_and_attribute(tmp_path):
    data = flat({"attributes": {"rounding_mode": "floor"}})
    with pytest.raises(ValueError, match=re.escape(
            "op.json: test_configurations.group.case.attributes: case 'Op_group_case': "
            "attribute 'rounding_mode' is not supported by operator 'Op'")):
        cases_of(tmp_path, data)


def test_duplicate_id_names_both_paths(tmp_path):
    data = {"a_b": {"input_size": [1]}, "a": {"b": {"input_size": [2]}}}
    with pytest.raises(ValueError, match=re.escape(
            "op.json: a.b: duplicate case id 'Op_a_b', also produced by a_b")):
        cases_of(tmp_path, data)


def test_specs_to_kwargs_failure_names_the_case(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            "case 'Op_group_case': specs_to_kwargs failed on input specs")) as info:
        cases_of(tmp_path, flat({}), specs_to_kwargs=lambda specs: {"n": specs[1]["shape"]})
    assert isinstance(info.value.__cause__, IndexError)


def test_unknown_skip_reason_key_is_a_warning(tmp_path):
    with pytest.warns(framework.OperatorConfigWarning, match=re.escape(
            "OperatorConfig(name='Op'): skip_reasons names no case: ['groupcase'] (ignored); "
            "the case keys are ['group_case']")):
        (case,) = cases_of(tmp_path, flat({}), skip_reasons={"groupcase": "typo"})
    assert case.id == "Op_group_case"


def test_missing_file_is_named(tmp_path):
    cfg = OperatorConfig(name="Op", op_class=Op, json_path=tmp_path / "absent.json")
    with pytest.raises(ValueError, match=r"absent\.json: cannot read the configuration"):
        build_cases(cfg)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"name": "Op", "op_class": Op}, ValueError, "give 'json_path' or 'manual_cases'"),
    ({"name": "", "op_class": Op, "manual_cases": []}, ValueError, "'name' must be"),
    ({"name": "Op", "op_class": Op(), "manual_cases": []}, TypeError, "'op_class' must be"),
    ({"name": "Op", "op_class": Op, "manual_cases": [], "backend": "tpu"}, ValueError,
     "'backend' must be 'cpu' or 'cuda', got 'tpu'"),
])
def test_operator_config_checks_its_arguments(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        OperatorConfig(**kwargs)


def test_manual_duplicate_ids_are_an_error():
    cfg = OperatorConfig(name="Op", op_class=Op, manual_cases=[
        OperatorCase("x", Op, {}, (1,)), OperatorCase("x", Op, {}, (2,))])
    with pytest.raises(ValueError, match="duplicate case id 'x'"):
        build_cases(cfg)


# -- the fixture and the plugin, through pytester ------------------------------------

TINY_SUITE = '''
import json
from pathlib import Path

import torch
import aidge_interop
from aidge_interop.testing import OperatorConfig, make_operator_fixture


class Tiny(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.fc = torch.nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x):
        return torch.relu(self.fc(x))


def fc_kwargs(specs):
    out_features, in_features = {{s["name"]: s["shape"] for s in specs}}["weight"]
    return {{"in_features": in_features, "out_features": out_features}}


CONFIG = OperatorConfig(name="Tiny", op_class=Tiny, json_path=Path(__file__).with_name(
    "tiny.json"), specs_to_kwargs=fc_kwargs, {config_kwargs})
tiny_case = make_operator_fixture(CONFIG)


def test_Tiny_interop(tiny_case):
{body}
'''

TINY_JSON = {
    "base_configuration": {"input_specs": [{"name": "data_input", "shape": [4, 6]},
                                           {"name": "weight", "shape": [3, 6]}]},
    "test_configurations": {
        "attributes": {"plain": {},
                       "no_bias": {"attributes": {"no_bias": True},
                                   "expected_failure": "known engine bug"}},
        "shape": {"batch_1": {"input_specs": [{"name": "data_input", "shape": [1, 6]}]}},
    },
}


def tiny_suite(pytester, body, config_kwargs="", json_data=TINY_JSON):
    pytester.makefile(".json", tiny=json.dumps(json_data))
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    pytester.makepyfile(test_tiny=TINY_SUITE.format(config_kwargs=config_kwargs, body=indented))


def run(pytester, *args):
    """A pytest run in a subprocess (an in-process run unloads the modules it
    imported, and torch cannot be imported twice in one interpreter), without
    unrelated plugins (hypothesis, pytest-benchmark)."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                         "-p", "no:benchmark", *args)


def test_plugin_is_registered_under_pytest11():
    (entry,) = [e for e in importlib.metadata.entry_points(group="pytest11")
                if e.name == "aidge_interop"]
    assert entry.value == "aidge_interop.testing.plugin"


def test_fixture_yields_the_documented_dict(pytester):
    tiny_suite(pytester, '''
case = tiny_case
assert set(case) == {"name", "torch_model", "aidge_model", "input_size", "output_size",
                     "test_backward", "optimizer", "cuda", "max_slowdown_ratio", "dtype",
                     "input_specs", "engine"}
assert case["engine"] == "aidge_interop"
assert case["dtype"] is torch.float32
assert case["input_specs"][0] == {"name": "data_input", "shape": list(case["input_size"])}
assert isinstance(case["torch_model"], Tiny)
assert isinstance(case["aidge_model"], aidge_interop.AidgeModule)
assert case["output_size"] == (case["input_size"][0], 3)   # inferred from the torch model
assert case["torch_model"].training is case["test_backward"]
assert case["aidge_model"].training is case["test_backward"]
assert case["cuda"] is False
for (n1, p1), (n2, p2) in zip(case["torch_model"].named_parameters(),
                              case["aidge_model"].named_parameters()):
    assert n1 == n2 and torch.equal(p1, p2)
if case["test_backward"]:
    assert isinstance(case["optimizer"], aidge_interop.SGD)
    assert case["optimizer"].defaults["lr"] == 0.01
    assert all(a is b for a, b in zip(case["optimizer"].params,
                                      case["aidge_model"].parameters(), strict=True))
else:
    assert case["optimizer"] is None
print("CASE", case["name"], case["input_size"], case["test_backward"])
x = torch.randn(case["input_size"])
torch.testing.assert_close(case["aidge_model"](x), case["torch_model"](x))
''', config_kwargs="forward_only_cases=True")
    result = run(pytester, "-s")
    result.assert_outcomes(passed=2, xpassed=1)
    result.stdout.fnmatch_lines_random([
        "*CASE Tiny_attributes_plain (4, 6) True",
        "*CASE Tiny_attributes_no_bias (4, 6) True",
        "*CASE Tiny_shape_batch_1 (1, 6) False",
    ])


def test_same_case_builds_the_same_model_every_time(pytester):
    tiny_suite(pytester, '''
w = tiny_case["torch_model"].fc.weight
print("W", tiny_case["name"], float(w.sum()))
''')
    sums = []
    for _ in range(2):  # the second run starts from another global RNG state
        result = run(pytester, "-s", "-k", "plain")
        sums += re.findall(r"W Tiny_attributes_plain (\S+)", result.stdout.str())
    assert len(sums) == 2 and sums[0] == sums[1]


@pytest.mark.parametrize("config_kwargs, outcomes, reasons", [
    pytest.param('skip_all="crashes", xfail_all="broken"', {"skipped": 3},
                 ["SKIPPED * crashes"], id="skip_all_first"),
    pytest.param('xfail_all="broken", xfail_backward="no backward"', {"xfailed": 3},
                 ["XFAIL *plain* - broken", "XFAIL *no_bias* - broken",
                  "XFAIL *batch_1* - broken"], id="xfail_all_then"),
    pytest.param('xfail_backward="no backward"', {"xfailed": 2, "failed": 1},
                 ["XFAIL *plain* - no backward", "XFAIL *no_bias* - no backward",
                  "FAILED *batch_1*"], id="xfail_backward_then"),
    pytest.param('skip_reasons={"attributes_plain": "see issue 7"}', {"xfailed": 2, "failed": 1},
                 ["XFAIL *plain* - see issue 7", "XFAIL *no_bias* - known engine bug",
                  "FAILED *batch_1*"], id="per_case_last"),
])
def test_marks_follow_the_priority_order(pytester, config_kwargs, outcomes,
                                        reasons):
    tiny_suite(pytester, 'assert False, "the engine disagrees"',
               config_kwargs=config_kwargs + ", forward_only_cases=True")
    result = run(pytester, "-rsxf")
    result.assert_outcomes(**outcomes)
    result.stdout.fnmatch_lines_random(reasons)


def test_plugin_markers_select_cases(pytester):
    tiny_suite(pytester, "pass", config_kwargs="forward_only_cases=True")
    result = run(pytester, "--strict-markers", "-m", "forward_only")
    result.assert_outcomes(passed=1, deselected=2)
    result = run(pytester, "--strict-markers",
                 "-m", "aidge_operator(name='Tiny') and not forward_only")
    result.assert_outcomes(passed=1, xpassed=1, deselected=1)
    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.aidge_operator(name):*",
                                 "@pytest.mark.forward_only:*"])


def test_forward_only_option_keeps_shape_cases(pytester):
    tiny_suite(pytester, "pass")
    result = run(pytester, "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*2 tests collected*"])
    result = run(pytester, "--collect-only", "-q", "--forward-only-cases")
    result.stdout.fnmatch_lines(["*Tiny_shape_batch_1*", "*3 tests collected*"])
    assert framework.INCLUDE_FORWARD_ONLY_CASES is False  # restored after the run


def test_a_conftest_toggle_keeps_shape_cases(pytester):
    tiny_suite(pytester, "pass")
    pytester.makeconftest("INCLUDE_FORWARD_ONLY_CASES = True\n")
    result = run(pytester, "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*Tiny_shape_batch_1*", "*3 tests collected*"])
    pytester.makeconftest("INCLUDE_FORWARD_ONLY_CASES = False\n")
    result = run(pytester, "--collect-only", "-q", "--forward-only-cases")  # the option wins
    result.stdout.fnmatch_lines(["*3 tests collected*"])


def test_bad_configuration_is_a_collection_error(pytester):
    bad = {"c": {"input_size": [2, 6], "attributes": {"kernel_dims": 3}}}
    tiny_suite(pytester, "pass", json_data=bad)
    result = run(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*ValueError: *tiny.json: c.attributes.kernel_dims: "
                                 "expected a list of numbers, got 3"])


def test_fixture_names_the_case_a_model_cannot_be_built_for(pytester):
    data = {"c": {"input_specs": [{"name": "data_input", "shape": [2, 6]},
                                  {"name": "weight", "shape": [3, 6]}],
                  "attributes": {"nb_groups": 2}}}
    tiny_suite(pytester, "pass", json_data=data)
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*TypeError: *unexpected keyword argument 'groups'",
        "*while building case Tiny_c: Tiny(**{'groups': 2, 'in_features': 6, "
        "'out_features': 3}) on an input of shape (2, 6)",
    ])
