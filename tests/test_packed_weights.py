"""Packed weights (csrc/packed.c): the engine's packed copy of a constant
weight read by its float32 products is never read stale. An AidgeModule's
parameters are the engine's memory, written in place by torch; every way of
writing them between two eval forwards must show in the next one, as in
torch. And a product over the packed copy makes the same sums, bit for bit,
as one packing its weight at every call."""

import copy

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from aidge_interop import SGD, load_onnx, wrap
from aidge_interop import _C

# the packed copies are taken by gemm_tiles.c's AVX-512 kernel (M, N, K >= 128)
PACKS = _C._set_avx512(True)
needs_avx512 = pytest.mark.skipif(not PACKS, reason="packed weights run on AVX-512 only")


class TwoLinears(torch.nn.Module):
    """Linears on 3-D inputs (FusedMatMul), one with N past a multiple of 64
    and K over one chunk of gemm_tiles.c (640), and a 2-D one (Gemm)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(160, 712)
        self.b = torch.nn.Linear(712, 200)
        self.c = torch.nn.Linear(200, 136)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return self.c(y.reshape(-1, 200))


def _pair(seed=0):
    torch.manual_seed(seed)
    model = TwoLinears().eval()
    return model, wrap(copy.deepcopy(model), [(3, 50, 160)])


def _x(seed=1):
    return torch.randn(3, 50, 160, generator=torch.Generator().manual_seed(seed))


def _eval(m, x):
    with torch.no_grad():
        return m(x)


def _assert_matches(wrapped, model, x):
    torch.testing.assert_close(_eval(wrapped, x), _eval(model, x), rtol=1e-4, atol=1e-4)


def _packed_bytes(wrapped):
    stats = wrapped.memory_stats()
    graph = stats["inference"] if stats["last_graph"] == "inference" else stats
    return graph["packed_weights_bytes"]


@needs_avx512
def test_weights_are_packed_once_and_bounded_by_one_copy():
    model, wrapped = _pair()
    x = _x()
    versions = []
    for _ in range(3):
        _assert_matches(wrapped, model, x)
        versions.append((wrapped._fused or wrapped._graph).weights_version)
    # packed at the second forward, whose version the third keeps (nothing wrote)
    assert versions[0] == -1 and versions[1] == versions[2] >= 0
    # one copy of each of the three weights, N rounded up to 64 columns
    padded = sum(m.in_features * -(-m.out_features // 64) * 64 * 4
                 for m in (model.a, model.b, model.c))
    assert _packed_bytes(wrapped) == padded


@needs_avx512
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_packed_product_is_bit_for_bit_the_per_call_one(threads):
    """Gemm and MatMul with a constant B (and transB), through load_onnx:
    forwards without a weights_version (no packed copy) and with one."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((712, 160), dtype=np.float32)  # Gemm transB: (N, K)
    w2 = rng.standard_normal((712, 200), dtype=np.float32)  # MatMul: (K, N)
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], transB=1),
             helper.make_node("MatMul", ["h", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [150, 160])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [150, 200])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    graph = load_onnx(model.SerializeToString())
    g = graph._g  # the engine's graph: load_onnx's Graph declares no weights_version
    x = rng.standard_normal((150, 160), dtype=np.float32)
    before = aidge_interop.get_num_threads()
    aidge_interop.set_num_threads(threads)
    try:
        plain = graph.forward([x])[0]
        assert g.weights_packable and g.weights_version == -1
        assert g.memory_stats()["packed_weights_bytes"] == 0
        g.weights_version = 0
        packed = graph.forward([x])[0]
        assert g.memory_stats()["packed_weights_bytes"] == 4 * (160 * 768 + 712 * 256)
        again = graph.forward([x])[0]
    finally:
        aidge_interop.set_num_threads(before)
    np.testing.assert_array_equal(packed, plain)
    np.testing.assert_array_equal(again, plain)
    np.testing.assert_allclose(plain, (x.astype(np.float64) @ w1.T.astype(np.float64))
                               @ w2.astype(np.float64), rtol=1e-4, atol=1e-3)


def test_weights_version_refuses_other_values():
    g = load_onnx(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])).SerializeToString())._g
    with pytest.raises(ValueError, match="weights_version must be >= 0, or -1"):
        g.weights_version = -2
    with pytest.raises(TypeError):
        g.weights_version = "1"


