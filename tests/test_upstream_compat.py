"""Scripts written for ``aidge_interop_torch`` 0.10 (Eclipse Aidge's torch
bridge) run with only their import changed: ``import aidge_interop as ait``.

The ``test_upstream_bridge_*`` tests are such a script's parts, written the
way aidge_interop_torch's documentation writes them (wrap with its keywords
and its positional opset, ``set_learning_rate`` training loops, the tensor
converters), each checked against torch, ONNX Runtime or NumPy.
"""
import copy
import os
import warnings

import numpy as np
import onnx
import pytest
import torch

import aidge_interop as ait

RTOL, ATOL = 1e-5, 1e-6  # float32, as in tests/test_wrap.py


class LeNetLike(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sequence = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(4 * 3 * 3, 10))

    def forward(self, x):
        return self.sequence(x)


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(6, 3)

    def forward(self, x, y):
        return self.a(x) * self.b(y)


def _assert_same_parameters(wrapped, model, msg):
    for (n, q), (m, p) in zip(wrapped.named_parameters(), model.named_parameters()):
        assert n == m
        torch.testing.assert_close(q.detach(), p.detach(), rtol=RTOL, atol=ATOL,
                                   msg=f"{msg}: {n}")


# ---------------------------------------------------------------- wrap


def test_upstream_bridge_wrap_positional_opset():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    wrapped = ait.wrap(model, (1, 16), 18)  # aidge_interop_torch: (model, input_size, opset)
    assert {o.domain: o.version for o in wrapped.onnx_model.opset_import}[""] == 18
    x = torch.randn(5, 16)
    torch.testing.assert_close(wrapped(x), model(x), rtol=RTOL, atol=ATOL)
    # every upstream argument positionally, in its order
    wrapped = ait.wrap(model, [(1, 16)], 17, False, ["features"], ["scores"], False)
    assert {o.domain: o.version for o in wrapped.onnx_model.opset_import}[""] == 17
    assert [i.name for i in wrapped.onnx_model.graph.input] == ["features"]
    torch.testing.assert_close(wrapped(x), model(x), rtol=RTOL, atol=ATOL)


