"""``aidge_interop_torch``'s spelling of :func:`wrap` (Eclipse Aidge's torch
bridge, 0.10): ``wrap(torch_model, input_size, opset_version=18,
save_onnx_model=False, in_names=None, out_names=None, verbose=False)``,
mapped onto ours so that a script written for it runs with its import
changed and nothing else (docs/wrap.md, "Coming from aidge_interop_torch")."""
from __future__ import annotations

import os
from pathlib import Path

import onnx

from .._util import write_atomic
from .structure import flatten

__all__ = ["wrap_options", "graph_names", "value_names", "after_export"]


def _given(value) -> bool:
    """Whether ``input_dims`` was given (its default is ``()``)."""
    return not (isinstance(value, tuple) and not value)


def wrap_options(name: str, input_dims, input_size, opset, opset_version, default_opset: int,
                 save_onnx_model):
    """``(input_dims, opset, path)``: the example inputs, the opset and the
    file to save the ONNX model to (None: none) of a call that may use
    either spelling. One value under both names is a TypeError."""
    for ours, theirs, both in (("input_dims", "input_size",
                                input_size is not None and _given(input_dims)),
                               ("opset", "opset_version",
                                opset_version is not None and opset is not None)):
        if both:
            raise TypeError(f"wrap: got both '{ours}' and '{theirs}' (aidge_interop_torch's "
                            "name for it): give one")
    if input_size is not None:
        input_dims = input_size
    opset = opset_version if opset_version is not None else opset
    if opset is None:
        opset = default_opset
    if not isinstance(opset, int) or isinstance(opset, bool):
        raise TypeError(f"wrap: the opset must be an int, not {opset!r}")
    if save_onnx_model is True:
        path = Path(f"{name}.onnx")  # where aidge_interop_torch saves it: the working folder
    elif save_onnx_model is False or save_onnx_model is None:
        path = None
    elif isinstance(save_onnx_model, (str, os.PathLike)):
        path = Path(save_onnx_model)
    else:
        raise TypeError(f"wrap: argument 'save_onnx_model' must be a bool (True: ./{name}.onnx) "
                        f"or a path, not {type(save_onnx_model).__name__}")
    if path is not None and not path.absolute().parent.is_dir():
        raise FileNotFoundError(f"wrap: save_onnx_model={str(path)!r}: folder "
                                f"{str(path.absolute().parent)!r} does not exist")
    return input_dims, opset, path


def value_names(given, n: int, prefix: str, arg: str) -> list[str]:
    """The names of ``n`` graph inputs or outputs: the ``given`` ones (from
    argument ``arg``), then ``{prefix}_{i}``. More names than values (torch
    would give the extra input names to the parameters) or a name twice (it
    would rename one) is a ValueError."""
    given = list(given or ())
    if len(given) > n:
        raise ValueError(f"argument '{arg}' has {len(given)} names for {n} graph {prefix}s")
    names = given + [f"{prefix}_{i}" for i in range(len(given), n)]
    if len(set(names)) != len(names):
        raise ValueError(f"argument '{arg}': the graph's {prefix} names {names} are not "
                         "distinct")
    return names


def graph_names(model, arguments: dict, in_names, out_names) -> dict:
    """``in_names`` and ``out_names`` checked for a call of ``arguments``:
    lists of distinct strings, none a parameter's or buffer's name (torch
    would rename one of the two silently), at most one input name per
    tensor of the call. As keyword arguments of ``_export``."""
    names = {}
    for arg, value in (("in_names", in_names), ("out_names", out_names)):
        if value is None:
            continue
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or \
                not all(isinstance(v, str) and v for v in value):
            raise TypeError(f"wrap: argument '{arg}' must be a list of non-empty str, not "
                            f"{value!r}")
        names[arg] = list(value)
    if not names:
        return names
    n_inputs = len(flatten(arguments, "input")[0])
    try:
        inputs = value_names(names.get("in_names"), n_inputs, "input", "in_names")
    except ValueError as exc:
        raise ValueError(f"wrap: {exc}") from None
    taken = {n: "a parameter or buffer of the model" for n, _ in
             [*model.named_parameters(remove_duplicate=False),
              *model.named_buffers(remove_duplicate=False)]}
    for arg, value in (("in_names", inputs),
                       ("out_names", names.get("out_names", ()))):
        for v in value:
            if v in taken:
                raise ValueError(f"wrap: name {v!r} in '{arg}' is also {taken[v]}: graph "
                                 "names must be distinct")
            taken[v] = f"a name in '{arg}'"
    return names


def after_export(name: str, onnx_bytes: bytes, path: Path | None, verbose: bool) -> None:
    """Saves the exported model to ``path`` (atomically) and, with
    ``verbose``, prints it, as aidge_interop_torch does."""
    if verbose:  # the graph, its initializers by name and shape (not their values)
        graph = onnx.load_from_string(onnx_bytes).graph
        weights = ", ".join(f"{i.name} {list(i.dims)}" for i in graph.initializer)
        del graph.initializer[:]
        print(f"{onnx.printer.to_text(graph)}\ninitializers: {weights}")
    if path is not None:
        write_atomic(path, onnx_bytes)
        if verbose:
            print(f"Saved the ONNX model of {name} to {path}")
