"""Blocked channels (recipe block_channels, csrc/kernels/conv.h, ops/layout.c).

Chains of float32 2-D convs run in (N, ceil(C / 8), H, W, 8) in the fused
inference graph. Every case is checked against torch's eval forward; each
case names the kernel path it is there for, and the test checks that the
graph really runs blocked (a case that silently stayed NCHW would prove
nothing). The reorders are checked against numpy, forward and backward.
"""
import copy

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import aidge_interop
from aidge_interop import load_onnx, recipes, wrap
from aidge_interop.compare.locate import torch_graph
from models import SAMPLE_SHAPES

TOL = dict(rtol=1e-4, atol=1e-5)


def _conv_bn(c, m, k=3, s=1, p=None, groups=1, dilation=1, act="relu"):
    p = k // 2 * dilation if p is None else p
    layers = [torch.nn.Conv2d(c, m, k, stride=s, padding=p, groups=groups, dilation=dilation),
              torch.nn.BatchNorm2d(m)]
    layers += {"relu": [torch.nn.ReLU()], "relu6": [torch.nn.ReLU6()], "": []}[act]
    return layers


class Residual(torch.nn.Module):
    """conv -> conv, plus the input (or a 1x1 strided shortcut), then Relu."""

    def __init__(self, c, m, s):
        super().__init__()
        self.body = torch.nn.Sequential(*_conv_bn(c, m, s=s), *_conv_bn(m, m, act=""))
        self.short = torch.nn.Identity() if c == m and s == 1 else torch.nn.Conv2d(c, m, 1, s)

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class ResidualPaths(torch.nn.Module):
    """Residual Adds after a depthwise conv and after a 3x3 conv on a plane
    too large for the direct tiles (the kernels that add the residual in a
    pass after the conv)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(*_conv_bn(3, 16, 1))
        self.dw = torch.nn.Sequential(*_conv_bn(16, 16, groups=16, act=""))
        self.big = torch.nn.Sequential(*_conv_bn(16, 16, act=""))

    def forward(self, x):
        x = self.stem(x)
        y = torch.relu(self.dw(x) + x)
        return torch.relu(self.big(y) + y)


class ChannelBroadcast(torch.nn.Module):
    """An Add of a 1-channel conv output to a 12-channel one: broadcast over
    the channels, which blocks cannot do (the Add stays NCHW)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 12, 3, padding=1)
        self.b = torch.nn.Conv2d(3, 1, 3, padding=1)
        self.c = torch.nn.Conv2d(12, 12, 1)

    def forward(self, x):
        return self.c(self.a(x) + self.b(x))


# name: (layers or module, input shape); channel counts off multiples of 8,
# odd plane sizes and batch sizes on purpose
CASES = {
    # pointwise on blocked x: tiles of 4/3/2/1 vectors, positions past the last
    # whole tile, several images per job (3x3 planes: 10 per job, batch 23)
    "pointwise_chain": ([*_conv_bn(5, 36, 1), *_conv_bn(36, 20, 1), *_conv_bn(20, 9, 1)],
                        (3, 5, 11, 7)),
    "pointwise_small_planes": ([*_conv_bn(12, 24, 1), *_conv_bn(24, 12, 1)], (23, 12, 3, 3)),
    # over 128 input channels (a tile's weights past L1), the last block partial
    "pointwise_wide": ([*_conv_bn(12, 205, 1), *_conv_bn(205, 40, 1)], (3, 12, 5, 5)),
    # depthwise: stride 1 through the padded copy, stride 2 on a large plane
    # read directly (border positions, odd sizes), a partial unit of 8, 5x5
    # and dilation
    "depthwise_s1_s2": ([*_conv_bn(3, 12, 1), *_conv_bn(12, 12, groups=12),
                         *_conv_bn(12, 12, s=2, groups=12), *_conv_bn(12, 16, 1)],
                        (2, 3, 37, 29)),
    # rows of 12 by the row tiles, then rows of 6 (8x6 outputs, padded copy)
    # by the flat tiles
    "depthwise_short_rows": ([*_conv_bn(8, 24, 1), *_conv_bn(24, 24, groups=24),
                              *_conv_bn(24, 24, s=2, groups=24), *_conv_bn(24, 8, 1)],
                             (5, 8, 16, 12)),
    "depthwise_5x5_dilated": ([*_conv_bn(4, 16, 1), *_conv_bn(16, 16, k=5, groups=16, s=2),
                               *_conv_bn(16, 16, groups=16, dilation=2)], (2, 4, 40, 33)),
    # the direct tiles reading blocked x: 3x3 padded, strided, asymmetric
    # output sizes, then an NCHW reader (a pool)
    "general_blocked": ([*_conv_bn(3, 10, 3), *_conv_bn(10, 17, 3, s=2), *_conv_bn(17, 8, 3),
                         torch.nn.AdaptiveAvgPool2d(1)], (2, 3, 15, 18)),
    # Clip as the activation: its pass over the whole blocks
    "clip_activation": ([*_conv_bn(3, 16, 3, act="relu6"), *_conv_bn(16, 16, 1, act="relu6")],
                        (2, 3, 9, 9)),
    # residual blocks: blocked Add and Relu, identity and strided shortcuts
    "residual": (lambda: torch.nn.Sequential(*_conv_bn(3, 16), Residual(16, 16, 1),
                                             Residual(16, 24, 2)), (3, 3, 16, 12)),
    # planes too large for the direct tiles' slots: the NCHW forward between reorders
    "fallback_large_plane": ([*_conv_bn(3, 16, 1), *_conv_bn(16, 16, 3)], (1, 3, 100, 100)),
    # residuals fused into a depthwise conv and into the fallback: added in a pass
    "residual_other_paths": (lambda: ResidualPaths(), (1, 3, 100, 100)),
}