def test_upstream_bridge_wrap_keywords_save_names_verbose(tmp_path, monkeypatch, capsys):
    ort = pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(1)
    model = LeNetLike()
    wrapped = ait.wrap(torch_model=model, input_size=(1, 1, 8, 8), opset_version=17,
                       save_onnx_model=True, in_names=["image"], out_names=["logits"],
                       verbose=True)
    printed = capsys.readouterr().out
    assert "Exporting LeNetLike to ONNX (opset 17" in printed
    assert "float[batch,1,8,8] image" in printed and "Conv" in printed
    assert "sequence.0.weight [4, 1, 3, 3]" in printed and "LeNetLike.onnx" in printed

    graph = wrapped.onnx_model.graph
    assert [i.name for i in graph.input] == ["image"]
    assert [o.name for o in graph.output] == ["logits"]
    # saved where aidge_interop_torch saves it, nothing else left in the folder
    assert sorted(os.listdir(tmp_path)) == ["LeNetLike.onnx"]
    saved = onnx.load(tmp_path / "LeNetLike.onnx")
    onnx.checker.check_model(saved)
    assert {o.domain: o.version for o in saved.opset_import}[""] == 17
    x = torch.randn(3, 1, 8, 8)
    expected = model(x).detach()
    session = ort.InferenceSession(saved.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (by_ort,) = session.run(["logits"], {"image": x.numpy()})
    np.testing.assert_allclose(by_ort, expected.numpy(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(wrapped(x), expected, rtol=RTOL, atol=ATOL)


def test_upstream_bridge_wrap_two_inputs_named():
    torch.manual_seed(2)
    model = TwoInputs()
    wrapped = ait.wrap(model, [(1, 4), (1, 6)], 18, in_names=["left", "right"],
                       out_names=["product"])
    graph = wrapped.onnx_model.graph
    assert [i.name for i in graph.input] == ["left", "right"]
    assert [o.name for o in graph.output] == ["product"]
    x, y = torch.randn(2, 4), torch.randn(2, 6)
    torch.testing.assert_close(wrapped(x, y), model(x, y), rtol=RTOL, atol=ATOL)
    # one name given: the other input keeps its default
    wrapped = ait.wrap(model, [(1, 4), (1, 6)], in_names=["left"])
    assert [i.name for i in wrapped.onnx_model.graph.input] == ["left", "input_1"]


def test_upstream_bridge_names_kept_for_another_input_shape():
    # a call of another image size runs a graph exported for it: same names
    torch.manual_seed(12)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.Sigmoid())
    wrapped = ait.wrap(model, (1, 2, 8, 8), 18, False, ["image"], ["map"])
    x = torch.randn(2, 2, 11, 9)
    torch.testing.assert_close(wrapped(x), model(x), rtol=RTOL, atol=ATOL)
    assert tuple(wrapped.input_dims[0]) == (2, 2, 11, 9)  # the new export is the current one
    assert [i.name for i in wrapped.onnx_model.graph.input] == ["image"]
    assert [o.name for o in wrapped.onnx_model.graph.output] == ["map"]
    assert {o.domain: o.version for o in wrapped.onnx_model.opset_import}[""] == 18


def test_upstream_bridge_wrap_saves_to_a_path_atomically(tmp_path, capsys):
    target = tmp_path / "model.onnx"
    target.write_bytes(b"an older file")
    model = torch.nn.Linear(3, 2)
    ait.wrap(model, (1, 3), save_onnx_model=target)
    assert capsys.readouterr().out == ""  # silent unless verbose
    saved = onnx.load(target)
    assert {i.name for i in saved.graph.initializer} == {"weight", "bias"}
    weight = next(i for i in saved.graph.initializer if i.name == "weight")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(weight),
                                  model.weight.detach().numpy())
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"]  # no temporary file left
    with pytest.raises(FileNotFoundError, match="save_onnx_model=.*does not exist"):
        ait.wrap(model, (1, 3), save_onnx_model=tmp_path / "missing" / "m.onnx")
    with pytest.raises(TypeError, match="'save_onnx_model'"):
        ait.wrap(model, (1, 3), save_onnx_model=3)


def test_upstream_bridge_wrap_both_spellings_refused():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(TypeError, match="both 'opset' and 'opset_version'"):
        ait.wrap(model, (1, 3), 18, opset=18)
    with pytest.raises(TypeError, match="both 'opset' and 'opset_version'"):
        ait.wrap(model, (1, 3), opset_version=17, opset=18)
    with pytest.raises(TypeError, match="both 'input_dims' and 'input_size'"):
        ait.wrap(model, (1, 3), input_size=(1, 3))
    with pytest.raises(TypeError, match="opset must be an int"):
        ait.wrap(model, (1, 3), "18")


def test_upstream_bridge_wrap_bad_names():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="'in_names' has 2 names for 1 graph inputs"):
        ait.wrap(model, (1, 3), in_names=["x", "y"])
    with pytest.raises(ValueError, match="'weight' in 'in_names' is also a parameter"):
        ait.wrap(model, (1, 3), in_names=["weight"])
    with pytest.raises(ValueError, match="'x' in 'out_names' is also a name in 'in_names'"):
        ait.wrap(model, (1, 3), in_names=["x"], out_names=["x"])
    with pytest.raises(TypeError, match="'in_names' must be a list of non-empty str"):
        ait.wrap(model, (1, 3), in_names="x")
    with pytest.raises(RuntimeError, match="'out_names' has 2 names for 1 graph outputs"):
        ait.wrap(model, (1, 3), out_names=["y", "z"])


# ---------------------------------------------------------------- training


def _upstream_training_loop(wrapped, reference, lr, steps, loss_fn, make_batch,
                            optimizer_too=False):
    """aidge_interop_torch's loop on ``wrapped`` (backward applies the step)
    beside torch.optim.SGD on ``reference``; the parameters compared after
    every step. ``optimizer_too``: the script also steps a torch optimizer
    over the wrapped module's parameters (a no-op in aidge_interop_torch)."""
    wrapped.set_learning_rate(lr)
    ignored = torch.optim.SGD(wrapped.parameters(), lr=lr) if optimizer_too else None
    sgd = torch.optim.SGD(reference.parameters(), lr=lr)
    for step in range(steps):
        x, label = make_batch(step)
        if ignored is not None:
            ignored.zero_grad()
        loss = loss_fn(wrapped(x), label)
        loss.backward()
        if ignored is not None:
            ignored.step()

        sgd.zero_grad()
        expected = loss_fn(reference(x), label)
        expected.backward()
        sgd.step()
        torch.testing.assert_close(loss.detach(), expected.detach(), rtol=RTOL, atol=ATOL,
                                   msg=f"loss, step {step}")
        _assert_same_parameters(wrapped, reference, f"after step {step}")
        assert all(p.grad is None for p in wrapped.parameters())


