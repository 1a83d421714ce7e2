"""C export (aidge_interop.quant.export): the generated project compiles with
-std=c99 -Wall -Wextra -Werror (and under ASan + UBSan), its layer check
passes, its int8 outputs equal the engine's bit for bit and its float
outputs agree with the engine; folders are handled safely."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from torch import nn

from aidge_interop import wrap
from aidge_interop.examples import _seeded
from aidge_interop.quant import BuildError, ExportError, compile_and_run, export_c, quantize

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")
STRICT = "-std=c99 -O1 -Wall -Wextra -Werror -pedantic"
SANITIZE = "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return torch.relu(self.a(x) + self.b(x))


class Branches(nn.Module):
    """Concat of two branches of different ranges (inputs requantized)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(3, 2, 1)

    def forward(self, x):
        return torch.cat([self.a(x), 4.0 * self.b(x)], dim=1)


class MatMulBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(12, 5))
        self.b = nn.Parameter(torch.randn(5))

    def forward(self, x):
        return x @ self.w + self.b


class ViewHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=2)
        self.fc = nn.Linear(3 * 3 * 3, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).view(x.shape[0], -1))


# name -> (model factory, input shape of one sample): every quantizable operator
CASES = {
    "conv_stride_pad_dilation": (lambda: nn.Sequential(
        nn.Conv2d(3, 5, 3, stride=2, padding=2, dilation=2), nn.ReLU()), (3, 11, 9)),
    "depthwise_bn_relu6": (lambda: nn.Sequential(
        nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False), nn.BatchNorm2d(4), nn.ReLU6()),
        (4, 7, 7)),
    "conv1d_avgpool": (lambda: nn.Sequential(
        nn.Conv1d(2, 3, 5, padding=2), nn.ReLU(), nn.AvgPool1d(2)), (2, 16)),
    "linear_relu_linear": (lambda: nn.Sequential(
        nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3)), (10,)),
    "matmul_bias": (MatMulBias, (12,)),
    "maxpool_padded_then_relu": (lambda: nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.MaxPool2d(3, stride=2, padding=1), nn.ReLU()), (1, 9, 9)),
    "avgpool_count_include_pad": (lambda: nn.Sequential(
        nn.Conv2d(2, 2, 1), nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=True)),
        (2, 8, 8)),
    "avgpool_exclude_pad": (lambda: nn.Sequential(
        nn.Conv2d(2, 2, 1), nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)),
        (2, 5, 5)),
    "global_pool_flatten_fc": (lambda: nn.Sequential(
        nn.Conv2d(3, 6, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 2)),
        (3, 8, 8)),
    "residual_add_relu": (Residual, (4, 6, 6)),
    "concat_requantize": (Branches, (3, 5, 5)),
    "zero_pad_conv": (lambda: nn.Sequential(nn.ZeroPad2d((1, 2, 0, 1)), nn.Conv2d(2, 3, 3)),
                      (2, 6, 6)),
    "view_reshape": (ViewHead, (2, 7, 7)),
}


@pytest.fixture(scope="module")
def calibration():
    return np.random.default_rng(0)


def _case(name, rng):
    factory, shape = CASES[name]
    model = _seeded(factory, 0).eval()  # seeded weights, random BatchNorm statistics
    x = rng.standard_normal((16, *shape)).astype(np.float32)
    return model, x


