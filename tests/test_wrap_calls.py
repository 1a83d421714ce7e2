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


def test_an_operator_the_engine_lacks_is_named_with_what_to_try():
    pytest.importorskip("onnxscript")

    class Halves(torch.nn.Module):  # the dynamo exporter splits into a sequence
        def forward(self, x):
            return torch.split(x, 2, dim=1)

    with pytest.raises(NotImplementedError) as info:
        wrap(Halves(), (torch.randn(3, 4),), exporter="dynamo")
    message = str(info.value)
    assert "wrap(Halves): operator SplitToSequence (node '" in message
    assert "is not supported by the engine; the dynamo exporter writes one for torch.split" \
        in message


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
