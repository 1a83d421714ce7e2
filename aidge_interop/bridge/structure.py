"""The structure of what a model takes and returns, around its tensors.

``flatten(obj)`` lists the tensors of a nested value — tuples, lists,
namedtuples, dicts (``OrderedDict`` and transformers' ``ModelOutput``
included), dataclasses — with a :class:`Structure` that remembers
everything else: the containers, and the leaves that are not tensors
(``None``, Python scalars, strings), kept as they were. ``unflatten``
rebuilds the same value around other tensors; ``paths`` names each tensor
as a user would write it (``output.logits``, ``output[1]['features']``).

The torch bridge exports a model through a module whose forward takes the
call's tensors as flat positional arguments and returns its result's
tensors as a flat tuple: these functions map a call and its result to and
from that form.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["Structure", "flatten", "unflatten", "paths"]

_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


@dataclasses.dataclass(frozen=True)
class Structure:
    """One node of a nested value: ``kind`` is ``"tensor"``, ``"const"``
    (``value`` kept), ``"tuple"``, ``"list"``, ``"namedtuple"``, ``"dict"``
    or ``"dataclass"``; ``cls`` the container's type, ``keys`` its keys or
    field names, ``children`` the structures of its items."""

    kind: str
    cls: Any = None
    keys: tuple = ()
    children: tuple = ()
    value: Any = None

    @property
    def n_tensors(self) -> int:
        if self.kind == "tensor":
            return 1
        return sum(c.n_tensors for c in self.children)

    def __eq__(self, other):
        if not isinstance(other, Structure):
            return NotImplemented
        if (self.kind, self.cls, self.keys, self.children) != \
                (other.kind, other.cls, other.keys, other.children):
            return False
        return self.kind != "const" or _same_const(self.value, other.value)

    def __hash__(self):
        return hash((self.kind, self.cls, self.keys, self.children,
                     repr(self.value) if self.kind == "const" else None))


def _same_const(a, b) -> bool:
    return type(a) is type(b) and (a is b or a == b)


def _is_model_output(x) -> bool:
    # transformers' ModelOutput: an OrderedDict and a dataclass, whose items
    # are its fields that are not None (rebuilt by its constructor)
    return isinstance(x, OrderedDict) and dataclasses.is_dataclass(x)


def flatten(obj, what: str = "value") -> tuple[list[torch.Tensor], Structure]:
    """The tensors of ``obj`` in order, and its structure. ``what`` names
    ``obj`` in the error raised for a leaf that is neither a tensor nor a
    constant."""
    tensors: list[torch.Tensor] = []

    def walk(x, path):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return Structure("tensor")
        if isinstance(x, _SCALARS):
            return Structure("const", value=x)
        if isinstance(x, tuple) and hasattr(type(x), "_fields"):  # namedtuple
            return Structure("namedtuple", type(x), tuple(type(x)._fields),
                             tuple(walk(v, f"{path}.{k}") for k, v in zip(x._fields, x)))
        if isinstance(x, (tuple, list)):
            kind = "tuple" if isinstance(x, tuple) else "list"
            cls = type(x) if type(x) not in (tuple, list) else None
            return Structure(kind, cls, (),
                             tuple(walk(v, f"{path}[{i}]") for i, v in enumerate(x)))
        if isinstance(x, dict):
            keys = tuple(x.keys())
            return Structure("dict", type(x), keys,
                             tuple(walk(x[k], _key_path(path, k, x)) for k in keys))
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            names = tuple(f.name for f in dataclasses.fields(x))
            return Structure("dataclass", type(x), names,
                             tuple(walk(getattr(x, n), f"{path}.{n}") for n in names))
        raise TypeError(f"{path} is of type {type(x).__name__}: the engine takes and returns "
                        "tensors, in tuples, lists, dicts or dataclasses, beside None and "
                        "Python scalars")

    structure = walk(obj, what)
    return tensors, structure


def _key_path(path, key, container) -> str:
    if _is_model_output(container) and isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def unflatten(structure: Structure, tensors) -> Any:
    """``structure`` rebuilt around ``tensors`` (as many as it has)."""
    it = iter(tensors)

    def build(s):
        if s.kind == "tensor":
            return next(it)
        if s.kind == "const":
            return s.value
        items = [build(c) for c in s.children]
        if s.kind == "tuple":
            return tuple(items) if s.cls is None else s.cls(items)
        if s.kind == "list":
            return items if s.cls is None else s.cls(items)
        if s.kind == "namedtuple":
            return s.cls(*items)
        if s.kind == "dict":
            if _is_model_output_type(s.cls):
                return s.cls(**dict(zip(s.keys, items)))
            d = s.cls()
            for k, v in zip(s.keys, items):
                d[k] = v
            return d
        # a dataclass: fields set as they were, without running __init__ or
        # __post_init__ again (frozen ones too)
        obj = object.__new__(s.cls)
        for n, v in zip(s.keys, items):
            object.__setattr__(obj, n, v)
        return obj

    out = build(structure)
    if next(it, None) is not None:
        raise ValueError("unflatten: more tensors than the structure has")
    return out


def _is_model_output_type(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, OrderedDict) and \
        dataclasses.is_dataclass(cls)


def paths(structure: Structure, root: str = "output") -> list[str]:
    """The name of each tensor of ``structure``, in order."""
    out = []

    def walk(s, path):
        if s.kind == "tensor":
            out.append(path)
        elif s.kind in ("tuple", "list"):
            for i, c in enumerate(s.children):
                walk(c, f"{path}[{i}]")
        elif s.kind == "dict" and not _is_model_output_type(s.cls):
            for k, c in zip(s.keys, s.children):
                walk(c, f"{path}[{k!r}]")
        else:  # namedtuple, dataclass, ModelOutput: attributes
            for k, c in zip(s.keys, s.children):
                walk(c, f"{path}.{k}" if isinstance(k, str) and k.isidentifier()
                     else f"{path}[{k!r}]")

    walk(structure, root)
    return out
