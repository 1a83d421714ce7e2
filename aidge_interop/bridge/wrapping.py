"""``wrap(torch_model, input_dims)``: a torch model running on the C engine.

The model is exported to ONNX (TorchScript exporter, ``dynamo=False``, no
constant folding, batch dimension dynamic — see ``docs/engine.md`` for why),
imported into the engine, and returned as an :class:`AidgeModule`, a
``torch.nn.Module`` whose parameters and buffers *are* the engine's memory
(zero-copy views), whose forward is one C call and whose backward goes
through torch autograd into one C call.
"""
from __future__ import annotations

import dataclasses
import inspect
import io
import itertools
import threading
import warnings
from collections import OrderedDict
from typing import Sequence

import numpy as np
import onnx
import torch
import torch.nn.modules.module as _nn_module
from torch.utils.dlpack import from_dlpack, to_dlpack

from .. import _C
from .._C import Tensor
from ..onnx import build_graph
from ..tensor_converter import aidge_tensor_to_torch, torch_tensor_to_aidge
from .structure import Structure, flatten, unflatten
from .symbolics import exporter_symbolics
from .upstream import after_export, graph_names, value_names, wrap_options

__all__ = ["wrap", "AidgeModule", "export_onnx_bytes"]

DEFAULT_OPSET = 20
#: backward passes after which a module whose parameters no step changed warns
_IDLE_BACKWARDS = 10

# torch.onnx.export keeps global state (GLOBALS.in_onnx_export): one export at a
# time, whatever the number of threads wrapping models
_EXPORT_LOCK = threading.Lock()


def _int_sequence(x) -> bool:
    return isinstance(x, (tuple, list, torch.Size)) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in x)


def _shapes_of(input_dims) -> list[tuple[int, ...]] | None:
    """``input_dims`` as a list of shapes when it is one (a shape, or a
    non-empty sequence of shapes), else None (example inputs)."""
    if input_dims and _int_sequence(input_dims):
        shapes = [input_dims]
    elif isinstance(input_dims, (tuple, list)) and input_dims and all(
            _int_sequence(d) for d in input_dims):
        shapes = list(input_dims)
    else:
        return None
    for i, dims in enumerate(shapes):
        if any(d < 0 for d in dims):
            raise TypeError(f"wrap: input_dims[{i}] = {tuple(dims)!r} is not a shape (a "
                            "tuple of ints >= 0)")
    return [tuple(int(d) for d in dims) for dims in shapes]


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.is_floating_point():
            return t.dtype
    return torch.float32


def _bind(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by parameter name, in the order of the model's
    forward signature, so that keyword order does not matter; positional
    and keyword forms of one argument are the same call."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return {"args": tuple(args), "kwargs": dict(kwargs)}
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{type(model).__name__}.forward: {exc}") from None
    return dict(bound.arguments)


class _FlatModel(torch.nn.Module):
    """The model in the form exporters take: its call's tensors as flat
    positional arguments, its result's tensors as a flat tuple.

    It holds the model's own submodule, parameter and buffer tables, so that
    the exported initializers keep the model's names. ``out_structure`` is
    the structure of the last result (the Python values around its tensors).
    """

    def __init__(self, model: torch.nn.Module, call_structure: Structure):
        super().__init__()
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_call_structure", call_structure)
        object.__setattr__(self, "out_structure", None)
        self._modules, self._parameters, self._buffers = \
            model._modules, model._parameters, model._buffers

    def forward(self, *tensors):
        caches = []  # a cache the model returns is one of the call's, or a new one
        args, kwargs = _call_arguments(self._model,
                                       unflatten(self._call_structure, tensors, caches))
        outs, structure = flatten(self._model(*args, **kwargs), "output", caches)
        object.__setattr__(self, "out_structure", structure)
        return tuple(outs)


def _call_arguments(model, arguments: dict) -> tuple[tuple, dict]:
    """_bind's dict back into the (args, kwargs) of a call."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return tuple(arguments["args"]), dict(arguments["kwargs"])
    bound = inspect.BoundArguments(sig, OrderedDict(arguments))
    return bound.args, bound.kwargs


@dataclasses.dataclass
class _Export:
    """One export of a model for one call signature."""

    onnx_bytes: bytes
    call_structure: Structure   # the call's arguments around its tensors
    out_structure: Structure    # the result around its tensors
    taken: list                 # indices of the call's tensors the graph takes, in order
    shapes: list                # shapes of the taken tensors in the example
    call_tensor_metas: list     # (dtype, shape) of every tensor of the call
    declared: list              # dims each graph input declares (None: symbolic)


EXPORTERS = ("torchscript", "dynamo")


def _export(model: torch.nn.Module, arguments: dict, *, opset: int,
            dynamic_batch: bool, exporter: str = "torchscript", in_names=None,
            out_names=None) -> _Export:
    """Exports ``model`` called with ``arguments`` (from :func:`_bind`).

    ``exporter``: ``"torchscript"`` (``torch.onnx.export(dynamo=False)``) or
    ``"dynamo"`` (the torch.export-based exporter, with its graph
    optimizations off: they fold BatchNorm into Conv and rename weights,
    which would leave the parameters unmappable). Parameters stay
    initializers under their torch names (no constant folding); the graph
    is the inference graph, the engine switches BatchNorm semantics with
    ``train()``; dropout is not exported (see :func:`_warn_dropout`).

    Every parameter and buffer keeps an initializer of its own: exported
    for inference, torch merges initializers of equal *values* (two fresh
    BatchNorm or LayerNorm layers of one width: ones and zeros), which
    would leave all but one of them untrainable. ``keep_initializers_as_inputs``
    turns that pass off (tensors that share memory, tied weights, are one
    parameter in torch as well); the initializers are then taken out of the
    graph's inputs again, where ONNX Runtime would not treat them as
    constants. The exporter leaves out inputs the model does not read:
    ``taken`` says which ones the graph has. The graph's inputs and outputs
    are named ``in_names`` and ``out_names``, then ``input_i``, ``output_i``.
    """
    tensors, call_structure = flatten(arguments, "input")
    flat = _FlatModel(model, call_structure)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            n_out = len(flat(*tensors))
        in_names = value_names(in_names, len(tensors), "input", "in_names")
        out_names = value_names(out_names, n_out, "output", "out_names")
        # traced with grad enabled whatever the caller's mode: under no_grad
        # some modules take fused paths no exporter knows
        # (nn.TransformerEncoder's aten::_transformer_encoder_layer_fwd)
        with _EXPORT_LOCK, warnings.catch_warnings(), torch.enable_grad():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                proto = _export_dynamo(flat, tensors, in_names, out_names, opset,
                                       dynamic_batch)
            else:
                proto = _export_torchscript(flat, tensors, in_names, out_names, opset,
                                            dynamic_batch)
    finally:
        model.train(was_training)
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    taken = [in_names.index(i.name) for i in inputs]
    if len(proto.graph.output) != n_out:
        raise RuntimeError(f"the exported graph has {len(proto.graph.output)} outputs, the "
                           f"model returns {n_out} tensors")
    declared = [[d.dim_value if d.HasField("dim_value") else None
                 for d in i.type.tensor_type.shape.dim] for i in inputs]
    return _Export(proto.SerializeToString(), call_structure, flat.out_structure, taken,
                   [tuple(tensors[i].shape) for i in taken],
                   [(t.dtype, tuple(t.shape)) for t in tensors], declared)


def _export_torchscript(flat, tensors, in_names, out_names, opset, dynamic_batch):
    dynamic = None
    if dynamic_batch:
        dynamic = {n: {0: "batch"} for n, x in zip(in_names, tensors) if x.dim() > 0}
        dynamic.update({n: {0: "batch"} for n in out_names})
    buf = io.BytesIO()
    with exporter_symbolics(opset):  # aten::diff, aten::cumsum of bool and integers
        torch.onnx.export(
            flat, tuple(tensors), buf, dynamo=False, opset_version=opset,
            do_constant_folding=False, training=torch.onnx.TrainingMode.EVAL,
            input_names=in_names, output_names=out_names, dynamic_axes=dynamic,
            keep_initializers_as_inputs=True,
        )
    return onnx.load_from_string(buf.getvalue())


def _export_dynamo(flat, tensors, in_names, out_names, opset, dynamic_batch):
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter needs it)
    except ImportError:
        raise ImportError("exporter='dynamo' needs the onnxscript package: pip install "
                          "onnxscript (or aidge_interop[dynamo])") from None
    # dim 0 dynamic where torch.export keeps it so (Dim.AUTO: a model that
    # fixes its batch size gets a static dim, which the engine then checks)
    dims = tuple({0: torch.export.Dim.AUTO} if dynamic_batch and x.dim() > 0 else None
                 for x in tensors)
    # scaled_dot_product_attention stays one node of the export (ONNX has
    # it); but the exporter's decomposition pass traces it through the
    # kernel torch would pick on the CPU, the fused one, whose output is laid
    # out [B, L, H, E]: a transpose(1, 2).contiguous() after it loses its
    # copy and the reshape that follows fails as a view (T5, Swin; torch
    # issue 136543). With the math kernel the layout is the op's own.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        program = torch.onnx.export(
            flat, tuple(tensors), dynamo=True, optimize=False, opset_version=opset,
            input_names=in_names, output_names=out_names, dynamic_shapes=(dims,),
            verbose=False)
    return program.model_proto


def export_onnx_bytes(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], *,
                      opset: int = DEFAULT_OPSET, dynamic_batch: bool = True,
                      kwargs: dict | None = None, exporter: str = "torchscript") -> bytes:
    """The model called with ``example_inputs`` (and keyword ``kwargs``) as
    ONNX bytes, exported the way the engine expects (see :func:`_export`):
    one graph input per tensor of the call that the model reads, one graph
    output per tensor of its result, in order."""
    arguments = _bind(model, tuple(example_inputs), kwargs or {})
    return _export(model, arguments, opset=opset, dynamic_batch=dynamic_batch,
                   exporter=exporter).onnx_bytes


def _example_call(model: torch.nn.Module, input_dims, kwargs) -> tuple[tuple, dict]:
    """The example call's (args, kwargs): shapes give random float tensors of
    the model's dtype; anything else is the example's positional inputs."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"wrap: argument 'kwargs' must be a dict of keyword example "
                        f"inputs, not {type(kwargs).__name__}")
    kwargs = dict(kwargs or {})
    shapes = _shapes_of(input_dims)
    if shapes is not None:
        gen = torch.Generator().manual_seed(0)
        dtype = _model_dtype(model)
        return tuple(torch.randn(s, generator=gen, dtype=dtype) for s in shapes), kwargs
    if isinstance(input_dims, torch.Tensor):
        return (input_dims,), kwargs
    if isinstance(input_dims, (tuple, list)) and (input_dims or kwargs):
        return tuple(input_dims), kwargs
    raise TypeError(
        "wrap: argument 'input_dims' must be the model's example inputs (a tensor or a tuple "
        "of tensors of any dtype, with keyword inputs in kwargs=) or their shapes, one per "
        f"model input, e.g. [(1, 16)]; got {input_dims!r}")


