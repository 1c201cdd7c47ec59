"""The graph as the Checkmate model sees it: op groups and values by index, and which variables
exist. Shared by every Checkmate back-end (`solvers.checkmate.milp_model` in PuLP, `solvers.checkmate.cpsat`).

See `solvers.checkmate.milp` for the model itself; this file only decides what is indexed and where
``R[t, g]`` and ``S[t, v]`` can be nonzero, so both back-ends build the same variables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from solvers.ir.graph import NodeKind, Phase, RematGraph


class TriviallyInfeasible(Exception):
    """A constraint without variables is violated: the model has no solution (both back-ends raise
    it while building, before any solver runs)."""


@dataclass(frozen=True)
class CheckmateData:
    """The graph in the shape the model needs: groups and values by index."""

    graph: RematGraph
    groups: tuple[tuple[str, ...], ...]
    """Sibling values of each op group; groups in topological order."""
    n_forward: int
    """F: groups 0..F-1 are forward ops, F..T-1 backward ops."""
    cost: tuple[float, ...]
    once: tuple[bool, ...]
    group_bytes: tuple[int, ...]
    temp_bytes: tuple[int, ...]
    reuse_bytes: tuple[int, ...]
    """Bytes a group's op may write into an input instead of allocating (`solvers.ir.inplace`):
    only the lower bound reads it; the models charge the output, which is conservative."""
    needed: tuple[bool, ...]
    """Groups some output or run-once op depends on; the others are never computed."""
    values: tuple[str, ...]
    """Op values in graph order, then tangents."""
    value_bytes: tuple[int, ...]
    producer: tuple[int | None, ...]
    """Group of each value (None for tangents)."""
    members: tuple[tuple[int, ...], ...]
    """Values of each group."""
    inputs: tuple[tuple[int, ...], ...]
    """Values each group reads (resident values are omitted: always live)."""
    readers: tuple[tuple[int, ...], ...]
    """Needed groups that read each value, in order."""
    forward_outputs: frozenset[int]
    final_outputs: frozenset[int]
    """User outputs, backward outputs and tangents: live when the step ends."""
    held: frozenset[int]
    """User outputs computed in forward: the caller holds forward's copy until the step ends."""
    tangent_bytes: int
    resident_bytes: int
    first_stage: tuple[int, ...]
    """First stage a value can be kept into (its group + 1; F for tangents)."""
    last_stage: tuple[int, ...]
    """Last stage that can need the value (-1: never needed)."""

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def group_last_stage(self, g: int) -> int:
        return max(self.last_stage[v] for v in self.members[g])


def prepare(graph: RematGraph) -> CheckmateData:
    """Index the graph's groups and values; reject graphs no schedule can run."""
    group_names = list(graph.groups)
    groups = tuple(graph.groups[g] for g in group_names)
    firsts = [graph[m[0]] for m in groups]
    n_forward = sum(n.phase is Phase.FORWARD for n in firsts)
    if any(n.phase is Phase.FORWARD for n in firsts[n_forward:]):
        raise ValueError("forward op groups must all come before backward op groups")
    for node in firsts:
        if node.compute_once and node.phase is Phase.BACKWARD:
            raise ValueError(f"random or mutating op {node.name!r} is a backward op: "
                             "the simulator runs such ops only in forward")
    for name in graph.forward_outputs:
        node = graph[name]
        if node.kind is NodeKind.TANGENT or (node.is_op and node.phase is Phase.BACKWARD):
            raise ValueError(f"forward output {name!r} cannot be live when forward ends")

    values = [n.name for n in graph.ops] + list(graph.tangents)
    vindex = {name: i for i, name in enumerate(values)}
    gindex = {name: g for g, name in enumerate(group_names)}
    producer = tuple(gindex[graph[v].group] if graph[v].is_op else None for v in values)
    members = tuple(tuple(vindex[m] for m in ms) for ms in groups)
    inputs = tuple(
        tuple(vindex[i] for i in dict.fromkeys(node.inputs) if i in vindex) for node in firsts
    )
    fo = frozenset(vindex[o] for o in graph.forward_outputs if o in vindex)
    # Tangents too: the caller holds them until the step ends (see solvers.ir.simulator).
    final = frozenset(vindex[o] for o in (*graph.user_outputs, *graph.backward_outputs, *graph.tangents)
                      if o in vindex)

    # Needed groups: ancestors of the outputs and of run-once ops (as `prune_dead`).
    needed = [False] * len(groups)
    stack = [producer[v] for v in sorted(fo | final) if producer[v] is not None]
    stack += [g for g, node in enumerate(firsts) if node.compute_once]
    while stack:
        g = stack.pop()
        if not needed[g]:
            needed[g] = True
            stack.extend(producer[v] for v in inputs[g] if producer[v] is not None)

    readers_list: list[list[int]] = [[] for _ in values]
    for g, ins in enumerate(inputs):
        if needed[g]:
            for v in ins:
                readers_list[v].append(g)
    readers = tuple(tuple(r) for r in readers_list)

    n_groups = len(groups)
    once = tuple(n.compute_once for n in firsts)
    first_stage, last_stage = [], []
    for v, g in enumerate(producer):
        first_stage.append(n_forward if g is None else g + 1)
        last = -1
        if g is None or needed[g]:
            for j in readers[v]:  # a run-once reader runs only in its own stage
                last = max(last, j if once[j] else n_groups - 1)
            if v in fo:
                last = max(last, n_forward - 1)
            if v in final:
                last = max(last, n_groups - 1)
        last_stage.append(last)

    return CheckmateData(
        graph=graph,
        groups=groups,
        n_forward=n_forward,
        cost=tuple(n.cost for n in firsts),
        once=once,
        group_bytes=tuple(sum(graph[m].bytes for m in ms) for ms in groups),
        temp_bytes=tuple(n.temp_bytes for n in firsts),
        reuse_bytes=tuple(n.bytes if n.reuses else 0 for n in firsts),
        needed=tuple(needed),
        values=tuple(values),
        value_bytes=tuple(graph[v].bytes for v in values),
        producer=producer,
        members=members,
        inputs=inputs,
        readers=readers,
        forward_outputs=fo,
        final_outputs=final,
        held=frozenset(v for v in (vindex[o] for o in graph.user_outputs if o in vindex)
                       if producer[v] is not None and producer[v] < n_forward),
        tangent_bytes=sum(graph[t].bytes for t in graph.tangents),
        resident_bytes=graph.resident_bytes,
        first_stage=tuple(first_stage),
        last_stage=tuple(last_stage),
    )


