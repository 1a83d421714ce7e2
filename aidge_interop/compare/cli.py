"""The ``aidge-interop`` command (also ``python -m aidge_interop``).

::

    aidge-interop compare lenet --train
    aidge-interop compare mypackage.nets:make_net --shape 8,3,32,32 --json out.json
    aidge-interop compare nets.py:make_net --shape 1,16 --backends torch,aidge_interop
    aidge-interop compare model.onnx --plot latency.png
    aidge-interop locate --help
    aidge-interop show resnet8 --recipes all --out resnet8.svg

``compare`` runs one model on several engines (:mod:`aidge_interop.compare.engines`)
on the same random input, times each on the same number of threads, and
prints per engine the latency (min / median / max) and the output's error
against the reference: torch, or ONNX Runtime for an ONNX file. ``--train``
also times a training step where the engine can train (torch, our engine,
Eclipse Aidge with ``aidge_learning``) and compares the loss and gradients
of the first step. Progress goes to
stderr when it is a terminal.

Exit status: 0; 1 when an engine failed, or a backend named in
``--backends`` is unavailable; 2 for a usage error (one line on stderr).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import io
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from .. import __version__
from .._util import Progress, UsageError, check_output, finite, int_arg, one_line, write_atomic
from .engines import BACKENDS
from .target import Target, load_model, model_arguments

__all__ = ["main", "compare", "load_model", "output_errors", "render", "plot_report",
           "UsageError", "Target"]

TRAINABLE = ("torch", "aidge_interop", "aidge")  # engines with a backward and an optimizer
LEARNING_RATE = 0.01


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other usage error
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# -- arguments --------------------------------------------------------------------------

def _backends_arg(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in BACKENDS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown backend {', '.join(map(repr, unknown)) or repr(text)} "
            f"(known: {', '.join(BACKENDS)})")
    return list(dict.fromkeys(keys))


# -- measuring --------------------------------------------------------------------------

def _timed(fn, repeat: int, warmup: int, progress: Progress, what: str):
    """Runs ``fn`` warmup + repeat times on THREADS threads; returns the
    timed samples (ms) and the last result. Progress is written between calls."""
    from . import engines

    samples, result = [], None
    with engines.limited_threads():
        for i in range(warmup):
            progress.update(f"{what}: warm-up {i + 1}/{warmup}")
            fn()
        for i in range(repeat):
            progress.update(f"{what}: run {i + 1}/{repeat}")
            start = time.perf_counter()
            result = fn()
            samples.append((time.perf_counter() - start) * 1e3)
    return samples, result


def _latency(samples: list[float]) -> dict:
    return {"min": min(samples), "median": float(np.median(samples)), "max": max(samples)}


def output_errors(actual, reference) -> dict:
    """``max_abs`` = max |a - r|; ``max_rel`` = max |a - r| / max |r| (None
    when r is all zeros; element-wise ratios would blow up on the elements
    near zero); ``cosine`` = cosine similarity of the flattened arrays (1 for
    two zero arrays). Computed in float64."""
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if a.shape != r.shape:
        raise ValueError(f"output shape {a.shape} differs from the reference's {r.shape}")
    diff = np.abs(a - r)
    scale = float(np.abs(r).max()) if r.size else 0.0
    norms = float(np.linalg.norm(a) * np.linalg.norm(r))
    if norms > 0:
        cosine = float(np.dot(a.ravel(), r.ravel()) / norms)
    else:
        cosine = 1.0 if not a.any() and not r.any() else 0.0
    max_abs = float(diff.max()) if diff.size else 0.0
    return {"max_abs": max_abs, "max_rel": max_abs / scale if scale > 0 else None,
            "cosine": cosine}


def _train_step(key: str, target: Target):
    """A training step of ``key`` on a fresh copy of the model: a function
    ``(x, capture) -> (loss, {name: grad} or None)`` doing zero_grad,
    forward, MSE loss against all-ones labels (ModelTester's), backward, SGD."""
    import copy

    import torch

    if key == "torch":
        model = copy.deepcopy(target.model).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    elif key == "aidge":
        from .eclipse_aidge import AidgeModel, AidgeSGD

        model = AidgeModel(target.model, [target.shape]).train()
        optimizer = AidgeSGD(model, lr=LEARNING_RATE)
    else:
        from ..bridge import SGD, wrap

        model = wrap(target.model, [target.shape]).train()
        optimizer = SGD(model, lr=LEARNING_RATE)

    def step(x, capture=False):
        optimizer.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, torch.ones_like(out))
        loss.backward()
        grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()
                 if p.grad is not None} if capture else None
        optimizer.step()
        return loss, grads

    return step


