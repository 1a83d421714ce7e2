"""ONNX Einsum, written at import as Transpose, Reshape, MatMul and ReduceSum.

The operands are contracted left to right, two at a time, as a batched
matrix product: each operand's letters are sorted into batch (in both and
still needed), own (in this operand only) and contracted (in both, needed
no more); letters needed by no later operand and not in the output are
summed out first. An operand is transposed to batch + own + contracted
(the other to batch + contracted + own), its groups reshaped to one axis
each, multiplied with MatMul (which broadcasts the batch axes), and the
result reshaped back to its letters (no reshapes where MatMul's
broadcasting does it: one contracted letter against a matrix). The last operand left is summed over
what the output lacks and transposed to the output's order. Products run
through the engine's GEMM, and backward is that of the operators.

Supported: explicit and implicit output (``->`` absent: the letters seen
once, in alphabetical order), ``...`` (the operands' shapes known at
import), any number of operands. Refused with the node named: a letter
twice in one operand (a diagonal), and reshapes that would need more than
one size unknown at import.
"""
from __future__ import annotations

import re

from .expand import Emitter


def check_equation(attrs, where) -> str:
    """The node's equation without spaces; ValueError if it has none or it
    is not one (checked before ONNX's shape inference sees it: some
    malformed ones hang it)."""
    if "equation" not in attrs:
        raise ValueError(f"{where}: Einsum needs an 'equation' attribute")
    equation = attrs["equation"]
    eq = equation.replace(" ", "") if isinstance(equation, str) else None
    if eq is None or not re.fullmatch(r"[A-Za-z.,]*(->[A-Za-z.]*)?", eq):
        raise ValueError(f"{where}: equation {equation!r} is not an Einsum equation")
    return eq


