"""aidge_interop.locate: first-divergence localisation, forward and backward.

A correct model must show no divergence against every reference; a
divergence injected on purpose into the engine only (a perturbed weight, a
different kernel at one node, a wrong weight during backward, a wrong
parameter gradient) must be found at the node where it was injected, with
the error figures that the injection implies.
"""
import importlib
import subprocess
import sys

import onnx
import pytest
import torch
from onnx import helper

import aidge_interop
from aidge_interop.graph import Graph
from aidge_interop.testing import ModelTester
from models import lenet, resnet8

locate_module = importlib.import_module("aidge_interop.compare.locate")
from aidge_interop.bridge.wrapping import export_onnx_bytes

LENET_NODES = ["/sequence/sequence.0/Conv", "/sequence/sequence.1/Relu",
               "/sequence/sequence.2/MaxPool", "/sequence/sequence.3/Conv",
               "/sequence/sequence.4/Relu", "/sequence/sequence.5/MaxPool",
               "/sequence/sequence.6/Flatten", "/sequence/sequence.7/Gemm",
               "/sequence/sequence.8/Relu", "/sequence/sequence.9/Gemm",
               "/sequence/sequence.10/Relu", "/sequence/sequence.11/Gemm"]


def _input(*shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def _engine_patch(monkeypatch, *, edit_model=None, edit_graph=None):
    """Applies ``edit_model(proto)`` and ``edit_graph(graph)`` to every graph
    that locate loads in the engine (the reference keeps the exported model)."""
    load = locate_module.load_onnx

    def patched(source, **kwargs):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)
        if edit_model:
            edit_model(proto)
        graph = load(proto, **kwargs)
        if edit_graph:
            edit_graph(graph)
        return graph

    monkeypatch.setattr(locate_module, "load_onnx", patched)


def _perturb_weight(name, index, delta):
    def edit(graph):
        graph.parameters()[name][index] += delta
    return edit


@pytest.mark.parametrize("reference", ["onnxruntime", "onnx", "torch"])
def test_correct_model_has_no_divergence(reference):
    result = aidge_interop.locate(lenet(), _input(2, 1, 32, 32), reference=reference)
    assert result.first is None and result.diverging() == []
    # every LeNet node is a module: all references compare all of them
    assert [n.name for n in result.forward] == LENET_NODES and result.unchecked == []
    assert all(c.ok and c.numel > 0 for n in result.forward for c in n.checks)
    assert max(c.max_abs_diff for n in result.forward for c in n.checks) < 1e-5
    assert "12 tensors at 12 nodes compared; none diverges" in str(result)


@pytest.mark.parametrize("reference", ["onnxruntime", "torch"])
def test_perturbed_weight_is_found_at_its_node(monkeypatch, reference):
    model, x = lenet(), _input(2, 1, 32, 32)
    _engine_patch(monkeypatch, edit_graph=_perturb_weight("sequence.3.weight", (0, 0, 0, 0), 0.5))
    result = locate_module.locate(model, x, reference=reference, top=2)

    first = result.first
    assert first.name == "/sequence/sequence.3/Conv" and first.op_type == "Conv"
    assert first.attrs["kernel_shape"] == (5, 5) and first.attrs["group"] == 1
    assert first.input_shapes == [(2, 6, 14, 14), (16, 6, 5, 5), (16,)]
    assert first.output_shapes == [(2, 16, 10, 10)]
    assert not any(n.diverges for n in result.forward[:3])
    # the output of channel 0 moves by 0.5 * the input pixel under w[0, 0, 0, 0]
    with torch.no_grad():
        pooled = model.sequence[:3](x)[:, 0, :10, :10]
    (check,) = first.checks
    assert check.max_abs_diff == pytest.approx(0.5 * pooled.abs().max().item(), rel=1e-4)
    assert check.max_abs_index[1] == 0 and 0 < check.mismatches <= 2 * 10 * 10
    # downstream nodes diverge too; the report lists the first and top - 1 more
    assert [n.name for n in result.diverging()][:2] == LENET_NODES[3:5]
    text = str(result)
    assert "The first node whose output diverges:\nnode '/sequence/sequence.3/Conv' (Conv)" in text
    assert "kernel_shape=(5, 5)" in text and "(2, 16, 10, 10)" in text
    assert "'/sequence/sequence.4/Relu' (Relu)" in text
    assert "'/sequence/sequence.5/MaxPool'" not in text