def _warn_dropout(model: torch.nn.Module, name: str) -> None:
    """Warns when ``model`` has dropout that torch applies in ``train()``: the
    export is the inference graph, which has no Dropout node, so the engine
    runs those layers as the identity in training too."""
    layers = [repr(n or name) for n, m in model.named_modules()
              if (isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0)
              or (isinstance(m, torch.nn.MultiheadAttention) and m.dropout > 0)]
    if layers:
        shown = ", ".join(layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
        warnings.warn(
            f"wrap({name}): {len(layers)} dropout layer(s) with p > 0 ({shown}) run as the "
            "identity in the engine, in train() as in eval(): the exported graph is the "
            "inference graph. Set their p to 0 to train and compare like for like",
            stacklevel=3)


def wrap(torch_model: torch.nn.Module, input_dims=(), opset_version: int | None = None,
         save_onnx_model=False, in_names: Sequence[str] | None = None,
         out_names: Sequence[str] | None = None, verbose: bool = False, *, input_size=None,
         kwargs: dict | None = None, opset: int | None = None, dynamic_batch: bool = True,
         fuse_inference: bool = True, exporter: str = "torchscript") -> "AidgeModule":
    """Exports ``torch_model`` to ONNX, imports it into the engine, copies its
    parameters and buffers, and returns an :class:`AidgeModule`, called like
    ``torch_model`` and returning what it returns.

    ``input_dims``: the model's example inputs as torch's exporters take
    them — a tensor or a tuple of positional inputs of any dtype (int64 token
    ids, bool masks, float images; ``()`` when every input is a keyword) —
    with the keyword example inputs in ``kwargs``; or, for float inputs,
    their shapes, one per input: ``wrap(torch.nn.Linear(16, 4), [(1, 16)])``.

    ``dynamic_batch``: dim 0 of every input stays free in the export (a new
    batch size re-plans the same graph); other dims are fixed, and a call
    with other dims, another set of arguments or other Python values among
    them runs a graph exported for that call, made on first use and kept
    (the parameters stay one: see :class:`AidgeModule`). ``fuse_inference``:
    run eval-mode forwards that need no backward on a second graph with the
    recipes applied; False keeps one graph. ``exporter``: ``"torchscript"``
    (the default) or ``"dynamo"`` (torch.export-based; needs onnxscript);
    see docs/wrap.md. ``opset``: the ONNX opset of the export (None:
    ``DEFAULT_OPSET``).

    ``aidge_interop_torch``'s arguments, in its order: ``input_size`` (our
    ``input_dims``), ``opset_version`` (our ``opset``; one of the two),
    ``save_onnx_model`` (True: the exported model is saved as
    ``./<class name>.onnx``; or a path), ``in_names`` / ``out_names`` (the
    names of the graph's inputs and outputs, in order), ``verbose`` (prints
    the export).
    """
    if not isinstance(torch_model, torch.nn.Module):
        raise TypeError(f"wrap: argument 'torch_model' must be a torch.nn.Module, not "
                        f"{type(torch_model).__name__}")
    device = next(itertools.chain(torch_model.parameters(), torch_model.buffers()),
                  torch.empty(0)).device
    if device.type != "cpu":
        raise NotImplementedError(
            f"wrap: the model is on {device}; the engine runs on the CPU: wrap model.cpu()"
        )
    if exporter not in EXPORTERS:
        raise ValueError(f"wrap: exporter must be one of {EXPORTERS}, not {exporter!r}")
    name = type(torch_model).__name__
    input_dims, opset, onnx_path = wrap_options(name, input_dims, input_size, opset,
                                                opset_version, DEFAULT_OPSET, save_onnx_model)
    args, kw = _example_call(torch_model, input_dims, kwargs)
    arguments = _bind(torch_model, args, kw)
    flatten(arguments, "input")  # a leaf the engine cannot take: TypeError naming it
    names = graph_names(torch_model, arguments, in_names, out_names)
    if verbose:
        print(f"Exporting {name} to ONNX (opset {opset}, {exporter} exporter) ...")
    try:
        export = _export(torch_model, arguments, opset=opset, dynamic_batch=dynamic_batch,
                         exporter=exporter, **names)
    except Exception as exc:
        raise RuntimeError(f"wrap: torch could not export {name} to ONNX: {exc}") from exc
    after_export(name, export.onnx_bytes, onnx_path, verbose)

    # every name of a tied tensor: an exporter may keep any one of them
    params = dict(torch_model.named_parameters(remove_duplicate=False))
    buffers = dict(torch_model.named_buffers(remove_duplicate=False))
    kinds = {n: ("param" if p.requires_grad else "buffer") for n, p in params.items()}
    kinds.update({n: "buffer" for n in buffers})
    graph, proto = _build_graph(export.onnx_bytes, param_kinds=kinds, where=f"wrap({name})",
                                input_shapes=export.shapes, free_batch=False)

    # check the name mapping by shape and value, and that nothing was lost
    from onnx import numpy_helper

    in_graph = set()
    for init in proto.graph.initializer:
        src = params.get(init.name, buffers.get(init.name))
        if src is None:
            continue
        value = numpy_helper.to_array(init)
        ref = src.detach().cpu()
        if ref.dtype == torch.bfloat16:  # (torch has no NumPy bfloat16: the bits)
            ref, value = ref.view(torch.int16).numpy(), value.view(np.int16)
        else:
            ref = ref.numpy()
        if value.shape != ref.shape or not np.array_equal(value, ref, equal_nan=True):
            raise ValueError(
                f"wrap({name}): the exported initializer '{init.name}' does not hold the "
                f"torch tensor of that name (shape {value.shape} vs {ref.shape})"
            )
        in_graph.add(init.name)
    names_of = {}
    for n, p in params.items():
        names_of.setdefault(id(p), []).append(n)
    unused = [names[0] for names in names_of.values() if not in_graph.intersection(names)]
    if unused:  # (neither exporter folds parameters as wrap runs them)
        warnings.warn(
            f"wrap({name}): parameter(s) {unused} are not in the exported graph: the model's "
            "forward does not use them for this call; they stay in the module, unchanged by "
            "the engine, and get no gradient (None), as in torch", stacklevel=2)
    _warn_dropout(torch_model, name)
    return AidgeModule(graph, proto, torch_model, in_graph, export,
                       fuse_inference=fuse_inference, kinds=kinds,
                       export_options={"opset": opset, "dynamic_batch": dynamic_batch,
                                       "exporter": exporter, **names})


# An AidgeModule's parameters and graph buffers are views of the engine's
# memory, which is all the engine reads. Torch's ways of giving one new
# values by replacing its tensor would leave the engine on the old values,
# silently: `module.weight = t` copies t into the engine's memory
# (_EngineMemory), and after `p.data = t` the next forward does
# (AidgeModule._relink). A new shape or dtype is refused.
def _assign_engine(target: torch.Tensor, value, name: str, how: str):
    """Copies `value` into `target` (the engine's memory for `name`) for
    `how` (the assignment, for the message)."""
    if not isinstance(value, torch.Tensor) or value.shape != target.shape or \
            value.dtype != target.dtype:
        got = (f"{value.dtype} of shape {tuple(value.shape)}"
               if isinstance(value, torch.Tensor) else type(value).__name__)
        raise RuntimeError(
            f"AidgeModule: {how} '{name}' (the engine's memory, {target.dtype} of shape "
            f"{tuple(target.shape)}): it cannot take {got}; wrap the model again to change it")
    with torch.no_grad():
        target.copy_(value)


# Packed weights: the engine keeps a packed copy of the weights its float32
# products read (csrc/packed.c), read at the version of the values the
# bridge declares before each eval forward: the sum of the parameters' and
# buffers' version counters, which torch bumps at every in-place write
# (optimizers, ours included, load_state_dict, `p.add_()` under no_grad,
# the copies of _assign_engine), plus the count of the reads of an engine
# parameter's `.data`, through which a write bumps no counter. Each term
# only grows: the sum changes whenever one of them does.
_DATA_READS = [0]


class _EngineParameter(torch.nn.Parameter):
    """A parameter over the engine's memory: reading its ``.data`` counts as
    a write to it (see _DATA_READS)."""

    @property
    def data(self):
        _DATA_READS[0] += 1
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value):
        torch.Tensor.data.__set__(self, value)


