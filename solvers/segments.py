"""Segment checkpointing: keep some forward values, recompute a segment when backward needs it.

What Chen's sqrt(n) schedule and per-block checkpointing (``torch.utils.checkpoint``) share.
Forward runs every op once and keeps the chosen values; the first backward op that reads a
dropped value of segment ``s`` triggers one recomputation of everything backward will read
from ``s`` (its interior), from the nearest kept values, right before that op. Recomputed
values of other segments are forgotten when a new segment is recomputed, so at most the
interiors that one backward op reads are live at once. `Schedule.from_computes` derives the
frees, so a kept value lives exactly until its last read.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from solvers.baselines import forward_closure, kept_through_backward
from solvers.ir.graph import NodeKind, Phase, RematGraph
from solvers.ir.schedule import Schedule


def pinned_values(graph: RematGraph) -> set[str]:
    """Values no schedule built here recomputes: resident, outputs, run-once ops and the
    siblings of user outputs (the caller holds a user output for the whole step, so its op
    must not run again)."""
    pinned = kept_through_backward(graph)
    for name in graph.user_outputs:
        if graph[name].is_op:
            pinned.update(graph.group_of(name))
    return pinned


def forward_values(graph: RematGraph) -> list[str]:
    """Forward op values in graph order."""
    return [n.name for n in graph.ops if n.phase is Phase.FORWARD]


def backward_groups(graph: RematGraph) -> list[tuple[str, ...]]:
    """Backward op groups in graph order."""
    return [m for m in graph.groups.values() if graph[m[0]].phase is Phase.BACKWARD]


def forward_reads(graph: RematGraph, members: tuple[str, ...]) -> list[str]:
    """Forward op values an op group reads."""
    first = graph[members[0]]
    return [i for i in dict.fromkeys(first.inputs)
            if graph[i].is_op and graph[i].phase is Phase.FORWARD]


def segment_schedule(graph: RematGraph, kept: Set[str], segment_of: Mapping[str, int]) -> Schedule:
    """Forward computes everything; backward recomputes a segment's interior when first needed.

    ``kept``: forward values held from forward into backward (besides `pinned_values`).
    ``segment_of``: forward value -> segment; values of one segment are recomputed together.
    """
    base = pinned_values(graph) | set(kept)
    needs: dict[int, set[str]] = {}
    for members in backward_groups(graph):
        for v in forward_reads(graph, members):
            if v not in base:
                needs.setdefault(segment_of[v], set()).add(v)
    available = set(base)
    active: dict[int, set[str]] = {}  # segment -> its recomputed values still considered live
    backward: list[str] = []
    for members in backward_groups(graph):
        reads = forward_reads(graph, members)
        missing = {segment_of[v] for v in reads if v not in available}
        if missing:
            touched = {segment_of[v] for v in reads if v in segment_of} | missing
            for seg in [s for s in active if s not in touched]:
                available -= active.pop(seg)
            for seg in sorted(missing):
                targets = sorted(needs[seg] - available, key=graph.position)
                backward.extend(forward_closure(graph, targets, available))
                available |= set(targets)
                active.setdefault(seg, set()).update(targets)
        backward.extend(members)
    return Schedule.from_computes(graph, forward_values(graph), backward)


def resident_names(graph: RematGraph) -> set[str]:
    return {n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)}