def _build(name):
    spec, shape = CASES[name]
    torch.manual_seed(sum(map(ord, name)))
    net = spec() if callable(spec) else torch.nn.Sequential(*spec)
    return _random_bn(net), torch.randn(shape, generator=torch.Generator().manual_seed(3))


def _random_bn(net):
    """net in eval mode, its BatchNorms' statistics and affine random: values
    that matter, and no two parameters equal (the exporter would merge them)."""
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.5, 0.5)
    return net.eval()


def _blocked_nodes(graph):
    return [n for n in graph.nodes() if n["attrs"].get("y_blocked")]


@pytest.mark.parametrize("name", list(CASES))
def test_blocked_chains_against_torch(name):
    net, x = _build(name)
    wrapped = wrap(copy.deepcopy(net), [tuple(x.shape)]).eval()
    with torch.no_grad():
        got, ref = wrapped(x), net(x)
    torch.testing.assert_close(got, ref, **TOL)
    assert len(_blocked_nodes(wrapped._fused)) >= 2  # it did run blocked
    if name.startswith("residual"):  # every Add fused into its conv
        nodes = wrapped._fused.nodes()
        assert not any(n["op_type"] == "Add" for n in nodes)
        assert sum(bool(n["attrs"].get("residual")) for n in nodes) == 2
    # another batch size: the plan is redone, the layout holds
    x5 = torch.randn((5, *x.shape[1:]), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x5), net(x5), **TOL)


@pytest.mark.parametrize("name", ["depthwise_s1_s2", "residual", "pointwise_small_planes"])
def test_blocked_results_do_not_depend_on_threads(name):
    net, x = _build(name)
    wrapped = wrap(net, [tuple(x.shape)]).eval()
    outs, saved = [], aidge_interop.get_num_threads()
    try:
        for n in (1, 2, 3):
            aidge_interop.set_num_threads(n)
            with torch.no_grad():
                outs.append(wrapped(x))
    finally:
        aidge_interop.set_num_threads(saved)
    for y in outs[1:]:  # each output position is computed whole by one thread
        torch.testing.assert_close(y, outs[0], rtol=0, atol=0)


def test_channel_broadcast_add_stays_nchw():
    net = ChannelBroadcast().eval()
    x = torch.randn(2, 3, 7, 6)
    graph, _, _ = torch_graph(net, [x], "test")
    report = recipes.block_channels(graph)
    ops = {n["name"]: n for n in graph.nodes()}
    add = next(n for n in ops.values() if n["op_type"] == "Add")
    assert not any(i.endswith("_blocked") for i in add["inputs"])  # read in NCHW
    with torch.no_grad():
        np.testing.assert_allclose(graph.forward(x.numpy())[0], net(x).numpy(), **TOL)
    assert report.skipped == [] or all("not blocked" in s for s in report.skipped)


