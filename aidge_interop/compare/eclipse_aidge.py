"""Eclipse Aidge as an engine: inference, and training where ``aidge_learning`` is installed.

::

    from aidge_interop.compare.eclipse_aidge import AidgeModel, AidgeSGD

    model = AidgeModel(torch_model, [(2, 16)])   # a torch.nn.Module run by Eclipse Aidge
    optimizer = AidgeSGD(model, lr=0.01)          # aidge_learning.SGD over its producers
    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()                               # Aidge's backward scheduler
    optimizer.step()

The model goes to Aidge as ONNX (opset ``ONNX_OPSET``, fixed shapes),
first simplified by :func:`fold_constants`: our engine's ``constant_fold``
computes every subgraph on constants (the shape arithmetic torch exports
for ``ZeroPad2d``, ...), and the ONNX model is written again with those
values as initializers. Aidge 0.10.1 cannot run some of those subgraphs
itself (``Slice: Step (-1) is negative``), which the upstream bridge
avoids the same way (onnxsim).

What Aidge cannot do (an operator it does not import or has no CPU kernel
for, a backward it lacks, an error inside its scheduler) raises
:class:`~aidge_interop._util.EngineUnsupported` with Aidge's own message:
the harness reports it as a skip, ``compare`` as a failed row.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile

import numpy as np
import torch

from .._util import EngineUnsupported

__all__ = ["ONNX_OPSET", "fold_constants", "AidgeGraph", "AidgeModel", "AidgeSGD"]


#: Opset of the exports AidgeModel hands to Aidge (aidge_onnx 0.10 reads it;
#: engines.ONNX_OPSET, the comparison's exports, is the same for that reason).
ONNX_OPSET = 13


# -- the ONNX model handed to Aidge ------------------------------------------------------

def _reads(node):
    """Every name ``node`` reads, those of its subgraphs (If, Loop, Scan) included."""
    import onnx

    names = list(node.input)
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                names += _reads(inner)
    return names


def _with_input_shapes(proto, shapes):
    """A copy of ``proto`` whose graph inputs declare ``shapes``."""
    import onnx

    inputs = proto.graph.input
    if len(shapes) != len(inputs):
        raise ValueError(f"{len(shapes)} input shape(s) for a model of {len(inputs)} "
                         f"input(s) ({', '.join(i.name for i in inputs)})")
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for value, shape in zip(out.graph.input, shapes):
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for d in shape:
            dims.add().dim_value = int(d)
    return out


def fold_constants(proto, shapes=None):
    """``proto`` (an ``onnx.ModelProto``) with every value our engine's
    ``constant_fold`` computes from constants alone (not from inputs,
    parameters or buffers) stored as an initializer, and the nodes,
    initializers and value infos nothing reads any more removed. ``shapes``
    (one per graph input) first fixes the inputs' dimensions, so that shape
    arithmetic folds too. Returns ``proto`` itself when nothing changes."""
    import onnx
    from onnx import numpy_helper

    from .. import recipes
    from ..onnx.importer import load_onnx

    if shapes is not None:
        proto = _with_input_shapes(proto, shapes)
    graph = load_onnx(proto)
    if not recipes.constant_fold(graph):
        return proto
    kinds = {v["name"]: v["kind"] for v in graph._g.values()}
    producer = {out: node for node in proto.graph.node for out in node.output if out}
    given = {i.name for i in proto.graph.input} | {i.name for i in proto.graph.initializer}
    kept, folded, seen = set(), [], set()
    stack = [o.name for o in proto.graph.output]
    while stack:  # from the outputs back, stopping at constants
        name = stack.pop()
        if name in seen or not name or name in given:
            continue
        seen.add(name)
        node = producer.get(name)  # None: a name local to a subgraph
        if node is None:
            continue
        if kinds.get(name) == "const":
            folded.append(name)
        elif id(node) not in kept:
            kept.add(id(node))
            stack += _reads(node)
    folded = [n for n in folded if id(producer[n]) not in kept]  # a kept node writes it
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[:]
    out.graph.node.extend(n for n in proto.graph.node if id(n) in kept)
    read = {name for n in out.graph.node for name in _reads(n)} | \
        {o.name for o in proto.graph.output}
    inits = [i for i in proto.graph.initializer if i.name in read]
    inits += [numpy_helper.from_array(np.asarray(graph._g.value(n).numpy()), n) for n in folded]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    written = {o for n in out.graph.node for o in n.output}
    infos = [v for v in proto.graph.value_info if v.name in written]
    del out.graph.value_info[:]
    out.graph.value_info.extend(infos)
    return out


def _aidge_names(proto):
    """A copy of ``proto`` whose graph inputs are named ``input_<k>`` and
    initializers ``init_<k>``: names aidge_onnx keeps (it rewrites
    ``conv.weight`` as ``conv_weight``, prefixes ``data_`` to a leading
    digit), so that its nodes can be found again. Returns the copy and
    new name -> old name for the initializers."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    inits = {i.name: f"init_{k}" for k, i in enumerate(out.graph.initializer)}
    names = {**{i.name: f"input_{k}" for k, i in enumerate(out.graph.input)}, **inits}

    def rename(graph):
        for node in graph.node:
            node.input[:] = [names.get(n, n) for n in node.input]
            for attr in node.attribute:
                for inner in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    rename(inner)
        for value in graph.output:
            value.name = names.get(value.name, value.name)

    for value in [*out.graph.initializer, *out.graph.input]:
        value.name = names[value.name]
    rename(out.graph)
    return out, {new: old for old, new in inits.items()}