@pytest.mark.parametrize("single_shift", [True, False], ids=["single_shift", "fixed_point"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_int8_export_is_bit_exact(name, single_shift, calibration, tmp_path):
    model, x = _case(name, calibration)
    q = quantize(model, x, single_shift=single_shift)
    _bit_exact(q, x, tmp_path)


@pytest.mark.parametrize("name", ["residual_add_relu", "concat_requantize",
                                  "avgpool_count_include_pad",
                                  "conv1d_avgpool", "linear_relu_linear"])
def test_int8_export_rounding_ties_to_even(name, calibration, tmp_path):
    """quantize(rounding="half_even"): the portable kernels round the requantizations,
    QAdd and the average pools' ties to even as the engine does, layer by layer."""
    model, x = _case(name, calibration)
    q = quantize(model, x, rounding="half_even")
    assert all(lay.half_even for lay in q.layers if lay.op in ("Conv", "Gemm", "Add"))
    _bit_exact(q, x, tmp_path)


def _bit_exact(q, x, tmp_path):
    result = export_c(q, tmp_path / "out", inputs=[x[:1]], verbose=False)
    assert result.quantized and result.layers == len(q.layers)
    # embedded input: the program checks every layer against the engine
    out = compile_and_run(tmp_path / "out", cflags=STRICT)
    np.testing.assert_array_equal(out[0], q.run(q.quantize_inputs(x[:1])[0])[0])
    # more samples through a file: equal to the engine bit for bit
    xq = q.quantize_inputs(x[:6])[0]
    np.testing.assert_array_equal(compile_and_run(tmp_path / "out", [xq])[0], q.run(xq)[0])


@pytest.mark.parametrize("name", sorted(CASES))
def test_float_export_agrees_with_the_engine(name, calibration, tmp_path):
    model, x = _case(name, calibration)
    wrapped = wrap(model, [(1, *x.shape[1:])]).eval()
    export_c(wrapped, tmp_path / "out", inputs=[x[:1]], verbose=False)
    out = compile_and_run(tmp_path / "out", cflags=STRICT)  # layer check within tolerance
    with torch.no_grad():
        ref = model(torch.from_numpy(x[:1])).numpy()
    np.testing.assert_allclose(out[0], ref, rtol=1e-3, atol=1e-5)
    many = compile_and_run(tmp_path / "out", [x[:5]])[0]
    with torch.no_grad():
        np.testing.assert_allclose(many, model(torch.from_numpy(x[:5])).numpy(),
                                   rtol=1e-3, atol=1e-5)


@pytest.fixture(scope="module")
def lenet():
    from aidge_interop.examples import EXAMPLES

    factory, shape, _ = EXAMPLES["lenet"]
    model = factory(seed=0).eval()
    x = np.random.default_rng(1).standard_normal((8, *shape[1:])).astype(np.float32)
    return model, x, quantize(model, x)


def test_lenet_runs_clean_under_sanitizers(lenet, tmp_path):
    model, x, q = lenet
    flags = f"-std=c99 -O1 -g -Wall -Wextra -Werror {SANITIZE}"
    export_c(q, tmp_path / "int8", inputs=[x[:1]], verbose=False)
    out = compile_and_run(tmp_path / "int8", cflags=flags, ldflags=SANITIZE)
    np.testing.assert_array_equal(out[0], q.run(q.quantize_inputs(x[:1])[0])[0])
    export_c(wrap(model, [(1, 1, 32, 32)]).eval(), tmp_path / "f32", inputs=[x[:1]],
             verbose=False)
    out = compile_and_run(tmp_path / "f32", cflags=flags, ldflags=SANITIZE)
    with torch.no_grad():
        np.testing.assert_allclose(out[0], model(torch.from_numpy(x[:1])).numpy(), rtol=1e-3,
                                   atol=1e-5)


def test_relative_and_absolute_folders_from_any_directory(lenet, tmp_path, monkeypatch):
    """export_c("export_int8") then compile_and_run("export_int8"), as the
    README writes them, and the same export reached from another directory
    by a relative and an absolute path."""
    model, x, q = lenet
    (tmp_path / "work").mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    export_c(q, "export_int8", inputs=[x[:1]], verbose=False)
    assert (tmp_path / "work" / "export_int8" / "forward.c").is_file()
    embedded = q.run(q.quantize_inputs(x[:1])[0])[0]
    np.testing.assert_array_equal(compile_and_run("export_int8")[0], embedded)
    monkeypatch.chdir(tmp_path / "other")
    xq = q.quantize_inputs(x)[0]
    for folder in ("../work/export_int8", str(tmp_path / "work" / "export_int8")):
        np.testing.assert_array_equal(compile_and_run(folder, [xq])[0], q.run(xq)[0])
    export_c(q, "../work/export_int8", inputs=[x[1:2]], verbose=False)  # replaced
    np.testing.assert_array_equal(compile_and_run("../work/export_int8")[0],
                                  q.run(q.quantize_inputs(x[1:2])[0])[0])
    assert not list((tmp_path / "other").iterdir())


def test_export_layout_sizes_and_makefile(lenet, tmp_path, capsys):
    model, x, q = lenet
    folder = tmp_path / "lenet"
    result = export_c(q, folder, inputs=[x[:1]])
    printed = capsys.readouterr().out
    assert f"RAM (activation arena) {result.ram_bytes} bytes" in printed
    assert f"ROM (weights) {result.rom_bytes} bytes" in printed
    # ROM: every int8 weight and int32 bias, and a 16-byte rescale per output channel
    assert result.rom_bytes == sum(lay.weight.size + 4 * lay.bias.size + 16 * len(lay.weight)
                                   for lay in q.layers if lay.weight is not None)
    # RAM: at least every layer's inputs and output side by side, less than all
    # values side by side (buffers are reused); batch 1, one byte per value
    size = {v: int(np.prod(s[1:])) for v, s in q.shapes.items()}
    peak = max(sum(size[i] for i in lay.inputs) + size[lay.output] for lay in q.layers)
    total = sum(size[v] for v in q.input_names) + sum(
        size[lay.output] for lay in q.layers if lay.op != "Reshape")
    assert peak <= result.ram_bytes < total
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert {"forward.c", "forward.h", "main.c", "Makefile", "input.h",
            "kernels/aidge_kernels.c", "kernels/aidge_kernels.h"} <= names
    assert sum(n.startswith("layers/") for n in names) == len(q.layers)
    source = (folder / "forward.c").read_text()
    assert "malloc" not in source and "static float arena[" in source
    if shutil.which("make"):
        proc = subprocess.run(["make", "-s", "run"], cwd=folder, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "aidge_cmp: all 8 layers match the engine" in proc.stdout


def test_a_wrong_reference_names_the_layer(lenet, tmp_path):
    _, x, q = lenet
    folder = tmp_path / "out"
    export_c(q, folder, inputs=[x[:1]], verbose=False)
    ref = next((folder / "reference").glob("L03_*.h"))
    text = ref.read_text()
    first = text.index("{\n    ") + 6
    end = text.index(",", first)
    value = int(text[first:end])
    ref.write_text(text[:first] + str(value + 1 if value < 127 else value - 1) + text[end:])
    with pytest.raises(BuildError, match=r"layer L03_\S+ differs at element 0: got "):
        compile_and_run(folder)


# -- bad inputs ---------------------------------------------------------------------

def test_unsupported_operator_is_named_and_nothing_is_written(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.Softmax(dim=0)).eval()  # not the last axis
    with pytest.raises(NotImplementedError, match=r"Softmax node '[^']+'"):
        export_c(wrap(model, [(1, 4)]).eval(), tmp_path / "out", inputs=[np.ones((1, 4),
                                                                                np.float32)])
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left either


def test_refuses_a_foreign_folder_and_deletes_nothing(lenet, tmp_path):
    _, x, q = lenet
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not empty and is not an aidge_interop export"):
        export_c(q, folder, inputs=[x[:1]], verbose=False)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ExportError, match="is not a folder"):
        export_c(q, afile, inputs=[x[:1]], verbose=False)
    assert afile.read_text() == "x"


def test_replaces_its_own_export_but_not_foreign_files_in_it(lenet, tmp_path):
    _, x, q = lenet
    folder = tmp_path / "out"
    (folder).mkdir()  # an empty folder is fine
    export_c(q, folder, inputs=[x[:1]], verbose=False)
    compile_and_run(folder)  # adds bin/, a build output
    export_c(q, folder, inputs=[x[1:2]], verbose=False)  # replaced whole
    assert not (folder / "bin").exists()
    (folder / "layers" / "mine.h").write_text("/* user file */")
    with pytest.raises(ExportError, match=r"layers/mine\.h"):
        export_c(q, folder, inputs=[x[:1]], verbose=False)
    assert (folder / "layers" / "mine.h").read_text() == "/* user file */"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no leftovers


def test_compile_errors_are_clear(lenet, tmp_path):
    _, x, q = lenet
    folder = tmp_path / "out"
    export_c(q, folder, inputs=[x[:1]], verbose=False)
    with pytest.raises(BuildError, match="no C compiler 'no-such-cc'"):
        compile_and_run(folder, cc="no-such-cc")
    (folder / "forward.c").write_text((folder / "forward.c").read_text() + "\nint broken(\n")
    with pytest.raises(BuildError, match=r"building .* failed:(.|\n)*forward\.c"):
        compile_and_run(folder)
    with pytest.raises(ExportError, match="is not an aidge_interop export"):
        compile_and_run(tmp_path)
    export_c(q, folder, inputs=[x[:1]], verbose=False)
    with pytest.raises(ValueError, match=r"input 0 has shape \(3, 32\)"):
        compile_and_run(folder, [np.zeros((3, 32), np.int8)])


def test_float_export_needs_a_shape(tmp_path):
    with pytest.raises(ExportError, match="pass `inputs`"):
        export_c(nn.Linear(3, 2), tmp_path / "out")


# -- a process killed while exporting ------------------------------------------------

KILL_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from torch import nn
    import torch
    from aidge_interop import wrap
    from aidge_interop.quant import export_c
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).eval()
    m = wrap(model, [(1, 256)]).eval()
    x = np.linspace(-1, 1, 256, dtype=np.float32)[None]
    export_c(m, sys.argv[1], inputs=[x], verbose=False)
    print("ready", flush=True)  # one export done; now replace it, again and again
    while True:
        export_c(m, sys.argv[1], inputs=[x], verbose=False)
""")


def test_a_killed_export_leaves_the_old_or_the_new_export_whole(tmp_path):
    script = tmp_path / "exporter.py"
    script.write_text(KILL_SCRIPT)
    target = tmp_path / "exports" / "model"
    reference = None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for delay in (0.0, 0.05, 0.2, 0.5, 1.0):
        proc = subprocess.Popen([sys.executable, str(script), str(target)], cwd=tmp_path,
                                stdout=subprocess.PIPE, env=env)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # killed while replacing the export: the old one or the new one, whole
        listed = json.loads((target / ".aidge_interop_export").read_text())["files"]
        contents = {f: (target / f).read_bytes() for f in listed}
        reference = reference or contents
        assert contents == reference  # every file whole, and the same export each time
        found = {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}
        assert found == set(listed) | {".aidge_interop_export"}


def test_export_after_recipes(tmp_path):
    """A graph rewritten by the recipes (FusedConv/FusedGemm with a flatten)
    quantizes and exports like the original."""
    from aidge_interop import Graph, recipes
    from aidge_interop.examples import EXAMPLES

    factory, shape, _ = EXAMPLES["lenet"]
    model = factory(seed=0).eval()
    wrapped = wrap(model, [shape]).eval()
    graph = Graph(wrapped._graph, wrapped.onnx_model)
    x = np.random.default_rng(2).standard_normal((6, *shape[1:])).astype(np.float32)
    graph.forward([x[:1]])
    assert recipes.remove_flatten(graph) and recipes.fuse_activation(graph)
    assert {n["op_type"] for n in graph.nodes()} >= {"FusedConv", "FusedGemm"}
    export_c(graph, tmp_path / "f32", inputs=[x[:1]], verbose=False)
    with torch.no_grad():
        np.testing.assert_allclose(compile_and_run(tmp_path / "f32", cflags=STRICT)[0],
                                   model(torch.from_numpy(x[:1])).numpy(), rtol=1e-3, atol=1e-5)
    q = quantize(graph, x)
    export_c(q, tmp_path / "int8", inputs=[x[:1]], verbose=False)
    xq = q.quantize_inputs(x)[0]
    np.testing.assert_array_equal(compile_and_run(tmp_path / "int8", [xq])[0], q.run(xq)[0])
