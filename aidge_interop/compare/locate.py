"""First-divergence localisation: the node where the engine and a reference part ways.

::

    result = aidge_interop.locate(model, torch.randn(2, 1, 32, 32))
    print(result)        # first diverging node: op type, attributes, shapes, error figures
    result.first         # a NodeReport, or None when every compared tensor agrees

The model is exported the way :func:`aidge_interop.wrap` exports it and
loaded in the engine with ``keep_intermediates``; one forward keeps every
value. The same values are computed by a reference, and both are compared
node by node in the engine's schedule order (topological) with
``_C.compare`` (``torch.testing.assert_close``'s rule). The first node with
an output outside ``rtol``/``atol`` is where the engine starts to compute
something else; the next few diverging nodes show how the error spreads.

References (``reference=``):

- ``"onnxruntime"`` (default in eval): ONNX Runtime on a copy of the same
  ONNX graph in which every node output is also a graph output; graph
  optimisations are off, so that no fused kernel stands for a node.
- ``"onnx"``: ``onnx.reference.ReferenceEvaluator``, the ONNX package's own
  NumPy implementation, which returns every intermediate value; slow, but
  independent of ONNX Runtime.
- ``"torch"`` (the only one with ``train=True``): the torch model itself.
  Every submodule's output is captured with a forward hook and mapped to the
  ONNX value it became, through the module scope the exporter writes in node
  names (``/stacks/stacks.0/conv1/Conv`` belongs to module
  ``stacks.0.conv1``; a module's value is the one value its nodes hand to
  the rest of the graph). Coarser than the ONNX references: values computed
  inside a module, or by functional calls, have no torch counterpart and are
  not compared (``LocateResult.unchecked``). The ONNX graph is the inference
  graph (BatchNorm with running statistics), so training needs torch.

Backward (``train=True``): torch runs forward and backward in train mode with
ModelTester's loss (MSE against all-ones labels, summed over outputs); hooks
on the submodules' outputs keep their gradients. The engine's backward starts
from torch's ``dL/dy``, so that a forward difference does not pass for a
backward one. ``Graph`` exposes the gradients of parameters and graph inputs
only, so the engine gradient of every mapped value is read through a probe:
a zero graph input added to the value (``v + probe``, exact in forward), whose
input gradient is ``dL/dv``. The walk goes from the loss backwards (reverse
schedule order); a value's gradient is complete once all its consumers ran
backward, so it is checked at its first consumer in schedule order, with the
gradients of that node's parameters. The first node with a gradient outside
tolerance is reported.

``aidge-interop locate MODEL`` (``add_arguments`` / ``run``) is the
command-line form.
"""
from __future__ import annotations

import copy
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx
from onnx import helper

from .. import _C
from .._util import Progress, UsageError, check_output, finite, int_arg, one_line, write_atomic
from ..onnx import load_onnx
from .target import load_model, model_arguments

__all__ = ["locate", "LocateResult", "NodeReport", "Check", "REFERENCES", "add_arguments",
           "run"]

REFERENCES = ("onnxruntime", "onnx", "torch")
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-4  # ModelTester's defaults
_PROBE = "locate_probe:"  # prefix of the graph inputs that read the engine's gradients
_MAX_GRAPH_INPUTS = 64  # per engine call (4 * AI_MAX_IO, graph_run in csrc/module.c)


# -- results ----------------------------------------------------------------------------

@dataclass
class Check:
    """One tensor of the engine against the reference: ``_C.compare``'s figures
    (indices unravelled; NaN on both sides agrees), or ``problem`` when shapes
    or dtypes differ."""

    what: str  # "output", "gradient" or "gradient of parameter"
    name: str  # ONNX value or parameter name
    shape: tuple
    numel: int = 0
    mismatches: int = 0
    max_abs_diff: float = 0.0
    max_abs_index: tuple | None = None
    max_rel_diff: float = 0.0
    max_rel_index: tuple | None = None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem and self.mismatches == 0

    def __str__(self) -> str:
        head = f"{self.what} '{self.name}'"
        if self.problem:
            return f"{head}: {self.problem}"
        if not self.numel:
            return f"{head} {self.shape}: empty"
        return (f"{head} {self.shape}: {self.mismatches} / {self.numel} mismatched "
                f"({self.mismatches / self.numel:.1%}), greatest absolute difference "
                f"{self.max_abs_diff:.3g} at {self.max_abs_index}, greatest relative "
                f"difference {self.max_rel_diff:.3g} at {self.max_rel_index}")


