"""A training graph as a heterogeneous chain of stages, in the quantities a chain DP needs.

Stage k (1-based) is the k-th stage of `solvers.linearize`: the forward values after
articulation value v[k-1] up to v[k]. Its backward B[k] is a contiguous run of backward op
groups, assigned so that B[n], ..., B[1] is the graph's own backward order. What B[k] reads
besides v[k-1] is the stage's *tape*. Memory is split into what a schedule decides (held
articulation values and tapes, and the transients of recomputing a stage) and what it does not
(resident values, gradients, tangents and values that are never recomputed: `fixed_*`), the
latter measured once on the store-all schedule, whose backward runs the same ops in the same
order as every schedule the chain DP builds.

Index 0 of every per-stage tuple stands for the step's inputs (resident, zero bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from solvers.baselines import forward_closure, store_all_schedule
from solvers.ir.derived import per_graph
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import StepKind
from solvers.linearize import Linearization, Stage, linearize
from solvers.segments import backward_groups, forward_reads, pinned_values, resident_names


@dataclass(frozen=True)
class Recompute:
    """Recomputing some targets of a stage from the previous articulation value."""

    order: tuple[str, ...]
    cost: float
    peak: int
    """Largest bytes live (targets included) while it runs, beyond the input and fixed values."""


@dataclass(frozen=True)
class ChainModel:
    """Per-stage bytes and costs; index k in 1..n, index 0 is the step's inputs."""

    n: int
    boundary: tuple[str, ...]
    """v[k]: the articulation value that ends stage k ('' for a trailing stage)."""
    values: tuple[tuple[str, ...], ...]
    """Forward values of stage k, in graph order."""
    tape: tuple[tuple[str, ...], ...]
    """Droppable forward values B[k] reads, besides v[k-1]."""
    backward: tuple[tuple[tuple[str, ...], ...], ...]
    """B[k]: backward op groups of stage k, in graph order."""
    x_bytes: tuple[int, ...]
    tape_bytes: tuple[int, ...]
    held_bytes: tuple[int, ...]
    """Bytes of tape[k] plus v[k]: what keeping the stage's tape through a subproblem holds."""
    advance: tuple[Recompute, ...]
    """Stage k's path to v[k] in backward (tape dropped)."""
    advance_tape: tuple[Recompute, ...]
    """Stage k's path to v[k] keeping its tape, in backward."""
    retape: tuple[Recompute, ...]
    """Stage k's tape recomputed from v[k-1] right before B[k]."""
    sweep: tuple[int, ...]
    """Transient of stage k in the forward pass (tape dropped)."""
    sweep_tape: tuple[int, ...]
    fixed_forward: tuple[int, ...]
    """Fixed bytes (resident included) while stage k runs in the forward pass."""
    fixed_before: tuple[int, ...]
    """Fixed bytes when B[k] is about to start (after B[k+1])."""
    backward_peak: tuple[int, ...]
    """Most bytes while B[k] runs: fixed bytes plus the tape values still to be read
    (v[k-1], held by the caller, not included)."""


def _assign_backward(
    graph: RematGraph, lin: Linearization, pinned: set[str]
) -> list[list[tuple[str, ...]]]:
    """B[1..n]: each backward group goes to the highest stage its reads allow, never rising.

    Reading v[j] fits stage j (as its tape) or j+1 (as its input); reading another value of
    stage j fits only j. A group whose reads fit no single stage goes to the highest stage
    it reads (its other reads are recomputed or held as that stage's tape).
    """
    n = len(lin.stages)
    stage_of = lin.stage_of
    boundary_of = {s.boundary: s.index + 1 for s in lin.stages if s.boundary}
    result: list[list[tuple[str, ...]]] = [[] for _ in range(n + 1)]
    current = n
    for members in backward_groups(graph):
        allowed: set[int] | None = None
        highest = 0
        for v in forward_reads(graph, members):
            if v in pinned:
                continue
            k = stage_of[v] + 1
            fits = {k, k + 1} if v in boundary_of else {k}
            allowed = fits if allowed is None else allowed & fits
            highest = max(highest, k)
        if allowed is None:
            stage = current
        else:
            below = [k for k in allowed if k <= current]
            stage = max(below) if below else min(current, highest)
        stage = max(stage, 1)
        result[stage].append(members)
        current = stage
    return result


