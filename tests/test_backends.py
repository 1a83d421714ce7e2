"""aidge_interop.compare.engines: every engine against torch on the model suite, the
weights fingerprint, the ONNX cache (reuse, LRU pruning, atomic export), the
runner LRU and thread pinning; compare.eclipse_aidge: the constant folding of
the model Eclipse Aidge is given, its training against torch, its refusals.

Every test exports into a temporary cache folder (AIDGE_INTEROP_CACHE), never
the user's.
"""
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import aidge_interop
from aidge_interop._util import EngineUnsupported
from aidge_interop.compare import engines as backends
from aidge_interop.compare.eclipse_aidge import fold_constants
from models import anomaly_model, kws_model, lenet_model, mobilenet_model, perceptron_model, \
    resnet_model

BATCH = 2
SUITE = {
    "perceptron": (perceptron_model.perceptron, (BATCH, 16)),
    "lenet": (lenet_model.lenet, (BATCH, 1, 32, 32)),
    "anomaly": (anomaly_model.anomaly_autoencoder, (BATCH, 640)),
    "ds_cnn": (kws_model.ds_cnn, (BATCH, 1, 49, 10)),
    "mobilenet": (mobilenet_model.mobilenet_v1, (BATCH, 3, 96, 96)),
    "resnet8": (resnet_model.resnet8, (BATCH, 3, 32, 32)),
}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache folder for the suite cases, so that the engines share exports."""
    return tmp_path_factory.mktemp("onnx_cache")


@pytest.fixture(autouse=True)
def isolated(shared_cache, monkeypatch):
    monkeypatch.setenv(backends.CACHE_ENV, str(shared_cache))
    backends.clear_runners()
    yield
    backends.clear_runners()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache folder."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(backends.CACHE_ENV, str(folder))
    return folder


def _linear(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(2, 2)


# -- each backend against torch ------------------------------------------------------

# ds_cnn on Eclipse Aidge runs because the model it is given is simplified
# first (fold_constants): Aidge 0.10.1 fails on the Pad subgraph TorchScript
# exports for ZeroPad2d ("Slice: Step (-1) is negative, we must have End (4) < Start (3)")
@pytest.mark.parametrize("name, backend", [
    pytest.param(name, backend, id=f"{name}-{backend}")
    for name in SUITE for backend in ("onnxruntime", "aidge_interop", "aidge")])
def test_backend_matches_torch(name, backend):
    ok, reason = backends.available(backend)
    if not ok:
        pytest.skip(f"{backend} unavailable: {reason}")
    factory, shape = SUITE[name]
    model = factory().eval()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    run = backends.get_runner(backend, model, shape)
    with backends.limited_threads():
        out = run(x)
        kept = out.copy()
        run(np.ones_like(x))  # the next call must not overwrite the array returned
    assert out.shape == expected.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out, kept)
    # float32, eval mode: measured max |error| 1e-7 for outputs of magnitude 0.06-0.4
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


# -- what Eclipse Aidge is given, and its training ----------------------------------------

def _export(model, shape):
    from aidge_interop.bridge.wrapping import export_onnx_bytes

    return onnx.load_from_string(export_onnx_bytes(model, [torch.zeros(shape)], opset=13,
                                                   dynamic_batch=False))


def test_fold_constants_computes_the_shape_arithmetic():
    """ds_cnn's ZeroPad2d exports as Shape/Gather/ConstantOfShape/Concat/
    Slice/... computing the pads: folded into one initializer, the model
    computes the same (ONNX Runtime on both), and nothing else changes."""
    import onnxruntime

    factory, shape = SUITE["ds_cnn"]
    model = factory().eval()
    proto = _export(model, shape)
    folded = fold_constants(proto)
    onnx.checker.check_model(folded, full_check=True)
    before = Counter(n.op_type for n in proto.graph.node)
    after = Counter(n.op_type for n in folded.graph.node)
    assert {"Shape", "Gather", "ConstantOfShape", "Slice", "Cast"} & set(before)
    assert not {"Shape", "Gather", "ConstantOfShape", "Slice", "Cast", "Constant"} & set(after)
    computing = ("Conv", "BatchNormalization", "Relu", "Pad", "AveragePool", "Gemm")
    assert [after[t] for t in computing] == [before[t] for t in computing]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    outs = [onnxruntime.InferenceSession(p.SerializeToString()).run(None, {"input_0": x})[0]
            for p in (proto, folded)]
    np.testing.assert_array_equal(outs[1], outs[0])
    with torch.no_grad():
        np.testing.assert_allclose(outs[1], model(torch.from_numpy(x)).numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_fold_constants_fixes_input_shapes_and_leaves_the_rest():
    proto = _export(perceptron_model.perceptron(), (2, 16))
    assert fold_constants(proto) is proto  # nothing to fold
    dynamic = onnx.ModelProto()
    dynamic.CopyFrom(proto)
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    fixed = fold_constants(dynamic, [(5, 16)])
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [5, 16]
    with pytest.raises(ValueError, match=r"2 input shape\(s\) for a model of 1 input"):
        fold_constants(proto, [(2, 16), (2, 16)])


def _aidge_training():
    ok, reason = backends.available("aidge")
    if not ok:
        pytest.skip(f"aidge unavailable: {reason}")
    pytest.importorskip("aidge_learning", reason="Eclipse Aidge trains with aidge_learning")
    from aidge_interop.compare.eclipse_aidge import AidgeModel, AidgeSGD

    return AidgeModel, AidgeSGD


def _same_grads_then_step(model, aidge, torch_sgd, aidge_sgd) -> dict:
    """Aidge's parameter gradients against torch's, one step of each
    optimizer, the parameters again; Aidge's parameters by name."""
    params = dict(aidge.named_parameters())
    for n, p in model.named_parameters():
        torch.testing.assert_close(params[n].grad, p.grad, rtol=1e-5, atol=1e-6)
    torch_sgd.step()
    aidge_sgd.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(params[n].detach(), p.detach(), rtol=1e-5, atol=1e-6)
    return params


