"""wrap() on models called as users call them: example inputs of any dtype,
keyword inputs, nested output structures, shapes that change between calls;
every result against torch."""
import collections
import dataclasses

import pytest
import torch

from aidge_interop import SGD, wrap
from aidge_interop.bridge.structure import flatten, paths, unflatten


def _close(a, b, what=""):
    ta, sa = flatten(a)
    tb, sb = flatten(b)
    assert sa == sb, f"{what}: structure {sa} != {sb}"
    for x, y, name in zip(ta, tb, paths(sa)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"{what} {name}")


class TextModel(torch.nn.Module):
    """Token ids (int64), an attention mask (int64 or bool), an optional float
    feature input by keyword; a dict with a nested list, None and an int."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8, padding_idx=0)
        self.pos = torch.nn.Embedding(32, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None, features=None):
        positions = torch.arange(input_ids.shape[1])
        h = self.emb(input_ids) + self.pos(positions)
        if features is not None:
            h = h * features
        if attention_mask is not None:
            m = attention_mask.to(h.dtype).unsqueeze(-1)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1)
        else:
            pooled = h.mean(1)
        return {"logits": self.head(pooled), "extra": [h, None], "n_layers": 1}


def _text_inputs(batch, seq, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (batch, seq), generator=g)
    ids[0, 0] = 0  # a padding token: its embedding row gets no gradient in torch
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, seq // 2:] = 0
    return ids, mask


def test_int64_ids_and_masks_as_torch_takes_them():
    torch.manual_seed(0)
    model = TextModel()
    ids, mask = _text_inputs(2, 6)
    engine = wrap(model, (ids, mask))
    out = engine(ids, mask)
    assert isinstance(out, dict) and out["extra"][1] is None and out["n_layers"] == 1
    _close(out, model(ids, mask), "eval")
    # training: parameter gradients (the padding row stays untouched) and an SGD step
    ref_opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = SGD(engine, lr=0.1)
    for step in range(3):
        ids, mask = _text_inputs(2, 6, seed=step)
        for m, o in ((model, ref_opt), (engine, opt)):
            o.zero_grad()
            m(ids, mask)["logits"].square().sum().backward()
        grads = dict(engine.named_parameters())
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name].grad, p.grad, rtol=1e-5, atol=1e-6,
                                       msg=f"step {step}, gradient of {name}")
        ref_opt.step()
        opt.step()
    _close(engine(ids, mask), model(ids, mask), "after 3 SGD steps")


def test_keyword_inputs_in_any_order_and_positional_forms():
    torch.manual_seed(0)
    model = TextModel()
    ids, mask = _text_inputs(2, 6)
    feats = torch.rand(2, 6, 8)
    engine = wrap(model, (), kwargs={"input_ids": ids, "attention_mask": mask})
    ref = model(ids, attention_mask=mask)
    _close(engine(attention_mask=mask, input_ids=ids), ref, "keywords swapped")
    _close(engine(ids, mask), ref, "positional")
    n = len(engine._variants)
    assert n == 1, "positional and keyword forms of one call are one signature"
    # another set of arguments: a graph exported for it
    _close(engine(ids, features=feats), model(ids, features=feats), "features, no mask")
    x = feats.clone().requires_grad_()
    engine(ids, mask, x)["logits"].sum().backward()
    y = feats.clone().requires_grad_()
    model(ids, mask, y)["logits"].sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6)


def test_integer_and_bool_inputs_get_no_gradient():
    class Masked(torch.nn.Module):
        def forward(self, x, keep, scale):
            return torch.where(keep, x * 2, x) * scale

    model = Masked()
    x, keep, scale = torch.randn(3, 4), torch.rand(3, 4) > 0.5, torch.tensor(3)
    engine = wrap(model, (x, keep, scale))
    xe = x.clone().requires_grad_()
    engine(xe, keep, scale).sum().backward()
    xt = x.clone().requires_grad_()
    model(xt, keep, scale).sum().backward()
    torch.testing.assert_close(xe.grad, xt.grad)


Pair = collections.namedtuple("Pair", "first second")


@dataclasses.dataclass
class Result:
    main: torch.Tensor
    aux: tuple
    label: str = "ok"
    missing: object = None


class Structured(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return Result(h, (Pair(h.relu(), {"s": h.sum(1)}), [h.tanh()]))


@pytest.mark.parametrize("model_output", [False, True], ids=["dataclass", "ModelOutput"])
def test_output_structure_comes_back(model_output):
    model = Structured()
    if model_output:
        transformers = pytest.importorskip("transformers")

        @dataclasses.dataclass
        class Output(transformers.utils.ModelOutput):
            logits: torch.Tensor = None
            hidden: torch.Tensor = None
            attentions: tuple = None

        class WithModelOutput(Structured):
            def forward(self, x):
                h = self.lin(x)
                return Output(logits=h.sum(1), hidden=h)

        model = WithModelOutput()
    x = torch.randn(2, 4)
    engine = wrap(model, [(2, 4)])
    out, ref = engine(x), model(x)
    assert type(out) is type(ref)
    _close(out, ref)
    if model_output:
        assert out.attentions is None and list(out.keys()) == ["logits", "hidden"]
        assert out[0] is out.logits
    else:
        assert out.label == "ok" and out.missing is None
        assert isinstance(out.aux[0], Pair)


def test_single_output_in_a_tuple_stays_a_tuple():
    class One(torch.nn.Module):
        def forward(self, x):
            return (x * 2,)

    out = wrap(One(), [(2, 3)])(torch.ones(2, 3))
    assert isinstance(out, tuple) and len(out) == 1


def test_a_new_sequence_length_runs_a_graph_of_its_own_on_the_same_parameters():
    torch.manual_seed(0)
    model = TextModel()
    ids, mask = _text_inputs(2, 6)
    engine = wrap(model, (ids, mask))
    ids2, mask2 = _text_inputs(3, 9, seed=1)
    _close(engine(ids2, mask2), model(ids2, mask2), "sequence length 9")
    _close(engine(ids, mask), model(ids, mask), "back to 6")
    assert len(engine._variants) == 2
    # one parameter memory, one gradient for both graphs
    first, second = engine._variants.values()
    ptr = dict(engine.named_parameters())["head.weight"].data_ptr()
    for variant in (first, second):
        assert variant.graph.value("head.weight").__array_interface__["data"][0] == ptr
    engine.zero_grad()
    model.zero_grad()
    for m in (engine, model):
        m(ids, mask)["logits"].sum().backward()
        m(ids2, mask2)["logits"].square().sum().backward()
    grads = dict(engine.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name].grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_static_batch_exports_again_for_another_batch():
    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(12, 2)

        def forward(self, x):
            return self.lin(x.reshape(x.shape[0] * 3, 12))

    model = Flat()
    engine = wrap(model, [(2, 3, 12)], dynamic_batch=False)
    for batch in (2, 5, 2):
        x = torch.randn(batch, 3, 12)
        _close(engine(x), model(x), f"batch {batch}")
    assert len(engine._variants) == 2


class _TakesX(torch.nn.Module):
    def forward(self, x):
        return x[0] if isinstance(x, tuple) else x


@pytest.mark.parametrize("inputs,kwargs,part", [
    (((torch.ones(2, 3), object()),), None, "input['x'][1] is of type object"),
    ((), {"input_ids": torch.ones(2, 3, dtype=torch.int64)}, "_TakesX.forward: "),
    ("text", None, "argument 'input_dims' must be the model's example inputs"),
    ((torch.ones(2, 3),), [1], "argument 'kwargs' must be a dict"),
], ids=["object", "keyword", "str", "kwargs"])
def test_bad_example_inputs_are_named(inputs, kwargs, part):
    with pytest.raises(TypeError) as info:
        wrap(_TakesX(), inputs, kwargs=kwargs)
    assert part in str(info.value)


def test_parameters_reached_only_from_unused_outputs_get_no_gradient():
    # as in torch: a loss on the first output leaves the second head's grad None
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 4)
            self.a, self.b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 3)

        def forward(self, x):
            h = self.body(x).relu()
            return self.a(h), self.b(h)

    model = TwoHeads()
    engine = wrap(model, [(2, 4)])
    x = torch.randn(2, 4)
    for m in (model, engine):
        m(x)[0].sum().backward()
    grads = dict(engine.named_parameters())
    for name, p in model.named_parameters():
        if p.grad is None:
            assert grads[name].grad is None, name
        else:
            torch.testing.assert_close(grads[name].grad, p.grad, msg=name)
    assert grads["b.weight"].grad is None
    for m in (model, engine):  # later both heads: b's gradient arrives
        sum(o.sum() for o in m(x)).backward()
    torch.testing.assert_close(grads["b.weight"].grad, dict(model.named_parameters())
                               ["b.weight"].grad)


# -- transformers' DynamicCache, in and out -----------------------------------
class CachedDecoder(torch.nn.Module):
    """Two attention layers that keep their keys and values in a
    DynamicCache as transformers' decoders do (cache.update per layer);
    returns the hidden states and the cache."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(8, 24) for _ in range(2))

    def forward(self, x, cache=None):
        from transformers import DynamicCache

        if cache is None:
            cache = DynamicCache()
        h = x
        for i, qkv in enumerate(self.qkv):
            q, k, v = qkv(h).unsqueeze(1).chunk(3, -1)  # [B, 1, S, 8]
            k, v = cache.update(k, v, i)
            h = h + torch.softmax(q @ k.transpose(-1, -2), -1).matmul(v).squeeze(1)
        return h, cache