# The ways a user changes a weight between two eval forwards, each on the
# weight of `layer` in the wrapped module and in its torch twin (also
# test_conv_packed's, on its convs' weights).
def _weights(wrapped, model, layer):
    return getattr(wrapped, layer).weight, getattr(model, layer).weight


def no_grad_add(wrapped, model, layer):
    with torch.no_grad():
        for w in _weights(wrapped, model, layer):
            w.add_(0.25)


def data_write(wrapped, model, layer):  # through .data: no version counter sees it
    for w in _weights(wrapped, model, layer):
        w.data.mul_(-1.5)


def detached_write(wrapped, model, layer):
    for w in _weights(wrapped, model, layer):
        w.detach().sub_(0.5)


def load_state_dict(wrapped, model, layer):
    state = model.state_dict()
    state[f"{layer}.weight"] = state[f"{layer}.weight"] * -0.5 + 0.1
    wrapped.load_state_dict(state)
    model.load_state_dict(state)


def assign(wrapped, model, layer):  # module.weight = t copies t into the engine's memory
    new = torch.nn.Parameter(torch.randn_like(getattr(model, layer).weight))
    getattr(wrapped, layer).weight = torch.nn.Parameter(new.detach().clone())
    getattr(model, layer).weight = new


def set_data(wrapped, model, layer):  # p.data = t: the next forward copies t in (_relink)
    new = torch.randn_like(getattr(model, layer).weight)
    getattr(wrapped, layer).weight.data = new.clone()
    getattr(model, layer).weight.data = new


def numpy_write(wrapped, model, layer):  # behind torch's back: said with increment_version
    w, m = _weights(wrapped, model, layer)
    w.detach().numpy()[:5] += 0.5
    torch.autograd.graph.increment_version(w)
    m.detach().numpy()[:5] += 0.5


def copy_into(wrapped, model, layer):
    new = torch.randn_like(getattr(model, layer).weight)
    with torch.no_grad():
        for w in _weights(wrapped, model, layer):
            w.copy_(new)


WEIGHT_WRITES = [no_grad_add, data_write, detached_write, load_state_dict, assign, set_data,
                 numpy_write, copy_into]


@needs_avx512
@pytest.mark.parametrize("change, layer", zip(WEIGHT_WRITES, "bacbbaba"))
def test_a_change_between_two_eval_forwards_shows(change, layer):
    model, wrapped = _pair()
    x = _x()
    for _ in range(2):  # the second forward reads packed weights
        _assert_matches(wrapped, model, x)
    assert _packed_bytes(wrapped) > 0
    change(wrapped, model, layer)
    _assert_matches(wrapped, model, x)
    _assert_matches(wrapped, model, x)


@needs_avx512
@pytest.mark.parametrize("optimizer", ["torch", "ours"])
def test_training_then_eval_reads_the_stepped_weights(optimizer):
    model, wrapped = _pair()
    x, target = _x(), torch.randn(150, 136)
    for m in (model, wrapped):
        _eval(m, x), _eval(m, x)  # packed
    opts = [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            (torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
             if optimizer == "torch" else SGD(wrapped, lr=0.05, momentum=0.9))]
    for m, opt in zip((model, wrapped), opts):
        m.train()
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), target).backward()
            opt.step()
        m.eval()
    _assert_matches(wrapped, model, x)
    # an optimizer step between two eval forwards
    for m, opt in zip((model, wrapped), opts):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), target).backward()
        opt.step()
    _assert_matches(wrapped, model, x)


@needs_avx512
def test_set_learning_rate_steps_show_in_eval():
    """aidge_interop_torch's training: backward steps the weights itself."""
    model, wrapped = _pair()
    x, target = _x(), torch.randn(150, 136)
    _eval(wrapped, x), _eval(wrapped, x)
    wrapped.set_learning_rate(0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.nn.functional.mse_loss(wrapped(x), target).backward()
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), target).backward()
    opt.step()
    _assert_matches(wrapped, model, x)


@needs_avx512
def test_without_avx512_the_weights_are_read_in_place():
    model, wrapped = _pair()
    x = _x()
    try:
        _C._set_avx512(False)
        for _ in range(2):
            _assert_matches(wrapped, model, x)
        assert _packed_bytes(wrapped) == 0
    finally:
        _C._set_avx512(True)
    _assert_matches(wrapped, model, x)