class _EngineMemory:
    """Mixin of the modules holding engine tensors: assigning a tensor to the
    name of one copies its values into it (a Parameter also passes on its
    requires_grad); replacing a submodule is refused."""

    def __setattr__(self, name, value):
        d = self.__dict__
        old = d["_parameters"].get(name) if "_parameters" in d else None
        if old is None and "_buffers" in d:
            old = d["_buffers"].get(name)
        if old is None and isinstance(d.get("_modules", {}).get(name), _Container) and \
                value is not d["_modules"][name]:
            raise RuntimeError(f"AidgeModule: submodule '{name}' holds the engine's memory; "
                               "the wrapped model's structure is fixed: wrap the model again")
        if old is None or getattr(old, "_engine_name", None) is None or value is old:
            return super().__setattr__(name, value)
        _assign_engine(old, value, old._engine_name, f"a {type(value).__name__} assigned to")
        if isinstance(value, torch.nn.Parameter) and isinstance(old, torch.nn.Parameter):
            old.requires_grad_(value.requires_grad)

    def __delattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers"):
            old = d.get(table, {}).get(name)
            if getattr(old, "_engine_name", None) is not None:
                raise RuntimeError(f"AidgeModule: '{old._engine_name}' is the engine's "
                                   "memory and cannot be deleted")
        super().__delattr__(name)


