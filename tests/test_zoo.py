"""The model zoo (tests/models/zoo.py) through wrap(), as users bring models:
transformers models from tiny configs and plain torch modules, called with
their own inputs (int64 ids, masks, keyword arguments, ModelOutput results).

For every model: eval outputs against torch leaf by leaf; a call of another
batch and sequence length (or image size) through the same wrapped module;
three training steps (outputs, loss, input and parameter gradients, SGD)
with every dropout-like randomness off. Models the engine cannot take yet
are strict xfails carrying the reason."""
import pytest
import torch

from aidge_interop import wrap
from aidge_interop.bridge.structure import flatten, paths
from models.zoo import ZOO
from utils import ModelTester

pytest.importorskip("transformers")

RTOL, ATOL = 1e-5, 1e-6  # test_wrap_calls.py's _close

#: models that cannot run on the engine today, in every test: the error and why
#: (none today)
CANNOT_WRAP = {}
#: training that float32 cannot decide at 1e-5: torch's own float32 result
#: is further than that from the float64 one, and so is the engine's
TRAIN_FAILS = {
    "mobilenetv2_cls": (AssertionError, (
        "ill-conditioned in float32: BatchNorm on batch statistics of 2 samples at 1x1 "
        "spatial (variance 5e-8, eps 1e-3) and initializer_range 0.3 give gradients of 3e5; "
        "in float64, inputs moved by 2^-24 (relative) move the step-1 logits by 4e-4. "
        "Against float64, step-1 logits: torch float32 3.4e-3, the engine 5.2e-3 (over "
        "initializer_range 0.2-0.4 the engine is closer at 3 of 5); the two float32 results "
        "differ by 1.8e-3, by 3.5e-3 with the same exact BatchNorm in both (the convolutions' "
        "rounding). The engine's BatchNorm is not the cause: on these layers its error is "
        "3e-8 of float64, torch's up to 5e-6 (tests/test_ops_matmul_norm.py, tiny variance)")),
}


def _params(failing):
    """The zoo's names, those of ``failing`` ({name: (error, reason)}) as
    strict xfails: they must fail, and with that error."""
    return [pytest.param(name, marks=pytest.mark.xfail(raises=failing[name][0],
                                                       reason=failing[name][1], strict=True))
            if name in failing else name for name in ZOO]


def _close(out, ref, what):
    """``out`` against ``ref`` leaf by leaf: same structure and types;
    floats to rtol 1e-5 and atol 1e-6 times the leaf's largest magnitude
    (at least 1): logits of a few hundred are not held to 1e-6 absolute.
    Returns the largest error relative to the leaf's largest magnitude."""
    assert type(out) is type(ref), f"{what}: {type(out).__name__} != {type(ref).__name__}"
    to, so = flatten(out)
    tr, sr = flatten(ref)
    assert so == sr, f"{what}: structure {so} != {sr}"
    worst = 0.0
    for x, y, name in zip(to, tr, paths(sr, "output")):
        assert x.dtype == y.dtype and x.shape == y.shape, \
            f"{what} {name}: {x.dtype}{list(x.shape)} != {y.dtype}{list(y.shape)}"
        if not y.is_floating_point():
            assert torch.equal(x, y), f"{what} {name}"
            continue
        scale = max(1.0, y.abs().max().item())
        torch.testing.assert_close(x, y, rtol=RTOL, atol=ATOL * scale, msg=f"{what} {name}")
        worst = max(worst, (x - y).abs().max().item() / max(y.abs().max().item(), 1e-30))
    return worst


@pytest.mark.parametrize("name", _params(CANNOT_WRAP))
def test_zoo_eval(name):
    model, inputs = ZOO[name]()
    args, kwargs = inputs(2)
    engine = wrap(model, args, kwargs=kwargs)
    with torch.no_grad():
        err = _close(engine(*args, **kwargs), model(*args, **kwargs), f"{name} eval")
    print(f"[zoo] {name} eval: max rel error {err:.1e}")