@dataclass
class NodeReport:
    """An engine node and the checks of its outputs (forward) or of the
    gradients of its inputs and parameters (backward)."""

    name: str
    op_type: str
    attrs: dict
    inputs: list
    input_shapes: list
    outputs: list
    output_shapes: list
    checks: list = field(default_factory=list)

    @property
    def diverges(self) -> bool:
        return any(not c.ok for c in self.checks)

    def describe(self) -> str:
        """Several lines: the node, its attributes and shapes, every check."""
        attrs = ", ".join(f"{k}={v}" for k, v in sorted(self.attrs.items())) or "none"
        ios = [", ".join(f"{n} {s}" for n, s in zip(names, shapes) if n)
               for names, shapes in ((self.inputs, self.input_shapes),
                                     (self.outputs, self.output_shapes))]
        lines = [f"node '{self.name}' ({self.op_type})", f"  attributes: {attrs}",
                 f"  inputs: {ios[0]}", f"  outputs: {ios[1]}"]
        lines += [f"  {'DIFFERS' if not c.ok else 'ok':7s} {c}" for c in self.checks]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: the node and its worst check."""
        worst = max(self.checks, key=lambda c: (not c.ok, bool(c.problem), c.max_abs_diff))
        return f"'{self.name}' ({self.op_type}): {worst}"


@dataclass
class LocateResult:
    """What :func:`locate` found.

    ``forward``: every node with a reference value, in schedule order;
    ``backward`` (``train=True``): every node with a checked gradient, from
    the loss backwards; ``unchecked``: nodes whose outputs have no reference
    value (the torch reference maps module outputs only).
    """

    reference: str
    rtol: float
    atol: float
    top: int
    train: bool
    forward: list
    backward: list | None = None
    unchecked: list = field(default_factory=list)

    def diverging(self, direction: str = "forward") -> list:
        """The diverging nodes of ``"forward"`` or ``"backward"``, in walk order."""
        return [n for n in (getattr(self, direction) or []) if n.diverges]

    @property
    def first(self) -> NodeReport | None:
        """The first diverging node: forward first (a forward difference also
        shows in every gradient after it), else backward; ``None`` if none."""
        found = self.diverging("forward") or self.diverging("backward")
        return found[0] if found else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["first"] = self.first and self.first.name
        return d

    def report(self) -> str:
        tol = f"rtol={self.rtol}, atol={self.atol}"
        ref = {"torch": "torch submodule outputs",
               "onnx": "onnx.reference"}.get(self.reference, self.reference)
        parts = [self._section(f"Forward, engine against {ref}, {tol}", "forward",
                               "first node whose output diverges")]
        if self.unchecked:
            parts[0] += (f"\n{len(self.unchecked)} node(s) without a reference value were not "
                         "compared: " + ", ".join(self.unchecked[:5])
                         + (", ..." if len(self.unchecked) > 5 else ""))
        if self.backward is not None:
            parts.append(self._section(
                f"Backward from the loss, engine against torch autograd, {tol}", "backward",
                "first node (from the loss) whose input or parameter gradient diverges"))
            if self.diverging("forward") and self.diverging("backward"):
                parts[-1] += ("\n(The forward already diverges: gradients that depend on "
                              "its values differ too; fix the forward first.)")
        return "\n\n".join(parts)

    def _section(self, title, direction, what) -> str:
        nodes, bad = getattr(self, direction), self.diverging(direction)
        n_checks = sum(len(n.checks) for n in nodes)
        head = f"{title}: {n_checks} tensors at {len(nodes)} nodes compared"
        if not nodes:
            return head + "."
        if not bad:
            worst = max(nodes, key=lambda n: max(c.max_abs_diff for c in n.checks))
            return f"{head}; none diverges.\nLargest difference: {worst.summary()}"
        lines = [f"{head}, {len(bad)} diverge.", f"The {what}:", bad[0].describe()]
        if len(bad) > 1 and self.top > 1:
            lines.append("Next diverging nodes:")
            lines += [f"  {n.summary()}" for n in bad[1:self.top]]
            if len(bad) > self.top:
                lines.append(f"  ... and {len(bad) - self.top} more")
        return "\n".join(lines)

    __str__ = report


def _check(what, name, actual, expected, rtol, atol) -> Check:
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return Check(what, name, expected.shape,
                     problem=f"shape {actual.shape} in the engine, {expected.shape} expected")
    if actual.dtype != expected.dtype:
        return Check(what, name, expected.shape,
                     problem=f"dtype {actual.dtype} in the engine, {expected.dtype} expected")
    r = _C.compare(actual, expected, rtol, atol, equal_nan=True)  # NaN on both sides agrees

    def index(flat):
        return None if flat is None else tuple(int(i) for i in np.unravel_index(flat, actual.shape))

    return Check(what, name, actual.shape, r["numel"], r["mismatches"], r["max_abs_diff"],
                 index(r["max_abs_index"]), r["max_rel_diff"], index(r["max_rel_index"]))


def _node_report(node: dict, checks: list) -> NodeReport:
    attrs = {k: (str(v) if isinstance(v, _C.Tensor) else v) for k, v in node["attrs"].items()}
    return NodeReport(node["name"], node["op_type"], attrs, list(node["inputs"]),
                      list(node["input_shapes"]), list(node["outputs"]),
                      list(node["output_shapes"]), checks)


# -- references -------------------------------------------------------------------------

def _onnxruntime_values(proto, feeds: dict) -> dict:
    try:
        import onnxruntime
    except ImportError as exc:
        raise ImportError(f"locate: reference='onnxruntime' needs the onnxruntime package "
                          f"(pip install onnxruntime), or use reference='onnx' ({exc})") from exc
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in outputs:
                model.graph.output.add().name = name
                outputs.add(name)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _onnx_reference_values(proto, feeds: dict) -> dict:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(proto).run(None, feeds, intermediate=True)


def _scopes(node_name: str, modules) -> list[str]:
    """Qualified names of the modules a TorchScript-exported node belongs to,
    outermost first: ``/stacks/stacks.0/conv1/Conv`` -> ``stacks``,
    ``stacks.0``, ``stacks.0.conv1`` (a component is either the qualified
    name, as for Sequential children, or the attribute name)."""
    found, prefix = [], ""
    for part in node_name.strip("/").split("/")[:-1]:
        name = part if not prefix or part.startswith(prefix + ".") else f"{prefix}.{part}"
        if name not in modules:
            break
        found.append(name)
        prefix = name
    return found


def _module_values(proto, modules) -> dict[str, str]:
    """module name -> the ONNX value of its output: the one value that nodes
    of the module's scope hand to nodes outside it (or to the graph outputs).
    Modules with no such value, or several, are left out."""
    producer_scopes = {}
    for node in proto.graph.node:
        if node.op_type != "Constant":
            for name in node.output:
                producer_scopes[name] = _scopes(node.name, modules)
    leaving = defaultdict(set)
    for node in proto.graph.node:
        inside = set(_scopes(node.name, modules))
        for name in node.input:
            for scope in producer_scopes.get(name, ()):
                if scope not in inside:
                    leaving[scope].add(name)
    for out in proto.graph.output:
        for scope in producer_scopes.get(out.name, ()):
            leaving[scope].add(out.name)
    return {scope: next(iter(names)) for scope, names in leaving.items() if len(names) == 1}


def _torch_run(model, inputs, proto, train: bool):
    """Runs a copy of ``model`` (the caller's keeps its state and gradients).

    Returns ``(values, grads, param_grads)``: ONNX value name -> NumPy array
    for the graph inputs and outputs and every mapped module output, their
    gradients and the parameter gradients (``train`` only; else empty).
    """
    import torch

    model = copy.deepcopy(model).train(train)
    modules = dict(model.named_modules())
    mapping = _module_values(proto, modules)
    tensors, grads, calls = {}, {}, Counter()

    def keep(value, tensor):
        tensors[value] = tensor
        if train and tensor.requires_grad:
            tensor.register_hook(lambda g: grads.__setitem__(value, g))

    def hook(name):
        def fn(module, args, out):
            calls[name] += 1
            if isinstance(out, torch.Tensor):
                keep(mapping[name], out)
        return fn

    handles = [modules[name].register_forward_hook(hook(name)) for name in mapping]
    xs = [x.detach().clone().requires_grad_(train and x.is_floating_point()) for x in inputs]
    try:
        with torch.set_grad_enabled(train):
            outs = model(*xs)
    finally:
        for h in handles:
            h.remove()
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    called_twice = {mapping[name] for name, n in calls.items() if n > 1}
    for k, out in enumerate(outs):  # export_onnx_bytes' names
        keep(f"output_{k}", out)
    param_grads = {}
    if train:
        loss = sum(torch.nn.functional.mse_loss(o, torch.ones_like(o)) for o in outs)
        loss.backward()
        grads.update({f"input_{k}": x.grad for k, x in enumerate(xs) if x.grad is not None})
        param_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    tensors.update({f"input_{k}": x for k, x in enumerate(xs)})

    def arrays(d):
        return {k: v.detach().cpu().numpy() for k, v in d.items() if k not in called_twice}

    return arrays(tensors), arrays(grads), arrays(param_grads)


# -- the engine's gradients -------------------------------------------------------------

def _with_probes(proto, probes: dict):
    """A copy of ``proto`` where each value ``v`` of ``probes`` (name ->
    example array) is replaced, for its consumers, by ``v + probe``, the
    probe being a new graph input ``locate_probe:v``."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    for value, array in probes.items():
        probe, probed = _PROBE + value, _PROBE + value + ":sum"
        for node in graph.node:
            for k, name in enumerate(node.input):
                if name == value:
                    node.input[k] = probed
        graph.node.append(helper.make_node("Add", [value, probe], [probed], name=probed))
        graph.input.append(helper.make_tensor_value_info(
            probe, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
    return model


def _engine_gradients(proto, kinds, feeds: dict, values: dict, output_grads: dict):
    """``(grads, param_grads)`` of the engine in train mode: value name ->
    ``dL/dv`` for the graph inputs and every value of ``values`` (name ->
    the engine's forward value), and the parameter gradients, after a
    backward from ``output_grads``. An engine call takes at most
    ``_MAX_GRAPH_INPUTS`` inputs: the probes are spread over several graphs."""
    names = list(values)
    per_graph = max(_MAX_GRAPH_INPUTS - len(feeds), 1)
    grads, param_grads = {}, None
    for start in range(0, max(len(names), 1), per_graph):
        chunk = {n: values[n] for n in names[start:start + per_graph]}
        graph = load_onnx(_with_probes(proto, chunk), param_kinds=kinds, where="locate")
        graph.training = True
        zeros = {_PROBE + v: np.zeros_like(a) for v, a in chunk.items()}
        graph.forward({**feeds, **zeros}, need_backward=True, input_grads=True)
        input_grads = graph.backward([output_grads.get(n) for n in graph.output_names])
        grads.update({n.removeprefix(_PROBE): g
                      for n, g in zip(graph.input_names, input_grads) if g is not None})
        if param_grads is None:
            param_grads = {n: g.copy() for n, g in graph.grads().items()}
    return grads, param_grads


def _backward_reports(nodes, engine, reference, rtol, atol) -> list[NodeReport]:
    """Walks ``nodes`` from the last to the first; at each node, checks the
    gradients that are complete there: those of the values it is the first
    consumer of. ``engine``/``reference``: ``(grads, param_grads)``."""
    first_consumer = {}
    for i, node in enumerate(nodes):
        for name in node["inputs"]:
            first_consumer.setdefault(name, i)
    reports = []
    for i in reversed(range(len(nodes))):
        checks = []
        for name in dict.fromkeys(nodes[i]["inputs"]):
            if first_consumer[name] != i:
                continue
            for what, eng, ref in (("gradient of parameter", engine[1], reference[1]),
                                   ("gradient", engine[0], reference[0])):
                if name in ref and name in eng:
                    checks.append(_check(what, name, eng[name], ref[name], rtol, atol))
                    break
        if checks:
            reports.append(_node_report(nodes[i], checks))
    return reports


# -- locate -----------------------------------------------------------------------------

def _is_module(model) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def torch_graph(model, inputs, where: str):
    """``(graph, proto, kinds)``: a torch module exported the way
    :func:`aidge_interop.wrap` exports it (on example ``inputs``, torch
    tensors; ``proto``: the ONNX model) and loaded in the engine, its
    parameters and buffers kept apart (``kinds``: name -> "param" or
    "buffer")."""
    from ..bridge.wrapping import export_onnx_bytes

    try:
        source = export_onnx_bytes(model, inputs)
    except Exception as exc:
        raise RuntimeError(f"{where}: torch could not export {type(model).__name__} to "
                           f"ONNX: {exc}") from exc
    kinds = {n: ("param" if p.requires_grad else "buffer") for n, p in model.named_parameters()}
    kinds.update({n: "buffer" for n, _ in model.named_buffers()})
    proto = onnx.load_from_string(source)
    return load_onnx(proto, param_kinds=kinds, where=where), proto, kinds


def locate(model, inputs, *, reference: str | None = None, rtol: float = DEFAULT_RTOL,
           atol: float = DEFAULT_ATOL, train: bool = False, top: int = 3) -> LocateResult:
    """Finds the first node where the engine and a reference disagree.

    ``model``: a ``torch.nn.Module`` (exported like :func:`aidge_interop.wrap`
    does), or an ONNX model (path, bytes or ``onnx.ModelProto``; eval with
    an ONNX reference only). ``inputs``: one tensor or array, or a sequence
    (one per model input). ``reference``: ``"onnxruntime"``, ``"onnx"`` or
    ``"torch"`` (see the module's documentation); ``None`` means
    ``"onnxruntime"``, or ``"torch"`` with ``train``. ``train``: train mode
    on both sides, and the backward walk as well. ``top``: how many diverging
    nodes the report lists per direction.
    """
    is_module = _is_module(model)
    reference = reference or ("torch" if train else "onnxruntime")
    if reference not in REFERENCES:
        raise ValueError(f"locate: argument 'reference' must be one of {', '.join(REFERENCES)}; "
                         f"got {reference!r}")
    if train and reference != "torch":
        raise ValueError(f"locate: train=True compares against torch autograd, and the ONNX "
                         f"graph is the inference graph (BatchNorm on running statistics): "
                         f"reference must be 'torch', not {reference!r}")
    if (train or reference == "torch") and not is_module:
        raise ValueError(f"locate: {'train=True' if train else 'reference=torch'} needs a "
                         f"torch.nn.Module, not {type(model).__name__} (an ONNX model can "
                         "be checked in eval against reference='onnxruntime' or 'onnx')")
    for arg, value in (("rtol", rtol), ("atol", atol)):
        if not value >= 0:
            raise ValueError(f"locate: argument '{arg}' must be >= 0, got {value!r}")
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"locate: argument 'top' must be an int >= 1, got {top!r}")
    inputs = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]

    kinds = None
    if is_module:
        import torch

        inputs = [torch.as_tensor(x) for x in inputs]
        graph, proto, kinds = torch_graph(model, inputs, "locate")
        arrays = [x.detach().cpu().numpy() for x in inputs]
    else:
        arrays = [np.asarray(x) for x in inputs]
        graph = load_onnx(model, where="locate")
        proto = graph.proto  # with its external data loaded
    if len(arrays) != len(graph.input_names):
        raise ValueError(f"locate: the model takes {len(graph.input_names)} input(s) "
                         f"({', '.join(graph.input_names)}), got {len(arrays)}")
    feeds = dict(zip(graph.input_names, arrays))
    graph.training = train
    graph.keep_intermediates = True
    graph.forward(feeds)
    nodes = graph.nodes()

    if reference == "torch":
        values, grads, param_grads = _torch_run(model, inputs, proto, train)
    elif reference == "onnxruntime":
        values = _onnxruntime_values(proto, feeds)
    else:
        values = _onnx_reference_values(proto, feeds)

    forward, unchecked = [], []
    for node in nodes:
        checks = [_check("output", name, graph.intermediate(name), values[name], rtol, atol)
                  for name in node["outputs"] if name and values.get(name) is not None]
        if checks:
            forward.append(_node_report(node, checks))
        else:
            unchecked.append(node["name"])
    result = LocateResult(reference, rtol, atol, top, train, forward, unchecked=unchecked)
    if train:
        mapped = {name: graph.intermediate(name) for name in grads
                  if name not in feeds and name not in graph.output_names}
        engine = _engine_gradients(proto, kinds, feeds, mapped,
                                   {n: grads.get(n) for n in graph.output_names})
        result.backward = _backward_reports(nodes, engine, (grads, param_grads), rtol, atol)
    return result


# -- command line -----------------------------------------------------------------------

def _tolerance_arg(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
    return value


def reference_arguments(parser, reference_help: str, of: str = "") -> None:
    """--reference, --rtol and --atol (``of``: what they are for, in the help)."""
    parser.add_argument("--reference", choices=REFERENCES, help=reference_help)
    parser.add_argument("--rtol", type=_tolerance_arg, default=DEFAULT_RTOL,
                        help=f"relative tolerance{of} (default %(default)s)")
    parser.add_argument("--atol", type=_tolerance_arg, default=DEFAULT_ATOL,
                        help=f"absolute tolerance{of} (default %(default)s)")


def add_arguments(parser) -> None:
    """The options of ``aidge-interop locate`` (``parser``: its argparse sub-parser)."""
    import functools

    parser.description = (
        "Run MODEL on the engine and on a reference with every intermediate value kept, and "
        "report the first node (in schedule order) whose output exceeds the tolerance, with "
        "its op type, attributes, shapes and error figures, and the next diverging nodes. "
        "With --train, also walk the graph from the loss (MSE against ones) backwards and "
        "report the first node whose input or parameter gradient differs from torch autograd.")
    parser.epilog = (
        "References: onnxruntime and onnx (onnx.reference.ReferenceEvaluator) run the same "
        "ONNX graph and give every node's value; torch gives its submodules' outputs only. "
        "Exit status: 0 when every compared tensor agrees; 1 when a node diverges or a run "
        "failed; 2 for a usage error.")
    model_arguments(parser)
    parser.add_argument("--train", action="store_true",
                        help="train mode, and compare gradients too (torch models; the "
                             "reference is then torch)")
    reference_arguments(parser, "default: onnxruntime, or torch with --train")
    parser.add_argument("--top", type=functools.partial(int_arg, minimum=1), default=3,
                        help="diverging nodes listed per direction (default %(default)s)")
    parser.add_argument("--json", metavar="FILE", help="write the full result as JSON")


def run(args) -> int:
    """``aidge-interop locate``: prints the report; returns the exit status
    (0 agree, 1 diverge or failed). Mistakes in the arguments raise
    :class:`~aidge_interop.compare.cli.UsageError` (``main`` prints them, status 2)."""
    import json

    check_output("--json", args.json)
    target = load_model(args.model, args.shape, args.seed)
    if target.kind == "onnx" and (args.train or args.reference == "torch"):
        raise UsageError(f"{'--train' if args.train else '--reference torch'} needs a torch "
                         "model (an example or module:callable), not an ONNX file")
    if args.train and args.reference not in (None, "torch"):
        raise UsageError("--train compares against torch autograd: --reference must be torch")
    x = np.random.default_rng(args.seed).standard_normal(target.shape).astype(target.dtype)
    progress = Progress()
    progress.update(f"{target.label}: running the engine and the reference"
                    + (", forward and backward" if args.train else ""), force=True)
    try:
        result = locate(target.model, x, reference=args.reference, rtol=args.rtol,
                        atol=args.atol, train=args.train, top=args.top)
    except Exception as exc:
        progress.close()
        if isinstance(exc, ImportError):  # the reference's package is missing
            raise UsageError(str(exc)) from exc
        sys.stderr.write(f"locate: {target.label} could not be run: {one_line(exc)}\n")
        return 1
    progress.close()
    sys.stdout.write(f"{target.label}: input {'x'.join(map(str, target.shape))} "
                     f"{target.dtype}, seed {args.seed}\n\n{result}\n")
    if args.json:
        data = {"model": target.label, "input_shape": list(target.shape), "seed": args.seed,
                **result.to_dict()}
        write_atomic(args.json, (json.dumps(finite(data), indent=2, allow_nan=False)
                                 + "\n").encode())
    return 1 if result.first else 0