def _train_case(key, target, x, repeat, warmup, progress, reference):
    """Times training steps of ``key``; compares its first step (same weights
    on both sides) with the reference's."""
    import torch

    progress.update(f"{BACKENDS[key]}: preparing a training step", force=True)
    step = _train_step(key, target)
    xt = torch.from_numpy(x)
    loss, grads = step(xt, capture=True)
    loss = loss.item()
    samples, _ = _timed(lambda: step(xt), repeat, warmup, progress, f"{BACKENDS[key]} (training)")
    entry = {"latency_ms": _latency(samples), "samples_ms": samples, "loss": loss,
             "loss_abs_error": None, "grad_error": None}
    if reference is not None and key != "torch":
        ref_loss, ref_grads = reference
        missing = [n for n in ref_grads if n not in grads]
        if missing:
            raise ValueError(f"no gradient for parameter(s) {missing}")
        entry["loss_abs_error"] = abs(loss - ref_loss)
        entry["grad_error"] = output_errors(np.concatenate([grads[n].ravel() for n in ref_grads]),
                                            np.concatenate([g.ravel() for g in ref_grads.values()]))
    return entry, (loss, grads)


INT8_CALIBRATION = 64  # normal samples the --int8 rows calibrate on


def _int8_runners(target: Target, seed: int) -> dict:
    """The --int8 rows: ``target`` quantized by :func:`aidge_interop.quantize`
    (calibrated on INT8_CALIBRATION normal samples) run by the engine, and its
    QDQ export (``to_onnx_qdq``) by ONNX Runtime."""
    from ..quant import quantize
    from . import engines

    shape = (INT8_CALIBRATION, *target.shape[1:])
    calibration = np.random.default_rng(seed + 1).standard_normal(shape).astype(target.dtype)
    q = quantize(target.model, [calibration])
    runners = {"aidge_interop int8": lambda x: q(x)[0]}
    if engines.available("onnxruntime")[0]:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = engines.THREADS, 1
        session = ort.InferenceSession(q.to_onnx_qdq().SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        name = q.input_names[0]
        runners["onnxruntime int8 (QDQ)"] = lambda x: session.run(None, {name: x})[0]
    return runners


def compare(target: Target, keys: list[str], *, repeat: int = 20, warmup: int = 3,
            train: bool = False, seed: int = 0, progress: Progress | None = None,
            int8: bool = False) -> dict:
    """Runs ``target`` on the backends ``keys`` (the first one is the
    reference) and returns the report (what ``--json`` writes). An engine
    that is unavailable or fails gets ``status`` "unavailable" or "failed"
    and a ``reason``; the others get latencies and errors. With ``int8``,
    rows for the model quantized to int8 follow (:func:`_int8_runners`)."""
    from . import engines

    progress = progress or Progress(io.StringIO())
    x = np.random.default_rng(seed).standard_normal(target.shape).astype(target.dtype)
    reference, ref_out, ref_train = keys[0], None, None
    entries = []
    for key in keys:
        entry = {"backend": key, "name": BACKENDS[key], "status": "ok", "reason": ""}
        entries.append(entry)
        ok, reason = engines.available(key)
        if not ok:
            entry.update(status="unavailable", reason=reason)
            continue
        try:
            progress.update(f"{BACKENDS[key]}: preparing", force=True)
            start = time.perf_counter()
            run = engines.get_runner(key, target.model, target.shape)
            entry["prepare_ms"] = (time.perf_counter() - start) * 1e3
            samples, out = _timed(lambda: run(x), repeat, warmup, progress, BACKENDS[key])
            entry.update(latency_ms=_latency(samples), samples_ms=samples, error=None)
            if key == reference:
                ref_out = out
            elif ref_out is not None:
                entry["error"] = output_errors(out, ref_out)
        except Exception as exc:
            entry.update(status="failed", reason=one_line(exc))
        if train and key == "aidge" and importlib.util.find_spec("aidge_learning") is None:
            entry["train"] = {"status": "unavailable", "reason": "Eclipse Aidge trains with "
                              "aidge_learning: pip install aidge-learning==0.10.1"}
        elif train and key in TRAINABLE:
            try:
                entry["train"], result = _train_case(key, target, x, repeat, warmup, progress,
                                                     ref_train)
                ref_train = result if key == reference else ref_train
            except Exception as exc:
                entry["train"] = {"status": "failed", "reason": one_line(exc)}
    if int8:
        try:
            progress.update("int8: quantizing", force=True)
            runners = _int8_runners(target, seed)
        except Exception as exc:
            entries.append({"backend": "int8", "name": "int8", "status": "failed",
                            "reason": one_line(exc)})
            runners = {}
        for name, run in runners.items():
            entry = {"backend": name, "name": name, "status": "ok", "reason": ""}
            entries.append(entry)
            try:
                samples, out = _timed(lambda: run(x), repeat, warmup, progress, name)
                entry.update(latency_ms=_latency(samples), samples_ms=samples,
                             error=None if ref_out is None else output_errors(out, ref_out))
            except Exception as exc:
                entry.update(status="failed", reason=one_line(exc))
    progress.close()
    return {
        "model": target.label, "kind": target.kind, "input_shape": list(target.shape),
        "dtype": target.dtype.name, "reference": reference, "threads": engines.THREADS,
        "repeat": repeat, "warmup": warmup, "seed": seed,
        "train": {"loss": "mse against ones", "optimizer": "SGD", "lr": LEARNING_RATE}
        if train else None,
        "versions": _versions(), "engines": entries,
    }


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "machine": platform.machine()}
    for dist in ("aidge_interop", "torch", "onnx", "onnxruntime", "aidge_core",
                 "aidge_backend_cpu", "aidge_onnx", "aidge_learning"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


# -- output ---------------------------------------------------------------------------

def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(max(map(len, rows)))]
    return ["  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                      for i, c in enumerate(r)).rstrip() for r in rows]


def render(report: dict) -> str:
    """The report as the table ``compare`` prints."""
    ref = BACKENDS[report["reference"]]
    shape = "x".join(map(str, report["input_shape"]))
    threads = report["threads"]
    lines = [f"{report['model']}: input {shape} {report['dtype']}, {threads} thread"
             f"{'s' if threads > 1 else ''}, {report['warmup']} warm-up + {report['repeat']} "
             f"timed runs; errors against {ref}", ""]
    rows = [["inference", "min ms", "median ms", "max ms", "max abs", "max rel", "cosine"]]
    notes = []
    for e in report["engines"]:
        if e["status"] != "ok":
            rows.append([e["name"], e["status"]])
            notes.append(f"{e['name']} {e['status']}: {e['reason']}")
            continue
        lat, err = e["latency_ms"], e["error"]
        row = [e["name"], f"{lat['min']:.3f}", f"{lat['median']:.3f}", f"{lat['max']:.3f}"]
        if e["backend"] == report["reference"]:
            row.append("reference")
        elif err:
            row += [_fmt(err["max_abs"], ".2e"), _fmt(err["max_rel"], ".2e"),
                    _fmt(err["cosine"], ".9f")]
        rows.append(row)
    lines += _table(rows)
    trained = [e for e in report["engines"] if "train" in e]
    if trained:
        t = report["train"]
        lines += ["", f"training step: forward, {t['loss']}, backward, {t['optimizer']} "
                      f"lr {t['lr']}; errors of the first step"]
        rows = [["training", "min ms", "median ms", "max ms", "loss abs", "grad max abs",
                 "grad max rel", "grad cosine"]]
        for e in trained:
            tr = e["train"]
            if "status" in tr:
                rows.append([e["name"], tr["status"]])
                notes.append(f"{e['name']} training {tr['status']}: {tr['reason']}")
                continue
            lat, err = tr["latency_ms"], tr["grad_error"]
            row = [e["name"], f"{lat['min']:.3f}", f"{lat['median']:.3f}", f"{lat['max']:.3f}"]
            if e["backend"] == report["reference"]:
                row.append("reference")
            elif err:
                row += [_fmt(tr["loss_abs_error"], ".2e"), _fmt(err["max_abs"], ".2e"),
                        _fmt(err["max_rel"], ".2e"), _fmt(err["cosine"], ".9f")]
            rows.append(row)
        lines += _table(rows)
    if notes:
        lines += [""] + notes
    return "\n".join(lines) + "\n"


def _plot_format(path: str) -> str:
    """The image format of ``path`` (from its extension), checked before the
    comparison runs: matplotlib missing or an unknown format is a UsageError."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed: pip install "
                         "matplotlib (or pip install 'aidge_interop[plot]')") from None
    fmt = Path(path).suffix[1:].lower()
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise UsageError(f"--plot {path!r}: unknown image format {fmt!r} "
                         f"(use one of {', '.join(sorted(supported))})")
    return fmt


def plot_report(report: dict, path: str) -> None:
    """Two panels: latency per engine (median bars, min-max whiskers, log
    scale; inference and training) and error against the reference (max abs
    and max rel, log scale; an exact 0 is written on the axis). Written atomically."""
    from matplotlib.figure import Figure

    fmt = _plot_format(path)
    ran = [e for e in report["engines"] if e["status"] == "ok"]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_time, ax_err = fig.subplots(1, 2)
    width = 0.4
    for k, (phase, colour) in enumerate((("inference", "tab:blue"), ("training", "tab:orange"))):
        xs, med, lo, hi = [], [], [], []
        for i, e in enumerate(ran):
            lat = e["latency_ms"] if phase == "inference" else e.get("train", {}).get("latency_ms")
            if lat:
                xs.append(i + (k - 0.5) * width)
                med.append(lat["median"])
                lo.append(lat["median"] - lat["min"])
                hi.append(lat["max"] - lat["median"])
        if xs:
            ax_time.bar(xs, med, width, yerr=[lo, hi], capsize=3, color=colour, label=phase)
    ax_time.set_xticks(range(len(ran)), [e["name"] for e in ran], rotation=15, ha="right")
    ax_time.set_yscale("log")
    ax_time.set_ylabel("latency, ms (median; min-max)")
    ax_time.set_title(f"{report['model']}, {report['threads']} thread(s)")
    ax_time.legend(fontsize="small")
    others = [e for e in ran if e["error"]]
    for k, (metric, colour) in enumerate((("max_abs", "tab:green"), ("max_rel", "tab:red"))):
        for i, e in enumerate(others):
            value, x = e["error"][metric], i + (k - 0.5) * width
            if value:
                ax_err.bar(x, value, width, color=colour,
                           label=metric.replace("_", " ") if i == 0 else None)
            else:
                ax_err.annotate("0" if value == 0 else "-", (x, 0), ha="center", va="bottom",
                                xycoords=("data", "axes fraction"), color=colour)
    ax_err.set_xticks(range(len(others)), [e["name"] for e in others], rotation=15, ha="right")
    ax_err.set_yscale("log")
    ax_err.set_ylabel(f"output error against {BACKENDS[report['reference']]}")
    ax_err.set_title("inference output error")
    if ax_err.get_legend_handles_labels()[0]:
        ax_err.legend(fontsize="small")
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=120)
    write_atomic(path, buffer.getvalue())


# -- commands -------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_aidge(used: bool):
    """Eclipse Aidge's console log at Fatal while the body runs (its warnings
    would cut through the table), its level as it was afterwards."""
    from . import engines

    if not (used and engines.available("aidge")[0]):
        yield
        return
    import aidge_core

    level = aidge_core.Log.get_console_level()
    aidge_core.Log.set_console_level(aidge_core.Level.Fatal)
    try:
        yield
    finally:
        aidge_core.Log.set_console_level(level)


def _compare_command(args) -> int:
    from . import engines

    check_output("--json", args.json)
    check_output("--plot", args.plot)
    if args.plot:
        _plot_format(args.plot)
    target = load_model(args.model, args.shape, args.seed)
    reference = "onnxruntime" if target.kind == "onnx" else "torch"
    if target.kind == "onnx":
        if args.train:
            raise UsageError("--train needs a torch model (an example or module:callable), "
                             "not an ONNX file")
        if args.backends and "torch" in args.backends:
            raise UsageError("torch cannot run an ONNX file; its reference is onnxruntime")
    keys = args.backends or [k for k in BACKENDS if not (k == "torch" and target.kind == "onnx")]
    keys = [reference] + [k for k in keys if k != reference]
    with _quiet_aidge("aidge" in keys):
        saved, engines.THREADS = engines.THREADS, args.threads
        try:
            report = compare(target, keys, repeat=args.repeat, warmup=args.warmup,
                             train=args.train, seed=args.seed, progress=Progress(),
                             int8=args.int8)
        finally:
            engines.THREADS = saved
    sys.stdout.write(render(report))
    if args.json:
        text = json.dumps(finite(report), indent=2, allow_nan=False) + "\n"
        write_atomic(args.json, text.encode())
    if args.plot:
        plot_report(report, args.plot)
    failed = any(e["status"] == "failed" or e.get("train", {}).get("status") == "failed"
                 or (e["status"] == "unavailable" and e["backend"] in (args.backends or ()))
                 for e in report["engines"])
    return 1 if failed else 0


def _recipes_arg(text: str) -> list[str]:
    from ..recipes import RECIPES

    keys = [k.strip() for k in text.split(",") if k.strip()]
    if keys == ["all"]:
        return [k for k in RECIPES if k not in ("expand_metaops", "restore_flatten")]
    unknown = [k for k in keys if k not in RECIPES]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown recipe {', '.join(map(repr, unknown)) or repr(text)} "
            f"(known: {', '.join(RECIPES)}, or all)")
    return keys


def _show_command(args) -> int:
    """``aidge-interop show``: draws the engine's graph of MODEL, after
    --recipes, coloured by a --locate comparison. Exit status 0; 1 when
    the comparison finds a diverging node or the model cannot be run."""
    from ..onnx import load_onnx
    from ..recipes import RECIPES
    from .locate import locate, torch_graph

    check_output("--out", args.out)
    if Path(args.out).suffix.lower() not in (".svg", ".html", ".htm"):
        raise UsageError(f"--out {args.out!r}: the picture is .svg or .html")
    target = load_model(args.model, args.shape, args.seed)
    x = np.random.default_rng(args.seed).standard_normal(target.shape).astype(target.dtype)
    try:
        if target.kind == "onnx":
            graph = load_onnx(str(target.model), where="show")
        else:
            import torch

            graph, _, _ = torch_graph(target.model, [torch.from_numpy(x)], "show")
        graph.forward([x])  # plans: every value gets its shape
        result = None
        if args.locate:
            result = locate(target.model, x, reference=args.reference, rtol=args.rtol,
                            atol=args.atol)
        for name in args.recipes or []:
            sys.stdout.write(f"{RECIPES[name](graph)}\n")
        title = args.title or f"{target.label}, input {'x'.join(map(str, target.shape))}"
        graph.visualize(args.out, title=title, comparison=result)
    except Exception as exc:
        if isinstance(exc, ImportError):  # the reference's package is missing
            raise UsageError(str(exc)) from exc
        sys.stderr.write(f"show: {target.label}: {one_line(exc)}\n")
        return 1
    sys.stdout.write(f"wrote {args.out}: {len(graph.nodes())} nodes"
                     + (f"; {result.first.summary()}" if result and result.first else "")
                     + "\n")
    return 1 if result is not None and result.first else 0


def _add_show(commands) -> None:
    from .locate import reference_arguments

    show = commands.add_parser(
        "show", help="a picture (SVG or HTML) of the engine's graph",
        description="Load MODEL in the engine, run it once on a random input (so that every "
                    "value has a shape), apply --recipes, and write a picture of the graph: "
                    "op type, name and output shape of every node, parameters folded into "
                    "their node, fused and quantized nodes marked; with --locate, nodes "
                    "coloured by their error against a reference.",
        epilog="Exit status: 0; 1 when --locate finds a diverging node or the model cannot "
               "be run; 2 for a usage error.")
    model_arguments(show)
    show.add_argument("--out", required=True, metavar="FILE",
                      help="the picture: .svg, or .html (the SVG in a page)")
    show.add_argument("--recipes", type=_recipes_arg, metavar="LIST",
                      help="comma-separated recipes applied in order before drawing "
                           "(constant_fold, fuse_batchnorm, batchnorm_epilogue, remove_flatten, "
                           "fuse_activation, expand_metaops, restore_flatten, fuse_pad, "
                           "block_channels), or all (every one but the two that undo)")
    show.add_argument("--title", help="title of the picture (default: the model and shape)")
    show.add_argument("--locate", action="store_true",
                      help="colour nodes by the error of their values against a reference "
                           "(aidge-interop locate, forward, before the recipes)")
    reference_arguments(show, "the reference of --locate (default: onnxruntime)",
                        " of --locate")
    show.set_defaults(run=_show_command)


def _parser(prog: str, with_locate: bool, with_show: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Run a PyTorch model on several engines and "
                     "compare them (compare), find where two diverge (locate), or draw the "
                     "engine's graph (show).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cmp = commands.add_parser(
        "compare", help="latency and output error of one model on several engines",
        description="Run one model on several engines with the same random input; print "
                    "per engine the latency (min/median/max) and the output error against the "
                    "reference (torch; onnxruntime for an ONNX file).",
        epilog="Exit status: 0; 1 when an engine failed or a backend named in --backends is "
               "unavailable; 2 for a usage error. ONNX exports are cached in "
               "$AIDGE_INTEROP_CACHE (default: ~/.cache/aidge_interop/onnx). max rel is "
               "max |y - ref| / max |ref|.")
    model_arguments(cmp)
    cmp.add_argument("--backends", type=_backends_arg, metavar="LIST",
                     help=f"comma-separated, among {', '.join(BACKENDS)} (default: all; the "
                          "reference always runs)")
    cmp.add_argument("--threads", type=functools.partial(int_arg, minimum=1), default=1,
                     help="compute threads of every engine (default %(default)s)")
    cmp.add_argument("--repeat", type=functools.partial(int_arg, minimum=1), default=20,
                     help="timed runs per engine (default %(default)s)")
    cmp.add_argument("--warmup", type=functools.partial(int_arg, minimum=0), default=3,
                     help="untimed runs before them (default %(default)s)")
    cmp.add_argument("--train", action="store_true",
                     help="also time a training step (forward, MSE loss, backward, SGD) on the "
                          "engines that train (torch, aidge_interop, aidge with aidge_learning) "
                          "and compare the loss and gradients of the first step")
    cmp.add_argument("--int8", action="store_true",
                     help="also quantize the model to int8 (aidge_interop.quantize, calibrated "
                          f"on {INT8_CALIBRATION} normal samples) and time it on the engine and, "
                          "exported to QDQ ONNX, on ONNX Runtime")
    cmp.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    cmp.add_argument("--plot", metavar="IMAGE",
                     help="draw latencies and errors (PNG, SVG, PDF...; needs matplotlib)")
    cmp.set_defaults(run=_compare_command)
    loc = commands.add_parser(
        "locate", help="the first node where the engine diverges from a reference",
        description="Find the first node where the engine's values (forward) or gradients "
                    "(backward) diverge from a reference.")
    if with_locate:  # imported only when asked for: the other commands never load it
        locate = importlib.import_module(".locate", __package__)
        locate.add_arguments(loc)
        loc.set_defaults(run=locate.run)
    if with_show:
        _add_show(commands)
    else:
        commands.add_parser("show", help="a picture (SVG or HTML) of the engine's graph")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(prog or "aidge-interop", with_locate=argv[:1] == ["locate"],
                     with_show=argv[:1] == ["show"])
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        sys.stderr.write(f"{parser.prog} {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
