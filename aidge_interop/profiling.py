"""Per-node time of the engine's graphs: where a forward or backward spends.

    with aidge_interop.profile(model) as prof:   # an AidgeModule or a Graph
        loss = model(x).square().mean()
        loss.backward()
    print(prof.table())          # nodes by total time, with op type and calls
    prof.by_op_type()            # op type -> seconds

The engine times each node's kernel call (a monotonic clock read before and
after, ~50 ns each) only while profiling is on; the rest of the time the
counters cost one branch per node. An AidgeModule's fused inference graph
(eval forwards, see ``wrap(fuse_inference=...)``) is profiled as well, its
rows marked ``graph="inference"`` (one built inside the block counts from
its first forward on). Times are wall-clock, threads included.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["profile", "Profile"]


@dataclass
class Profile:
    """Rows of one profiling session: dicts with ``graph`` ("main" or
    "inference"), ``name``, ``op_type``, ``fwd_s``, ``fwd_calls``, ``bwd_s``,
    ``bwd_calls``, in execution order (filled when the ``with`` block ends)."""

    rows: list[dict] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(r["fwd_s"] + r["bwd_s"] for r in self.rows)

    def by_op_type(self) -> dict[str, float]:
        """Seconds per op type (forward + backward), largest first."""
        out: dict[str, float] = {}
        for r in self.rows:
            if not (r["fwd_calls"] or r["bwd_calls"]):
                continue
            out[r["op_type"]] = out.get(r["op_type"], 0.0) + r["fwd_s"] + r["bwd_s"]
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def table(self, top: int | None = 20) -> str:
        """The ``top`` nodes by total time (all with None): milliseconds per
        call forward and backward, share of the total."""
        rows = sorted((r for r in self.rows if r["fwd_calls"] or r["bwd_calls"]),
                      key=lambda r: -(r["fwd_s"] + r["bwd_s"]))
        total = self.total_s or 1.0
        width = max([len(r["name"]) for r in rows] + [4])
        lines = [f"{'node':<{width}}  {'op':<18} {'graph':<9} {'calls':>6} "
                 f"{'fwd ms/call':>11} {'bwd ms/call':>11} {'share':>6}"]
        for r in rows[:top]:
            fwd = 1e3 * r["fwd_s"] / r["fwd_calls"] if r["fwd_calls"] else 0.0
            bwd = 1e3 * r["bwd_s"] / r["bwd_calls"] if r["bwd_calls"] else 0.0
            share = 100 * (r["fwd_s"] + r["bwd_s"]) / total
            lines.append(f"{r['name']:<{width}}  {r['op_type']:<18} {r['graph']:<9} "
                         f"{max(r['fwd_calls'], r['bwd_calls']):>6} {fwd:>11.4f} {bwd:>11.4f} "
                         f"{share:>5.1f}%")
        if top is not None and len(rows) > top:
            lines.append(f"... {len(rows) - top} more nodes")
        lines.append(f"total {1e3 * self.total_s:.3f} ms in node kernels")
        return "\n".join(lines)

    __str__ = table


def _graphs(target):
    """(role, C graph) pairs of an AidgeModule, a Graph or a C graph."""
    from . import _C
    from .graph import Graph

    if isinstance(target, Graph):
        return [("main", target._g)]
    if isinstance(target, _C.Graph):
        return [("main", target)]
    if hasattr(target, "_graph") and hasattr(target, "_fused"):  # an AidgeModule (torch bridge)
        out = [("main", target._graph)]
        if target._fused:
            out.append(("inference", target._fused))
        return out
    raise TypeError(f"profile: expected an AidgeModule (from wrap) or a Graph, "
                    f"got {type(target).__name__}")


@contextmanager
def profile(target):
    """Times every node of ``target``'s graphs while the block runs; yields a
    :class:`Profile` whose rows are filled when the block ends (also when it
    raises). Counters start from zero."""
    prof = Profile()
    for _, g in _graphs(target):
        g.profile_counts(True)
        g.profile = True
    try:
        yield prof
    finally:
        for role, g in _graphs(target):  # the inference graph may be new
            g.profile = False
            for name, op, fs, fn, bs, bn in g.profile_counts(True):
                prof.rows.append(dict(graph=role, name=name, op_type=op, fwd_s=fs,
                                      fwd_calls=fn, bwd_s=bs, bwd_calls=bn))
