"""Operators written at import as other engine operators (``einsum.py``):
the ``Emitter`` they write their nodes with."""
from __future__ import annotations

import numpy as np

from .._C import Tensor

CONCAT_MAX = 16  # inputs of one engine node (AI_MAX_IO): longer Concats go as a tree


class Emitter:
    """Writes nodes and constants under names derived from the expanded node's."""

    def __init__(self, prefix, add_node, add_const):
        self.prefix, self._add_node, self._add_const = prefix, add_node, add_const
        self.count = 0

    def name(self, what):
        self.count += 1
        return f"{self.prefix}/{what}_{self.count}"

    def const(self, values, dtype=np.int64):
        name = self.name("const")
        self._add_const(name, Tensor(np.asarray(values, dtype=dtype), copy=True))
        return name

    def op(self, op_type, inputs, n_out=1, node_name=None, **attrs):
        outs = [self.name(op_type) for _ in range(n_out)]
        self._add_node(node_name or self.name(op_type + "_node"), op_type, list(inputs), outs,
                       attrs)
        return outs[0] if n_out == 1 else outs

    def slice(self, x, start, end, axis):
        return self.op("Slice", [x, self.const([start]), self.const([end]), self.const([axis])])

    def split(self, x, sizes, axis):
        return self.op("Split", [x, self.const(sizes)], n_out=len(sizes), axis=axis)

    def concat(self, xs, axis):
        while len(xs) > 1:
            xs = [xs[i] if len(xs[i:i + CONCAT_MAX]) == 1 else
                  self.op("Concat", xs[i:i + CONCAT_MAX], axis=axis)
                  for i in range(0, len(xs), CONCAT_MAX)]
        return xs[0]