def test_wrong_kernel_is_found_at_its_node(monkeypatch):
    """The engine runs LeakyRelu where the model has a Relu."""
    def leaky(proto):
        node = next(n for n in proto.graph.node if n.name == "/sequence/sequence.8/Relu")
        node.op_type = "LeakyRelu"
        node.attribute.append(helper.make_attribute("alpha", 0.1))

    _engine_patch(monkeypatch, edit_model=leaky)
    result = locate_module.locate(lenet(), _input(2, 1, 32, 32))
    assert result.first.name == "/sequence/sequence.8/Relu"
    assert result.first.op_type == "LeakyRelu" and result.first.attrs == {"alpha": 0.1}
    assert [n.diverges for n in result.forward][:8] == [False] * 8


def test_residual_model_against_torch_maps_module_outputs(monkeypatch):
    model, x = resnet8(), _input(2, 3, 32, 32)
    clean = aidge_interop.locate(model, x, reference="torch")
    assert clean.first is None
    compared = {c.name for n in clean.forward for c in n.checks}
    # module outputs, the residual block's output among them; functional calls are not
    assert "/stacks/stacks.1/shortcut/Conv_output_0" in compared
    assert "/stacks/stacks.1/Relu_1_output_0" in compared
    assert "/stacks/stacks.1/Add" in clean.unchecked and "/Flatten" in clean.unchecked

    _engine_patch(monkeypatch,
                  edit_graph=_perturb_weight("stacks.1.shortcut.weight", (3, 2, 0, 0), 1.0))
    for reference in ("torch", "onnxruntime"):
        result = locate_module.locate(model, x, reference=reference)
        assert result.first.name == "/stacks/stacks.1/shortcut/Conv", reference
        assert result.first.checks[0].max_abs_index[1] == 3


def _dl_dy(model, x, module):
    """torch's gradient of the MSE-against-ones loss at ``module``'s output."""
    grads = {}

    def hook(module, args, out):
        out.register_hook(lambda g: grads.setdefault("g", g))

    module.register_forward_hook(hook)
    out = model(x)
    torch.nn.functional.mse_loss(out, torch.ones_like(out)).backward()
    return grads["g"]


def test_wrong_weight_in_backward_is_found_at_its_node(monkeypatch):
    """Gemm 'sequence.9' computes its input gradient with a wrong weight:
    forward agrees, the walk from the loss stops at that node."""
    model, x = lenet(), _input(2, 1, 32, 32)
    fresh = lenet()
    dy = _dl_dy(fresh, x, fresh.sequence[9])
    row = int(dy.abs().sum(0).argmax())  # an output unit with a gradient
    backward = Graph.backward

    def wrong_backward(self, grad_outputs):
        w = self.parameters()["sequence.9.weight"]
        w[row, 7] += 0.25
        try:
            return backward(self, grad_outputs)
        finally:
            w[row, 7] -= 0.25

    monkeypatch.setattr(Graph, "backward", wrong_backward)
    result = aidge_interop.locate(model, x, train=True)
    assert result.diverging("forward") == []
    walked = [n.name for n in result.backward]
    assert walked == LENET_NODES[::-1]
    first = result.first
    assert first.name == "/sequence/sequence.9/Gemm" and walked.index(first.name) == 2
    assert not any(n.diverges for n in result.backward[:2])
    checks = {c.name: c for c in first.checks}
    assert checks["sequence.9.weight"].ok and checks["sequence.9.bias"].ok
    # d(input)[b, 7] moves by 0.25 * dL/dy[b, row]: only column 7 differs
    bad = checks["/sequence/sequence.8/Relu_output_0"]
    assert bad.what == "gradient" and not bad.ok
    assert bad.max_abs_diff == pytest.approx(0.25 * dy[:, row].abs().max().item(), rel=1e-3)
    assert bad.max_abs_index[1] == 7 and bad.mismatches <= 2
    text = str(result)
    assert "first node (from the loss) whose input or parameter gradient diverges" in text
    assert "DIFFERS gradient '/sequence/sequence.8/Relu_output_0'" in text



def test_gradient_of_a_value_with_two_consumers_is_checked_at_the_first(monkeypatch):
    """The stem's output feeds the first block's conv1 and its residual Add:
    its gradient is complete after both; a wrong conv1 backward shows there."""
    backward = Graph.backward

    def wrong_backward(self, grad_outputs):
        w = self.parameters()["stacks.0.conv1.weight"]
        w += 0.05
        try:
            return backward(self, grad_outputs)
        finally:
            w -= 0.05

    monkeypatch.setattr(Graph, "backward", wrong_backward)
    result = aidge_interop.locate(resnet8(), _input(2, 3, 32, 32), train=True)
    assert result.diverging("forward") == []
    first = result.first
    assert first.name == "/stacks/stacks.0/conv1/Conv"
    assert [c.name for c in first.checks if not c.ok] == ["/stem/stem.2/Relu_output_0"]
    walked = [n.name for n in result.backward]
    assert walked.index("/stacks/stacks.0/Add") < walked.index(first.name)