def test_a_dynamic_cache_comes_back_and_goes_in_as_torch_passes_it():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = CachedDecoder()
    x = torch.randn(2, 5, 8)
    engine = wrap(model, (x,))
    out, ref = engine(x), model(x)
    assert type(out[1]) is transformers.DynamicCache
    _close(out, ref, "no cache given")
    # the next step: the model updates the cache it is given and returns it
    step = torch.randn(2, 1, 8)
    cache, cache_ref = out[1], ref[1]
    out, ref = engine(step, cache), model(step, cache_ref)
    assert out[1] is cache and ref[1] is cache_ref
    assert cache.get_seq_length() == 6
    _close(out, ref, "cache of 5 given")
    out, ref = engine(step, cache), model(step, cache_ref)  # a cache of 6: another graph
    _close(out, ref, "cache of 6 given")
    assert len(engine._variants) == 3
    # gradients through the cache's tensors, as torch computes them
    leaves = [t.detach().requires_grad_() for t in flatten(cache)[0]]
    grads = []
    for m in (engine, model):
        c = unflatten(flatten(cache)[1], leaves)
        h, c = m(step, c)
        (h.square().sum() + c.layers[1].values.sum()).backward()
        grads.append([t.grad.clone() for t in leaves])
        for t in leaves:
            t.grad = None
    for name, a, b in zip(paths(flatten(cache)[1], "cache"), *grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_a_cache_is_flattened_to_its_layers_and_rebuilt_through_its_api():
    cache_utils = pytest.importorskip("transformers.cache_utils")
    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    cache = cache_utils.DynamicCache([(k, v), (None, None), (k * 2, v * 2, torch.tensor(5))])
    tensors, structure = flatten({"cache": cache}, "input")
    assert paths(structure, "input") == [
        "input['cache'].layers[0].keys", "input['cache'].layers[0].values",
        "input['cache'].layers[2].keys", "input['cache'].layers[2].values"]
    assert structure.children[0].keys == ((None, True), (None, False), (5, True))
    rebuilt = unflatten(structure, [t + 1 for t in tensors])["cache"]
    assert rebuilt is not cache
    assert [type(layer) for layer in rebuilt.layers] == [type(layer) for layer in cache.layers]
    assert rebuilt.layers[1].keys is None and rebuilt.layers[2].sliding_window == 5
    assert rebuilt.get_seq_length(2) == cache.get_seq_length(2) == 3
    for a, b in zip(flatten(rebuilt)[0], tensors):
        assert torch.equal(a, b + 1)
    # given the call's caches, the same object, refilled
    same = unflatten(structure, [t * 3 for t in tensors], [cache])["cache"]
    assert same is cache and torch.equal(cache.layers[2].values, v * 6)


def test_caches_the_engine_cannot_take_are_named():
    cache_utils = pytest.importorskip("transformers.cache_utils")
    k = torch.randn(1, 2, 3, 4)
    encdec = cache_utils.EncoderDecoderCache(cache_utils.DynamicCache([(k, k)]),
                                             cache_utils.DynamicCache([(k, k)]))
    with pytest.raises(TypeError, match=r"input\['past'\] is a EncoderDecoderCache: "
                                        "the engine takes and returns transformers' "
                                        "DynamicCache"):
        flatten({"past": encdec}, "input")
    window = cache_utils.DynamicCache([(k, k, torch.tensor(2))])  # keeps 1 of 3 tokens
    with pytest.raises(TypeError, match=r"input\.layers\[0\]: a sliding-window layer that "
                                        "has dropped tokens"):
        flatten(window, "input")


# -- operators the TorchScript exporter lacks (bridge/symbolics.py) ----------
class Diff(torch.nn.Module):
    def __init__(self, n, dim, prepend, append):
        super().__init__()
        self.n, self.dim, self.prepend, self.append = n, dim, prepend, append

    def forward(self, x):
        # prepend/append: slices of x, so that their gradient counts too
        pre = x.narrow(self.dim, 0, self.prepend).flip(self.dim) if self.prepend else None
        post = x.narrow(self.dim, 1, self.append) if self.append else None
        return torch.diff(x, n=self.n, dim=self.dim, prepend=pre, append=post)


@pytest.mark.parametrize("dtype,n,dim,prepend,append", [
    (torch.float32, 1, -1, 0, 0), (torch.float32, 2, 1, 2, 1), (torch.float64, 3, 0, 0, 2),
    (torch.float32, 0, 1, 1, 0), (torch.int64, 1, -1, 1, 0), (torch.bool, 2, 2, 0, 1),
], ids=["n1", "n2-prepend-append", "n3-dim0-f64", "n0", "int64", "bool-xor"])
def test_torch_diff_exports_as_torch_computes_it(dtype, n, dim, prepend, append):
    model = Diff(n, dim, prepend, append)
    x = torch.randn(3, 6, 5, dtype=torch.float64).mul(4).round().to(dtype)
    engine = wrap(model, (x,))
    out, ref = engine(x), model(x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    if dtype.is_floating_point:
        xs = [x.clone().requires_grad_() for _ in range(2)]
        for m, xi in zip((engine, model), xs):
            m(xi).pow(2).sum().backward()
        torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=0, atol=0)


class CumSum(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return (x > 0).cumsum(1), x.to(torch.int32).cumsum(-1), x.cumsum(0, dtype=self.dtype)


def test_cumsum_of_bool_and_integers_is_in_int64_as_in_torch():
    x = torch.randn(3, 7).mul(3)
    model = CumSum(torch.float64)
    out, ref = wrap(model, (x,))(x), model(x)
    for a, b in zip(out, ref):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_added_symbolics_are_wrap_s_alone():
    """Registered for wrap's export only: torch's own export still lacks
    aten::diff after it, and a symbolic the user registered is used."""
    import io

    from torch.onnx._internal.torchscript_exporter import registration

    model, x = Diff(1, -1, 0, 0), torch.randn(2, 5)
    wrap(model, (x,))
    assert not registration.registry.is_registered_op("aten::diff", 20)
    with pytest.raises(Exception, match="diff"):
        torch.onnx.export(model, (x,), io.BytesIO(), dynamo=False, opset_version=20)

    def negated_diff(g, x, n, dim, prepend, append):  # a user's own, recognisable form
        return g.op("Neg", x)

    torch.onnx.register_custom_op_symbolic("aten::diff", negated_diff, 20)
    try:
        torch.testing.assert_close(wrap(model, (x,))(x), -x)
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::diff", 20)