@contextlib.contextmanager
def _aidge_errors(what: str):
    """Turns an exception raised inside Aidge into EngineUnsupported naming ``what``."""
    try:
        yield
    except EngineUnsupported:
        raise
    except Exception as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise EngineUnsupported(f"Eclipse Aidge: {what}: {text}") from exc


@contextlib.contextmanager
def _converter_errors():
    """The errors of aidge_onnx's node converters while the body runs: it
    logs them (``Log.warn``) and imports the node as a GenericOperator."""
    import aidge_core

    errors, warn = [], aidge_core.Log.warn

    def capture(message, *args):
        if "returned:" in message:
            errors.append(message.rsplit("returned:", 1)[1].strip().strip('"'))
        return warn(message, *args)

    aidge_core.Log.warn = staticmethod(capture)
    try:
        yield errors
    finally:
        aidge_core.Log.warn = warn


@contextlib.contextmanager
def _logged_errors():
    """The ERROR entries Aidge's C++ log writes to the console (file
    descriptors 1 and 2) while the body runs, in a list filled on exit; the
    console output itself is written to stderr afterwards. A console level
    above Error (``aidge-interop compare`` sets Fatal, a user may too) is
    lowered to Error meanwhile, so that the errors are written, and what it
    would have hidden is not shown."""
    import aidge_core

    errors = []
    level = aidge_core.Log.get_console_level()
    shown = level.value <= aidge_core.Level.Error.value
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        if not shown:
            aidge_core.Log.set_console_level(aidge_core.Level.Error)
        try:
            yield errors
        finally:
            aidge_core.Log.set_console_level(level)
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            log.seek(0)
            text = log.read()
            if shown:
                os.write(2, text)
            entry = None
            for line in re.sub(r"\x1b\[[0-9;]*m", "", text.decode(errors="replace")).splitlines():
                head, _, rest = line.partition("]")
                if head == "[ERROR" and rest.startswith(" - "):
                    entry = [rest[3:].strip()]
                    errors.append(entry)
                elif head == "[ERROR" and entry is not None:
                    entry.append(rest.strip())
                else:
                    entry = None
            errors[:] = [" ".join(e) for e in errors]


def _tensor(array: np.ndarray):
    import aidge_core

    t = aidge_core.Tensor(np.ascontiguousarray(array))
    t.set_backend("cpu")
    return t


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