def test_wrong_parameter_gradient_is_found_at_its_node(monkeypatch):
    backward = Graph.backward

    def wrong_backward(self, grad_outputs):
        out = backward(self, grad_outputs)
        self.grads()["sequence.3.bias"][2] += 0.1
        return out

    monkeypatch.setattr(Graph, "backward", wrong_backward)
    result = aidge_interop.locate(lenet(), _input(2, 1, 32, 32), train=True)
    (first,) = result.diverging("backward")
    assert result.first is first and first.name == "/sequence/sequence.3/Conv"
    checks = {c.name: c for c in first.checks}
    assert set(checks) == {"/sequence/sequence.2/MaxPool_output_0", "sequence.3.weight",
                           "sequence.3.bias"}
    bias = checks["sequence.3.bias"]
    assert bias.what == "gradient of parameter" and bias.mismatches == 1
    assert bias.max_abs_index == (2,) and bias.max_abs_diff == pytest.approx(0.1, rel=1e-5)
    assert [c.ok for c in first.checks].count(False) == 1


def test_perturbed_weight_in_training_is_a_forward_divergence(monkeypatch):
    _engine_patch(monkeypatch, edit_graph=_perturb_weight("sequence.7.bias", 0, 0.5))
    result = aidge_interop.locate(lenet(), _input(2, 1, 32, 32), train=True)
    assert result.first.name == "/sequence/sequence.7/Gemm"
    assert result.first is result.diverging("forward")[0]
    # gradients that depend on the wrong values differ too; the report says so
    assert result.diverging("backward")
    assert "The forward already diverges" in str(result)