class _Container(_EngineMemory, torch.nn.Module):
    """A submodule of an AidgeModule, holding parameters and buffers."""


def _owner(root: torch.nn.Module, dotted: str):
    """The submodule that holds `dotted` (created as needed) and the leaf name."""
    *path, leaf = dotted.split(".")
    m = root
    for part in path:
        if part not in m._modules:
            m.add_module(part, _Container())
        m = m._modules[part]
    return m, leaf


def _engine_input(x: torch.Tensor):
    """An engine view of a CPU tensor straight through DLPack (the common case),
    anything else through the converter: other devices, lazy conj/neg bits,
    and overlapping layouts (expand), which the graph reads from a copy."""
    if x.is_cpu and not (x.is_conj() or x.is_neg()):
        try:  # (to_dlpack takes a tensor that requires grad: no detach needed)
            return Tensor.from_dlpack(to_dlpack(x))
        except ValueError:
            pass
    return torch_tensor_to_aidge(x)


# The fast path of every engine call: the graph takes torch tensors through
# torch's DLPack export and returns its results through torch's import, all
# in C (Graph.forward/backward's bridge); the graph answers None when a
# tensor does not go that way (an overlapping layout), then _engine_input.
_BRIDGE = (to_dlpack, getattr(torch._C, "_from_dlpack", from_dlpack))
_autograd_backward = _C.autograd_backward


def _graph_call(call, tensors):
    """``call`` (a graph's forward or backward) on torch tensors (None allowed
    in backward), torch tensors out."""
    # through the bridge when torch's DLPack export gives the engine these
    # tensors' values: CPU tensors without a lazy negation bit, which
    # to_dlpack ignores (a lazy conjugate is complex, a dtype the engine
    # refuses on either path). (Inline: this is every call's overhead.)
    for x in tensors:
        if x is not None and not (x.is_cpu and not x.is_neg()):
            break
    else:
        outs = call(tensors, _BRIDGE)
        if outs is not None:
            return outs
    views = [None if x is None else _engine_input(x) for x in tensors]
    return [None if o is None else _torch_result(o, tensors, views) for o in call(views)]


def _torch_result(o, tensors, views):
    """A result of the engine as a torch tensor: an argument's view (an input's
    gradient that is an output's unchanged, as Add's) is the caller's tensor,
    as torch's autograd hands it on, anything else through DLPack."""
    for x, v in zip(tensors, views):
        if v is o:
            return x
    return from_dlpack(o.__dlpack__())


class _EngineFunction(torch.autograd.Function):
    """Autograd bridge: forward and backward are one engine call each."""

    @staticmethod
    def forward(ctx, module, anchor, *inputs):
        # anchor: a leaf that requires grad when no input does (the parameters
        # are engine memory, not arguments: without it autograd would record
        # nothing), else None (each argument that requires grad is an edge
        # the autograd engine walks at every backward)
        # what backward reads, in one attribute (_C.autograd_backward): this
        # forward's number, to tell whether the engine still holds its state
        graph, calls = module._graph, module._calls
        ctx.call = (module, graph, calls, calls[0], bool(module._params))
        # an output the loss does not use comes to backward as None, not
        # zeros: the parameters only it reaches keep a None gradient
        ctx.set_materialize_grads(False)
        outs = _graph_call(graph.forward, inputs)
        for o in outs:  # (a loop: a list comprehension's frame costs here)
            if not o.is_floating_point():
                ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
                break
        # the outputs are the engine's own forward results and the inputs the
        # caller's tensors, which the engine views (no copy): when backward
        # reads them (Relu, Tanh... their outputs; Mul, Gemm, Conv... their
        # inputs), saving them makes torch refuse a backward after an
        # in-place change to them instead of computing a wrong gradient; when
        # it does not (Add...), the change is harmless and torch allows it,
        # as it does for its own operators
        reads_inputs, reads_outputs = graph.backward_reads_inputs, graph.backward_reads_outputs
        if reads_inputs or reads_outputs:
            ctx.save_for_backward(*(inputs if reads_inputs else ()),
                                  *(outs if reads_outputs else ()))
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        # in C: where the backward reads outputs or inputs, ctx.saved_tensors
        # (torch's in-place check of the saved tensors), the older-forward check, and
        # for a module without parameters or with parameters in _backward's
        # steady state (module._steady_backward) the engine call through the
        # bridge (benchmarks/results/overhead.md); None: the rest is Python's
        grads = _autograd_backward(ctx, grad_outputs, _BRIDGE)
        return _backward_rest(ctx, grad_outputs) if grads is None else grads


def _backward_rest(ctx, grad_outputs):
    """_EngineFunction.backward after its checks: modules with parameters
    outside _backward's steady state, and gradients the bridge does not take."""
    module = ctx.call[0]
    if module._params:  # (kept lean: a small model's backward is mostly overhead)
        if module._learning_rate is not None:
            return (None, None, *module._stepping_backward(grad_outputs))
        return (None, None, *module._backward(grad_outputs))
    return (None, None, *_graph_call(module._graph.backward, grad_outputs))


# The autograd engine runs a Function's backward through the `apply` of its
# node class; torch's (BackwardCFunction.apply, Python) looks the user's
# function up at every call, about 2 us of a small model's backward. Unless
# torch's is replaced by something else, _EngineFunction's node class calls
# backward directly: what that apply does for a Function that defines
# neither vjp nor boxed gradients. That apply is backward's C part itself
# (_C.node_apply: no Python frame), _backward_rest where it answers None.
_NODE_CLS = getattr(_EngineFunction, "_backward_cls", None)
if (_NODE_CLS is not None
        and _NODE_CLS.apply is getattr(torch.autograd.function.BackwardCFunction, "apply", None)
        and _EngineFunction.vjp is torch.autograd.Function.vjp
        and not getattr(_EngineFunction, "boxed_grads_call", False)):
    _NODE_CLS.apply = _C.node_apply(_BRIDGE, _backward_rest)


# _EngineFunction.apply without the Python layer of Function.apply (which
# costs nearly as much as the C apply itself, benchmarks/results/overhead.md):
# outside functorch transforms that layer unwraps dead functorch wrappers
# (done here the same way) and calls the C apply; under a transform it
# takes the full path, which refuses a Function without setup_context.
_C_APPLY = super(torch.autograd.Function, _EngineFunction).apply
_UNWRAP_IF_DEAD = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


def _apply_engine_function(module, anchor, inputs):
    if _UNWRAP_IF_DEAD is None or torch._C._are_functorch_transforms_active():
        return _EngineFunction.apply(module, anchor, *inputs)
    return _C_APPLY(module, anchor, *map(_UNWRAP_IF_DEAD, inputs))