class AidgeGraph:
    """An ONNX model in Eclipse Aidge: ``aidge_onnx.load_onnx``, backend
    "cpu", dimensions forwarded for ``shapes`` (one per graph input),
    sequential scheduler. ``forward`` and ``backward`` take and return
    NumPy arrays; ``producers`` maps each initializer's name in ``proto``
    to its Producer node. Raises EngineUnsupported when Aidge refuses the
    model."""

    def __init__(self, proto, shapes):
        import aidge_backend_cpu  # noqa: F401  (registers the "cpu" backend)
        import aidge_core
        import aidge_onnx

        renamed, init_names = _aidge_names(proto)
        with _aidge_errors("importing the ONNX model"), _converter_errors() as errors:
            graph = aidge_onnx.load_onnx(renamed.SerializeToString())
        generic = [n for n in graph.get_nodes()
                   if isinstance(n.get_operator(), aidge_core.GenericOperatorOp)]
        if generic:  # aidge_onnx imports what it cannot convert as a generic node
            what = "; ".join(dict.fromkeys(f"{n.type()} {dict(n.get_operator().attr.dict())}"
                                           for n in generic))
            why = f" (aidge_onnx: {'; '.join(dict.fromkeys(errors))})" if errors else ""
            raise EngineUnsupported(f"Eclipse Aidge: ONNX {what} imported as a GenericOperator, "
                                    f"which has no kernel{why}")
        with _aidge_errors("preparing the graph (set_backend, forward_dims, scheduling)"):
            graph.set_backend("cpu")
            graph.forward_dtype()
            with _logged_errors() as logged:
                ok = graph.forward_dims([list(s) for s in shapes], True)
            if not ok:  # Aidge logs why and returns False
                raise RuntimeError(f"forward_dims failed for input shapes "
                                   f"{[list(s) for s in shapes]}"
                                   + "".join(f": {e}" for e in logged[:1]))
            self.scheduler = aidge_core.SequentialScheduler(graph)
            self.scheduler.generate_scheduling()
        self.graph = graph
        # where each graph input goes (aidge_onnx puts an Identity before one
        # read twice); other free inputs are optional ones left unconnected
        free = {node.input_name(i): (node, i) for node, i in graph.get_ordered_inputs()}
        names = [i.name for i in renamed.graph.input]
        missing = [proto.graph.input[k].name for k, n in enumerate(names) if n not in free]
        if missing:
            raise EngineUnsupported(f"Eclipse Aidge: graph input(s) {missing} are not free "
                                    "inputs of its graph")
        self.inputs = [free[n] for n in names]
        self.outputs = graph.get_ordered_outputs()
        # the tensors of the inputs (ours, the operators') and outputs, once known
        self._fed = self._held = self._results = None
        self.producers = {init_names[p.name()]: p for p in aidge_core.producers(graph)
                          if p.name() in init_names}

    def forward(self, arrays) -> list[np.ndarray]:
        """One forward on ``arrays`` (one per input, of the shapes prepared
        for): a copy of each output."""
        with _aidge_errors("forward"):
            if self._fed is None:  # Aidge's input tensors, given once and refilled after
                # (each set_input, get_input or get_output call costs about 0.1 ms);
                # the operators hold tensors of their own over the same data, whose
                # gradients the backward writes
                self._fed = [_tensor(a) for a in arrays]
                for (node, i), t in zip(self.inputs, self._fed):
                    node.get_operator().set_input(i, t)
                self._held = [node.get_operator().get_input(i) for node, i in self.inputs]
            else:
                for t, a in zip(self._fed, arrays):
                    np.asarray(t)[...] = a
            self.scheduler.forward(forward_dims=False)
            if self._results is None:
                self._results = [node.get_operator().get_output(i) for node, i in self.outputs]
            return [np.array(t, copy=True) for t in self._results]

    def backward(self, grads, producers=()) -> list[np.ndarray]:
        """Aidge's backward scheduler from the outputs' gradients (None:
        zeros) after a forward; returns the inputs' gradients. The gradients
        of ``producers`` (their output tensors) are zeroed first: they are
        then this backward's."""
        with _aidge_errors("backward"):
            for out, g in zip(self._results, grads):
                np.asarray(out.grad)[...] = 0 if g is None else g
            for t in self._held + list(producers):  # the backward adds to what it finds
                np.asarray(t.grad)[...] = 0
            self.scheduler.backward()
            return [np.array(t.grad, copy=True) for t in self._held]


