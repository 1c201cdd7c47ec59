"""Lossless graph reduction: a smaller problem with the same optimum, and the way back.

Capture already folds aliases (views, detach) into the storage they view, and `prune_dead`
drops ops no output depends on; parameters and inputs are resident values, never scheduled.
On top of that, `reduce_graph` fuses an op ``u`` into its only reader ``v`` when

- ``u`` and ``v`` are single-value ops, ``u`` is not run-once, not an output, has no
  temporaries, and every input of ``u`` is resident (a parameter, buffer or input);
- ``bytes(v) <= bytes(u)`` or ``u`` costs nothing;
- ``v`` may not run in place on ``u`` (``u`` not in ``v.reuses``, `solvers.ir.inplace`).

Why no optimum is lost. Fused ``w`` computes ``u`` then ``v`` and drops ``u``: its cost is the sum,
its transient (``temp_bytes``) holds ``u``, so a fused schedule expanded back (``u``; ``v``;
free ``u``) has exactly its cost and peak (an input ``v`` writes into in place is freed right after ``v`` in
both, so the donation rule decides alike; ``u`` is never one, and ``u``'s resident inputs never
are). Conversely, take any schedule of the original graph.
(1) If one instance of ``u`` feeds several computations of ``v``, keep the first ``v`` alive
until the last read of the last one and drop the others: ``v`` now occupies the interval ``u``
did (``bytes(v) <= bytes(u)``, or ``u`` is free so it may as well be recomputed), and cost falls.
(2) Move each computation of ``u`` to right before the ``v`` that reads it: ``u``'s inputs are
resident, so this is always allowed, and it only shortens ``u``'s life. The result is a schedule
of the fused graph with no more cost and no higher peak, so the optima are equal (and any
lower bound on the reduced graph bounds the original).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from solvers.ir.graph import Node, NodeKind, RematGraph, prune_dead
from solvers.ir.schedule import Schedule


@dataclass(frozen=True)
class ReductionCounts:
    """Sizes before and after; ``fx_nodes`` when the caller knows the captured graph's size."""

    values_before: int
    values_after: int
    groups_before: int
    groups_after: int
    fused: int
    pruned: int
    fx_nodes: int | None = None

    def describe(self) -> str:
        fx = f"{self.fx_nodes} fx nodes -> " if self.fx_nodes is not None else ""
        return (f"{fx}{self.values_before} values / {self.groups_before} op groups -> "
                f"{self.values_after} values / {self.groups_after} op groups "
                f"({self.pruned} dead ops pruned, {self.fused} ops fused into their reader)")


@dataclass(frozen=True)
class Reduction:
    """A reduced graph and what each of its ops stands for in the original."""

    original: RematGraph
    graph: RematGraph
    absorbed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Reduced op -> the original ops fused into it, in the order they run before it."""
    counts: ReductionCounts | None = None

    def expand_computes(self, names) -> list[str]:
        out: list[str] = []
        for name in names:
            out.extend(self.absorbed.get(name, ()))
            out.append(name)
        return out

    def expand(self, schedule: Schedule) -> Schedule:
        """The reduced graph's schedule as a schedule of the original graph (same cost, peak)."""
        return Schedule.from_computes(self.original, self.expand_computes(schedule.computes("forward")),
                                      self.expand_computes(schedule.computes("backward")))


def _fusible(graph: RematGraph, u: Node, outputs: set[str]) -> str | None:
    """The reader ``u`` fuses into, or None (see the module docstring for the conditions)."""
    if not u.is_op or u.compute_once or u.temp_bytes or u.name in outputs:
        return None
    if len(graph.group_of(u.name)) != 1:
        return None
    if any(graph[i].kind not in (NodeKind.PARAMETER, NodeKind.INPUT) for i in u.inputs):
        return None
    readers = graph.users[u.name]
    if len(readers) != 1:
        return None
    v = graph[readers[0]]
    if len(graph.group_of(v.name)) != 1 or (v.phase != u.phase):
        return None
    if v.bytes > u.bytes and u.cost > 0:
        return None
    if u.name in v.reuses:  # v may run in place on u: fused, it would hold both (see below)
        return None
    return v.name


def reduce_graph(graph: RematGraph, fx_nodes: int | None = None) -> Reduction:
    """Prune dead ops, then fuse resident-fed single-reader ops into their reader, to a fixpoint."""
    pruned = prune_dead(graph)
    nodes = {n.name: n for n in pruned.nodes}
    absorbed: dict[str, tuple[str, ...]] = {}
    outputs = set(pruned.forward_outputs) | set(pruned.backward_outputs) | set(pruned.user_outputs)
    current = pruned
    fused = 0
    while True:
        merged: dict[str, str] = {}
        for u in current.ops:
            target = _fusible(current, u, outputs)
            if (target is not None and target not in merged and target not in merged.values()
                    and u.name not in merged.values()):
                merged[u.name] = target
        if not merged:
            break
        for u_name, v_name in merged.items():
            u, v = nodes[u_name], nodes[v_name]
            inputs = tuple(dict.fromkeys([*u.inputs, *(i for i in v.inputs if i != u_name)]))
            nodes[v_name] = replace(v, inputs=inputs, cost=u.cost + v.cost, flops=u.flops + v.flops,
                                    temp_bytes=v.temp_bytes + u.bytes)
            absorbed[v_name] = (*absorbed.pop(u_name, ()), u_name, *absorbed.get(v_name, ()))
            del nodes[u_name]
            fused += 1
        ordered = tuple(n for n in (nodes.get(x.name) for x in current.nodes) if n is not None)
        current = RematGraph(ordered, pruned.forward_outputs, pruned.user_outputs,
                             pruned.backward_outputs, pruned.cost_model, pruned.name)
    counts = ReductionCounts(
        values_before=len(graph.ops), values_after=len(current.ops),
        groups_before=len(graph.groups), groups_after=len(current.groups),
        fused=fused, pruned=len(graph.ops) - len(pruned.ops), fx_nodes=fx_nodes)
    return Reduction(original=graph, graph=current, absorbed=absorbed, counts=counts)