@pytest.mark.parametrize("name", ["perceptron", "lenet"])
def test_aidge_trains_like_torch(name):
    """AidgeModel + AidgeSGD (Aidge's forward, backward and SGD) against
    torch, three steps in lock-step: outputs, input and parameter gradients,
    parameters after each step."""
    AidgeModel, AidgeSGD = _aidge_training()
    factory, shape = SUITE[name]
    model = factory().train()
    aidge = AidgeModel(model, [shape])
    assert [n for n, _ in aidge.named_parameters()] == [n for n, _ in model.named_parameters()]
    torch_sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    aidge_sgd = AidgeSGD(aidge, lr=0.05)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        x = torch.randn(shape, generator=gen)
        torch_sgd.zero_grad()
        aidge_sgd.zero_grad()
        xs = [x.clone().requires_grad_() for _ in range(2)]
        outs = [model(xs[0]), aidge(xs[1])]
        # float32, same weights: measured differences below 3e-7
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
        for out in outs:
            torch.nn.functional.mse_loss(out, torch.ones_like(out)).backward()
        torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-5, atol=1e-6)
        params = _same_grads_then_step(model, aidge, torch_sgd, aidge_sgd)
    assert all(not torch.equal(params[n].detach(), initial[n]) for n in initial)  # they moved


def test_aidge_gradients_add_up_like_torch():
    """Two backwards before a step: torch sums the gradients, and the step
    uses the sum; Aidge's producers get them from torch before updating."""
    AidgeModel, AidgeSGD = _aidge_training()
    model = _linear(5)
    aidge = AidgeModel(model, [(3, 2)])
    torch_sgd, aidge_sgd = torch.optim.SGD(model.parameters(), lr=0.1), AidgeSGD(aidge, lr=0.1)
    xs = torch.randn(2, 3, 2, generator=torch.Generator().manual_seed(6))
    for m in (model, aidge):
        for x in xs:
            m(x).square().sum().backward()
    _same_grads_then_step(model, aidge, torch_sgd, aidge_sgd)
    aidge_sgd.zero_grad()
    assert all(p.grad is None for p in aidge.parameters())
    torch.testing.assert_close(aidge(xs[0]), model(xs[0]), rtol=1e-5, atol=1e-6)  # new weights