# -- a torch module run by Aidge ----------------------------------------------------------

class _AidgeFunction(torch.autograd.Function):
    """Forward and backward of a whole AidgeModel; its parameters are inputs,
    so that autograd hands their gradients to torch."""

    @staticmethod
    def forward(ctx, model, n_inputs, *tensors):
        ctx.model = model
        outs = model._run_forward([t.detach().numpy() for t in tensors[:n_inputs]])
        ctx.forward_id = model._forwards
        return tuple(torch.from_numpy(o) for o in outs)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.forward_id != ctx.model._forwards:
            raise RuntimeError(f"AidgeModel({ctx.model.source_name}): backward through a "
                               "forward that is not the last one; Eclipse Aidge keeps the "
                               "state of its last forward only")
        grad_inputs, grad_params = ctx.model._run_backward(
            [None if g is None else g.detach().contiguous().numpy() for g in grads])
        return (None, None, *(torch.from_numpy(g) for g in grad_inputs + grad_params))


class AidgeModel(torch.nn.Module):
    """``torch_model`` run by Eclipse Aidge for inputs like ``input_dims``
    (one example float tensor, or a shape, per input; shapes fixed).

    ``named_parameters()`` has the torch model's names and shapes; their
    values mirror Aidge's producers (copied at construction and after each
    :class:`AidgeSGD` step), and a backward (Aidge's backward scheduler)
    writes Aidge's gradients into ``p.grad``. ``train()``/``eval()`` switch
    Aidge's BatchNorm training mode. ``onnx_model`` is the simplified ONNX
    model Aidge was given (see :class:`AidgeGraph` for the names).
    """

    def __init__(self, torch_model: torch.nn.Module, input_dims):
        import onnx

        from ..bridge.wrapping import _bind, _export, _model_dtype, _owner

        super().__init__()
        if not isinstance(torch_model, torch.nn.Module):
            raise TypeError(f"AidgeModel: argument 'torch_model' must be a torch.nn.Module, "
                            f"not {type(torch_model).__name__}")
        gen = torch.Generator().manual_seed(0)
        dtype = _model_dtype(torch_model)
        try:
            example = tuple(d if isinstance(d, torch.Tensor) and d.is_floating_point() else
                            torch.randn(tuple(int(n) for n in d), generator=gen, dtype=dtype)
                            for d in input_dims)
        except (TypeError, ValueError):
            example = ()
        if not example:
            raise TypeError(f"AidgeModel: argument 'input_dims' must be one float tensor or "
                            f"shape per input, e.g. [(1, 16)]; got {input_dims!r}")
        self.source_name = type(torch_model).__name__
        object.__setattr__(self, "_source", torch_model)  # its forward's signature binds calls
        export = _export(torch_model, _bind(torch_model, example, {}), opset=ONNX_OPSET,
                         dynamic_batch=False)
        self.onnx_model = fold_constants(onnx.load_from_string(export.onnx_bytes))
        self._call_structure, self._out_structure = export.call_structure, export.out_structure
        self._taken, self._shapes = export.taken, [tuple(s) for s in export.shapes]
        self._aidge = AidgeGraph(self.onnx_model, self._shapes)
        producers = self._aidge.producers
        # each torch parameter: a mirror under its name; those in the graph, and their producers
        self._params, self._producers = [], []
        made = {}
        for name, p in torch_model.named_parameters(remove_duplicate=False):
            if id(p) not in made:
                made[id(p)] = torch.nn.Parameter(p.detach().clone(),
                                                 requires_grad=p.requires_grad)
                if name in producers:
                    self._params.append(made[id(p)])
                    self._producers.append(producers[name])
            owner, leaf = _owner(self, name)
            owner.register_parameter(leaf, made[id(p)])
        self._values = [node.get_operator().get_output(0) for node in self._producers]
        self._forwards = 0  # forwards run: a backward goes through the last one only
        self.train(torch_model.training)

    def train(self, mode: bool = True):
        super().train(mode)
        if "_aidge" in self.__dict__ and _importable("aidge_learning"):
            import aidge_learning

            aidge_learning.set_batchnorm_training_mode(self._aidge.graph, mode)
        return self

    def forward(self, *args, **kwargs):
        from ..bridge.structure import flatten, unflatten
        from ..bridge.wrapping import _bind

        tensors, structure = flatten(_bind(self._source, args, kwargs), "input")
        if structure != self._call_structure:
            raise ValueError(f"AidgeModel({self.source_name}): called with another structure "
                             "of arguments than the one it was built for")
        taken = [tensors[i] for i in self._taken]
        shapes = [tuple(t.shape) for t in taken]
        if shapes != self._shapes:
            raise ValueError(f"AidgeModel({self.source_name}): built for input shapes "
                             f"{self._shapes}, called with {shapes}")
        outs = _AidgeFunction.apply(self, len(taken), *taken, *self._params)
        return unflatten(self._out_structure, list(outs))

    # -- what _AidgeFunction calls ---------------------------------------------
    def _run_forward(self, arrays):
        self._forwards += 1
        return self._aidge.forward(arrays)

    def _run_backward(self, grads):
        grad_inputs = [self._as_shape(g, s, f"gradient of input {k}") for k, (g, s) in
                       enumerate(zip(self._aidge.backward(grads, self._values), self._shapes))]
        grad_params = [self._as_shape(np.array(t.grad), tuple(p.shape),
                                      f"gradient of {node.name()}")
                       for p, node, t in zip(self._params, self._producers, self._values)]
        return grad_inputs, grad_params

    def _as_shape(self, array: np.ndarray, shape: tuple, what: str) -> np.ndarray:
        """Aidge's array in torch's shape: Aidge keeps a 0-d tensor as [1]."""
        if array.size != int(np.prod(shape)):
            raise RuntimeError(f"AidgeModel({self.source_name}): Eclipse Aidge's {what} has "
                               f"shape {array.shape}, torch's {shape}")
        return np.array(array.reshape(shape), copy=True)

    def _mirror(self):
        """Copies Aidge's producers into the torch parameters."""
        with torch.no_grad():
            for p, node, t in zip(self._params, self._producers, self._values):
                p.copy_(torch.from_numpy(self._as_shape(np.array(t), tuple(p.shape),
                                                        node.name())))