@pytest.mark.parametrize("optimizer_too", [False, True], ids=["backward_only", "with_optimizer"])
def test_upstream_bridge_set_learning_rate_trains_like_sgd(optimizer_too):
    torch.manual_seed(3)
    model = LeNetLike()
    reference = copy.deepcopy(model)
    wrapped = ait.wrap(model, (1, 1, 8, 8), 18)
    before = [p.detach().clone() for p in wrapped.parameters()]
    gen = torch.Generator().manual_seed(4)
    _upstream_training_loop(
        wrapped, reference, 0.05, 6, torch.nn.CrossEntropyLoss(),
        lambda step: (torch.randn(4, 1, 8, 8, generator=gen),
                      torch.randint(0, 10, (4,), generator=gen)),
        optimizer_too=optimizer_too)
    moved = [(p.detach() - b).abs().max().item() for p, b in zip(wrapped.parameters(), before)]
    assert min(moved) > 1e-4, moved  # every parameter trained


def test_upstream_bridge_step_uses_each_backward_gradient_alone():
    # aidge_interop_torch resets the gradients at each backward: two backward
    # calls without zero_grad are two steps, each with its own gradient
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    reference = copy.deepcopy(model)
    wrapped = ait.wrap(model, (1, 6))
    gen = torch.Generator().manual_seed(6)
    batches = [(torch.randn(3, 6, generator=gen), torch.randn(3, 2, generator=gen))
               for _ in range(4)]
    _upstream_training_loop(wrapped, reference, 0.1, 4, torch.nn.MSELoss(),
                            lambda step: batches[step])


def test_upstream_bridge_hybrid_model_steps_once():
    # a torch layer before the wrapped block, one torch optimizer over the whole
    # model: the torch layer steps by the optimizer, the wrapped block by its
    # backward, each once
    torch.manual_seed(7)
    head, block = torch.nn.Linear(5, 6), torch.nn.Sequential(torch.nn.ReLU(),
                                                             torch.nn.Linear(6, 3))
    ref_head, ref_block = copy.deepcopy(head), copy.deepcopy(block)
    wrapped = ait.wrap(block, (1, 6))
    wrapped.set_learning_rate(0.2)
    hybrid = torch.nn.Sequential(head, wrapped)
    reference = torch.nn.Sequential(ref_head, ref_block)
    opt = torch.optim.SGD(hybrid.parameters(), lr=0.2)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.2)
    gen = torch.Generator().manual_seed(8)
    for step in range(4):
        x, y = torch.randn(4, 5, generator=gen), torch.randn(4, 3, generator=gen)
        for o, m in ((opt, hybrid), (ref_opt, reference)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
        _assert_same_parameters(hybrid, reference, f"after step {step}")


def test_upstream_bridge_learning_rate_changes_and_none():
    torch.manual_seed(9)
    model = torch.nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    wrapped = ait.wrap(model, (1, 4))
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(10)
    for lr in (0.1, 0.01, 0.0):  # each backward takes the current rate
        wrapped.set_learning_rate(lr)
        for g in sgd.param_groups:
            g["lr"] = lr
        x = torch.randn(3, 4, generator=gen)
        wrapped(x).square().sum().backward()
        sgd.zero_grad()
        reference(x).square().sum().backward()
        sgd.step()
        _assert_same_parameters(wrapped, reference, f"lr {lr}")
    # None: torch's way again, backward accumulates into .grad, nothing moves
    wrapped.set_learning_rate(None)
    before = [p.detach().clone() for p in wrapped.parameters()]
    x = torch.randn(3, 4, generator=gen)
    for _ in range(2):
        wrapped(x).square().sum().backward()
    reference.zero_grad()
    reference(x).square().sum().backward()
    for p, b, r in zip(wrapped.parameters(), before, reference.parameters()):
        torch.testing.assert_close(p.detach(), b, rtol=0, atol=0)
        torch.testing.assert_close(p.grad, 2 * r.grad, rtol=RTOL, atol=ATOL)


def test_upstream_bridge_default_backward_does_not_step():
    # never called set_learning_rate: torch's semantics (ours), unlike
    # aidge_interop_torch's step at 0.01 (docs/wrap.md)
    model = torch.nn.Linear(4, 2)
    wrapped = ait.wrap(model, (1, 4))
    before = [p.detach().clone() for p in wrapped.parameters()]
    wrapped(torch.randn(3, 4)).sum().backward()
    for p, b in zip(wrapped.parameters(), before):
        torch.testing.assert_close(p.detach(), b, rtol=0, atol=0)
        assert p.grad is not None


def test_upstream_bridge_set_learning_rate_keeps_an_earlier_gradient():
    # a gradient accumulated before set_learning_rate stays what it was
    model = torch.nn.Linear(4, 2)
    wrapped = ait.wrap(model, (1, 4))
    x = torch.randn(3, 4)
    wrapped(x).sum().backward()
    kept = [p.grad.clone() for p in wrapped.parameters()]
    wrapped.set_learning_rate(0.5)
    wrapped(torch.randn(3, 4)).sum().backward()
    for p, g in zip(wrapped.parameters(), kept):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)