@pytest.mark.parametrize("name", _params(CANNOT_WRAP))
def test_zoo_new_shape(name):
    """Batch 3 and another length (11 tokens, 40 x 40 images) through the
    wrapped module of the first example, then the first example again."""
    model, inputs = ZOO[name]()
    args, kwargs = inputs(2)
    engine = wrap(model, args, kwargs=kwargs)
    args2, kwargs2 = inputs(3, other_size=True, seed=1)
    with torch.no_grad():
        err = _close(engine(*args2, **kwargs2), model(*args2, **kwargs2), f"{name} batch 3")
        _close(engine(*args, **kwargs), model(*args, **kwargs), f"{name} first shape again")
    print(f"[zoo] {name} new shape: max rel error {err:.1e}")


@pytest.mark.parametrize("name", _params({**CANNOT_WRAP, **TRAIN_FAILS}))
def test_zoo_train(name):
    """Three steps in training mode (BatchNorm on batch statistics of 2
    samples; every dropout off in the config), each comparing outputs,
    loss, input gradients and every parameter gradient, then an SGD step."""
    model, inputs = ZOO[name](no_dropout=True)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    args, kwargs = inputs(2)
    engine = wrap(model, args, kwargs=kwargs)
    model.train()
    engine.train()
    tester = ModelTester(model, engine, name=f"{name}_train", benchmark=False,
                         relative_precision=RTOL, absolute_precision=ATOL)
    for step in range(3):
        args, kwargs = inputs(2, seed=step)
        tester.unit_test(args, None, input_kwargs=kwargs)
    worst = max(c.max_abs_diff for c in tester.checks)
    print(f"[zoo] {name} train: max abs error {worst:.1e} (step 3)")


@pytest.mark.parametrize("name, exporter", [("gpt2_lm", "torchscript"),
                                            ("llama_lm", "torchscript"), ("llama_lm", "dynamo")])
def test_zoo_greedy_generation_with_the_cache_fed_back(name, exporter):
    """The generation loop: the prompt, then 3 tokens each given with the
    cache the previous call returned (the model updates it in place, as in
    torch; each cache length is a signature of its own). Tokens exactly,
    logits and caches leaf by leaf."""
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    model, inputs = ZOO[name]()
    args, kwargs = inputs(2)
    engine = wrap(model, args, kwargs=kwargs, exporter=exporter)

    def generate(m):
        out = m(*args, **kwargs)
        steps, kw = [out], dict(kwargs)
        for _ in range(3):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            if "attention_mask" in kw:
                kw["attention_mask"] = torch.cat([kw["attention_mask"],
                                                  torch.ones_like(token)], 1)
            kw.pop("input_ids", None)
            cache = out.cache
            out = m(token, cache=cache, **kw)
            assert out.cache is cache
            steps.append(out)
        return steps

    with torch.no_grad():
        steps, ref = generate(engine), generate(model)
    for i, (out, expected) in enumerate(zip(steps, ref)):
        assert torch.equal(out.logits[:, -1].argmax(-1), expected.logits[:, -1].argmax(-1))
        _close(out, expected, f"{name} step {i}")
    prompt = (args[0] if args else kwargs["input_ids"]).shape[1]
    assert steps[-1].cache.get_seq_length() == prompt + 3


# The torch.export-based exporter (wrap(..., exporter="dynamo")), eval and a
# new shape. What it cannot take today, and why:
DYNAMO_FAILS = {}


@pytest.mark.parametrize("name", _params(DYNAMO_FAILS))
def test_zoo_dynamo_exporter(name):
    """wrap(..., exporter="dynamo"): the first example and batch 3 of another
    length, exact as with the TorchScript exporter."""
    pytest.importorskip("onnxscript")
    model, inputs = ZOO[name]()
    args, kwargs = inputs(2)
    engine = wrap(model, args, kwargs=kwargs, exporter="dynamo")
    args2, kwargs2 = inputs(3, other_size=True, seed=1)
    with torch.no_grad():
        err = _close(engine(*args, **kwargs), model(*args, **kwargs), f"{name} dynamo")
        err = max(err, _close(engine(*args2, **kwargs2), model(*args2, **kwargs2),
                              f"{name} dynamo, batch 3"))
    print(f"[zoo] {name} dynamo exporter: max rel error {err:.1e}")