def _recompute(
    graph: RematGraph, targets: list[str], available: set[str], pinned: set[str]
) -> Recompute:
    """Order, cost and transient peak of recomputing ``targets`` from ``available``."""
    order = forward_closure(graph, targets, available)
    return _walk(graph, order, set(targets), pinned)


class _WalkTables:
    """Per-graph lookups for `_walk` (see `per_graph`): a chain model walks every op of the
    forward several times, and node lookups were most of it on a 10,000-step loop."""

    def __init__(self, graph: RematGraph) -> None:
        self.members = {n.name: graph.group_of(n.name) for n in graph.ops}
        self.inputs = {n.name: tuple(dict.fromkeys(n.inputs)) for n in graph.ops}
        self.bytes = {n.name: n.bytes for n in graph.nodes}
        self.temp = {n.name: n.temp_bytes for n in graph.ops}
        self.cost = {n.name: n.cost for n in graph.ops}


def _walk(graph: RematGraph, order: list[str], targets: set[str], pinned: set[str]) -> Recompute:
    """Free each computed value after its last read inside ``order`` unless it is a target.

    Linear in ``order``: the live bytes are a running sum, and only the values a run computes
    or reads can become free after it (a super-stage of a 10,000-step loop recomputes
    thousands of ops)."""
    tables = per_graph(graph, _WalkTables)
    members_of, inputs_of, size = tables.members, tables.inputs, tables.bytes
    reads: dict[str, int] = {}
    runs: list[tuple[str, ...]] = []
    i = 0
    while i < len(order):
        members = members_of[order[i]]
        runs.append(members)
        for inp in inputs_of[members[0]]:
            reads[inp] = reads.get(inp, 0) + 1
        i += len(members)
    live: dict[str, int] = {}
    live_bytes = 0
    peak = cost = 0.0
    for members in runs:
        head = members[0]
        alloc = sum(size[m] for m in members if m not in pinned)
        peak = max(peak, live_bytes + alloc + tables.temp[head])
        cost += tables.cost[head]
        for m in members:
            if m not in pinned:
                live_bytes += size[m] - live.get(m, 0)
                live[m] = size[m]
        inputs = inputs_of[head]
        for inp in inputs:
            reads[inp] -= 1
        for name in (*members, *inputs):
            if name in live and reads.get(name, 0) == 0 and name not in targets:
                live_bytes -= live.pop(name)
    return Recompute(tuple(order), float(cost), int(peak))


def _fixed_profile(
    graph: RematGraph, lin: Linearization, stage_of_group: dict[str, int], pinned: set[str]
) -> tuple[list[int], list[int], dict[str, int]]:
    """Fixed live bytes measured on the store-all schedule.

    Returns the most fixed bytes while each stage runs in the forward pass, the fixed bytes
    when each B[k] is about to start, and the fixed bytes while each backward group runs.
    A pinned value that a recomputable op of stage k reads (a dropout output feeding a
    residual add) must outlive every recomputation of that op, the last of which comes
    right before B[k]: it is counted until B[k] starts.
    """
    n = len(lin.stages)
    fixed_names = {v.name for v in graph.nodes if not v.is_op} | pinned
    fixed_names |= {v.name for v in graph.ops if v.phase is Phase.BACKWARD}
    release: dict[str, int] = {}
    for node in graph.ops:
        if node.phase is Phase.FORWARD and node.name not in pinned:
            for inp in node.inputs:
                if inp in pinned and graph[inp].is_op:
                    k = stage_of_group[node.group]
                    release[inp] = min(release.get(inp, k), k)
    deferred: dict[int, int] = {}
    schedule = store_all_schedule(graph)
    fixed = graph.resident_bytes
    forward = [graph.resident_bytes] * (n + 1)
    before = [0] * (n + 1)
    during: dict[str, int] = {}
    stage = n
    steps = schedule.steps
    i = 0
    while i <= len(steps):
        if i == len(schedule.forward):  # tangents arrive
            fixed += sum(graph[t].bytes for t in graph.tangents)
            before[n] = fixed
            fixed -= deferred.pop(n, 0)
        if i == len(steps):
            break
        step = steps[i]
        node = graph[step.node]
        if step.kind is StepKind.FREE:
            in_backward = i >= len(schedule.forward)
            if step.node in release and (not in_backward or stage > release[step.node]):
                r = release[step.node]
                deferred[r] = deferred.get(r, 0) + node.bytes
            elif step.node in fixed_names:
                fixed -= node.bytes
            i += 1
            continue
        members = graph.group_of(step.node)
        alloc = sum(graph[m].bytes for m in members if m in fixed_names)
        k = stage_of_group[node.group]
        if node.phase is Phase.FORWARD:
            forward[k] = max(forward[k], fixed + alloc)
        else:
            while stage > k:  # stages in between hand the bytes on
                stage -= 1
                before[stage] = fixed
                fixed -= deferred.pop(stage, 0)
            during[node.group] = fixed + alloc + node.temp_bytes
        fixed += alloc
        i += len(members)
    while stage > 1:
        stage -= 1
        before[stage] = fixed
        fixed -= deferred.pop(stage, 0)
    for k in range(2, n + 1):
        forward[k] = max(forward[k], forward[k - 1])
    return forward, before, during


