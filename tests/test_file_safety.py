"""Files: the package deletes nothing but its own exports and their orphaned
temporary files, only in its cache folder, and ``wrap`` writes no file.

(Exports are written to a temporary file and renamed; a failed or killed
export leaves no truncated file: test_backends.py,
test_failed_export_leaves_no_file and test_killed_export_leaves_no_file.)
"""
import os
import time

import pytest
import torch

import aidge_interop as ai
from aidge_interop.compare import engines as backends


def linear(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(2, 2)


def tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def folders(tmp_path, monkeypatch):
    outside, cache = tmp_path / "user", tmp_path / "user" / "cache"
    cache.mkdir(parents=True)
    monkeypatch.setenv(backends.CACHE_ENV, str(cache))
    monkeypatch.setattr(backends, "MAX_ONNX_FILES", 2)
    backends.clear_runners()
    yield outside, cache
    backends.clear_runners()


def test_pruning_deletes_only_its_own_exports(folders):
    outside, cache = folders
    old = time.time() - backends.STALE_TEMP_S - 10
    keep = {
        outside / "notes.txt": b"the user's",
        outside / "0123456789ab_1x2_opset20.onnx": b"export-like, but outside the cache",
        cache / "model.onnx": b"the user's model",
        cache / "0123456789ab_1x2_opset20.onnx.bak": b"not an export name",
        cache / "0123_1x2_opset20.onnx": b"not an export name",
        cache / ".draft.onnx.tmp": b"an old temporary file, not ours",
        cache / ".0123456789ab_1x2_opset20.onnx.tmp": b"ours would carry pid and tag",
        cache / "sub" / "0123456789ab_1x2_opset20.onnx": b"in a subfolder",
    }
    for path, data in keep.items():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (old, old))
    target = outside / "target.onnx"
    target.write_bytes(b"a symlink's target")
    os.symlink(target, cache / "fedcba987654_9_opset20.onnx")  # named like an export
    orphan = cache / f".{'a' * 12}_1x2_opset{backends.ONNX_OPSET}.onnx.4242.0badc0de.tmp"
    orphan.write_bytes(b"left by a killed export")
    os.utime(orphan, (old, old))

    exports = [backends.export_onnx(linear(seed), (1, 2)) for seed in range(5)]

    for path, data in keep.items():
        assert path.read_bytes() == data, f"{path} was touched"
    assert target.read_bytes() == b"a symlink's target"
    assert not orphan.exists()  # our own orphan, old: swept
    ours = [p for p in cache.iterdir() if backends._EXPORT_NAME.fullmatch(p.name)]
    assert len(ours) == backends.MAX_ONNX_FILES and exports[-1] in ours


def test_wrap_writes_no_file(tmp_path, monkeypatch):
    for var in ("HOME", "XDG_CACHE_HOME", "TMPDIR", backends.CACHE_ENV):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    m = ai.wrap(linear(0), [(3, 2)])
    m(torch.randn(3, 2)).sum().backward()
    assert tree(tmp_path) == before