def test_training_residual_model_checks_every_parameter_gradient():
    """BatchNorm in train mode on both sides; the caller's model is left alone."""
    model, x = resnet8(), _input(2, 3, 32, 32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = aidge_interop.locate(model, x, train=True)
    assert result.first is None, str(result)
    checked = {c.name: c.what for n in result.backward for c in n.checks}
    params = [n for n, _ in model.named_parameters()]
    assert {n for n, w in checked.items() if w == "gradient of parameter"} == set(params)
    assert checked["input_0"] == "gradient"
    assert "/stacks/stacks.0/Relu_1_output_0" in checked  # a block's output
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_onnx_file_model(tmp_path):
    model, x = lenet(), _input(2, 1, 32, 32)
    path = tmp_path / "lenet.onnx"
    path.write_bytes(export_onnx_bytes(model, [x]))
    result = aidge_interop.locate(str(path), x.numpy(), reference="onnx")
    assert result.first is None and len(result.forward) == 12
    with pytest.raises(ValueError, match=r"train=True needs a torch.nn.Module, not str"):
        aidge_interop.locate(str(path), x.numpy(), train=True)
    with pytest.raises(FileNotFoundError, match="locate: no ONNX file at"):
        aidge_interop.locate(str(tmp_path / "missing.onnx"), x.numpy())


@pytest.mark.parametrize("kwargs, error", [
    ({"reference": "tf"}, r"argument 'reference' must be one of onnxruntime, onnx, torch"),
    ({"train": True, "reference": "onnxruntime"}, r"reference must be 'torch'"),
    ({"rtol": -1.0}, r"argument 'rtol' must be >= 0"),
    ({"atol": float("nan")}, r"argument 'atol' must be >= 0"),
    ({"top": 0}, r"argument 'top' must be an int >= 1"),
])
def test_bad_arguments_are_named(kwargs, error):
    with pytest.raises(ValueError, match=error):
        aidge_interop.locate(lenet(), _input(1, 1, 32, 32), **kwargs)


def test_input_count_is_checked(tmp_path):
    x = _input(1, 1, 32, 32)
    with pytest.raises(ValueError, match=r"the model takes 1 input\(s\) \(input_0\), got 2"):
        aidge_interop.locate(export_onnx_bytes(lenet(), [x]), [x.numpy(), x.numpy()])


def test_package_attribute_is_lazy_and_stays_callable(tmp_path):
    code = ("import sys, aidge_interop\n"
            "f = aidge_interop.locate\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "import aidge_interop.compare.locate, aidge_interop.bridge.wrapping\n"
            "assert callable(aidge_interop.locate) and callable(aidge_interop.wrap)\n"
            "import torch\n"
            "r = aidge_interop.locate(torch.nn.Linear(4, 2), torch.ones(1, 4), reference='onnx')\n"
            "assert r.first is None and callable(aidge_interop.wrap)\n"
            "print(f.__module__)")
    # from tmp_path: the installed package, not the checkout's sources
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "aidge_interop.compare.locate"


def test_model_tester_failure_points_to_locate():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    shifted = torch.nn.Linear(16, 4)
    shifted.load_state_dict(model.state_dict())
    with torch.no_grad():
        shifted.bias += 0.01
    tester = ModelTester(model.eval(), shifted.eval(), name="Shifted", epochs=1,
                         test_backward=False, benchmark=False)
    with pytest.raises(AssertionError) as info:
        tester.test_multiple_step((2, 16))
    # the message is unchanged; the hint is a note (shown by tracebacks and pytest)
    assert str(info.value).startswith("Shifted, epoch 1/1, output: Tensor-likes are not close!")
    assert "locate" not in str(info.value)
    assert info.value.__notes__ == ["To find the first diverging node: aidge_interop.locate("
                                    "model, inputs) or `aidge-interop locate MODEL`"]
    tester = ModelTester(model.train(), shifted.train(), name="Shifted", epochs=1,
                         benchmark=False)
    with pytest.raises(AssertionError) as info:
        tester.test_multiple_step((2, 16))
    assert info.value.__notes__[0].endswith("locate(model, inputs, train=True) or "
                                            "`aidge-interop locate MODEL --train`")


# -- command line ------------------------------------------------------------------------

def _args(*argv):
    import argparse

    parser = argparse.ArgumentParser()
    locate_module.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_run_reports_agreement(capsys):
    assert locate_module.run(_args("models:lenet", "--shape", "2,1,32,32",
                                   "--reference", "onnx")) == 0
    out = capsys.readouterr().out
    assert out.startswith("models:lenet: input 2x1x32x32 float32, seed 0\n\n")
    assert "Forward, engine against onnx.reference, rtol=0.001, atol=0.0001: 12 tensors at " \
           "12 nodes compared; none diverges." in out


def test_cli_run_reports_divergence_and_writes_json(monkeypatch, tmp_path, capsys):
    import json

    _engine_patch(monkeypatch, edit_graph=_perturb_weight("sequence.9.bias", 3, 0.5))
    path = tmp_path / "locate.json"
    assert locate_module.run(_args("lenet", "--train", "--top", "1", "--json", str(path))) == 1
    out = capsys.readouterr().out
    assert "The first node whose output diverges:\nnode '/sequence/sequence.9/Gemm' (Gemm)" in out
    assert "Next diverging nodes" not in out  # --top 1
    data = json.loads(path.read_text())
    assert data["model"] == "lenet" and data["train"] is True and data["reference"] == "torch"
    assert data["first"] == "/sequence/sequence.9/Gemm"
    (check,) = next(n for n in data["forward"] if n["name"] == data["first"])["checks"]
    assert check["max_abs_index"] == [0, 3] and check["max_abs_diff"] == pytest.approx(0.5)
    assert [p.name for p in tmp_path.iterdir()] == ["locate.json"]  # no temporary left


def test_cli_errors(monkeypatch, tmp_path, capsys):
    from aidge_interop.compare import cli

    onnx_file = tmp_path / "lenet.onnx"
    onnx_file.write_bytes(export_onnx_bytes(lenet(), [_input(1, 1, 32, 32)],
                                            dynamic_batch=False))
    with pytest.raises(cli.UsageError, match=r"--train needs a torch model .*not an ONNX file"):
        locate_module.run(_args(str(onnx_file), "--train"))
    with pytest.raises(cli.UsageError, match=r"--reference must be torch"):
        locate_module.run(_args("lenet", "--train", "--reference", "onnxruntime"))
    # through the command: one line, status 2, no traceback
    assert cli.main(["locate", "lenet", "--json", str(tmp_path / "no" / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aidge-interop locate: error: --json") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["locate", "lenet", "--rtol", "-1"])
    assert exit_info.value.code == 2
    assert "argument --rtol: '-1' is not a number >= 0" in capsys.readouterr().err

    def broken(source, **kwargs):
        raise NotImplementedError("operator Foo (node 'f', opset 20) is not supported")

    monkeypatch.setattr(locate_module, "load_onnx", broken)
    assert locate_module.run(_args(str(onnx_file))) == 1
    assert capsys.readouterr().err == (f"locate: {onnx_file} could not be run: "
                                       "NotImplementedError: operator Foo (node 'f', opset 20) "
                                       "is not supported\n")
