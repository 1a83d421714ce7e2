"""The structure of what a model takes and returns, around its tensors.

``flatten(obj)`` lists the tensors of a nested value — tuples, lists,
namedtuples, dicts (``OrderedDict`` and transformers' ``ModelOutput``
included), dataclasses, transformers' ``DynamicCache`` (its layers' keys
and values) — with a :class:`Structure` that remembers everything else:
the containers, and the leaves that are not tensors (``None``, Python
scalars, strings), kept as they were. ``unflatten``
rebuilds the same value around other tensors; ``paths`` names each tensor
as a user would write it (``output.logits``, ``output[1]['features']``).

The torch bridge exports a model through a module whose forward takes the
call's tensors as flat positional arguments and returns its result's
tensors as a flat tuple: these functions map a call and its result to and
from that form.
"""
from __future__ import annotations

import dataclasses
import sys
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["Structure", "flatten", "unflatten", "paths"]

_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


@dataclasses.dataclass(frozen=True)
class Structure:
    """One node of a nested value: ``kind`` is ``"tensor"``, ``"const"``
    (``value`` kept), ``"tuple"``, ``"list"``, ``"namedtuple"``, ``"dict"``,
    ``"dataclass"`` or ``"cache"``; ``cls`` the container's type, ``keys``
    its keys or field names, ``children`` the structures of its items.

    A cache (transformers' ``DynamicCache``): ``keys`` has one entry per
    layer, its sliding window (None: a full layer) and whether it holds
    keys and values (``children``: two tensors per layer that does);
    ``value`` is its position among the caches of the call (see
    :func:`flatten`'s ``caches``)."""

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
        return self.kind not in ("const", "cache") or _same_const(self.value, other.value)

    def __hash__(self):
        return hash((self.kind, self.cls, self.keys, self.children,
                     repr(self.value) if self.kind in ("const", "cache") else None))


def _same_const(a, b) -> bool:
    return type(a) is type(b) and (a is b or a == b)


def _is_model_output(x) -> bool:
    # transformers' ModelOutput: an OrderedDict and a dataclass, whose items
    # are its fields that are not None (rebuilt by its constructor)
    return isinstance(x, OrderedDict) and dataclasses.is_dataclass(x)


def _cache_utils():
    """transformers.cache_utils if transformers is loaded (a cache can come
    from nowhere else), else None: transformers is not a dependency."""
    return sys.modules.get("transformers.cache_utils")


def flatten(obj, what: str = "value", caches: list | None = None
            ) -> tuple[list[torch.Tensor], Structure]:
    """The tensors of ``obj`` in order, and its structure. ``what`` names
    ``obj`` in the error raised for a leaf that is neither a tensor nor a
    constant.

    ``caches``: the caches met so far, each cache of ``obj`` recorded by its
    position there, a new one appended. Flattening a call, then its result
    with the same list, records a cache the model updated in place and
    returned as the call's own (``unflatten`` then refills that object)."""
    tensors: list[torch.Tensor] = []
    caches = [] if caches is None else caches

    def walk(x, path):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return Structure("tensor")
        if isinstance(x, _SCALARS):
            return Structure("const", value=x)
        cache_utils = _cache_utils()
        if cache_utils is not None and isinstance(x, cache_utils.Cache):
            return walk_cache(x, path, cache_utils)
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

    def walk_cache(cache, path, cache_utils):
        full, sliding = cache_utils.DynamicLayer, cache_utils.DynamicSlidingWindowLayer
        layers = getattr(cache, "layers", None)
        if type(cache) is not cache_utils.DynamicCache or layers is None or any(
                type(layer) not in (full, sliding) for layer in layers):
            kind = type(cache).__name__ + (f" of {[type(layer).__name__ for layer in layers]}"
                                           if layers is not None else "")
            raise TypeError(f"{path} is a {kind}: the engine takes and returns transformers' "
                            "DynamicCache of DynamicLayer and DynamicSlidingWindowLayer only")
        layout = []
        for i, layer in enumerate(layers):
            window = layer.sliding_window if type(layer) is sliding else None
            held = layer.keys is not None and layer.values is not None
            if window is not None and held and (layer.record_past or
                                                layer.cumulative_length != layer.keys.shape[-2]):
                raise TypeError(f"{path}.layers[{i}]: a sliding-window layer that has dropped "
                                "tokens (or records its past) holds more than its keys and "
                                "values; the engine cannot take it")
            layout.append((window, held))
            if held:
                tensors.extend((layer.keys, layer.values))
        position = next((i for i, c in enumerate(caches) if c is cache), None)
        if position is None:
            position = len(caches)
            caches.append(cache)
        return Structure("cache", type(cache), tuple(layout),
                         (Structure("tensor"),) * (2 * sum(h for _, h in layout)), position)

    structure = walk(obj, what)
    return tensors, structure


def _key_path(path, key, container) -> str:
    if _is_model_output(container) and isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def unflatten(structure: Structure, tensors, caches: list | None = None) -> Any:
    """``structure`` rebuilt around ``tensors`` (as many as it has).

    ``caches``: the caches a cache's position refers to (``flatten``'s
    list): one found there is that object, refilled in place with its
    tensors (a model updates the cache it is given and returns it); one
    past the end is a new cache, appended."""
    it = iter(tensors)
    caches = [] if caches is None else caches

    def build(s):
        if s.kind == "tensor":
            return next(it)
        if s.kind == "const":
            return s.value
        items = [build(c) for c in s.children]
        if s.kind == "cache":
            return _build_cache(s, items, caches)
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


def _build_cache(s: Structure, tensors: list, caches: list):
    """A DynamicCache of layout ``s.keys`` holding ``tensors``, through
    transformers' public API: the cache at ``s.value`` in ``caches`` reset
    and updated layer by layer, or a new one from per-layer data."""
    pairs = iter(zip(tensors[0::2], tensors[1::2]))
    data = [next(pairs) if held else (None, None) for _, held in s.keys]
    if s.value < len(caches):
        cache = caches[s.value]
        cache.reset()
        for i, (k, v) in enumerate(data):
            if k is not None:
                cache.update(k, v, i)
        return cache
    cache = s.cls([(k, v) if window is None else (k, v, torch.tensor(window))
                   for (k, v), (window, _) in zip(data, s.keys)])
    caches.append(cache)
    return cache


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
        elif s.kind == "cache":
            for i, (_, held) in enumerate(s.keys):
                if held:
                    out.extend((f"{path}.layers[{i}].keys", f"{path}.layers[{i}].values"))
        elif s.kind == "dict" and not _is_model_output_type(s.cls):
            for k, c in zip(s.keys, s.children):
                walk(c, f"{path}[{k!r}]")
        else:  # namedtuple, dataclass, ModelOutput: attributes
            for k, c in zip(s.keys, s.children):
                walk(c, f"{path}.{k}" if isinstance(k, str) and k.isidentifier()
                     else f"{path}[{k!r}]")

    walk(structure, root)
    return out