def _backward_peak(
    graph: RematGraph, groups: tuple[tuple[str, ...], ...], tape: tuple[str, ...],
    before: int, during: dict[str, int],
) -> int:
    """Most bytes while ``groups`` run: fixed bytes plus tape values still to be read (a
    running sum: linear in the stage's backward, which is thousands of groups on a
    super-stage of a long loop)."""
    on_tape = set(tape)
    last_read: dict[str, int] = {}
    for i, members in enumerate(groups):
        for v in graph[members[0]].inputs:
            if v in on_tape:
                last_read[v] = i
    done_at: dict[int, int] = {}  # bytes of the tape values last read by group i
    for v, last in last_read.items():
        done_at[last] = done_at.get(last, 0) + graph[v].bytes
    peak = before + sum(graph[v].bytes for v in tape)
    pending = sum(done_at.values())
    for i, members in enumerate(groups):
        group = graph[members[0]].group
        if group in during:  # else a dead op (nothing reads it): no schedule runs it
            peak = max(peak, during[group] + pending)
        pending -= done_at.get(i, 0)
    return peak


def coarsen(lin: Linearization, size: int) -> Linearization:
    """``lin`` with every ``size`` consecutive stages merged into one super-stage.

    A super-stage ends at the boundary of its last stage; the articulation values inside it
    become tape (values its backward reads). A chain DP over the super-stages searches the
    schedules that checkpoint only super-stage boundaries: a coarser family, exact within it,
    with ``size`` times fewer stages (rotor's work grows with the cube of the stage count).
    """
    if size < 1:
        raise ValueError(f"coarsen: size must be at least 1, got {size}")
    if size == 1:
        return lin
    groups = [lin.stages[i:i + size] for i in range(0, len(lin.stages), size)]
    stages = tuple(Stage(k, tuple(v for s in group for v in s.values), group[-1].boundary)
                   for k, group in enumerate(groups))
    return Linearization(articulation=tuple(s.boundary for s in stages if s.boundary),
                         stages=stages)