class AidgeSGD:
    """``aidge_learning.SGD`` (constant learning rate ``lr``, ``momentum``,
    ``weight_decay``) over the producers of an :class:`AidgeModel`, driven
    like a torch optimizer: ``zero_grad()`` resets Aidge's gradients and the
    torch mirrors', ``step()`` hands the torch parameters' gradients to
    Aidge's producers, updates them and copies them into the torch
    parameters. ``defaults`` holds the hyper-parameters, for a torch
    ``SGD`` that should train alike."""

    def __init__(self, model, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        import aidge_learning

        if not lr > 0:
            raise ValueError(f"AidgeSGD: lr must be > 0, got {lr}")
        self.model = model
        self.defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        self._optimizer = aidge_learning.SGD(momentum=momentum, weight_decay=weight_decay)
        self._optimizer.set_learning_rate_scheduler(aidge_learning.constant_lr(lr))
        self._optimizer.set_parameters(
            [n for n, p in zip(model._producers, model._params) if p.requires_grad])

    def zero_grad(self, set_to_none: bool = True) -> None:
        with _aidge_errors("reset_grad"):
            self._optimizer.reset_grad()
        for p in self.model.parameters():
            p.grad = None

    def step(self) -> None:
        """Updates from the torch parameters' gradients (Aidge's, summed by
        torch over the backwards since ``zero_grad``), as torch's SGD would."""
        for p, t in zip(self.model._params, self.model._values):
            np.asarray(t.grad)[...] = 0 if p.grad is None else \
                p.grad.detach().numpy().reshape(np.asarray(t.grad).shape)
        with _aidge_errors("SGD update"):
            self._optimizer.update()
        self.model._mirror()
