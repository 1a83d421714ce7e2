"""ONNX forms of aten operators the TorchScript exporter cannot export, or
exports wrongly, which models users bring call: registered for wrap's
exports only.

transformers looks for packed sequences when a causal LM (GPT-2, Llama...)
is called without an attention mask: ``(torch.diff(position_ids, ...) !=
1).cumsum(-1)``. ``aten::diff`` has no ONNX form in torch; torch's
``aten::cumsum`` leaves a bool (or int32...) input as it is, where torch
sums integers in int64, and ONNX's CumSum takes no bool.
"""
from __future__ import annotations

import contextlib

import torch
from torch.onnx import symbolic_helper

__all__ = ["exporter_symbolics"]

_INT64_MAX = 2**63 - 1


def _const(g, values):
    return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))


@symbolic_helper.parse_args("v", "i", "i", "v", "v")
def _diff(g, x, n, dim, prepend, append):
    """torch.diff(x, n, dim, prepend, append): ``prepend`` and ``append``
    concatenated to ``x`` along ``dim``, then ``n`` times the difference of
    neighbours along ``dim`` (x[1:] - x[:-1]; for bool, their xor). With
    ``n = 0``, ``x`` as it is, as in torch."""
    if n == 0:
        return x
    op = "Xor" if symbolic_helper._is_bool(x) else "Sub"
    parts = [t for t in (prepend, x, append) if not symbolic_helper._is_none(t)]
    if len(parts) > 1:
        x = g.op("Concat", *parts, axis_i=dim)
    axes = _const(g, [dim])
    for _ in range(n):
        after = g.op("Slice", x, _const(g, [1]), _const(g, [_INT64_MAX]), axes)
        before = g.op("Slice", x, _const(g, [0]), _const(g, [-1]), axes)
        x = g.op(op, after, before)
    return x


_NARROW_INTEGERS = ("Bool", "Byte", "Char", "Short", "Int")


@symbolic_helper.parse_args("v", "i", "v")
def _cumsum(g, x, dim, dtype):
    """torch.cumsum(x, dim, dtype): in ``dtype`` if given, else bool and
    integer inputs in int64 (torch's promotion), others in their own."""
    if not symbolic_helper._is_none(dtype):
        to = symbolic_helper._get_const(dtype, "i", "dtype")
        x = g.op("Cast", x, to_i=symbolic_helper._type_utils.JitScalarType(to).onnx_type())
    elif x.type().scalarType() in _NARROW_INTEGERS:
        x = g.op("Cast", x, to_i=torch.onnx.TensorProtoDataType.INT64)
    return g.op("CumSum", x, _const(g, dim))


_SYMBOLICS = {"aten::diff": _diff, "aten::cumsum": _cumsum}


@contextlib.contextmanager
def exporter_symbolics(opset: int):
    """Registers _SYMBOLICS with the TorchScript exporter for ``opset``
    while the block runs (one export: the caller holds the export lock),
    except where the user registered one of that name, which is left as it
    is."""
    from torch.onnx._internal.torchscript_exporter import registration

    def custom(name):
        group = registration.registry.get_function_group(name)
        return group is not None and group._functions.overridden(opset)

    added = [name for name in _SYMBOLICS if not custom(name)]
    for name in added:
        torch.onnx.register_custom_op_symbolic(name, _SYMBOLICS[name], opset)
    try:
        yield
    finally:
        for name in added:
            torch.onnx.unregister_custom_op_symbolic(name, opset)
            if not registration.registry.get_function_group(name)._functions:
                # an empty group left behind would fail torch's own exports of
                # the operator with "min() arg is an empty sequence"
                del registration.registry._registry[name]