def chain_model(graph: RematGraph, stages_per_unit: int = 1,
                lin: Linearization | None = None) -> ChainModel:
    """Measure the chain model of ``graph`` (stages from its articulation values, merged
    ``stages_per_unit`` at a time: `coarsen`); ``lin``: its linearization, if already made."""
    lin = coarsen(lin or linearize(graph), stages_per_unit)
    n = len(lin.stages)
    pinned = pinned_values(graph)
    resident = resident_names(graph)
    boundary = ("",) + tuple(s.boundary for s in lin.stages)
    backward = _assign_backward(graph, lin, pinned)
    stage_of_group: dict[str, int] = {}
    for s in lin.stages:
        for v in s.values:
            stage_of_group[graph[v].group] = s.index + 1
    for k in range(1, n + 1):
        for members in backward[k]:
            stage_of_group[graph[members[0]].group] = k
    tapes: list[tuple[str, ...]] = [()]
    for k in range(1, n + 1):
        reads = {v for members in backward[k] for v in forward_reads(graph, members)}
        reads -= pinned | {boundary[k - 1]}
        tapes.append(tuple(sorted(reads, key=graph.position)))

    def nbytes(names) -> int:
        return sum(graph[v].bytes for v in set(names) if v)

    empty = Recompute((), 0.0, 0)
    advance, advance_tape, retape = [empty], [empty], [empty]
    sweep, sweep_tape = [0], [0]
    for k in range(1, n + 1):
        base = pinned | resident | ({boundary[k - 1]} if boundary[k - 1] else set())
        path = [boundary[k]] if boundary[k] else []
        advance.append(_recompute(graph, path, base, pinned))
        advance_tape.append(_recompute(graph, path + list(tapes[k]), base, pinned))
        retape.append(_recompute(graph, list(tapes[k]), base, pinned))
        own = [v for v in lin.stages[k - 1].values if v in pinned and graph[v].is_op]
        sweep_base = (base - set(own))
        sweep.append(_recompute(graph, path + own, sweep_base, pinned).peak)
        sweep_tape.append(_recompute(graph, path + own + list(tapes[k]), sweep_base, pinned).peak)
    forward, before, during = _fixed_profile(graph, lin, stage_of_group, pinned)
    peaks = [0] + [_backward_peak(graph, backward[k], tapes[k], before[k], during)
                   for k in range(1, n + 1)]
    x_bytes = tuple(nbytes([b]) if b not in pinned else 0 for b in boundary)
    return ChainModel(
        n=n,
        boundary=boundary,
        values=((),) + tuple(s.values for s in lin.stages),
        tape=tuple(tapes),
        backward=tuple(tuple(b) for b in backward),
        x_bytes=x_bytes,
        tape_bytes=tuple(nbytes(t) for t in tapes),
        held_bytes=tuple(nbytes(list(tapes[k]) + [boundary[k]]) for k in range(n + 1)),
        advance=tuple(advance),
        advance_tape=tuple(advance_tape),
        retape=tuple(retape),
        sweep=tuple(sweep),
        sweep_tape=tuple(sweep_tape),
        fixed_forward=tuple(forward),
        fixed_before=tuple(before),
        backward_peak=tuple(peaks),
    )


@dataclass(frozen=True)
class TapeOptions:
    """What a stage may keep of its tape between its advance and its backward, option by option.

    Rotor keeps a stage's whole tape or none of it; on a CNN the tape is a convolution's output
    (costly to recompute) beside a ReLU's (cheap per byte), and the cheap way
    to save memory is to keep the first and recompute the second right before the backward
    (what the bound's LP does). Option 0 keeps nothing, the last option the whole tape; between
    them, the tape values whose group costs at least a threshold per byte (`cost_thresholds`).
    Per option t and stage k: ``kept[t][k]``, its bytes, ``held_bytes`` (kept plus v[k]),
    ``advance`` (stage k's path to v[k] keeping them, in backward), ``sweep`` (its transient in
    the forward pass) and ``rest`` (the tape's other values, recomputed from v[k-1] and the
    kept ones right before B[k])."""

    kept: tuple[tuple[tuple[str, ...], ...], ...]
    kept_bytes: tuple[tuple[int, ...], ...]
    held_bytes: tuple[tuple[int, ...], ...]
    advance: tuple[tuple[Recompute, ...], ...]
    sweep: tuple[tuple[int, ...], ...]
    rest: tuple[tuple[Recompute, ...], ...]

    @property
    def count(self) -> int:
        return len(self.kept)


def _density(graph: RematGraph) -> dict[str, float]:
    """Cost per byte of each forward value's group: what dropping a byte of it costs to redo."""
    out: dict[str, float] = {}
    for members in graph.groups.values():
        first = graph[members[0]]
        if first.phase is Phase.FORWARD:
            size = sum(graph[m].bytes for m in members)
            for m in members:
                out[m] = first.cost / size if size else float("inf")
    return out