# The recipes of every graph wrap builds, training and inference alike:
# the same arithmetic as the exported graph (outputs and gradients bit for
# bit at a transformer's sizes, docs/graphs.md), the parameters untouched.
# fuse_linear: an nn.Linear on 3-D inputs, which the exporter writes as
# Transpose(W) -> MatMul -> Add(b), is one FusedMatMul reading W in place
# (a transformer's training step ran a Transpose and its slow backward per
# Linear: benchmarks/results/fuse-linear.md).
_GRAPH_RECIPES = ("fuse_linear",)


def _build_graph(model, **kwargs):
    """build_graph, then _GRAPH_RECIPES on the graph."""
    graph, proto = build_graph(model, **kwargs)
    for name in _GRAPH_RECIPES:
        graph.apply_recipe(name)
    return graph, proto


# The recipes of the fused inference graph (after _GRAPH_RECIPES); the graph
# is kept only when batchnorm_epilogue or fuse_gelu (after constant_fold,
# which prepares: shape subgraphs -> constants) changed it: without a
# BatchNorm or a written-out GELU the second graph would gain little.
# fuse_gelu: a tanh GELU written out in eight nodes (GPT-2) as one Gelu,
# the same function within float32 rounding, so for eval forwards only.
# fuse_activation then runs the Relu/Clip after a Conv/Gemm in place on
# the pool, in the BatchNorm epilogue's pass (csrc/ops/fused.c; a Conv
# applies both as it writes each output plane): no pass over the output of
# its own. remove_flatten is left out: it gains nothing measurable.
# block_channels last runs the conv chains in blocked channels
# (docs/engine.md); its residual fusion needs planned shapes, so the graph
# runs once before it.
# fuse_pad before it gives a zero Pad's padding to the Convs that read it
# (KWS's ZeroPad2d: one node and one activation buffer fewer).
# Measurements: benchmarks/results/fused-inference.md.
_INFERENCE_RECIPES = ("constant_fold", "fuse_gelu", "batchnorm_epilogue", "fuse_activation",
                      "fuse_pad", "block_channels")


class _Variant:
    """The graph of one call signature of a wrapped model (its export, its
    fused inference graph: None before the first try, False for none)."""

    def __init__(self, graph: _C.Graph, proto, export: _Export, source: torch.nn.Module):
        self.graph, self.proto, self.export, self.fused = graph, proto, export, None
        # plain: called with its graph's inputs alone, in order, as positional
        # tensors (forward's fast path)
        n = len(export.call_tensor_metas)
        self.plain = export.taken == list(range(n)) and _plain_call(source, export)


def _plain_call(source, export: _Export) -> bool:
    dummies = [torch.empty(0) for _ in export.call_tensor_metas]
    try:
        return flatten(_bind(source, tuple(dummies), {}), "input")[1] == export.call_structure
    except TypeError:
        return False


