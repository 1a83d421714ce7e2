"""aidge_interop.profile: per-node kernel time of a wrapped model or a Graph."""
import numpy as np
import onnx
import pytest
import torch

import aidge_interop
from aidge_interop import SGD, wrap
from aidge_interop.bridge.wrapping import export_onnx_bytes


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))


def _steps(model, x, n):
    opt = SGD(model, lr=0.01)
    for _ in range(n):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def test_training_steps_count_every_node_forward_and_backward():
    torch.manual_seed(0)
    model, x = wrap(ConvBN().train(), [(2, 2, 6, 6)]), torch.randn(2, 2, 6, 6)
    _steps(model, x, 1)  # outside: not counted
    with aidge_interop.profile(model) as prof:
        _steps(model, x, 3)
    _steps(model, x, 1)  # after: not counted either
    names = [n["name"] for n in model._graph.nodes()]
    rows = {r["name"]: r for r in prof.rows}
    assert sorted(rows) == sorted(names)
    for r in prof.rows:
        assert r["graph"] == "main"
        if r["op_type"] == "Flatten":  # a view of the Relu's output: nothing runs
            assert r["fwd_calls"] == r["bwd_calls"] == 0, r
            continue
        assert r["fwd_calls"] == 3 and r["fwd_s"] > 0, r
        # every node of this chain is differentiable and on the path to the loss
        assert r["bwd_calls"] == 3 and r["bwd_s"] > 0, r
    assert not model._graph.profile
    assert prof.total_s == pytest.approx(sum(prof.by_op_type().values()))
    assert {"Conv", "BatchNormalization", "Relu", "Gemm"} <= set(prof.by_op_type())
    table = prof.table()
    assert "/conv/Conv" in table and "BatchNormalization" in table and "total" in table
    assert len(prof.table(top=2).splitlines()) == 1 + 2 + 2  # header, 2 rows, more, total


def test_eval_forward_profiles_the_fused_inference_graph():
    torch.manual_seed(1)
    model, x = wrap(ConvBN().eval(), [(2, 2, 6, 6)]), torch.randn(2, 2, 6, 6)
    with aidge_interop.profile(model) as prof, torch.no_grad():
        for _ in range(2):
            model(x)
    ran = [r for r in prof.rows if r["fwd_calls"]]
    assert ran and all(r["graph"] == "inference" and r["fwd_calls"] == 2 for r in ran)
    assert "BatchNormalization" not in {r["op_type"] for r in ran}  # folded into the Conv
    assert all(r["bwd_calls"] == 0 for r in prof.rows)


def test_a_graph_and_an_exception_inside_the_block():
    proto = export_onnx_bytes(torch.nn.Linear(3, 2), [torch.zeros(1, 3)])
    graph = aidge_interop.load_onnx(onnx.load_from_string(proto))
    with pytest.raises(ValueError, match="forward"):
        with aidge_interop.profile(graph) as prof:
            graph.forward([np.zeros((1, 3), np.float32)])
            graph.forward([])  # wrong input count: raises inside the block
    assert [(r["op_type"], r["fwd_calls"]) for r in prof.rows] == [("Gemm", 1)]
    assert not graph._g.profile  # switched off on the way out


def test_bad_target_is_named():
    with pytest.raises(TypeError, match="AidgeModule .* or a Graph, got Linear"):
        with aidge_interop.profile(torch.nn.Linear(2, 2)):
            pass