def cost_thresholds(graph: RematGraph, count: int, boundaries: frozenset[str] = frozenset()
                    ) -> tuple[float, ...]:
    """Up to ``count`` cost-per-byte thresholds between the forward values backward reads (the
    tapes' values; ``boundaries``, the articulation values, are a stage's input, not its tape),
    at the widest gaps (ratio) between their distinct densities: the natural classes
    (convolutions against element-wise ops), wherever they lie. Highest first (the smallest
    kept sets first). None where the tapes hold one class (a tanh chain's): rotor's own two."""
    density = _density(graph)
    skip = pinned_values(graph) | boundaries
    read = {v for n in graph.ops if n.phase is Phase.BACKWARD for v in n.inputs}
    values = sorted({density[v] for v in read if v in density and v not in skip})
    gaps = [(values[i + 1] / max(values[i], 1e-300), i) for i in range(len(values) - 1)
            if values[i] > 0 and values[i + 1] > values[i] * 1.05]
    chosen = sorted(gaps, reverse=True)[:count]
    return tuple(sorted((math.sqrt(values[i] * values[i + 1]) for _, i in chosen), reverse=True))


def tape_options(graph: RematGraph, model: ChainModel, thresholds: tuple[float, ...]) -> TapeOptions:
    """The `TapeOptions` of ``model``: keep nothing, keep each tape's values of at least each
    threshold's density, keep the whole tape."""
    pinned = pinned_values(graph)
    resident = resident_names(graph)
    density = _density(graph)
    n = model.n

    def nbytes(names) -> int:
        return sum(graph[v].bytes for v in set(names) if v)

    kept: list[tuple[tuple[str, ...], ...]] = [tuple(() for _ in range(n + 1))]
    for theta in thresholds:
        kept.append(tuple(tuple(v for v in model.tape[k] if density.get(v, math.inf) >= theta)
                          for k in range(n + 1)))
    kept.append(model.tape)
    empty = Recompute((), 0.0, 0)
    advance, sweep, rest = [], [], []
    for t, option in enumerate(kept):
        adv, swp, rst = [empty], [0], [empty]
        for k in range(1, n + 1):
            if t == 0:
                adv.append(model.advance[k])
                swp.append(model.sweep[k])
                rst.append(model.retape[k])
                continue
            if t == len(kept) - 1:
                adv.append(model.advance_tape[k])
                swp.append(model.sweep_tape[k])
                rst.append(empty)
                continue
            base = pinned | resident | ({model.boundary[k - 1]} if model.boundary[k - 1] else set())
            path = [model.boundary[k]] if model.boundary[k] else []
            adv.append(_recompute(graph, path + list(option[k]), base, pinned))
            own = [v for v in model.values[k] if v in pinned and graph[v].is_op]
            swp.append(_recompute(graph, path + own + list(option[k]), base - set(own), pinned).peak)
            rst.append(_recompute(graph, list(model.tape[k]), base | set(option[k]), pinned))
        advance.append(tuple(adv))
        sweep.append(tuple(swp))
        rest.append(tuple(rst))
    return TapeOptions(
        kept=tuple(kept),
        kept_bytes=tuple(tuple(nbytes(o[k]) for k in range(n + 1)) for o in kept),
        held_bytes=(model.x_bytes, *(tuple(nbytes(list(o[k]) + [model.boundary[k]])
                                           for k in range(n + 1)) for o in kept[1:-1]),
                    model.held_bytes),
        advance=tuple(advance), sweep=tuple(sweep), rest=tuple(rest))


def whole_tape_options(model: ChainModel) -> TapeOptions:
    """Rotor's own two options: keep nothing of a stage's tape, or all of it."""
    empty = Recompute((), 0.0, 0)
    return TapeOptions(
        kept=(tuple(() for _ in model.tape), model.tape),
        kept_bytes=(tuple(0 for _ in model.tape), model.tape_bytes),
        held_bytes=(model.x_bytes, model.held_bytes),
        advance=(model.advance, model.advance_tape), sweep=(model.sweep, model.sweep_tape),
        rest=(model.retape, tuple(empty for _ in model.tape)))