@pytest.mark.parametrize("name", list(SAMPLE_SHAPES))
def test_block_channels_on_the_suite(name):
    factory, shape = SAMPLE_SHAPES[name]
    net = factory().eval()
    x = torch.randn((3, *shape), generator=torch.Generator().manual_seed(1))
    graph, _, _ = torch_graph(net, [x], "test")
    for recipe in ("constant_fold", "batchnorm_epilogue", "fuse_activation", "block_channels"):
        report = recipes.RECIPES[recipe](graph)
    with torch.no_grad():
        ref = net(x).numpy()
    np.testing.assert_allclose(graph.forward(x.numpy())[0], ref, **TOL)
    blocked = _blocked_nodes(graph)
    convs = sum(n["op_type"] in ("Conv", "FusedConv") for n in graph.nodes())
    if name in ("kws", "mobilenet", "resnet"):  # conv chains: every conv blocked
        assert len(blocked) == convs
        # the chain's end: MobileNet's and ResNet's GlobalAveragePool reads the
        # blocks; KWS's AveragePool would too with the shapes planned (a
        # forward before the recipe, as wrap does), here it reads NCHW
        ops = [n["op_type"] for n in graph.nodes()]
        ends = ["UnblockChannels"] if name == "kws" else ["BlockedGlobalAveragePool"]
        assert [op for op in ops if op in ("UnblockChannels", "BlockedGlobalAveragePool")] == ends
        with pytest.raises(ValueError, match="expand_metaops: FusedConv '.*' runs in blocked"):
            recipes.expand_metaops(graph)
    else:  # lone convs (LeNet: pools between them) or none: left alone, with the reason
        assert not blocked
        assert all("no conv, Add or Relu next to it" in s for s in report.skipped)
        assert len(report.skipped) == convs


def test_blocked_conv_is_inference_only_and_not_exported(tmp_path):
    from aidge_interop.quant import export_c

    net, x = _build("pointwise_chain")
    graph, _, _ = torch_graph(net.train(), [x], "test")
    recipes.block_channels(graph)
    graph.training = True
    y = graph.forward(x.numpy(), need_backward=True)[0]
    with pytest.raises(ValueError, match="blocked channels .*inference-only"):
        graph.backward([np.ones_like(y)])
    graph.training = False
    with pytest.raises(NotImplementedError, match="blocked channels .*cannot be exported"):
        export_c(graph, tmp_path / "out", inputs=[x.numpy()[:1]], verbose=False)


# -- residual Adds fused into the conv ------------------------------------------------