def test_aidge_backward_through_an_older_forward_is_refused():
    """Aidge keeps the state of its last forward only: a backward through an
    earlier one would use another input's values."""
    AidgeModel, _ = _aidge_training()
    aidge = AidgeModel(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh()), [(3, 2)])
    first = aidge(torch.randn(3, 2))
    aidge(torch.randn(3, 2))
    with pytest.raises(RuntimeError, match="backward through a forward that is not the last "
                                           "one; Eclipse Aidge keeps the state of its last "
                                           "forward only"):
        first.sum().backward()


@pytest.mark.parametrize("make, shape, message", [
    (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)),
     (2, 3, 8, 8), "Eclipse Aidge: backward: Backward not yet implemented for BatchNorm"),
    (lambda: torch.nn.ConvTranspose2d(4, 6, 3, groups=2), (2, 4, 5, 5),
     "Eclipse Aidge: ONNX ConvTranspose .*'group': 2.* imported as a GenericOperator, which "
     "has no kernel \\(aidge_onnx: Error: ConvTranspose DepthWise is not supported yet.\\)"),
    (lambda: torch.nn.Conv2d(6, 12, 3, groups=6), (2, 6, 10, 10),
     "Eclipse Aidge: preparing the graph .*: forward_dims failed for input shapes "
     "\\[\\[2, 6, 10, 10\\]\\]: Wrong input size \\(\\[2, 6, 10, 10\\]\\) for ConvDepthWise "
     "operator. Expected dims are \\[x, 12, x, x\\]."),
], ids=["no_backward", "no_converter", "logged_error"])
def test_what_aidge_cannot_run_raises_its_message(make, shape, message):
    AidgeModel, _ = _aidge_training()
    with pytest.raises(EngineUnsupported, match=message):
        aidge = AidgeModel(make().train(), [shape])
        aidge(torch.randn(shape)).sum().backward()


def test_aidge_logged_error_is_kept_whatever_its_console_level(capfd):
    """The reason Aidge logs for a failed forward_dims reaches the exception
    even where its console is set to Fatal (as ``aidge-interop compare``
    does while it runs); nothing is shown then, and the level stays."""
    AidgeModel, _ = _aidge_training()
    import aidge_core

    level = aidge_core.Log.get_console_level()
    aidge_core.Log.set_console_level(aidge_core.Level.Fatal)
    try:
        capfd.readouterr()
        with pytest.raises(EngineUnsupported, match="Wrong input size .* for ConvDepthWise"):
            AidgeModel(torch.nn.Conv2d(6, 12, 3, groups=6), [(2, 6, 10, 10)])
        assert aidge_core.Log.get_console_level() == aidge_core.Level.Fatal
        assert capfd.readouterr().err == ""
    finally:
        aidge_core.Log.set_console_level(level)
    with pytest.raises(EngineUnsupported, match="Wrong input size .* for ConvDepthWise"):
        AidgeModel(torch.nn.Conv2d(6, 12, 3, groups=6), [(2, 6, 10, 10)])
    assert "Wrong input size" in capfd.readouterr().err  # shown at the default level


def test_torch_runner_is_the_module_in_eval_without_grad():
    model = resnet_model.resnet8().train()
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    out = backends.get_runner("torch", model, x.shape)(x)
    assert model.training  # restored
    assert all(p.grad is None for p in model.parameters())
    with torch.no_grad():
        np.testing.assert_array_equal(out, model.eval()(torch.from_numpy(x)).numpy())


