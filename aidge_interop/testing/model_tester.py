"""``ModelTester``: a torch model and its engine twin, side by side, epoch by epoch.

::

    torch_model = torch.nn.Linear(16, 4)
    tester = ModelTester(torch_model, aidge_interop.wrap(torch_model, [(1, 16)]),
                         name="Linear_example", epochs=10)
    tester.test_multiple_step(input_sizes=(1, 16), label_sizes=(1, 4))

Each epoch feeds the same random inputs to both models (in ``model1``'s float
dtype; for a model without parameters, the one ``model2`` was wrapped for)
and compares, in this order, the outputs, the MSE loss against all-ones
labels, the input gradients and the gradient of every parameter (matched by
name); then one SGD step runs on each side (``torch.optim.SGD`` on
``model1``, the engine's :class:`aidge_interop.SGD` on ``model2``) so that
the two stay in lock-step.

Comparisons run in C (``aidge_interop._C.compare``, the
``torch.testing.assert_close`` rule, ``model2`` against ``model1``). Failure
messages start with ``<name>, epoch <i>/<N>, <tensor>:`` where ``<tensor>`` is
``output``, ``loss``, ``input gradient`` or ``gradient of parameter '<name>'``
(``[k]`` appended for the k-th of several), then read like assert_close's::

    LeNet_train, epoch 3/10, gradient of parameter 'conv1.weight': Tensor-likes are not close!

    Mismatched elements: 3 / 150 (2.0%)
    Greatest absolute difference: 0.0021 at index (0, 0, 4, 1) (up to 0.0001 allowed)
    Greatest relative difference: 0.013 at index (0, 0, 4, 1) (up to 0.001 allowed)

A value mismatch also carries a note (PEP 678: shown under the message in
tracebacks and pytest reports, not part of ``str(error)``) pointing to
:func:`aidge_interop.locate`, which finds the first diverging node.

A slowdown over ``max_slowdown_ratio`` fails with
``<name>: <phase> is <ratio>x slower than torch (...)``.
"""
from __future__ import annotations

import datetime
import itertools
import json
import os
import sys
import time

import numpy as np
import torch

from .. import _C
from .._util import EngineUnsupported
from ..bridge.optim import SGD
from ..bridge.structure import flatten, paths, unflatten
from .engines import DEFAULT_ENGINE, check_engine, engine_available, engine_model

__all__ = ["ModelTester"]

_PHASES = ("forward", "backward")


def _aidge_model_class():
    from ..compare.eclipse_aidge import AidgeModel

    return AidgeModel


def _aidge_sgd_class():
    from ..compare.eclipse_aidge import AidgeSGD

    return AidgeSGD


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _is_shape(sizes) -> bool:
    return isinstance(sizes, (tuple, list, torch.Size)) and all(
        isinstance(d, (int, np.integer)) for d in sizes)


def _describe(structure) -> str:
    """A structure in a few words: ``a tensor``, ``a tuple of 2``, ``a dict
    with keys ['a', 'b']``, ``a BaseModelOutput with fields [...]``."""
    if structure.kind == "tensor":
        return "a tensor"
    if structure.kind == "const":
        return f"{structure.value!r}"
    name = structure.cls.__name__ if structure.cls is not None else structure.kind
    if structure.kind in ("tuple", "list"):
        return f"a {name} of {len(structure.children)}"
    return f"a {name} with {'keys' if structure.kind == 'dict' else 'fields'} " \
           f"{list(structure.keys)}"


def _device(model: torch.nn.Module) -> torch.device:
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


def _float_dtype(model1: torch.nn.Module, model2: torch.nn.Module | None) -> torch.dtype:
    """The dtype of the random inputs: that of model1's float parameters and
    buffers; for a model1 without any, the float dtype model2 was wrapped
    for (its ``onnx_model``'s first float input), else float32."""
    for t in itertools.chain(model1.parameters(), model1.buffers()):
        if t.is_floating_point():
            return t.dtype
    from onnx import ModelProto, TensorProto

    floats = {TensorProto.FLOAT: torch.float32, TensorProto.DOUBLE: torch.float64,
              TensorProto.FLOAT16: torch.float16, TensorProto.BFLOAT16: torch.bfloat16}
    proto = getattr(model2, "onnx_model", None)
    for value in proto.graph.input if isinstance(proto, ModelProto) else ():
        if value.type.tensor_type.elem_type in floats:
            return floats[value.type.tensor_type.elem_type]
    return torch.float32