class Residuals(torch.nn.Module):
    """Four Adds of blocked values: a ResNet block (fused, with its Relu); an
    Add whose conv output is also read elsewhere and whose other input ends
    with a Relu (left alone); an Add of a conv (fused, no Relu after it);
    one that broadcasts a 1x1 plane over the other (left alone)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(*_conv_bn(3, 12))
        self.block = Residual(12, 12, 1)
        self.a = torch.nn.Conv2d(12, 12, 3, padding=1)
        self.b = torch.nn.Conv2d(12, 12, 1)
        self.whole = torch.nn.Conv2d(12, 12, (5, 4))  # a 5x4 plane -> 1x1
        self.c = torch.nn.Conv2d(12, 12, 1)

    def forward(self, x):
        x = self.block(self.stem(x))
        a = self.a(x)
        y = self.b(a + x) + a  # a is read twice
        return self.c(y + self.whole(y))  # (N, 12, 1, 1) broadcast over the plane


def _recipes(net, x, plan):
    graph, _, _ = torch_graph(net, [x], "test")
    for recipe in ("constant_fold", "batchnorm_epilogue", "fuse_activation", "block_channels"):
        if recipe == "block_channels" and plan:
            graph.forward(x.numpy())  # the shapes the residual fusion checks
        report = recipes.RECIPES[recipe](graph)
    return graph, report


def test_residual_add_fuses_into_the_conv():
    torch.manual_seed(0)
    net = _random_bn(Residuals())
    x = torch.randn(3, 3, 5, 4)
    graph, report = _recipes(net, x, plan=True)
    plain, plain_report = _recipes(net, x, plan=False)
    nodes = graph.nodes()
    fused = {n["name"]: n for n in nodes if n["attrs"].get("residual")}
    assert sorted(fused) == ["/b/Conv", "/block/body/body.3/Conv"]
    assert fused["/block/body/body.3/Conv"]["attrs"]["activation"] == "Relu"
    assert "activation" not in fused["/b/Conv"]["attrs"]
    for n in fused.values():
        assert len(n["inputs"]) == 8 and n["inputs"][7].endswith("_blocked")
    assert sum(n["op_type"] == "Add" for n in nodes) == 2  # of 4
    assert sum(n["op_type"] == "Relu" for n in nodes) == 0
    assert any("+ Add '" in d and "+ Relu '" in d for d in report)
    why = " ".join(report.skipped)
    assert ("Add '/Add' not fused into a conv: input 0: the conv's output is also read "
            "elsewhere; input 1: the conv already ends with an activation" in why)
    assert "Add '/Add_2' not fused into a conv: input 0: " in why
    assert "input 1: the Add broadcasts" in why
    # unplanned: every Add stays, and says why
    assert not any(n["attrs"].get("residual") for n in plain.nodes())
    assert "input shapes are unknown (run a forward first)" in " ".join(plain_report.skipped)
    # the residual is added where the Add would round it: the same bits
    with torch.no_grad():
        ref = net(x).numpy()
    y = graph.forward(x.numpy())[0]
    np.testing.assert_array_equal(y, plain.forward(x.numpy())[0])
    np.testing.assert_allclose(y, ref, **TOL)
    # through wrap: planned at the first eval forward, then another input size
    wrapped = wrap(copy.deepcopy(net), [tuple(x.shape)]).eval()
    x2 = torch.randn(2, 3, 5, 4)
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), net(x), **TOL)
        torch.testing.assert_close(wrapped(x2), net(x2), **TOL)
    assert any(n["attrs"].get("residual") for n in wrapped._fused.nodes())


def test_residual_shape_mismatch_names_the_node():
    f32 = TensorProto.FLOAT
    w = helper.make_tensor("w", f32, (8, 8, 1, 1), np.ones(64, np.float32))
    node = helper.make_node("FusedConv", ["x", "w", "", "", "", "", "", "r"], ["y"], name="conv",
                            domain="aidge_interop", y_blocked=1, residual=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f32, None),
                                            helper.make_tensor_value_info("r", f32, None)],
                              [helper.make_tensor_value_info("y", f32, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("aidge_interop", 1)])
    g = load_onnx(model)
    x = np.random.default_rng(0).standard_normal((2, 8, 3, 3)).astype(np.float32)
    r = np.random.default_rng(1).standard_normal((2, 1, 3, 3, 8)).astype(np.float32)
    y = g.forward([x, r])[0]  # the conv (all-ones 1x1 weights: channel sums) plus r
    ref = np.broadcast_to(x.sum(1)[:, None, :, :, None], r.shape) + r
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="FusedConv node 'conv': the residual .*blocked "
                                         "output's shape"):
        g.forward([x, r[:, :, :2]])


# -- the reorders ---------------------------------------------------------------------


def _reorder_model(channels, rank, dtype):
    t = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    nodes = [helper.make_node("BlockChannels", ["x"], ["b"], name="block", domain="aidge_interop"),
             helper.make_node("UnblockChannels", ["b"], ["y"], name="unblock",
                              domain="aidge_interop", channels=channels)]
    sp = ["N", channels] + [None] * (rank - 2)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, sp)],
                              [helper.make_tensor_value_info("y", t, sp),
                               helper.make_tensor_value_info("b", t, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("aidge_interop", 1)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 13, 5, 7), (3, 8, 9), (1, 20, 2, 3, 4), (2, 3)], ids=str)
def test_reorders_against_numpy(shape, dtype):
    C = shape[1]
    graph = load_onnx(_reorder_model(C, len(shape), dtype))
    x = np.random.default_rng(5).standard_normal(shape).astype(dtype)
    y, b = graph.forward(x)
    cb = -(-C // 8)
    xp = np.zeros((shape[0], cb * 8, *shape[2:]), dtype)
    xp[:, :C] = x
    ref = np.moveaxis(xp.reshape(shape[0], cb, 8, *shape[2:]), 2, -1)
    np.testing.assert_array_equal(b, ref)  # padding lanes are zeros
    np.testing.assert_array_equal(y, x)
    # backward: with gradients dy of y and db of the blocked value, x gets dy
    # (Unblock then Block's backwards) plus db's real lanes (Block's)
    y, b = graph.forward(x, need_backward=True, input_grads=True)
    rng = np.random.default_rng(6)
    dy, db = rng.standard_normal(y.shape).astype(dtype), rng.standard_normal(b.shape).astype(dtype)
    (dx,) = graph.backward([dy, db])
    db_plain = np.moveaxis(db, -1, 2).reshape(shape[0], cb * 8, *shape[2:])[:, :C]
    np.testing.assert_array_equal(dx, dy + db_plain)


def test_reorder_errors_name_the_node():
    bad = _reorder_model(13, 4, np.float32)
    unblock = next(n for n in bad.graph.node if n.op_type == "UnblockChannels")
    del unblock.attribute[:]
    graph = load_onnx(bad)
    with pytest.raises(ValueError, match="UnblockChannels node 'unblock': attribute 'channels'"):
        graph.forward(np.zeros((2, 13, 3, 3), np.float32))
    wrong = _reorder_model(20, 4, np.float32)  # 13 channels make 2 blocks, not 3
    wrong.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "C"  # (not refused at input)
    wrong = load_onnx(wrong)
    with pytest.raises(ValueError, match="UnblockChannels node 'unblock': .*for 20 channels"):
        wrong.forward(np.zeros((2, 13, 3, 3), np.float32))


# -- the channel means of blocked values ------------------------------------------------


class _PoolHead(torch.nn.Module):
    """Two blocked convs, then a pool over the last one's output."""

    def __init__(self, pool):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 20, 3, padding=1)
        self.b = torch.nn.Conv2d(20, 20, 3, padding=1)
        self.pool = pool

    def forward(self, x):
        return self.pool(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.mark.parametrize("pool,reads_blocks", [
    (torch.nn.AdaptiveAvgPool2d(1), True),             # GlobalAveragePool
    (torch.nn.AvgPool2d((7, 5)), True),                # the whole 7 x 5 plane
    (torch.nn.AvgPool2d((7, 5), stride=(2, 3)), True),  # still one window
    (torch.nn.AvgPool2d(3), False),                    # windows of a part of the plane
    (torch.nn.AvgPool2d((7, 5), padding=1), False),    # padded: not the plane's mean
], ids=["global", "whole", "whole-strided", "part", "padded"])
def test_pool_of_whole_planes_reads_the_blocks(pool, reads_blocks):
    torch.manual_seed(0)
    net = _PoolHead(pool).eval()
    x = torch.randn(4, 3, 7, 5)
    graph, _, _ = torch_graph(net, [x], "test")
    graph.forward(x.numpy())  # plans the shapes (as wrap does before block_channels)
    report = recipes.block_channels(graph)
    ops = [n["op_type"] for n in graph.nodes()]
    assert ("BlockedGlobalAveragePool" in ops) == reads_blocks
    assert ("UnblockChannels" in ops) != reads_blocks
    if reads_blocks:
        assert any("-> BlockedGlobalAveragePool on the blocks of" in d for d in report)
    with torch.no_grad():
        ref = net(x).numpy()
    np.testing.assert_allclose(graph.forward(x.numpy())[0], ref, **TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 13, 5, 7), (3, 8, 9), (2, 20, 1, 1)], ids=str)
