"""The MODEL argument of every command (compare, locate, show): a built-in
example, an ONNX file or ``module:callable``, resolved into the :class:`Target`
the command runs (:func:`load_model`); ``model_arguments`` adds MODEL,
--shape and --seed to a command's parser."""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._util import UsageError, one_line

__all__ = ["Target", "load_model", "model_arguments"]


def _shape_arg(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in re.split(r"[,x]", text))
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a shape: positive integers separated by commas, e.g. 1,3,32,32")
    return dims


def model_arguments(parser) -> None:
    """MODEL, --shape and --seed: what load_model takes (every command)."""
    parser.add_argument("model", help="a built-in example (perceptron, lenet, ds_cnn, resnet8), "
                        "an .onnx file, or module:callable (a factory returning a "
                        "torch.nn.Module; module importable or a path to a .py file)")
    parser.add_argument("--shape", type=_shape_arg,
                        help="input shape, e.g. 1,3,32,32 (default: the example's or the ONNX "
                             "file's; required for module:callable)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random input and of an example's weights "
                             "(default %(default)s)")


@dataclass
class Target:
    """What ``compare`` runs: a torch module or an ONNX file, with its input."""
    label: str
    kind: str  # "example", "factory" or "onnx"
    model: object  # torch.nn.Module, or the Path of the ONNX file
    shape: tuple[int, ...]
    dtype: np.dtype


def _import_factory(spec: str):
    """``module:callable`` -> the object (``module`` importable, or a .py file)."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise UsageError(f"model {spec!r}: expected module:callable")
    path = Path(module_name)
    from_file = module_name.endswith(".py") or os.sep in module_name
    if from_file and not path.is_file():
        raise UsageError(f"no Python file at {module_name!r}")
    try:
        if from_file:
            sys.path.insert(0, str(path.resolve().parent))  # its siblings import, as in a script
            name = f"aidge_interop_model_{path.stem}"  # never shadows an installed module
            loader = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module  # dataclasses and inspect look their module up there
            loader.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # as `python -m` does
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
        return functools.reduce(getattr, attr.split("."), module)
    except Exception as exc:
        raise UsageError(f"cannot load {spec!r}: {one_line(exc)}") from exc


def _onnx_target(spec: str, shape) -> Target:
    import onnx

    path = Path(spec)
    if not path.is_file():
        raise UsageError(f"no ONNX file at {spec!r}")
    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception as exc:
        raise UsageError(f"{spec!r} is not a valid ONNX model ({one_line(exc)})") from exc
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise UsageError(f"{spec!r} has {len(inputs)} inputs; compare takes models with one")
    tensor_type = inputs[0].type.tensor_type
    dtype = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64}.get(
        tensor_type.elem_type)
    if dtype is None:
        raise UsageError(f"{spec!r}: input '{inputs[0].name}' is not float32 or float64")
    dims = [d.dim_value if d.dim_value > 0 else None for d in tensor_type.shape.dim]
    if shape is None:
        if not dims or None in dims:
            raise UsageError(f"{spec!r}: input '{inputs[0].name}' has dynamic dimensions "
                             f"{['?' if d is None else d for d in dims]}; give --shape")
        shape = tuple(dims)
    elif dims and (len(dims) != len(shape) or any(d not in (None, s)
                                                  for d, s in zip(dims, shape))):
        raise UsageError(f"--shape {','.join(map(str, shape))} does not fit input "
                         f"'{inputs[0].name}' of {spec!r} "
                         f"({['?' if d is None else d for d in dims]})")
    return Target(str(path), "onnx", path, tuple(shape), np.dtype(dtype))


def load_model(spec: str, shape=None, seed: int = 0) -> Target:
    """Resolves the MODEL argument: an ``.onnx`` file, a built-in example
    (:data:`aidge_interop.examples.EXAMPLES`, weights from ``seed``) or
    ``module:callable`` (a factory returning a ``torch.nn.Module``, or the
    module itself). The module is put in eval mode and run once on zeros of
    ``shape`` (required for a factory), so that an unfitting shape is a
    UsageError here rather than a failure of every engine later."""
    if spec.endswith(".onnx"):
        return _onnx_target(spec, shape)
    import torch

    from ..examples import EXAMPLES
    from ..bridge.wrapping import _model_dtype

    if spec in EXAMPLES:
        factory, default_shape, _ = EXAMPLES[spec]
        module, kind, shape = factory(seed), "example", shape or default_shape
    elif ":" in spec:
        if shape is None:
            raise UsageError(f"give the input shape of {spec!r} with --shape, "
                             "e.g. --shape 1,3,32,32")
        obj = _import_factory(spec)
        try:
            module = obj if isinstance(obj, torch.nn.Module) else obj()
        except Exception as exc:
            raise UsageError(f"{spec!r} raised {one_line(exc)}") from exc
        if not isinstance(module, torch.nn.Module):
            raise UsageError(f"{spec!r} returned a {type(module).__name__}, not a torch.nn.Module")
        kind = "factory"
    else:
        raise UsageError(f"unknown model {spec!r}: give a built-in example "
                         f"({', '.join(EXAMPLES)}), an .onnx file or module:callable")
    module.eval()
    dtype = _model_dtype(module)
    try:
        with torch.no_grad():
            module(torch.zeros(shape, dtype=dtype))
    except Exception as exc:
        raise UsageError(f"{spec!r} does not take an input of shape "
                         f"{','.join(map(str, shape))}: {one_line(exc)}") from exc
    return Target(spec, kind, module, tuple(shape), np.dtype(str(dtype).removeprefix("torch.")))
