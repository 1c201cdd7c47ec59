"""Place the copies of offloaded values into a compute schedule (issue 39).

A solver decides *which* saved values go to host memory; this module decides *where* their
steps go, so every offload plan is an explicit schedule the simulator checks:

- ``offload(v)`` right after the forward run that produces v (the copy starts as early as it can);
- the device ``free(v)`` in forward right after v's last forward read (never before the offload).
  When the copy is still running there, the free would stall compute: it moves later, to where
  compute has caught up with the copy, as far as the device budget allows;
- ``reload(v)`` before v's first backward read: as late as it can start while the copies queued
  before it and compute in between still hide it (prefetch), else as early in backward as the
  budget allows (the value is live from its reload on).

The device budget is kept with a per-step slot curve of the schedule with the tightest placement
(copy back right before the read, free right after the last forward read): moving a step adds the
value's bytes over the steps it moves across. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable

from solvers.ir.graph import RematGraph
from solvers.ir.link import Link, get_link
from solvers.ir.schedule import Schedule, Step, StepKind, free, offload, reload
from solvers.ir.simulator import simulate


def place_offloads(graph: RematGraph, schedule: Schedule, values: Iterable[str], link: Link | str,
                   budget_bytes: int | None = None) -> Schedule:
    """``schedule`` (compute and free steps only) with ``values`` offloaded after forward makes
    them and reloaded before backward reads them (see the module docstring for where).

    ``values`` must be saved by ``schedule`` (live when forward ends) and read in backward.
    ``budget_bytes``: the device budget moved steps must respect (None: no limit)."""
    link = get_link(link)
    wanted = sorted(set(values), key=graph.position)
    if not wanted:
        return schedule
    steps = schedule.steps
    odd = [s for s in steps if s.kind not in (StepKind.COMPUTE, StepKind.FREE)]
    if odd:
        raise ValueError(f"place_offloads takes a schedule of compute and free steps, got {odd[0]}: "
                         "place every offload in one call")
    base = simulate(graph, schedule)
    saved = set(base.saved)
    refused = [v for v in wanted if v not in saved or v in graph.forward_outputs]
    if refused:
        raise ValueError(f"cannot offload {refused[:5]}: only values forward saves for backward (live at the "
                         "boundary, not forward outputs) are offloaded")
    n_forward = len(schedule.forward)
    reads = value_reads(graph, steps, n_forward, frozenset(wanted))
    unread = [v for v in wanted if v not in reads.first_backward]
    if unread:
        raise ValueError(f"cannot offload {unread[:5]}: backward never reads them")

    after: dict[int, list[Step]] = {}  # offloads and frees right after a forward step
    forward_free_at = {v: reads.last_forward.get(v, reads.produced[v]) for v in wanted}
    for v in wanted:
        after.setdefault(reads.produced[v], []).append(offload(v))
    for v in wanted:
        after.setdefault(forward_free_at[v], []).append(free(v))
    reload_before = {v: reads.first_backward[v] for v in wanted}
    tight = emit_copies(steps, n_forward, after, {}, _by_position(reload_before, wanted))
    if budget_bytes is None:
        budget_bytes = 1 << 62
    slots = _slots(graph, tight, steps, n_forward, after, reload_before, link)
    clock = _clock(graph, steps)
    ok = _run_starts(graph, steps)
    extra = [0] * (len(steps) + 1)

    # The forward frees, in the order their copies run: later until the copy has landed.
    moved_frees: dict[str, int] = {}
    to_host = 0.0
    for v in sorted(wanted, key=reads.produced.__getitem__):
        nbytes = graph[v].bytes
        done = max(clock[reads.produced[v] + 1], to_host) + link.offload_seconds(nbytes)
        to_host = done
        start = forward_free_at[v] + 1
        if clock[start] >= done:
            continue
        stop, last_ok = start, start
        for j in range(start, n_forward + 1):
            if j == n_forward or (ok[j] and clock[j] >= done):
                stop = j
                break
            if ok[j]:
                last_ok = j  # a free before step j does not hold v across it
            if slots[j] + extra[j] + nbytes > budget_bytes:
                stop = last_ok
                break
        if stop > start:
            moved_frees[v] = stop
            for j in range(start, stop):
                extra[j] += nbytes
            after[forward_free_at[v]].remove(free(v))

    # The reloads, latest first: each must land by its read and before the next one starts.
    order = sorted(wanted, key=lambda v: (reload_before[v], graph.position(v)))
    latest: dict[str, float] = {}
    next_start = float("inf")
    for v in reversed(order):
        finish = min(clock[reload_before[v]], next_start)
        latest[v] = next_start = finish - link.reload_seconds(graph[v].bytes)
    for v in order:
        nbytes, read = graph[v].bytes, reload_before[v]
        position = first_ok = read
        for j in range(read - 1, n_forward - 1, -1):
            if slots[j] + extra[j] + nbytes > budget_bytes:
                position = first_ok
                break
            if ok[j]:
                first_ok = j
                if clock[j] <= latest[v]:
                    position = j
                    break
        else:
            position = first_ok
        for j in range(position, read):
            extra[j] += nbytes
        reload_before[v] = position
    return emit_copies(steps, n_forward, after, _by_position(moved_frees, wanted), _by_position(reload_before, wanted))


class ValueReads:
    """Where each offloaded value is made and read in the base schedule (step indices)."""

    def __init__(self) -> None:
        self.produced: dict[str, int] = {}
        """The last step of the forward run that makes the value (the one forward saves)."""
        self.last_forward: dict[str, int] = {}
        """The last step of the last forward run that reads it after that."""
        self.first_backward: dict[str, int] = {}
        """The first step of the first backward run that reads it."""


def value_reads(graph: RematGraph, steps, n_forward: int, wanted: frozenset[str]) -> ValueReads:
    """Where each of ``wanted`` is made and read in ``steps`` (the first ``n_forward`` are forward)."""
    reads = ValueReads()
    i = 0
    while i < len(steps):
        step = steps[i]
        if step.kind is not StepKind.COMPUTE:
            i += 1
            continue
        members = graph.group_of(step.node)
        end = i + len(members) - 1
        inputs = graph[step.node].inputs
        if i < n_forward:
            for m in members:
                if m in wanted:
                    reads.produced[m] = end
                    reads.last_forward.pop(m, None)
            for inp in inputs:
                if inp in wanted:
                    reads.last_forward[inp] = end
        else:
            for inp in inputs:
                if inp in wanted and inp not in reads.first_backward:
                    reads.first_backward[inp] = i
        i = end + 1
    return reads


def _by_position(position: dict[str, int], order: list[str]) -> dict[int, list[str]]:
    """Values grouped by the step they go before, in ``order`` within a step."""
    grouped: dict[int, list[str]] = {}
    for v in sorted(position, key=lambda v: (position[v], order.index(v))):
        grouped.setdefault(position[v], []).append(v)
    return grouped


def emit_copies(steps, n_forward: int, after: dict[int, list[Step]], frees_before: dict[int, list[str]],
          reloads_before: dict[int, list[str]]) -> Schedule:
    """The base steps with the copies inserted: ``after[j]`` after forward step j (offloads first),
    ``frees_before[j]`` before step j (j == n_forward: at forward's end), ``reloads_before[j]``
    before backward step j."""
    forward: list[Step] = []
    backward: list[Step] = []
    for j, step in enumerate(steps):
        part = forward if j < n_forward else backward
        if j == n_forward:
            forward.extend(free(v) for v in frees_before.get(j, ()))
        if j < n_forward:
            part.extend(free(v) for v in frees_before.get(j, ()))
        else:
            part.extend(reload(v) for v in reloads_before.get(j, ()))
        part.append(step)
        inserted = after.get(j)
        if inserted:
            part.extend(s for s in inserted if s.kind is StepKind.OFFLOAD)
            part.extend(s for s in inserted if s.kind is not StepKind.OFFLOAD)
    if n_forward == len(steps):
        forward.extend(free(v) for v in frees_before.get(n_forward, ()))
    return Schedule(tuple(forward), tuple(backward))


def _slots(graph: RematGraph, tight: Schedule, steps, n_forward: int, after: dict[int, list[Step]],
           reload_before: dict[str, int], link: Link) -> list[int]:
    """Bytes live around each base step of the tightest placement: the most of the bytes live
    before it and while it runs. A value kept live across base step j adds its bytes there."""
    during: list[int] = []
    before: list[int] = []
    n_tight_forward = len(tight.forward)
    boundary = [0]

    def observe(index: int, live_bytes: int, live: set[str], width: int) -> None:
        if width == 0:
            boundary[0] = live_bytes
            return
        during.extend([live_bytes] * width)

    sim = simulate(graph, tight, observe=observe, link=link)
    curve = sim.live_curve
    for t in range(len(curve)):
        if t == n_tight_forward:
            before.append(boundary[0])
        else:
            before.append(curve[t - 1] if t else graph.resident_bytes)
    tight_slots = [max(b, d) for b, d in zip(before, during)]
    # Map base steps to their tight indices (the inserted steps shift them).
    reloads_at: dict[int, int] = {}
    for j in reload_before.values():
        reloads_at[j] = reloads_at.get(j, 0) + 1
    slots: list[int] = []
    t = 0
    for j in range(len(steps)):
        t += reloads_at.get(j, 0)
        slots.append(tight_slots[t])
        t += 1 + len(after.get(j, ()))
    slots.append(0)
    return slots


def _clock(graph: RematGraph, steps) -> list[float]:
    """Compute seconds elapsed before each base step (copies do not stall in this estimate)."""
    clock = [0.0] * (len(steps) + 1)
    elapsed = 0.0
    i = 0
    while i < len(steps):
        step = steps[i]
        clock[i] = elapsed
        if step.kind is StepKind.COMPUTE:
            width = len(graph.group_of(step.node))
            for k in range(i + 1, i + width):
                clock[k] = elapsed
            elapsed += graph[step.node].cost
            i += width
        else:
            i += 1
    clock[len(steps)] = elapsed
    return clock


def _run_starts(graph: RematGraph, steps) -> list[bool]:
    """Whether a copy step may go before base step j (not inside a run of siblings)."""
    ok = [True] * (len(steps) + 1)
    i = 0
    while i < len(steps):
        if steps[i].kind is StepKind.COMPUTE:
            width = len(graph.group_of(steps[i].node))
            for k in range(i + 1, i + width):
                ok[k] = False
            i += width
        else:
            i += 1
    return ok