def test_blocked_global_average_pool_against_numpy(shape, dtype):
    t = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    C = shape[1]
    nodes = [helper.make_node("BlockChannels", ["x"], ["b"], name="block", domain="aidge_interop"),
             helper.make_node("BlockedGlobalAveragePool", ["b"], ["y"], name="mean",
                              domain="aidge_interop", channels=C)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, None)],
                              [helper.make_tensor_value_info("y", t, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("aidge_interop", 1)])
    g = load_onnx(model)
    x = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    axes = tuple(range(2, len(shape)))
    (y,) = g.forward(x, need_backward=True, input_grads=True)
    assert y.shape == (*shape[:2], *([1] * len(axes)))
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, x.mean(axis=axes, keepdims=True), **tol)
    dy = np.random.default_rng(8).standard_normal(y.shape).astype(dtype)
    (dx,) = g.backward([dy])  # each position gets dy / S
    S = int(np.prod(shape[2:]))
    np.testing.assert_allclose(dx, np.broadcast_to(dy / S, shape), **tol)



def test_blocked_global_average_pool_names_the_node_on_a_wrong_channel_count():
    nodes = [helper.make_node("BlockChannels", ["x"], ["b"], name="block", domain="aidge_interop"),
             helper.make_node("BlockedGlobalAveragePool", ["b"], ["y"], name="mean",
                              domain="aidge_interop", channels=20)]  # 13 channels: 2 blocks
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("aidge_interop", 1)])
    with pytest.raises(ValueError, match="BlockedGlobalAveragePool node 'mean': .*for 20 "
                                         "channels"):
        load_onnx(model).forward(np.zeros((2, 13, 3, 3), np.float32))
