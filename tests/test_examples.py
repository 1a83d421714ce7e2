"""The examples run as scripts (in a fresh interpreter, on the installed
package) and the notebook holds the same code as its script."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _script_cells(path: Path) -> list[str]:
    chunks = re.split(r"^# %%", path.read_text(), flags=re.M)[1:]
    return [c.strip("\n") for c in chunks if not c.startswith(" [markdown]")]


def test_the_notebook_has_the_script_code():
    nb = json.loads((EXAMPLES / "quantized_lenet_export.ipynb").read_text())
    code = ["".join(c["source"]).strip("\n") for c in nb["cells"] if c["cell_type"] == "code"]
    assert code == _script_cells(EXAMPLES / "quantized_lenet_export.py")


def test_quantized_lenet_export(tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "export"
    proc = subprocess.run([sys.executable, str(EXAMPLES / "quantized_lenet_export.py"),
                           "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "compiled program == engine on 360 test images: True" in text
    float_acc = float(re.search(r"float accuracy \(engine\): ([\d.]+) %", text)[1])
    int8_acc = float(re.search(r"int8 accuracy \(engine\): +([\d.]+) %", text)[1])
    c_acc = float(re.search(r"int8 accuracy \(compiled C\): ([\d.]+) %", text)[1])
    assert float_acc >= 90 and float_acc - int8_acc <= 1.0 and c_acc == int8_acc
    assert (out / "forward.c").is_file() and (out / "bin" / "model").is_file()