def test_get_runner_takes_an_onnx_file(cache):
    model = lenet_model.lenet().eval()
    path = backends.export_onnx(model, (1, 1, 32, 32))
    x = np.random.default_rng(2).standard_normal((1, 1, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    out = backends.get_runner("aidge_interop", str(path), (1, 1, 32, 32))(x)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="torch backend runs a torch.nn.Module"):
        backends.get_runner("torch", path, (1, 1, 32, 32))
    with pytest.raises(FileNotFoundError, match="no ONNX file at .*missing.onnx"):
        backends.get_runner("onnxruntime", cache / "missing.onnx", (1, 1, 32, 32))


def test_availability_and_bad_keys():
    assert backends.available("torch") == (True, "")
    assert backends.available_backends()[:1] == ["torch"]
    assert set(backends.available_backends()) <= set(backends.BACKENDS)
    ok, reason = backends.available("aidge")
    assert ok == (reason == "")
    if not ok:
        assert "aidge" in reason and "pip install" in reason
    with pytest.raises(ValueError, match="unknown backend 'tvm'.*known: torch, onnxruntime"):
        backends.available("tvm")
    with pytest.raises(ValueError, match="unknown backend 'tvm'"):
        backends.get_runner("tvm", _linear(0), (1, 2))
    with pytest.raises(ValueError, match="shape must be a tuple of positive ints"):
        backends.get_runner("torch", _linear(0), (1, 0))


def test_unavailable_backend_raises_with_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    ok, reason = backends.available("onnxruntime")
    assert not ok and "ModuleNotFoundError" in reason and "pip install onnxruntime" in reason
    with pytest.raises(RuntimeError, match="ONNX Runtime is unavailable: ModuleNotFoundError"):
        backends.get_runner("onnxruntime", _linear(0), (1, 2))


# -- fingerprint ------------------------------------------------------------------------

def test_fingerprint_follows_weights_and_architecture():
    a, b = lenet_model.lenet(seed=0), lenet_model.lenet(seed=0)
    fp = backends.fingerprint(a)
    assert len(fp) == 12 and int(fp, 16) >= 0
    assert backends.fingerprint(b) == fp  # same weights, same architecture
    assert backends.fingerprint(lenet_model.lenet(seed=1)) != fp
    # no weights at all: the architecture alone tells them apart
    assert backends.fingerprint(torch.nn.ReLU()) != backends.fingerprint(torch.nn.Sigmoid())
    assert backends.fingerprint(torch.nn.MaxPool2d(2)) != backends.fingerprint(
        torch.nn.MaxPool2d(3))


def test_fingerprint_is_cached_and_invalidated_in_place(monkeypatch):
    model = resnet_model.resnet8()
    fp = backends.fingerprint(model)
    real_sha1 = backends.hashlib.sha1

    def no_hashing(*args):
        raise AssertionError("fingerprint hashed the weights again")

    monkeypatch.setattr(backends.hashlib, "sha1", no_hashing)
    assert backends.fingerprint(model) == fp  # from the cache: no hashing
    monkeypatch.setattr(backends.hashlib, "sha1", real_sha1)

    weight = model.stem[0].weight
    old = weight[0, 0, 0, 0].item()
    with torch.no_grad():
        weight[0, 0, 0, 0] = old + 1.0  # in place: same tensor, same data_ptr
    changed = backends.fingerprint(model)
    assert changed != fp
    with torch.no_grad():
        weight[0, 0, 0, 0] = old
    assert backends.fingerprint(model) == fp  # the same values again

    model.stem[1].running_mean.add_(0.5)  # a buffer, in place
    assert backends.fingerprint(model) not in (fp, changed)


def test_fingerprint_sees_optimizer_steps_and_replaced_tensors():
    model = perceptron_model.perceptron()
    fp = backends.fingerprint(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(3, 16)).sum().backward()
    optimizer.step()
    stepped = backends.fingerprint(model)
    assert stepped != fp
    model.sequence[2].bias = torch.nn.Parameter(torch.zeros(4))
    assert backends.fingerprint(model) not in (fp, stepped)
    model.load_state_dict(perceptron_model.perceptron().state_dict())
    assert backends.fingerprint(model) == fp


# -- the ONNX cache ----------------------------------------------------------------------

def test_cache_folder_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(backends.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert backends.cache_folder() == tmp_path / "xdg" / "aidge_interop" / "onnx"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert backends.cache_folder() == tmp_path / "home" / ".cache" / "aidge_interop" / "onnx"
    monkeypatch.setenv(backends.CACHE_ENV, str(tmp_path / "env"))
    assert backends.cache_folder() == tmp_path / "env"
    assert backends.cache_folder(tmp_path / "arg") == tmp_path / "arg"


def test_export_is_reused_not_rewritten(cache, monkeypatch):
    model = lenet_model.lenet()
    path = backends.export_onnx(model, (1, 1, 32, 32))
    assert path.parent == cache and path.name.startswith(backends.fingerprint(model))
    assert "1x1x32x32" in path.name and path.name.endswith(f"_opset{backends.ONNX_OPSET}.onnx")
    before = path.stat()
    os.utime(path, ns=(before.st_atime_ns - 10**10, before.st_mtime_ns))  # used 10 s ago

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    with monkeypatch.context() as patch:
        patch.setattr(importlib.import_module("aidge_interop.bridge.wrapping"), "export_onnx_bytes",
                      no_export)
        assert backends.export_onnx(model, (1, 1, 32, 32)) == path
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == \
        (before.st_ino, before.st_mtime_ns, before.st_size)
    assert after.st_atime_ns > before.st_atime_ns - 10**10  # touched: recently used
    # another shape, or other weights: another file
    assert backends.export_onnx(model, (2, 1, 32, 32)) != path
    assert backends.export_onnx(lenet_model.lenet(seed=1), (1, 1, 32, 32)) != path


def _set_atime(path, seconds_from_now):
    st = path.stat()
    os.utime(path, ns=(time.time_ns() + int(seconds_from_now * 1e9), st.st_mtime_ns))


def test_prune_removes_least_recently_used_first(cache, monkeypatch):
    monkeypatch.setattr(backends, "MAX_ONNX_FILES", 3)
    a, b, c = (backends.export_onnx(_linear(s), (1, 2)) for s in range(3))
    for path, age in ((a, -30), (b, -20), (c, -10)):
        _set_atime(path, age)
    foreign = cache / "model.onnx"  # not named like an export: never pruned
    foreign.write_bytes(b"x")
    assert backends.export_onnx(_linear(0), (1, 2)) == a  # reuse: a is now the most recent
    d = backends.export_onnx(_linear(3), (1, 2))
    assert a.exists() and not b.exists() and c.exists() and d.exists() and foreign.exists()


def test_prune_never_removes_the_file_just_written(cache, monkeypatch):
    monkeypatch.setattr(backends, "MAX_ONNX_FILES", 2)
    a, b = (backends.export_onnx(_linear(s), (1, 2)) for s in range(2))
    _set_atime(a, 1000)  # both look more recent than anything written now
    _set_atime(b, 2000)
    c = backends.export_onnx(_linear(2), (1, 2))
    assert c.exists() and not a.exists() and b.exists()
    monkeypatch.setattr(backends, "MAX_ONNX_FILES", 0)
    d = backends.export_onnx(_linear(3), (1, 2))
    assert sorted(p.name for p in cache.iterdir()) == [d.name]


def test_failed_export_leaves_no_file(cache, monkeypatch):
    def disk_full(fd):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(backends.os, "fsync", disk_full)  # after the bytes, before the rename
        with pytest.raises(OSError, match="No space left"):
            backends.export_onnx(lenet_model.lenet(), (1, 1, 32, 32))
    assert list(cache.iterdir()) == []  # no final file, no temporary file

    class Unexportable(torch.nn.Module):
        def forward(self, x):
            return x.numpy()

    with pytest.raises(RuntimeError, match=r"could not export Unexportable for an input of "
                                           r"shape \(1, 2\)"):
        backends.export_onnx(Unexportable(), (1, 2))
    assert list(cache.iterdir()) == []


def test_killed_export_leaves_no_file(cache, tmp_path):
    """An export killed with SIGKILL after writing its temporary file, before
    the rename: nothing at the final path; the next export sweeps the
    orphan once it is older than STALE_TEMP_S, not before."""
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from aidge_interop.compare import engines as backends
        from models import lenet_model

        def hang(src, dst):
            print(src, dst, flush=True)
            time.sleep(60)

        os.replace = hang
        backends.export_onnx(lenet_model.lenet(), (1, 1, 32, 32))
    """)
    env = dict(os.environ, **{backends.CACHE_ENV: str(cache)})
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env,
                            text=True, cwd=tmp_path)  # not the checkout: the installed package
    try:
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    tmp, final = map(Path, line.split())
    assert final.parent == cache and final.name.endswith(".onnx") and not final.exists()
    assert tmp.exists() and tmp.stat().st_size > 1000  # it was killed with the bytes written
    backends.export_onnx(_linear(0), (1, 2))
    assert tmp.exists()  # young: maybe another process still writing it
    old = time.time() - backends.STALE_TEMP_S - 1
    os.utime(tmp, (old, old))
    backends.export_onnx(_linear(1), (1, 2))
    assert not tmp.exists() and not final.exists()
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


# -- runners -------------------------------------------------------------------------------

def test_runners_lru(monkeypatch):
    monkeypatch.setattr(backends, "MAX_RUNNERS", 2)
    m0, m1, m2 = (_linear(s) for s in range(3))
    r0 = backends.get_runner("torch", m0, (1, 2))
    assert backends.get_runner("torch", m0, (1, 2)) is r0  # prepared once
    r1 = backends.get_runner("torch", m1, (1, 2))
    assert backends.get_runner("torch", m0, (1, 2)) is r0  # m0 becomes the most recent
    backends.get_runner("torch", m2, (1, 2))  # evicts m1, the least recently used
    assert len(backends._runners) == 2
    assert backends.get_runner("torch", m0, (1, 2)) is r0
    assert backends.get_runner("torch", m1, (1, 2)) is not r1  # prepared again
    # other weights, shape or thread count: another runner
    with torch.no_grad():
        m0.weight.add_(1.0)
    assert backends.get_runner("torch", m0, (1, 2)) is not r0
    backends.clear_runners()
    assert len(backends._runners) == 0


def test_limited_threads_pins_and_restores(monkeypatch):
    before = (torch.get_num_threads(), aidge_interop.get_num_threads())
    try:
        torch.set_num_threads(2)
        aidge_interop.set_num_threads(2)
        monkeypatch.setattr(backends, "THREADS", 1)
        with backends.limited_threads():
            assert (torch.get_num_threads(), aidge_interop.get_num_threads()) == (1, 1)
        assert (torch.get_num_threads(), aidge_interop.get_num_threads()) == (2, 2)
        with pytest.raises(KeyError):
            with backends.limited_threads():
                raise KeyError("restored on errors too")
        assert (torch.get_num_threads(), aidge_interop.get_num_threads()) == (2, 2)
    finally:
        torch.set_num_threads(before[0])
        aidge_interop.set_num_threads(before[1])


def test_limited_threads_pins_aidge_openmp(monkeypatch):
    ok, reason = backends.available("aidge")
    if not ok:
        pytest.skip(f"aidge unavailable: {reason}")
    omp = backends._aidge_openmp()
    assert omp is not None, "Aidge's OpenMP runtime was not found"
    before = omp.omp_get_max_threads()
    try:
        omp.omp_set_num_threads(2)
        monkeypatch.setattr(backends, "THREADS", 1)
        with backends.limited_threads():
            assert omp.omp_get_max_threads() == 1
        assert omp.omp_get_max_threads() == 2
    finally:
        omp.omp_set_num_threads(before)


def test_onnxruntime_session_uses_threads(cache, monkeypatch):
    ok, reason = backends.available("onnxruntime")
    if not ok:
        pytest.skip(f"onnxruntime unavailable: {reason}")
    import onnxruntime

    created = []
    real = onnxruntime.InferenceSession

    def spy(path, options, **kwargs):
        created.append(options.intra_op_num_threads)
        return real(path, options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", spy)
    monkeypatch.setattr(backends, "THREADS", 1)
    backends.get_runner("onnxruntime", _linear(0), (1, 2))
    monkeypatch.setattr(backends, "THREADS", 2)
    backends.get_runner("onnxruntime", _linear(0), (1, 2))  # another key: a new session
    assert created == [1, 2]