def append_record(path: str | os.PathLike, record: dict) -> None:
    """Appends ``record`` to the JSONL file ``path`` as one line, atomically.

    The whole line goes out in a single ``os.write`` on a descriptor opened
    with ``O_APPEND``: the kernel then moves the offset to the end of the file
    and writes the bytes as one step, so lines written at the same time by
    several processes (pytest-xdist workers) land one after the other, never
    torn or overwritten. This holds for regular files on local POSIX file
    systems; network file systems (NFS) do not guarantee it.
    """
    line = (json.dumps(record, allow_nan=False) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, line)
    finally:
        os.close(fd)
    if written != len(line):
        raise OSError(f"ModelTester: short write to {os.fspath(path)!r} "
                      f"({written} of {len(line)} bytes)")


class ModelTester:
    """Compares ``model2`` (the engine) with ``model1`` (the torch reference).

    Arguments as documented for the harness; in short: ``test_backward``
    also compares loss and gradients and trains both models; tolerances are
    ``relative_precision`` (rtol) and ``absolute_precision`` (atol);
    ``cuda=True`` runs ``model1`` on the GPU (an engine model stays on the
    CPU, where the engine runs) and synchronises around every timing;
    ``benchmark`` times forward and backward of every epoch after the first
    ``bench_warmup``, and :meth:`test_multiple_step` fails when the engine is
    more than ``max_slowdown_ratio`` times slower than torch in a phase whose
    torch time is at least ``bench_min_time_ms`` (``None``: record timings,
    assert nothing — what the package's own suites do unless asked, see
    the pytest option ``--max-slowdown-ratio``).

    ``optimizer2`` (keyword only) is the engine optimizer of ``model2``, e.g.
    the ``optimizer`` that :func:`make_operator_fixture` yields; its
    hyper-parameters (``optimizer2.defaults``: lr, momentum, ...) are used
    for the ``torch.optim.SGD`` of ``model1``, and its ``lr`` must equal
    ``learning_rate``. Without it, ``aidge_interop.SGD(model2, lr=learning_rate)``
    is built.

    Both models must have the same parameter names (``named_parameters()``);
    :func:`aidge_interop.wrap` keeps the torch names.

    ``engine`` (keyword only): what ``model2`` runs on, ``"aidge_interop"``
    (this package's engine) or ``"aidge"`` (Eclipse Aidge, see
    :mod:`aidge_interop.testing.engines`); by default the kind of
    ``model2``. It picks the default ``optimizer2`` and is written in the
    benchmark records. Without ``model2``, ModelTester wraps ``model1`` with
    ``engine`` itself, for the input shapes of the first step.
    """

    #: JSONL file that :meth:`test_multiple_step` appends one benchmark record
    #: per test to (``name``, ``forward``, ``backward``, ``timestamp``): pytest
    #: captures stdout, a file survives. ``None`` disables it. Safe with
    #: pytest-xdist (see :func:`append_record`).
    BENCH_LOG_FILE: str | None = "benchmarks.jsonl"

    def __init__(self, model1: torch.nn.Module, model2: torch.nn.Module | None = None,
                 name: str = "",
                 test_backward: bool = True, epochs: int = 10,
                 relative_precision: float = 0.001, absolute_precision: float = 0.0001,
                 learning_rate: float = 0.01, cuda: bool = False, benchmark: bool = True,
                 max_slowdown_ratio: float | None = 10.0, bench_warmup: int = 2,
                 bench_print: bool = True, bench_min_time_ms: float = 0.1, *,
                 optimizer2=None, engine: str | None = None):
        for arg, model in (("model1", model1), ("model2", model2)):
            if not (isinstance(model, torch.nn.Module) or arg == "model2" and model is None):
                raise TypeError(f"ModelTester: argument '{arg}' must be a torch.nn.Module, "
                                f"not {type(model).__name__}")
        self.name = name or type(model1).__name__
        if engine is None:
            engine = "aidge" if isinstance(model2, _aidge_model_class()) else DEFAULT_ENGINE
        self.engine = check_engine(engine, f"ModelTester({self.name})")
        if epochs < 1 or bench_warmup < 0:
            raise ValueError(f"ModelTester({self.name}): epochs must be >= 1 and bench_warmup "
                             f">= 0, got epochs={epochs}, bench_warmup={bench_warmup}")
        if relative_precision < 0 or absolute_precision < 0:
            raise ValueError(f"ModelTester({self.name}): tolerances must be >= 0, got "
                             f"relative_precision={relative_precision}, "
                             f"absolute_precision={absolute_precision}")
        if cuda and not torch.cuda.is_available():
            raise RuntimeError(f"ModelTester({self.name}): cuda=True but CUDA is not "
                               "available (torch.cuda.is_available() is False)")
        self.model1 = model1.to("cuda") if cuda else model1
        self.test_backward = test_backward
        self.epochs = epochs
        self.relative_precision = relative_precision
        self.absolute_precision = absolute_precision
        self.learning_rate = learning_rate
        self.cuda = cuda
        self.benchmark = benchmark
        self.max_slowdown_ratio = max_slowdown_ratio
        self.bench_warmup = bench_warmup
        self.bench_print = bench_print
        self.bench_min_time_ms = bench_min_time_ms
        self.dtype = _float_dtype(model1, model2)
        self.model2 = self.optimizer1 = self.optimizer2 = None
        if model2 is not None:
            self._attach(model2, optimizer2)
        elif optimizer2 is not None:
            raise ValueError(f"ModelTester({self.name}): optimizer2 without model2 (ModelTester "
                             "wraps model1 and makes its optimizer itself)")
        self._times = {phase: ([], []) for phase in _PHASES}  # seconds, (model1, model2)
        self.checks = []  # divergence.Check of every tensor compared by the last unit_test
        self.skipped = []  # what the last unit_test could not compare, and why
        self._where = self.name

    def _attach(self, model2: torch.nn.Module, optimizer2) -> None:
        """Takes ``model2`` (checked against model1) and its optimizer
        (``optimizer2``, else the engine's SGD when training)."""
        names1 = [n for n, _ in self.model1.named_parameters()]
        names2 = [n for n, _ in model2.named_parameters()]
        if set(names1) != set(names2):
            only1 = [n for n in names1 if n not in names2]
            only2 = [n for n in names2 if n not in names1]
            raise ValueError(f"ModelTester({self.name}): the models' parameter names differ: "
                             f"only in model1: {only1}, only in model2: {only2}")
        self.model2 = model2
        self.dtype = _float_dtype(self.model1, model2)
        if self.test_backward and any(p.requires_grad for p in model2.parameters()):
            if optimizer2 is None:
                optimizer2 = (_aidge_sgd_class() if self.engine == "aidge" else SGD)(
                    model2, lr=self.learning_rate)
            elif optimizer2.defaults["lr"] != self.learning_rate:
                raise ValueError(f"ModelTester({self.name}): optimizer2 has lr="
                                 f"{optimizer2.defaults['lr']} but learning_rate="
                                 f"{self.learning_rate}: the two models would not train alike")
            self.optimizer1 = torch.optim.SGD(self.model1.parameters(), **optimizer2.defaults)
            self.optimizer2 = optimizer2

    def _wrap(self, inputs: tuple, kwargs: dict) -> None:
        """model2 = model1 wrapped by ``engine`` for the shapes of the first
        call's inputs (float tensors, positional)."""
        if kwargs or not all(isinstance(x, torch.Tensor) and x.is_floating_point()
                             for x in inputs):
            raise ValueError(f"ModelTester({self.name}): without model2, the inputs must be "
                             "float tensors, given positionally (wrap model1 yourself for "
                             "other calls)")
        ok, reason = engine_available(self.engine)
        if not ok:
            raise EngineUnsupported(f"ModelTester({self.name}): {reason}")
        model2, _ = engine_model(self.engine, self.model1, inputs, False, self.learning_rate)
        self._attach(model2.train(self.model1.training), None)

    # -- one step ----------------------------------------------------------
    def unit_test(self, input_tensors, label, record_timing: bool = False,
                  input_kwargs: dict | None = None) -> None:
        """One forward pass (and, with ``test_backward``, loss, backward and an
        SGD step) of both models on ``input_tensors`` (a tensor or a
        sequence, one per positional model input, of any dtype) and keyword
        inputs ``input_kwargs``; ``label`` is the loss target (a tensor, one
        per float output tensor, or ``None`` for all ones). Outputs of any
        structure (tuples, dicts, dataclasses, transformers' ``ModelOutput``)
        are compared tensor by tensor, each named by its place
        (``output.logits``). Float inputs require grad and their gradients
        are compared, unless ``model1`` refuses it (it changes its inputs in
        place): then ``skipped`` says so. Raises :class:`AssertionError` at
        the first tensor that differs."""
        if self.model2 is None:
            self._wrap(_as_tuple(input_tensors), dict(input_kwargs or {}))
        if self.model1.training != self.model2.training:
            mode = {True: "train", False: "eval"}
            raise ValueError(f"{self._where}: model1 is in {mode[self.model1.training]} mode, "
                             f"model2 in {mode[self.model2.training]} mode")
        self.checks = []
        self.skipped = []
        call = (_as_tuple(input_tensors), dict(input_kwargs or {}))
        if self.optimizer1 is not None:
            self.optimizer1.zero_grad()
            self.optimizer2.zero_grad()

        with torch.set_grad_enabled(self.test_backward):
            grads = self.test_backward
            (a1, k1), leaves1 = self._inputs(call, _device(self.model1), grads)
            try:
                out1, t1 = self._timed(self.model1, *a1, **k1)
            except RuntimeError as exc:
                if not grads or "requires_grad" not in str(exc):
                    raise
                grads = False  # the model changes its input in place: no input gradients
                self.skipped.append(f"input gradients: model1 refuses inputs that require "
                                    f"grad ({str(exc).splitlines()[0]})")
                (a1, k1), leaves1 = self._inputs(call, _device(self.model1), grads)
                out1, t1 = self._timed(self.model1, *a1, **k1)
            (a2, k2), leaves2 = self._inputs(call, _device(self.model2), grads)
            out2, t2 = self._timed(self.model2, *a2, **k2)
        outs1, structure1 = flatten(out1, "output of model1")
        outs2, structure2 = flatten(out2, "output of model2")
        if structure1 != structure2:
            self._fail("output", f"model2 returns {_describe(structure2)}, model1 "
                                 f"{_describe(structure1)}")
        names = paths(structure1, "output")
        for name, a, e in zip(names, outs2, outs1):
            self._check(name, a, e)
        if record_timing:
            self._record("forward", t1, t2)
        if not self.test_backward:
            return

        floats = [i for i, o in enumerate(outs1) if o.is_floating_point()]
        labels = (tuple(torch.ones_like(outs1[i]) for i in floats) if label is None
                  else _as_tuple(label))
        if len(labels) != len(floats):
            raise ValueError(f"{self._where}: {len(labels)} label(s) for "
                             f"{len(floats)} float output(s)")
        loss1 = self._loss([outs1[i] for i in floats], labels)
        loss2 = self._loss([outs2[i] for i in floats], labels)
        self._check("loss", loss2, loss1)
        _, t1 = self._timed(loss1.backward)
        _, t2 = self._timed(loss2.backward)
        inputs_with_grad = [i for i, x in enumerate(leaves1) if x.requires_grad]
        for i in inputs_with_grad:
            what = "input gradient" if len(inputs_with_grad) == 1 else f"input gradient[{i}]"
            self._check(what, leaves2[i].grad, leaves1[i].grad)
        params2 = dict(self.model2.named_parameters())
        for pname, p1 in self.model1.named_parameters():
            self._check(f"gradient of parameter '{pname}'", params2[pname].grad, p1.grad)
        if record_timing:
            self._record("backward", t1, t2)
        if self.optimizer1 is not None:
            self.optimizer1.step()
            self.optimizer2.step()

    def _inputs(self, call, device, grads: bool):
        """A fresh copy of the call's inputs on ``device`` (float tensors
        requiring grad when ``grads``), and its tensors in order."""
        tensors, structure = flatten(call, "input")
        copies = [x.detach().to(device, copy=True) for x in tensors]
        for x in copies:
            if grads and x.is_floating_point():
                x.requires_grad_()
        return unflatten(structure, copies), copies

    @staticmethod
    def _loss(outputs, labels) -> torch.Tensor:
        return sum(torch.nn.functional.mse_loss(o, lab.to(o.device, o.dtype))
                   for o, lab in zip(outputs, labels))

    def _timed(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` and its wall-clock time in seconds."""
        self._sync()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        self._sync()
        return result, time.perf_counter() - start

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _record(self, phase: str, t1: float, t2: float) -> None:
        self._times[phase][0].append(t1)
        self._times[phase][1].append(t2)

    # -- comparisons -------------------------------------------------------
    def _check(self, what: str, actual, expected) -> None:
        """``actual`` (model2) against ``expected`` (model1): metadata first,
        then values (torch.testing.assert_close's rule and wording)."""
        if actual is None or expected is None:
            if actual is not expected:
                has, lacks = ("model1", "model2") if actual is None else ("model2", "model1")
                self._fail(what, f"{has} computes it, {lacks} does not (None)")
            return
        for attr in ("shape", "dtype"):
            if getattr(actual, attr) != getattr(expected, attr):
                self._record_check(what, tuple(expected.shape), problem=(
                    f"{attr} {getattr(actual, attr)} in model2, {getattr(expected, attr)} "
                    "in model1"))
                self._fail(what, f"The values for attribute '{attr}' do not match: "
                                 f"{getattr(actual, attr)} != {getattr(expected, attr)}.")
        rtol, atol = self.relative_precision, self.absolute_precision
        r = _C.compare(actual.detach().cpu(), expected.detach().cpu(), rtol, atol)
        self._record_check(what, tuple(actual.shape), r)
        if not r["mismatches"]:
            return
        close = "equal" if rtol == atol == 0 else "close"  # assert_close's wording
        if actual.dim() == 0:
            lines = [f"Scalars are not {close}!", "",
                     f"Expected {expected.item()} but got {actual.item()}."]
        else:
            n, m = r["numel"], r["mismatches"]
            lines = [f"Tensor-likes are not {close}!", "",
                     f"Mismatched elements: {m} / {n} ({m / n:.1%})"]
        for kind, tol in (("absolute", atol), ("relative", rtol)):
            diff = r[f"max_{kind[:3]}_diff"]
            if actual.dim() == 0:
                line = f"{kind.title()} difference: {diff}"
            else:
                flat = r[f"max_{kind[:3]}_index"]
                index = tuple(int(i) for i in np.unravel_index(flat, tuple(actual.shape)))
                line = f"Greatest {kind} difference: {diff} at index {index}"
            lines.append(line + (f" (up to {tol} allowed)" if tol > 0 else ""))
        train = self.model1.training or not what.startswith("output")
        self._fail(what, "\n".join(lines), note=(
            "To find the first diverging node: aidge_interop.locate(model, inputs"
            + (", train=True) or `aidge-interop locate MODEL --train`" if train
               else ") or `aidge-interop locate MODEL`")))

    def _record_check(self, what: str, shape: tuple, r: dict | None = None,
                      problem: str = "") -> None:
        """Keeps the figures of one comparison (``_C.compare``'s ``r``, or a
        metadata ``problem``) in ``checks``: the tensors of the last
        :meth:`unit_test`, in order (pictures colour nodes with them, see
        :func:`aidge_interop.visualize.value_errors`)."""
        from ..compare.locate import Check

        if r is None:
            self.checks.append(Check(what, what, shape, problem=problem))
            return

        def index(flat):
            return None if flat is None or not shape else tuple(
                int(i) for i in np.unravel_index(flat, shape))

        self.checks.append(Check(what, what, shape, r["numel"], r["mismatches"],
                                 r["max_abs_diff"], index(r["max_abs_index"]),
                                 r["max_rel_diff"], index(r["max_rel_index"])))

    def _fail(self, what: str, message: str, note: str = ""):
        error = AssertionError(f"{self._where}, {what}: {message}")
        if note:
            error.add_note(note)
        raise error

    # -- epochs ------------------------------------------------------------
    def test_multiple_step(self, input_sizes, label_sizes=None) -> None:
        """Runs :meth:`unit_test` for ``epochs`` epochs on fresh random inputs
        of ``input_sizes`` (a shape, or a list of shapes, one per input) and,
        when training, all-ones labels of ``label_sizes`` (a shape or list of
        shapes; ``None``: the outputs' shapes). Every AssertionError names its
        epoch. Then, with ``benchmark``, prints and logs the timings and
        checks the slowdown."""
        shapes = [tuple(input_sizes)] if _is_shape(input_sizes) else [tuple(s) for s in input_sizes]
        labels = None
        if self.test_backward and label_sizes is not None:
            label_shapes = ([label_sizes] if _is_shape(label_sizes) else list(label_sizes))
            labels = [torch.ones(tuple(s), dtype=self.dtype) for s in label_shapes]
        gen = torch.Generator().manual_seed(0)
        progress = _Progress(self.name, self.epochs)
        try:
            for epoch in range(1, self.epochs + 1):
                self._where = f"{self.name}, epoch {epoch}/{self.epochs}"
                inputs = [torch.randn(s, generator=gen, dtype=self.dtype) for s in shapes]
                try:
                    self.unit_test(inputs, labels,
                                   record_timing=self.benchmark and epoch > self.bench_warmup)
                except AssertionError as exc:
                    if str(exc).startswith(self._where):
                        raise
                    raise AssertionError(f"{self._where}: {exc}").with_traceback(
                        exc.__traceback__) from None
                progress.update(epoch, self._times)
        finally:
            self._where = self.name
            progress.close()
        if self.benchmark:
            self._report_benchmark()

    # -- benchmark ---------------------------------------------------------
    def performance_stats(self) -> dict:
        """``{"forward": {...}, "backward": {...}}``, each with ``mean1``
        (torch), ``mean2`` (engine), in seconds, ``ratio`` (mean2 / mean1)
        and ``samples``; means and ratio are ``None`` without samples (no
        timed epoch, or a phase that was not run)."""
        stats = {}
        for phase, (t1, t2) in self._times.items():
            mean1 = sum(t1) / len(t1) if t1 else None
            mean2 = sum(t2) / len(t2) if t2 else None
            ratio = mean2 / mean1 if t1 and mean1 > 0 else None
            stats[phase] = {"mean1": mean1, "mean2": mean2, "ratio": ratio, "samples": len(t1)}
        return stats

    def _report_benchmark(self) -> None:
        stats = self.performance_stats()
        if self.bench_print:
            parts = [f"{phase} {s['mean1'] * 1e3:.3f} ms torch, {s['mean2'] * 1e3:.3f} ms "
                     f"engine ({s['ratio']:.2f}x)"
                     for phase, s in stats.items() if s["ratio"] is not None]
            print(f"[bench] {self.name}: " + ("; ".join(parts) or "no timed epoch"))
        if self.BENCH_LOG_FILE is not None:
            append_record(self.BENCH_LOG_FILE, {
                "name": self.name, "engine": self.engine, **stats,
                "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"),
            })
        for phase, s in stats.items():
            if s["ratio"] is None or s["mean1"] * 1e3 < self.bench_min_time_ms:
                continue  # overhead-dominated: the ratio means nothing
            if self.max_slowdown_ratio is not None and s["ratio"] > self.max_slowdown_ratio:
                raise AssertionError(
                    f"{self.name}: {phase} is {s['ratio']:.2f}x slower than torch "
                    f"(engine {s['mean2'] * 1e3:.3f} ms, torch {s['mean1'] * 1e3:.3f} ms, mean "
                    f"of {s['samples']} epochs; at most {self.max_slowdown_ratio}x allowed)")


class _Progress:
    """One self-rewriting line on stderr (epoch i/N, latest ratios) when
    stderr is a terminal; silent under pytest's capture or a pipe."""

    def __init__(self, name: str, epochs: int):
        self.name, self.epochs = name, epochs
        self.active = sys.stderr.isatty()

    def update(self, epoch: int, times: dict) -> None:
        if not self.active:
            return
        ratios = [f"{phase} {t2[-1] / t1[-1]:.2f}x" for phase, (t1, t2) in times.items()
                  if t1 and t1[-1] > 0]
        sys.stderr.write(f"\r\x1b[K{self.name}: epoch {epoch}/{self.epochs}"
                         + (f", last ratio {', '.join(ratios)}" if ratios else ""))
        sys.stderr.flush()

    def close(self) -> None:
        if self.active:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