@pytest.mark.parametrize("lr", [-0.1, float("nan"), float("inf"), "0.1", True])
def test_upstream_bridge_bad_learning_rate(lr):
    wrapped = ait.wrap(torch.nn.Linear(2, 2), (1, 2))
    with pytest.raises(ValueError, match="set_learning_rate: argument 'lr'"):
        wrapped.set_learning_rate(lr)


# ---------------------------------------------------------------- tensors


CONVERTER_DTYPES = [torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8,
                    torch.int16, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("shape", [(), (0, 3), (7,), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("dtype", CONVERTER_DTYPES, ids=lambda d: str(d)[6:])
def test_upstream_bridge_convert_tensor_round_trip(dtype, shape):
    gen = torch.Generator().manual_seed(11)
    t = (torch.randn(shape, generator=gen, dtype=torch.float64) * 50).to(dtype)
    a = ait.convert_tensor(t)
    assert isinstance(a, ait.Tensor)
    assert a.dtype == str(dtype)[6:] and a.shape == tuple(shape)
    np.testing.assert_array_equal(a.numpy(), t.numpy())
    back = ait.convert_tensor(a)
    assert isinstance(back, torch.Tensor) and back.dtype == dtype
    assert torch.equal(back, t)
    # the top-level converters are tensor_converter's
    b = ait.torch_tensor_to_aidge(t)
    np.testing.assert_array_equal(b.numpy(), t.numpy())
    assert torch.equal(ait.aidge_tensor_to_torch(b), t)
    assert ait.aidge_tensor_to_torch is ait.tensor_converter.aidge_tensor_to_torch
    assert ait.torch_tensor_to_aidge is ait.tensor_converter.torch_tensor_to_aidge


def test_upstream_bridge_convert_expanded_tensor():
    # aidge_interop_torch copies; so do we where no view can hold the tensor
    t = torch.arange(4, dtype=torch.int32).reshape(4, 1).expand(4, 3)
    for a in (ait.convert_tensor(t), ait.torch_tensor_to_aidge(t)):
        np.testing.assert_array_equal(a.numpy(), t.numpy())
        assert a.dtype == "int32" and a.is_contiguous()
    x = torch.randn(3).expand(2, 3)
    assert torch.equal(ait.convert_tensor(ait.convert_tensor(x)), x)
    with pytest.raises(ValueError, match="more than once"):
        ait.convert_tensor(t, copy=False)


def test_upstream_bridge_convert_tensor_bad_input():
    with pytest.raises(TypeError, match="convert_tensor: argument 'tensor'.*list"):
        ait.convert_tensor([1.0, 2.0])


def test_upstream_bridge_loop_without_a_step_warns():
    """A loop written for aidge_interop_torch without set_learning_rate (its
    backward stepped at 0.01 by itself): here nothing steps the weights, and
    the module says so after 10 backward passes, once; a loop that steps
    (torch's optimizer or ours) is not warned."""
    x = torch.randn(3, 4)
    am = ait.wrap(torch.nn.Linear(4, 2), (3, 4))
    with pytest.warns(UserWarning, match="10 backward passes and no step.*set_learning_rate"):
        for _ in range(10):
            am(x).sum().backward()
    for make in (lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                 lambda m: ait.SGD(m, lr=0.1)):
        am = ait.wrap(torch.nn.Linear(4, 2), (3, 4))
        opt = make(am)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(12):
                opt.zero_grad()
                am(x).sum().backward()
                opt.step()