def _parse(equation, ranks, where):
    """(operand letter lists, output letters): ``...`` replaced by
    placeholder letters, right-aligned across operands (NumPy's rule)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"{where}: equation '{equation}' has {len(terms)} operand(s), the node "
                         f"{len(ranks)}")
    n_ell = 0
    for term, rank in zip(terms, ranks):
        if "..." in term:
            if rank is None:
                raise NotImplementedError(f"{where}: '...' needs the operands' ranks at import")
            n_ell = max(n_ell, rank - len(term.replace("...", "")))
    ell = [chr(0x3b1 + i) for i in range(n_ell)]  # Greek: not equation letters
    letters = []
    for term, rank in zip(terms, ranks):
        if term.count("...") > 1 or "." in term.replace("...", ""):
            raise ValueError(f"{where}: equation '{equation}': '{term}' is not an operand term")
        head, _, tail = term.partition("...")
        own = rank - len(head) - len(tail) if "..." in term else 0
        ls = list(head) + (ell[n_ell - own:] if own > 0 else []) + list(tail)
        if rank is not None and len(ls) != rank:
            raise ValueError(f"{where}: operand term '{term}' has {len(ls)} letters for an "
                             f"input of rank {rank}")
        if len(set(ls)) != len(ls):
            raise NotImplementedError(f"{where}: '{term}' repeats a letter (a diagonal), which "
                                      "the engine's Einsum does not take")
        letters.append(ls)
    if arrow:
        head, _, tail = rhs.partition("...")
        out = list(head) + (ell if "..." in rhs else []) + list(tail)
    else:  # implicit: the broadcast axes, then the letters seen once, sorted
        counts = {}
        for ls in letters:
            for c in ls:
                counts[c] = counts.get(c, 0) + 1
        out = ell + sorted(c for c, k in counts.items() if k == 1 and c not in ell)
    if len(set(out)) != len(out) or not set(out) <= {c for ls in letters for c in ls}:
        raise ValueError(f"{where}: equation '{equation}': output '{rhs}' repeats a letter or "
                         "has one no operand has")
    return letters, out


class _Contraction:
    def __init__(self, e, where):
        self.e, self.where = e, where

    def sum_out(self, x, ls, dims, keep):
        axes = [i for i, c in enumerate(ls) if c not in keep]
        if not axes:
            return x, ls, dims
        x = self.e.op("ReduceSum", [x, self.e.const(axes)], keepdims=0)
        return x, [c for c in ls if c in keep], [d for c, d in zip(ls, dims) if c in keep]

    def transpose(self, x, ls, dims, order):
        perm = [ls.index(c) for c in order]
        if perm != list(range(len(perm))):
            x = self.e.op("Transpose", [x], perm=perm)
        return x, list(order), [dims[p] for p in perm]

    def reshape(self, x, shape):
        """Reshape to ``shape`` (0: keep the axis, None: unknown, as -1)."""
        if sum(s is None for s in shape) > 1:
            raise NotImplementedError(f"{self.where}: the reshape to {shape} needs more than one "
                                      "size unknown at import (fix the input shapes)")
        return self.e.op("Reshape", [x, self.e.const([-1 if s is None else s for s in shape])])

    def pair(self, a, b, keep):
        """a, b: (value, letters, dims); the product over the letters not in keep."""
        (x, la, da), (y, lb, db) = a, b
        x, la, da = self.sum_out(x, la, da, set(lb) | keep)
        y, lb, db = self.sum_out(y, lb, db, set(la) | keep)
        batch = [c for c in la if c in lb and c in keep]
        contr = [c for c in la if c in lb and c not in keep]
        own_a = [c for c in la if c not in lb]
        own_b = [c for c in lb if c not in la]
        x, la, da = self.transpose(x, la, da, batch + own_a + contr)
        y, lb, db = self.transpose(y, lb, db, batch + contr + own_b)
        nb = len(batch)
        size = {c: d for c, d in zip(la + lb, da + db) if d is not None}
        def prod(group):
            p = 1
            for c in group:
                if c not in size:
                    return None
                p *= size[c]
            return p
        # x (own_a..., c) by y (c, own_b): MatMul broadcasts own_a's leading
        # letters as it would batch axes (a Linear's einsum: no reshapes,
        # each a copy); else each group reshaped to one axis
        broadcast = not batch and own_a and len(contr) == 1 and len(own_b) == 1
        if not broadcast and (len(own_a) != 1 or len(contr) != 1):  # (else already so)
            x = self.reshape(x, [0] * nb + [prod(own_a), prod(contr)])
        if len(contr) != 1 or len(own_b) != 1:
            y = self.reshape(y, [0] * nb + [prod(contr), prod(own_b)])
        z = self.e.op("MatMul", [x, y])
        if not broadcast and (len(own_a) != 1 or len(own_b) != 1):
            z = self.reshape(z, [0] * nb + [size.get(c) for c in own_a + own_b])
        out = batch + own_a + own_b
        dims = [size.get(c) if c in size else None for c in out]
        return z, out, dims


def expand_einsum(node, attrs, dims, emit_node, emit_const, where):
    """Writes Einsum `node` through emit_node(name, op_type, inputs, outputs,
    attrs) and emit_const(name, Tensor); ``dims``: value name -> dims
    (None where unknown) by ONNX shape inference."""
    inputs = list(node.input)
    shapes = [dims.get(n) for n in inputs]
    letters, out = _parse(attrs["equation"], [None if s is None else len(s) for s in shapes],
                          where)
    e = Emitter(node.name or f"Einsum_{node.output[0]}", emit_node, emit_const)
    c = _Contraction(e, where)
    operands = [(n, ls, list(s) if s is not None else [None] * len(ls))
                for n, ls, s in zip(inputs, letters, shapes)]
    acc = operands[0]
    for k in range(1, len(operands)):
        keep = set(out).union(*(set(ls) for _, ls, _ in operands[k + 1:]))
        acc = c.pair(acc, operands[k], keep)
    x, ls, ds = c.sum_out(*acc, set(out))
    x, ls, ds = c.transpose(x, ls, ds, out)
    emit_node(e.name("Identity_node"), "Identity", [x], [node.output[0]], {})