class AidgeModule(_EngineMemory, torch.nn.Module):
    """A torch module computed by the engine (returned by :func:`wrap`).

    - ``forward`` runs the whole graph in one C call (GIL released); a new
      batch size or input shape re-plans transparently.
    - backward runs the engine's backward in one C call; parameter
      gradients land in ``p.grad``, which is the engine's gradient buffer.
      A parameter frozen after ``wrap`` (``requires_grad_(False)``) keeps its
      gradient as torch would; one that was frozen at ``wrap`` is a buffer
      of the engine (no gradient computed): a forward that would need its
      gradient raises, wrap the model again after unfreezing it. A gradient
      hook on a parameter would never run (the engine writes the gradients
      itself): backward refuses it.
    - ``named_parameters()`` / ``named_buffers()`` have the torch model's
      names, order and shapes; ``.data`` is the engine's memory. New values
      given by replacing a tensor (``module.weight = t``, or ``p.data = t``,
      seen at the next forward) are copied into that memory; a new shape or
      dtype is refused (wrap the model again).
    - ``train()`` / ``eval()`` switch BatchNorm like torch; dropout runs as the
      identity (``wrap`` warns).

    Fused inference (``fuse_inference``, default True): a forward in eval
    mode that needs no backward (grad disabled, or neither the inputs nor
    any parameter require grad) runs a second graph, built on first use
    from ``onnx_model``, with the recipes ``constant_fold``, ``fuse_gelu``
    (a tanh GELU written out node by node -> one Gelu),
    ``batchnorm_epilogue`` (each Conv/Gemm applies the BatchNormalization
    after it to its output) and ``fuse_activation`` (Conv/Gemm + Relu/Clip,
    see ``_INFERENCE_RECIPES``). A model with neither a BatchNorm to move
    nor a GELU to fuse keeps one graph: the first such forward finds
    nothing and the module never tries again.

    The fused graph shares the main graph's memory for every parameter and
    buffer (as non-constant values: nothing is folded from them), and its
    BatchNorm epilogues recompute their per-channel factors from the
    current statistics at each forward. Whatever changes the weights (a
    torch or engine optimizer, ``load_state_dict``, ``p.data``, a NumPy or
    DLPack view, a train-mode forward updating BatchNorm statistics in C),
    the next fused forward reads them: there is nothing to compare or
    rebuild, and no second copy of the weights.
    """

    def __init__(self, graph: _C.Graph, proto, source: torch.nn.Module, in_graph: set,
                 export: _Export, fuse_inference: bool = True, kinds: dict | None = None,
                 export_options: dict | None = None):
        super().__init__()
        self.source_name = type(source).__name__
        # the torch model, to export it again for a call of another signature
        object.__setattr__(self, "_source", source)
        self._kinds = kinds or {}
        self._export_options = export_options or {"opset": DEFAULT_OPSET,
                                                  "dynamic_batch": True}
        # dim 0 of every input free in the export: a new batch size is the
        # same signature (the dynamo exporter may have fixed it)
        self._batch_free = all(not dims or dims[0] is None for dims in export.declared)
        self._calls = [0]  # forward counter (a list: nn.Module.__setattr__ is slow)
        self._learning_rate = None  # set_learning_rate's: backward steps the parameters
        # backward passes, and the parameters' versions after the first: a
        # loop whose parameters never change gets a warning (_check_stepping)
        self._backwards = [0, None]
        self._params, self._engine_grads, self._grad_views = [], [], []
        self._param_rows = []  # (parameter, engine gradient, its engine view): _backward's
        # parameters that required no gradient at wrap(): imported as buffers,
        # the engine has no gradient for them (name, parameter)
        self._frozen = []
        # (tensor, view): each parameter and graph buffer, and a view of its
        # engine memory (_relink); their data pointers, checked at each forward
        self._engine_tensors = []
        made = {}  # id of a torch parameter -> ours: tied weights stay one, under each name
        graph_name = {}  # id of a torch tensor -> the one of its names the graph has
        for name, t in itertools.chain(source.named_parameters(remove_duplicate=False),
                                       source.named_buffers(remove_duplicate=False)):
            if name in in_graph:
                graph_name.setdefault(id(t), name)
        for name, p in source.named_parameters(remove_duplicate=False):
            owner, leaf = _owner(self, name)
            if id(p) in made:
                owner.register_parameter(leaf, made[id(p)])
                continue
            if id(p) not in graph_name:  # unused by the export: a torch parameter
                made[id(p)] = torch.nn.Parameter(p.detach().clone(),
                                                 requires_grad=p.requires_grad)
                owner.register_parameter(leaf, made[id(p)])
                continue
            name = graph_name[id(p)]
            view = aidge_tensor_to_torch(graph.value(name))
            made[id(p)] = _EngineParameter(view, requires_grad=p.requires_grad)
            made[id(p)]._engine_name = name
            self._engine_tensors.append((made[id(p)], view))
            owner.register_parameter(leaf, made[id(p)])
            if p.requires_grad:
                self._params.append(owner._parameters[leaf])
                self._grad_views.append(graph.grad(name))
                self._engine_grads.append(aidge_tensor_to_torch(self._grad_views[-1]))
                self._param_rows.append((self._params[-1], self._engine_grads[-1],
                                         self._grad_views[-1]))
            else:
                self._frozen.append((name, made[id(p)]))
        # embeddings' padding rows: torch never adds to their gradient, while
        # the exported Gather knows nothing of padding_idx (engine gradient
        # view, row)
        engine_grad = dict(zip((p._engine_name for p in self._params), self._engine_grads))
        self._padding_rows = [
            (engine_grad[made[id(m.weight)]._engine_name], m.padding_idx)
            for m in source.modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
            and m.padding_idx is not None and id(m.weight) in made
            and made[id(m.weight)]._engine_name in engine_grad]
        # _backward's steady state (each p.grad the engine's buffer, no hook,
        # all requiring grad), which _C.autograd_backward runs in C: what it
        # reads, or None where Python runs every backward (padding rows, and
        # set_learning_rate's stepping: _steady_backward is None meanwhile)
        self._steady = None if self._padding_rows else (
            tuple((p, eg) for p, eg, _ in self._param_rows), self._backwards, _IDLE_BACKWARDS)
        self._steady_backward = self._steady
        # BatchNorms' num_batches_tracked, counted at each training forward:
        # the usual ones (0-d, not in the graph) are views of one tensor,
        # counted in one torch call (a call each: 3 us apiece, 80 us of
        # MobileNet's training step); any other in a list
        buffers = dict(source.named_buffers())
        counted = [n for n in buffers if n.rsplit(".", 1)[-1] == "num_batches_tracked"]
        stacked = {n: i for i, n in enumerate(
            n for n in counted if n not in in_graph and buffers[n].dim() == 0 and
            buffers[n].dtype == torch.long)}
        self._batch_counts = (torch.stack([buffers[n].detach() for n in stacked])
                              if stacked else None)
        self._batch_counters = []
        for name, b in buffers.items():
            owner, leaf = _owner(self, name)
            if name in stacked:
                t = self._batch_counts[stacked[name]]
            elif id(b) in graph_name:
                t = aidge_tensor_to_torch(graph.value(graph_name[id(b)]))
                t._engine_name = graph_name[id(b)]
                self._engine_tensors.append((t, t.detach()))
            else:
                t = b.detach().clone()
            owner.register_buffer(leaf, t)
            if name in counted and name not in stacked:
                self._batch_counters.append(t)
        self._engine_data = [t for t, _ in self._engine_tensors]
        self._engine_ptrs = [v.data_ptr() for _, v in self._engine_tensors]
        self._anchor = torch.zeros(0, requires_grad=True)
        # fused inference: the engine values it shares (name -> Tensor) and
        # the graph (None: not built yet, False: none)
        self._sources = {n: graph.value(n) for n in in_graph}
        self._reach_cache = {}  # (variant, outputs with a gradient) -> values reached
        self._grads = {n: graph.grad(n) for n in in_graph if self._kinds.get(n) == "param"}
        # one graph per call signature (see _Variant), the first one exported by wrap()
        self._variant = None
        first = _Variant(graph, proto, export, source)
        self._variants = {self._key_of(export.call_structure, export.call_tensor_metas): first}
        self._use(first)
        self.fuse_inference = fuse_inference
        self._fused_call = [0]  # the forward (self._calls) that ran the fused graph last
        self.train(source.training)

    @property
    def fuse_inference(self) -> bool:
        """Whether eval forwards without backward run the fused graph; setting
        it (True or False) drops the fused graph built so far."""
        return self._fuse_inference

    @fuse_inference.setter
    def fuse_inference(self, value: bool):
        self._fuse_inference = bool(value)
        for variant in self._variants.values():
            variant.fused = None if value else False
        self._fused = None if value else False

    # -- call signatures ---------------------------------------------------
    def _key_of(self, structure: Structure, metas) -> tuple:
        """A call's signature: its structure, and its tensors' (dtype, shape)
        (without dim 0 where the export leaves the batch free)."""
        if self._batch_free:
            metas = [(dt, shape[1:]) for dt, shape in metas]
        return structure, tuple(metas)

    def _use(self, variant: "_Variant"):
        """Makes ``variant`` the graph that forward runs."""
        if self._variant is not None:
            self._variant.fused = self._fused
        self._variant = variant
        self._graph = variant.graph
        self.onnx_model = variant.proto
        self.input_dims = variant.export.shapes
        self._n_inputs = len(variant.export.taken)
        self._taken = variant.export.taken
        self._plain = variant.plain
        self._out_structure = variant.export.out_structure
        self._out_single = self._out_structure.kind == "tensor"
        self._out_tuple = self._out_structure.kind == "tuple" and \
            self._out_structure.cls is None and \
            all(c.kind == "tensor" for c in self._out_structure.children)
        self._fused = variant.fused

    def _switch(self, arguments: dict, tensors: list, structure: Structure) -> bool:
        """Makes the graph of this call's signature current, exporting the
        model for it on first use; False if it is current already."""
        key = self._key_of(structure, [(t.dtype, tuple(t.shape)) for t in tensors])
        variant = self._variants.get(key)
        if variant is self._variant:
            return False
        if variant is None:
            variant = self._variants[key] = self._new_variant(arguments)
        self._use(variant)
        return True

    def _new_variant(self, arguments: dict) -> "_Variant":
        """The model exported for a call of another signature, on the same
        parameters and buffers (the engine's memory, shared) and the same
        gradients."""
        name = self.source_name
        try:
            export = _export(self._source, arguments, **self._export_options)
        except Exception as exc:
            raise RuntimeError(f"AidgeModule({name}): torch could not export {name} for "
                               f"this call: {exc}") from exc
        graph, proto = _build_graph(export.onnx_bytes, param_kinds=self._kinds,
                                    values=self._sources, share_values=True,
                                    grads=self._grads, where=f"AidgeModule({name})",
                                    input_shapes=export.shapes, free_batch=False)
        names = {i.name for i in proto.graph.initializer}
        missing = [n for n in self._sources if n not in names]
        if missing:
            raise RuntimeError(f"AidgeModule({name}): the graph exported for this call lacks "
                               f"{missing}, which the first export has")
        graph.profile = self._graph.profile
        return _Variant(graph, proto, export, self._source)

    def _declares_otherwise(self, inputs) -> bool:
        """Whether ``inputs`` contradict the dims the current graph declares
        (forward then raised): a call of another signature."""
        for x, dims in zip(inputs, self._variant.export.declared):
            if x.dim() != len(dims) or any(d is not None and d != n
                                           for d, n in zip(dims, x.shape)):
                return True
        return False

    # -- engine calls ------------------------------------------------------
    def _relink(self):
        """After `t.data = new` on parameters or buffers: new's values into the
        engine's memory, and t a view of that memory again."""
        for t, view in self._engine_tensors:
            if t.data_ptr() != view.data_ptr():
                _assign_engine(view, t.data, t._engine_name, "new .data given to")
                t.data = view

    def _hooked(self, p) -> NotImplementedError:
        return NotImplementedError(
            f"AidgeModule({self.source_name}): parameter '{p._engine_name}' has a gradient "
            "hook (register_hook or register_post_accumulate_grad_hook); the engine writes "
            "parameter gradients itself and runs no such hook: remove it, or apply it to "
            "p.grad after backward")

    def _check_frozen(self):
        for name, p in self._frozen:
            if p.requires_grad:
                raise RuntimeError(
                    f"AidgeModule({self.source_name}): parameter '{name}' required no "
                    "gradient when the model was wrapped, so the engine has none for it; "
                    "set requires_grad before wrap(), or wrap the model again")

    def _backward(self, grad_outputs):
        # kept lean: a small model's backward is mostly this bookkeeping and
        # the engine call (no list, zip or comprehension in the steady state,
        # where each p.grad is the engine's buffer: 1 us of 4 per parameter)
        fresh = None
        for p, eg, v in self._param_rows:
            if p._backward_hooks or p._post_accumulate_grad_hooks:
                raise self._hooked(p)
            g = p.grad
            if not p.requires_grad:  # frozen since wrap(): its gradient stays as it is,
                if g is not None and g.data_ptr() == eg.data_ptr():  # as torch leaves it,
                    p.grad = eg.clone()  # not the engine's buffer, which backward adds to
                continue
            if g is not eg and (g is None or g.data_ptr() != eg.data_ptr()):
                fresh = fresh or []
                fresh.append((p, eg, g, v))
        if fresh:  # the engine accumulates: these start from zero (one C call for all,
            _C.zero_tensors([v for *_, v in fresh])  # not a torch zero_ each: after
            torch.autograd.graph.increment_version([eg for _, eg, *_ in fresh])  # set_to_none
        kept = ([(g, row, g[row].clone()) for g, row in self._padding_rows]
                if self._padding_rows else ())
        input_grads = _graph_call(self._graph.backward, grad_outputs)
        for g, row, value in kept:
            g[row] = value
        # (not `None in grad_outputs`: that compares None with each tensor
        # through torch's __eq__, 40 us of a small backward)
        reached = None
        if fresh and any(g is None for g in grad_outputs):
            reached = self._reached(grad_outputs)
        for p, eg, g, _ in fresh or ():
            if g is None:
                if reached is None or p._engine_name in reached:
                    p.grad = eg  # from now on p.grad is the engine's buffer
            else:
                g.add_(eg)
        self._backwards[0] += 1
        if self._backwards[0] in (1, _IDLE_BACKWARDS):
            self._check_stepping()
        return input_grads

    def _check_stepping(self):
        """After the first backward, the parameters' versions; after the
        _IDLE_BACKWARDS-th, one warning if none changed (no optimizer
        stepped them: torch's and ours bump the version counters). A training
        loop written for aidge_interop_torch, whose backward stepped by
        itself, would otherwise run to its end with the weights untouched."""
        versions = [p._version for p in self._params if p.requires_grad]
        if self._backwards[0] == 1:
            self._backwards[1] = versions
        elif versions and versions == self._backwards[1]:
            warnings.warn(
                f"AidgeModule: {self._backwards[0]} backward passes and no step changed "
                "the parameters. As in torch, backward computes .grad and an optimizer "
                "(torch.optim.SGD, aidge_interop.SGD) steps them; aidge_interop_torch's "
                "backward stepped by itself: call set_learning_rate(lr) for that", stacklevel=2)

    def set_learning_rate(self, lr: float | None) -> None:
        """aidge_interop_torch's training: from now on each backward also
        steps the module's trainable parameters by plain SGD, ``p -= lr *
        grad``, with that backward's gradient alone, and leaves their
        ``.grad`` as it was: an optimizer over them (alone or with other
        modules) does not step them a second time. ``None`` goes back to
        torch's way (backward accumulates into ``.grad``, an optimizer
        steps). See docs/wrap.md, "Coming from aidge_interop_torch"."""
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float))
                               or not 0 <= lr < float("inf")):
            raise ValueError(f"AidgeModule.set_learning_rate: argument 'lr' must be a finite "
                             f"number >= 0 or None, not {lr!r}")
        if lr is not None:
            for p, eg in zip(self._params, self._engine_grads):
                if p.grad is eg:  # backward zeroes the engine's buffer: keep what it holds
                    p.grad = eg.clone()
        self._learning_rate = None if lr is None else float(lr)
        self._steady_backward = self._steady if lr is None else None

    def _stepping_backward(self, grad_outputs):
        """backward after set_learning_rate: the gradients of this backward
        alone (each parameter starts from zero, as if its .grad were None),
        an SGD step with them, .grad left as it was."""
        kept = [p.grad for p in self._params]
        for p in self._params:
            p.grad = None
        try:
            input_grads = self._backward(grad_outputs)
            stepped = [p for p, eg in zip(self._params, self._engine_grads) if p.grad is eg]
            if stepped:
                with torch.no_grad():
                    torch._foreach_add_(stepped, [p.grad for p in stepped],
                                        alpha=-self._learning_rate)
        finally:
            for p, g in zip(self._params, kept):
                p.grad = g
        return input_grads

    def _reached(self, grad_outputs) -> set:
        """The values on a path to an output that has a gradient (some have
        none): a parameter outside it gets no gradient in torch (None)."""
        mask = tuple(g is not None for g in grad_outputs)
        key = (id(self._variant), mask)
        reached = self._reach_cache.get(key)
        if reached is None:
            graph = self.onnx_model.graph
            producer = {out: n for n in graph.node for out in n.output}
            todo = [o.name for o, has in zip(graph.output, mask) if has]
            reached = set()
            while todo:
                value = todo.pop()
                if value not in reached:
                    reached.add(value)
                    if value in producer:
                        todo.extend(producer[value].input)
            self._reach_cache[key] = reached
        return reached

    def _build_fused(self, inputs):
        """The fused inference graph from the current values (planned for
        ``inputs``), or False when the recipes change nothing (or fail: then
        with a warning)."""
        from ..graph import Graph
        from ..recipes import RECIPES

        where = f"AidgeModule({self.source_name}) fused inference"
        try:
            # the module's parameters and buffers: shared, never folded
            # ("buffer"); the graph's other initializers: constants
            g, _ = _build_graph(self.onnx_model, values=self._sources, share_values=True,
                                where=where, input_shapes=self.input_dims,
                                param_kinds={i.name: "buffer" if i.name in self._sources
                                             else "const"
                                             for i in self.onnx_model.graph.initializer})
            graph = Graph(g, self.onnx_model)
            reports = {}
            for name in _INFERENCE_RECIPES:
                if name == "block_channels":  # plans the shapes its residual fusion checks
                    try:
                        _graph_call(g.forward, inputs)
                    except Exception:  # bad inputs: the forward that follows says why;
                        pass           # block_channels then leaves the residual Adds alone
                reports[name] = RECIPES[name](graph)
        except Exception as exc:  # the main graph still runs: say so, do not fail
            warnings.warn(f"{where}: disabled, the graph could not be fused: {exc}",
                          RuntimeWarning, stacklevel=4)
            return False
        if not (reports["batchnorm_epilogue"] or reports["fuse_gelu"]):  # nothing fused
            return False
        graph._g.profile = self._graph.profile  # inside aidge_interop.profile()
        return graph._g

    def _run_fused(self, inputs):
        fused = self._fused
        if fused is None:
            fused = self._fused = self._build_fused(inputs)
            if fused is False:
                return _graph_call(self._graph.forward, inputs)
        self._fused_call[0] = self._calls[0]
        return _graph_call(fused.forward, inputs)

    def _call(self, *inputs, **kwargs):
        # __call__ where _C.module_call's steady-state path does not apply
        # (see below). nn.Module.__call__ goes straight to forward when no
        # hook is registered; this is that test without its two extra
        # Python calls (0.44 us of a 16-feature Linear's 4-5 us, paired).
        # Anything else (hooks, keyword arguments, torch.compile, jit
        # tracing) takes torch's own path.
        if (kwargs or self._forward_pre_hooks or self._forward_hooks or self._backward_hooks
                or self._backward_pre_hooks or self._compiled_call_impl is not None
                or _nn_module._global_forward_pre_hooks or _nn_module._global_forward_hooks
                or _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks
                or torch._C._get_tracing_state()):
            return super().__call__(*inputs, **kwargs)
        return self.forward(*inputs)

    def forward(self, *args, **kwargs):
        # kept lean: this is the per-call overhead of every wrapped model
        if self._plain and not kwargs and len(args) == self._n_inputs:
            try:
                outs = self._run(args)
            except ValueError:
                if not self._declares_otherwise(args):
                    raise
                return self._forward_call(args, kwargs)  # another shape: another graph
            if self._out_single:
                return outs[0]
            if self._out_tuple:
                return tuple(outs)
            return unflatten(self._out_structure, outs)
        return self._forward_call(args, kwargs)

    def _forward_call(self, args, kwargs):
        """forward for any call: the arguments bound to the model's signature,
        the graph of their signature, the result's structure rebuilt."""
        arguments = _bind(self._source, args, kwargs)
        caches = []
        tensors, structure = flatten(arguments, "input", caches)
        self._switch(arguments, tensors, structure)
        outs = self._run([tensors[i] for i in self._taken])
        return unflatten(self._out_structure, outs, caches)  # the call's caches updated

    def _run(self, inputs):
        """The engine's outputs for the graph's inputs (torch tensors)."""
        if _C.data_moved(self._engine_data, self._engine_ptrs) >= 0:
            self._relink()
        input_grads = False
        for x in inputs:
            if not isinstance(x, torch.Tensor):
                raise self._not_a_tensor(inputs)
            if x.requires_grad:
                input_grads = True
        need_backward = False
        if torch.is_grad_enabled():
            need_backward = input_grads
            if not need_backward:  # any parameter requiring grad (a generator costs here)
                for p in self._params:
                    if p.requires_grad:
                        need_backward = True
                        break
            if self._frozen:
                self._check_frozen()
        input_grads = input_grads and need_backward
        training = self.training
        g = self._graph
        g.training = training
        g.need_backward = need_backward
        g.input_grads = input_grads
        self._calls[0] += 1
        if not training:  # the graph that runs reads packed weights of this version
            run = g if need_backward or not self._fused else self._fused
            if run.weights_packable:
                run.weights_version = sum([t._version for t in self._engine_data]) + \
                    _DATA_READS[0]
        if need_backward:
            outs = _apply_engine_function(self, None if input_grads else self._anchor, inputs)
        elif not training and self._fused is not False:
            outs = self._run_fused(inputs)
        else:
            outs = _graph_call(g.forward, inputs)
        if training:
            if self._batch_counts is not None:
                self._batch_counts.add_(1)
            for counter in self._batch_counters:
                counter.add_(1)
        return outs

    def _not_a_tensor(self, inputs) -> TypeError:
        i, x = next((i, x) for i, x in enumerate(inputs) if not isinstance(x, torch.Tensor))
        return TypeError(f"AidgeModule({self.source_name}): input {i} must be a "
                         f"torch.Tensor, not {type(x).__name__}")

    # -- torch.nn.Module plumbing -----------------------------------------
    def _apply(self, fn, recurse=True):
        # the parameters are the engine's memory: moving or casting them would
        # silently detach the module from the engine
        for t in itertools.chain(self.parameters(), self.buffers()):
            out = fn(t)
            if out.data_ptr() != t.data_ptr() or out.dtype != t.dtype or out.device != t.device:
                raise NotImplementedError(
                    "AidgeModule lives in the engine's CPU memory and cannot be moved or "
                    "cast; wrap a torch model that already has the device and dtype you need"
                )
        return self

    def memory_stats(self) -> dict:
        """The main graph's memory plan (``Graph.memory_stats``), plus
        ``"inference"``: the fused inference graph's plan (None while there is
        none) and ``"last_graph"``: ``"main"`` or ``"inference"``, the graph the
        latest forward ran."""
        stats = self._graph.memory_stats()
        fused = self._fused
        stats["inference"] = fused.memory_stats() if fused else None
        stats["last_graph"] = "inference" if fused and self._fused_call[0] == self._calls[0] \
            else "main"
        return stats

    def extra_repr(self) -> str:
        return f"source={self.source_name}, nodes={len(self._graph.nodes())}, engine=aidge_interop"


# AidgeModule's __call__ is a C method descriptor (no Python frame between
# the caller and the engine): a forward without grad on plain CPU tensors,
# with no hook, the module's graph current and its memory in place, runs
# _call's, forward's and _run's steps in C; anything else is _call as it
# was (csrc/python/graph.c, module_call; benchmarks/results/overhead.md).
AidgeModule.__call__ = _C.module_call(
    AidgeModule, _BRIDGE, AidgeModule._call, _graph_call, torch.Tensor, _nn_module,
    torch._C._get_tracing_state, torch._C.is_grad_enabled, _DATA_READS,
    torch._C.DisableTorchFunctionSubclass)