def lower_bound_bytes(data: CheckmateData) -> int:
    """A peak no schedule avoids: the boundary, each needed op with its inputs, and the end
    (an op that may run in place is charged its inputs only).

    At the end every final output (user outputs, gradients) is live, so while the last op that
    produces one runs, all of them are (the others were computed before and are kept); which
    op is last depends on the schedule, so the least of its extra inputs and temporaries counts.
    """
    fo_bytes = sum(data.value_bytes[v] for v in data.forward_outputs)
    bound = data.resident_bytes + data.tangent_bytes + fo_bytes
    for g in range(data.n_groups):
        if data.needed[g]:
            during = sum(data.value_bytes[v] for v in data.inputs[g])
            bound = max(bound, data.resident_bytes + during + data.group_bytes[g]
                        + data.temp_bytes[g] - data.reuse_bytes[g])
    final_bytes = sum(data.value_bytes[v] for v in data.final_outputs)
    producers = {data.producer[v] for v in data.final_outputs} - {None}  # tangents: no producer
    extra = 0
    if producers:
        extra = min(data.temp_bytes[g] + sum(data.value_bytes[v] for v in data.inputs[g]
                                             if v not in data.final_outputs)
                    + sum(data.value_bytes[v] for v in data.members[g]
                          if v not in data.final_outputs) - data.reuse_bytes[g]
                    for g in producers)
    return max(bound, data.resident_bytes + final_bytes + extra)



# ============================================================ variables that exist
def is_const(x: object) -> bool:
    return isinstance(x, (int, float))


def is_kept(data: CheckmateData, model, t_next: int, v: int):
    """Is value v live when stage t_next - 1 ends: S[t_next, v], with the two boundaries."""
    if t_next == data.n_forward and v in data.forward_outputs:
        return 1  # forward outputs are live when forward ends
    if t_next == data.n_groups:
        return 1 if v in data.final_outputs else 0
    return model.S.get((t_next, v), 0)


def stage_slots(data: CheckmateData) -> Iterator[tuple[int, int]]:
    """(t, g): stage t computes its own group g == t, or may recompute an earlier group (not
    a run-once one) while a value of it can still be read. Shared by every Checkmate back-end."""
    for t in range(data.n_groups):
        for g in range(t + 1):
            if data.needed[g] and (g == t or (not data.once[g] and t <= data.group_last_stage(g))):
                yield t, g


def keep_slots(data: CheckmateData) -> Iterator[tuple[int, int, bool]]:
    """(t, v, held): value v may be live when stage t starts; ``held`` when it must be (a user
    output computed in forward is held by the caller through backward, never recomputed)."""
    for v in range(len(data.values)):
        for t in range(data.first_stage[v], min(data.last_stage[v], data.n_groups - 1) + 1):
            yield t, v, v in data.held and t >= data.n_forward


def free_once_slots(data: CheckmateData, free: dict) -> Iterator[tuple[int, int, list]]:
    """(t, v, frees): the free variables of each live copy of v in stage t, for the (redundant)
    free-once constraint every back-end adds; none before a tangent arrives."""
    frees: dict[tuple[int, int], list] = {}
    for (t, v, _k), f in free.items():
        frees.setdefault((t, v), []).append(f)
    for (t, v), fs in sorted(frees.items()):
        if not (data.producer[v] is None and t < data.first_stage[v]):
            yield t, v, fs


def computed(data: CheckmateData, model, t: int, v: int):
    """R of v's group in stage t (0 for tangents and where no variable exists)."""
    g = data.producer[v]
    return 0 if g is None else model.R.get((t, g), 0)
