"""The simulator: the single source of truth for a schedule's validity, peak memory and cost.

Memory model (what the rewritten module does when it runs):
- parameters, buffers, lifted constants (all `NodeKind.PARAMETER`) and user inputs are
  resident for the whole step: live before the first step, never freed or computed;
- computing an op allocates all its outputs (siblings) plus its unused outputs (temp bytes)
  while its inputs are still live; the unused outputs are dropped right after;
- output gradients (tangents) arrive when backward starts and stay until the step ends: the
  caller holds them (``loss.backward()`` keeps the ones it makes until backward returns, and a
  gradient passed to ``backward(grad)`` is the caller's own tensor), so freeing one frees nothing;
- a value stays live until its free step.
Offload (issue 39): ``offload(v)`` starts copying live value v to host memory (it stays live and
readable on device); the next ``free(v)`` releases its device bytes after waiting for that copy;
``reload(v)`` allocates v's device bytes again at its step (the first compute that reads it waits
for the copy). The host copy counts against the host pool until reloaded or the step ends. Memory
is exact by position; time is the compute stream's cost plus its waits on two FIFO copy streams
(one per direction) priced by a `solvers.ir.link.Link` (`_copy_times`).
An op may run in place (`solvers.ir.inplace.donations`): it allocates nothing, and the input whose
storage it takes over frees nothing at its free step, which follows the op at once.
Random ops run once, in order; one that replays a saved generator state (`Node.replays_rng`)
may be recomputed, but its first run (the one that draws) is in forward, in that order.
Every solver's schedule is simulated before it is used or reported.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from solvers.ir.derived import per_graph
from solvers.ir.graph import NodeKind, Phase, RematGraph
from solvers.ir.inplace import donations
from solvers.ir.link import Link, get_link
from solvers.ir.schedule import Schedule, StepKind


class InvalidScheduleError(ValueError):
    """The schedule cannot run: it reads a dead value, misses an output, or breaks a rule."""


@dataclass(frozen=True)
class SimulationResult:
    """What one schedule costs. Bytes include resident parameters and inputs."""

    peak_bytes: int
    peak_step: int
    """Index into ``schedule.steps`` where the peak occurs (-1: at the boundary)."""
    peak_phase: Phase
    peak_node: str
    """The value being allocated at the peak ('' when the peak is the tangents' arrival)."""
    boundary_bytes: int
    """Live bytes when forward ends (resident + outputs + what forward saves)."""
    saved: tuple[str, ...]
    """Values forward leaves live for backward (not resident, not user outputs)."""
    total_cost: float
    extra_cost: float
    total_flops: float
    extra_flops: float
    recomputed: tuple[tuple[str, int], ...]
    """(value, times computed) for every value computed more than once."""
    live_curve: tuple[int, ...]
    """Live bytes after each step (same length as ``schedule.steps``)."""
    offloaded: tuple[str, ...] = ()
    """Values the schedule copies to host memory (in the order of their first offload)."""
    saved_on_host: tuple[str, ...] = ()
    """Values forward leaves on host only (offloaded and freed on device) for backward to reload:
    the rest of what forward saves, beside ``saved`` (which is on device, in ``boundary_bytes``)."""
    host_peak_bytes: int = 0
    """Most bytes held on host at once (pinned buffers of offloaded values not yet reloaded)."""
    transfer_time_s: float = 0.0
    """Seconds the copy streams are busy (every offload and reload, latency included)."""
    stall_time_s: float = 0.0
    """Seconds the compute stream waits on copies: the transfer time compute does not hide."""

    @property
    def step_time_s(self) -> float:
        """Predicted time of the step: compute plus the copy time it does not hide."""
        return self.total_cost + self.stall_time_s


StepObserver = Callable[[int, int, "set[str]", int], None]
"""``observe(index, live_bytes, live, width)``: called at the boundary (``index`` = the first
backward step, ``width`` 0, after the tangents arrive), after each free (``width`` 1, bytes left)
and during each compute (``width`` = its siblings, bytes while it runs, temporaries included).
``live`` is the simulator's own set: read it, do not keep or change it."""


class _SimulatorTables:
    """Per-graph lookups for `simulate` (built once per graph, see `per_graph`): the same
    facts the rules read off the graph's nodes, as sets and dicts instead of properties."""

    def __init__(self, graph: RematGraph) -> None:
        self.nodes = {n.name: n for n in graph.nodes}
        self.resident = frozenset(
            n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT))
        self.ops = frozenset(n.name for n in graph.ops)
        self.backward_ops = frozenset(n.name for n in graph.ops if n.phase is Phase.BACKWARD)
        self.compute_once = frozenset(n.name for n in graph.ops if n.compute_once)
        self.replays_rng = frozenset(n.name for n in graph.ops if n.replays_rng)
        self.user_outputs = frozenset(graph.user_outputs)
        self.members = {n.name: graph.group_of(n.name) for n in graph.ops}
        self.position = {n.name: i for i, n in enumerate(graph.nodes)}
        self.saveable = tuple(n.name for n in graph.ops if n.name not in self.user_outputs)
        """Ops in graph order that forward may leave live for backward (`SimulationResult.saved`)."""
        self.tangents = tuple((t, graph[t].bytes) for t in graph.tangents)
        self.run_once_rules = tuple((n.name, n.compute_once, n.replays_rng) for n in graph.ops
                                    if n.compute_once or n.replays_rng)
        self.unfreeable = self.resident | self.user_outputs | frozenset(graph.tangents)
        self.plain = {
            n.name: (n.bytes, n.inputs, n.temp_bytes, n.cost, n.flops, n.phase is Phase.BACKWARD)
            for n in graph.ops if len(self.members[n.name]) == 1 and not n.compute_once
            and not n.replays_rng
        }
        """Ops with no sibling that may run any number of times, the most common compute step:
        for them the sibling and run-once rules hold by construction (one member, no count to
        keep), so `simulate` checks only the phase, the inputs and liveness."""
        self.plain_groups = {
            members[0]: (members, tuple(graph[m].bytes for m in members), first.inputs, first.temp_bytes,
                         first.cost, first.flops, first.phase is Phase.BACKWARD)
            for members in graph.groups.values() if len(members) > 1
            for first in (graph[members[0]],) if not first.compute_once and not first.replays_rng
        }
        """The same for an op with siblings, by its first member (the one a compute step names; its
        flags are the op's): the sibling rule is checked, the run-once rules hold by construction."""
        self.freeable = {n.name: n.bytes for n in graph.nodes if n.name not in self.unfreeable}
        """Values a free step may drop (not resident, not held by the caller): only liveness to check."""
        self.reuses = any(n.reuses for n in graph.ops)
        """Some op may run in place (`solvers.ir.inplace`): only then are the donations looked up."""


class _Simulated:
    """Per-graph results of `simulate`, by schedule identity (see `per_graph`): a graph and a
    schedule are frozen, so a schedule's result never changes. Solvers, ``hierarchical`` and the
    planner each check the same schedules (store-all several times per plan): on a 10,000-step
    loop every walk takes seconds. Entries leave with their schedule."""

    def __init__(self, graph: RematGraph) -> None:
        self.results: dict[tuple[int, Link | None], tuple[weakref.ref, SimulationResult]] = {}

    def get(self, schedule: Schedule, link: Link | None = None) -> SimulationResult | None:
        entry = self.results.get((id(schedule), link))
        return entry[1] if entry is not None and entry[0]() is schedule else None

    def put(self, schedule: Schedule, result: SimulationResult, link: Link | None = None) -> None:
        key = (id(schedule), link)

        def forget(ref: weakref.ref, key: tuple = key, results=self.results) -> None:
            if results.get(key, (None,))[0] is ref:
                del results[key]

        self.results[key] = (weakref.ref(schedule, forget), result)


def simulate(graph: RematGraph, schedule: Schedule, observe: StepObserver | None = None,
             link: Link | str | None = None) -> SimulationResult:
    """Walk the schedule (`_walk`, see there); without ``observe`` a schedule already simulated
    on this graph (with the same ``link``) returns its result again (`_Simulated`).

    ``link`` (a `Link` or a preset name, `solvers.ir.link.LINKS`) prices the copies of a schedule
    with offload steps; such a schedule without one is an `InvalidScheduleError`."""
    if link is not None:
        link = get_link(link)
    if observe is not None:
        return _walk(graph, schedule, observe, link)
    memo = per_graph(graph, _Simulated)
    found = memo.get(schedule, link)
    if found is None:
        found = _walk(graph, schedule, None, link)
        memo.put(schedule, found, link)
    return found


def _walk(graph: RematGraph, schedule: Schedule, observe: StepObserver | None,
          link: Link | None = None) -> SimulationResult:
    """Walk the schedule; raise InvalidScheduleError on the first rule it breaks.

    ``observe`` sees the live bytes and values at every step (`solvers.ir.timeline` draws the
    curve with it), so nothing else has to re-walk a schedule to know what is live when.

    Solvers simulate hundreds of candidates per graph: the common steps (a free, an op that may
    run any number of times) take fast paths from per-graph tables that check the rules which can
    fail for them, in the same order and with the same messages, and skip only those that hold by
    construction; tests/solvers/ir/test_fast_paths.py holds them to the straightforward walk."""
    tables = per_graph(graph, _SimulatorTables)
    nodes, user_outputs = tables.nodes, tables.user_outputs
    plain, plain_groups, freeable = tables.plain, tables.plain_groups, tables.freeable
    live: set[str] = set(tables.resident)
    live_bytes = graph.resident_bytes
    peak, peak_step, peak_phase, peak_node = live_bytes, -1, Phase.FORWARD, ""
    counts: dict[str, int] = {}  # computations of each value, but the plain ops'
    plain_computes: list[str] = []  # the plain ops computed, in order (counted at the end)
    total_cost = total_flops = 0.0
    curve: list[int] = []
    boundary_bytes = 0
    saved: tuple[str, ...] = ()
    steps = schedule.steps
    n_steps = len(steps)
    n_forward = len(schedule.forward)
    last_once = -1
    FREE, COMPUTE, FORWARD, BACKWARD = StepKind.FREE, StepKind.COMPUTE, Phase.FORWARD, Phase.BACKWARD
    OFFLOAD, RELOAD = StepKind.OFFLOAD, StepKind.RELOAD
    host: set[str] = set()  # values with a host copy (offloaded, not reloaded since)
    host_bytes = host_peak = 0
    offloaded: dict[str, None] = {}  # in order of the first offload
    saved_on_host: tuple[str, ...] = ()
    donated = donations(graph, schedule) if tables.reuses else {}  # step -> input it writes into
    transferred: set[str] = set()  # donated inputs whose bytes now belong to the op's output

    def fail(index: int, message: str) -> None:
        phase = "forward" if index < n_forward else "backward"
        raise InvalidScheduleError(f"{phase} step {index} ({steps[index]}): {message}")

    i = 0
    while True:  # the forward steps, the boundary, the backward steps
        if i == n_forward:  # the boundary: forward outputs must exist, tangents arrive
            boundary_bytes, saved = live_bytes, _saved_at_boundary(graph, tables, live)
            if host:
                saved_on_host = tuple(n for n in tables.saveable if n in host and n not in live)
            live_bytes += _tangents_arrive(tables, live)
            if live_bytes > peak:
                peak, peak_step, peak_phase, peak_node = live_bytes, -1, BACKWARD, ""
            if observe is not None:
                observe(i, live_bytes, live, 0)
        if i == n_steps:
            break
        # The steps up to the boundary, then those after it. A run of siblings that straddles
        # the boundary jumps over it, as in a single walk: the boundary is then never reached.
        in_forward = i < n_forward
        phase = FORWARD if in_forward else BACKWARD
        end = n_forward if in_forward else n_steps
        while i < end:
            step = steps[i]
            name = step.node
            kind = step.kind
            if kind is COMPUTE and (info := plain.get(name)) is not None:  # every rule below, for a plain op
                nbytes, inputs, temp_bytes, cost, flops, backward_op = info
                if in_forward and backward_op:
                    fail(i, "backward op scheduled in forward")
                for inp in inputs:
                    if inp not in live:
                        fail(i, f"input {inp!r} is not live")
                if name in live:
                    if name not in user_outputs:
                        fail(i, f"{name!r} is computed again while still live")
                    allocated, throwaway = 0, nbytes
                else:
                    allocated, throwaway = nbytes, 0
                if donated and i in donated:  # in place: the input's storage becomes the output
                    allocated = 0
                    transferred.add(donated[i])
                during = live_bytes + allocated + throwaway + temp_bytes
                if during > peak:
                    peak, peak_step, peak_phase, peak_node = during, i, phase, name
                live.add(name)
                plain_computes.append(name)
                live_bytes += allocated
                total_cost += cost
                total_flops += flops
                curve.append(live_bytes)
                if observe is not None:
                    observe(i, during, live, 1)
                i += 1
                continue
            if kind is COMPUTE and (group := plain_groups.get(name)) is not None:  # the same, for siblings
                members, sizes, inputs, temp_bytes, cost, flops, backward_op = group
                width = len(members)
                run = steps[i : i + width]
                if len(run) != width:
                    fail(i, f"siblings {list(members)} must be computed in consecutive steps")
                for s, m in zip(run, members):
                    if s.kind is not COMPUTE or s.node != m:
                        fail(i, f"siblings {list(members)} must be computed in consecutive steps")
                if in_forward and backward_op:
                    fail(i, "backward op scheduled in forward")
                for inp in inputs:
                    if inp not in live:
                        fail(i, f"input {inp!r} is not live")
                throwaway = allocated = 0
                for m, nbytes in zip(members, sizes):
                    if m in live:
                        if m not in user_outputs:
                            fail(i, f"{m!r} is computed again while still live")
                        throwaway += nbytes
                    else:
                        allocated += nbytes
                during = live_bytes + allocated + throwaway + temp_bytes
                if during > peak:
                    peak, peak_step, peak_phase, peak_node = during, i, phase, name
                for m in members:
                    live.add(m)
                    counts[m] = counts.get(m, 0) + 1
                live_bytes += allocated
                total_cost += cost
                total_flops += flops
                curve.extend([live_bytes] * width)
                if observe is not None:
                    observe(i, during, live, width)
                i += width
                continue
            if kind is FREE and (nbytes := freeable.get(name)) is not None:  # the same, for a free
                if name not in live:
                    fail(i, "frees a value that is not live")
                live.discard(name)
                if transferred and name in transferred:  # its storage lives on as the op's output
                    transferred.discard(name)
                    nbytes = 0
                live_bytes -= nbytes
                curve.append(live_bytes)
                if observe is not None:
                    observe(i, live_bytes, live, 1)
                i += 1
                continue
            node = nodes.get(name)
            if node is None:
                fail(i, "unknown value")
            if kind is OFFLOAD or kind is RELOAD:
                if link is None:
                    fail(i, "the schedule copies values to host memory: pass simulate(..., link=...) "
                            "(a solvers.ir.link.Link or a preset name: pcie4, pcie5, nvlink-c2c) to price the copies")
                if name not in freeable:
                    fail(i, "only values the step computes and may free are offloaded (not parameters, "
                            "inputs, user outputs or output gradients)")
                if kind is OFFLOAD:
                    if name not in live:
                        fail(i, "offloads a value that is not live on device")
                    if name in host:
                        fail(i, "offloads a value that is already on host (reload it first)")
                    host.add(name)
                    offloaded.setdefault(name)
                    host_bytes += node.bytes
                    if host_bytes > host_peak:
                        host_peak = host_bytes
                    during = live_bytes
                else:
                    if name not in host:
                        fail(i, "reloads a value that is not on host (offload it first)")
                    if name in live:
                        fail(i, "reloads a value that is still live on device (free it after its offload first)")
                    host.discard(name)
                    host_bytes -= node.bytes
                    live.add(name)
                    live_bytes += node.bytes
                    during = live_bytes
                    if during > peak:
                        peak, peak_step, peak_phase, peak_node = during, i, phase, name
                curve.append(live_bytes)
                if observe is not None:
                    observe(i, during, live, 1)
                i += 1
                continue
            if kind is FREE:
                _check_free(tables, live, name, i, fail)
                live.discard(name)
                live_bytes -= node.bytes
                curve.append(live_bytes)
                if observe is not None:
                    observe(i, live_bytes, live, 1)
                i += 1
                continue
            # Any other compute step (a random or mutating op, a value that is no op): every rule.
            last_once = _check_compute(tables, steps, i, node, phase, counts, last_once, live, fail)
            members = tables.members[name]
            width = len(members)
            throwaway = 0  # a user output recomputed with its siblings: the copy is dropped at once
            allocated = 0
            for m in members:
                if m in live:
                    if m not in user_outputs:
                        fail(i, f"{m!r} is computed again while still live")
                    throwaway += nodes[m].bytes
                else:
                    allocated += nodes[m].bytes
            during = live_bytes + allocated + throwaway + node.temp_bytes
            if during > peak:
                peak, peak_step, peak_phase, peak_node = during, i, phase, name
            for m in members:
                live.add(m)
                counts[m] = counts.get(m, 0) + 1
            live_bytes += allocated
            total_cost += node.cost
            total_flops += node.flops
            if width == 1:
                curve.append(live_bytes)
            else:
                curve.extend([live_bytes] * width)
            if observe is not None:
                observe(i, during, live, width)
            i += width

    _check_end(graph, tables, live, counts)
    transfer_s = stall_s = 0.0
    if offloaded:
        transfer_s, stall_s = _copy_times(tables, steps, link)
    return SimulationResult(
        peak_bytes=peak,
        peak_step=peak_step,
        peak_phase=peak_phase,
        peak_node=peak_node,
        boundary_bytes=boundary_bytes,
        saved=saved,
        total_cost=total_cost,
        extra_cost=total_cost - graph.base_cost,
        total_flops=total_flops,
        extra_flops=total_flops - graph.base_flops,
        recomputed=_recomputed(counts, plain_computes),
        live_curve=tuple(curve),
        offloaded=tuple(offloaded),
        saved_on_host=saved_on_host,
        host_peak_bytes=host_peak,
        transfer_time_s=transfer_s,
        stall_time_s=stall_s,
    )


def _copy_times(tables: _SimulatorTables, steps, link: Link) -> tuple[float, float]:
    """(seconds the copy streams are busy, seconds the compute stream waits on them) for a valid
    schedule with offload steps.

    One compute stream runs each op for its ``cost``; one copy stream per direction runs its copies
    in issue order (FIFO). An offload or reload is issued when the compute stream reaches its step
    and starts once its stream is free; it lasts ``link.latency_s + bytes / bandwidth``. The compute
    stream waits: at the free of a value until its offload (or a reload never read) has landed, at the
    first compute reading a reloaded value until its reload has landed, and at the end of the step
    for every copy still running."""
    nodes, members = tables.nodes, tables.members
    COMPUTE, FREE, OFFLOAD = StepKind.COMPUTE, StepKind.FREE, StepKind.OFFLOAD
    clock = to_host = to_device = transfer = stall = 0.0
    offload_done: dict[str, float] = {}  # copies to host the value's free must wait for
    reload_done: dict[str, float] = {}  # copies to device the first read (or free) must wait for
    i, n = 0, len(steps)
    while i < n:
        step = steps[i]
        kind, name = step.kind, step.node
        if kind is COMPUTE:
            node = nodes[name]
            if reload_done:
                ready = clock
                for inp in node.inputs:
                    landed = reload_done.pop(inp, None)
                    if landed is not None and landed > ready:
                        ready = landed
                stall += ready - clock
                clock = ready
            clock += node.cost
            i += len(members.get(name, (name,)))
            continue
        if kind is FREE:
            wait = max(offload_done.pop(name, 0.0), reload_done.pop(name, 0.0))
            if wait > clock:
                stall += wait - clock
                clock = wait
        elif kind is OFFLOAD:
            start = max(clock, to_host, reload_done.get(name, 0.0))
            seconds = link.offload_seconds(nodes[name].bytes)
            to_host = offload_done[name] = start + seconds
            transfer += seconds
        else:  # RELOAD: its free waited for the offload, so only the stream's queue delays it
            seconds = link.reload_seconds(nodes[name].bytes)
            to_device = reload_done[name] = max(clock, to_device) + seconds
            transfer += seconds
        i += 1
    end = max(clock, to_host, to_device)
    return transfer, stall + end - clock


Fail = Callable[[int, str], None]
"""``fail(index, message)``: raise `InvalidScheduleError` naming the step and its phase."""


def _saved_at_boundary(graph: RematGraph, tables: _SimulatorTables, live: set[str]) -> tuple[str, ...]:
    """Forward has ended: its outputs must be live; what else is live is saved for backward."""
    missing = [o for o in graph.forward_outputs if o not in live]
    if missing:
        raise InvalidScheduleError(f"forward ends without outputs {missing[:5]}")
    return tuple(name for name in tables.saveable if name in live)


def _tangents_arrive(tables: _SimulatorTables, live: set[str]) -> int:
    """The output gradients arrive as backward starts: their bytes."""
    arrived = 0
    for t, nbytes in tables.tangents:
        live.add(t)
        arrived += nbytes
    return arrived


def _check_free(tables: _SimulatorTables, live: set[str], name: str, index: int, fail: Fail) -> None:
    """A free of a value that may not be freeable (the fast path took every freeable one)."""
    if name not in live:
        fail(index, "frees a value that is not live")
    if name in tables.unfreeable:
        if name in tables.resident:
            fail(index, "parameters and inputs are resident and cannot be freed")
        if name in tables.nodes and tables.nodes[name].kind is NodeKind.TANGENT:
            fail(index, "output gradients are held by the caller until backward ends and cannot be freed")
        fail(index, "user outputs are held by the caller and cannot be freed")


def _check_compute(tables: _SimulatorTables, steps, index: int, node, phase: Phase, counts: dict[str, int],
                   last_once: int, live: set[str], fail: Fail) -> int:
    """The rules of a compute step the fast paths do not cover (random and mutating ops, and
    anything not an op): it names an op, its first sibling, with every sibling in the next steps;
    no backward op in forward; run-once ops once, in their phase and original order; a replayable
    random op's first run in forward; every input live. Returns the position of the last
    run-once op run so far."""
    name = node.name
    if name not in tables.ops:
        fail(index, f"{node.kind.value} values are given, not computed")
    members = tables.members[name]
    if name != members[0]:
        fail(index, f"siblings of {node.group!r} must be computed together, first {members[0]!r}")
    width = len(members)
    if width == 1:  # the run is this step alone, and it names its op's only member
        if steps[index].kind is not StepKind.COMPUTE:
            fail(index, f"siblings {list(members)} must be computed in consecutive steps")
    else:  # each of the next ``width`` steps computes the next member
        run = steps[index : index + width]
        if len(run) != width:
            fail(index, f"siblings {list(members)} must be computed in consecutive steps")
        for s, m in zip(run, members):
            if s.kind is not StepKind.COMPUTE or s.node != m:
                fail(index, f"siblings {list(members)} must be computed in consecutive steps")
    if phase is Phase.FORWARD and name in tables.backward_ops:
        fail(index, "backward op scheduled in forward")
    position = tables.position
    if name in tables.compute_once:
        if counts.get(name) or phase is not node.phase:
            fail(index, "random or mutating op must run exactly once, in its own phase")
        if position[name] < last_once:
            fail(index, "random or mutating ops must keep their original order")
        last_once = position[name]
    elif name in tables.replays_rng and not counts.get(name):  # the run that draws from the stream
        if phase is not Phase.FORWARD or position[name] < last_once:
            fail(index, "a replayable random op must first run in forward, in the original order "
                        "of the random and mutating ops")
        last_once = position[name]
    for inp in node.inputs:
        if inp not in live:
            fail(index, f"input {inp!r} is not live")
    return last_once


def _check_end(graph: RematGraph, tables: _SimulatorTables, live: set[str], counts: dict[str, int]) -> None:
    """Backward has ended: every output is live, and every run-once op ran exactly once (a
    replayable random op at least once)."""
    missing = [o for o in (*graph.backward_outputs, *graph.user_outputs) if o not in live]
    if missing:
        raise InvalidScheduleError(f"backward ends without outputs {missing[:5]}")
    never = [name for name, once, replays in tables.run_once_rules
             if (once and counts.get(name, 0) != 1) or (replays and not counts.get(name, 0))]
    if never:
        raise InvalidScheduleError(f"random or mutating ops not run exactly once: {never[:5]}")


def _recomputed(counts: dict[str, int], plain_computes: list[str]) -> tuple[tuple[str, int], ...]:
    """(value, times computed) for every value computed more than once, by name."""
    return tuple(sorted([*((k, v) for k, v in counts.items() if v > 1),
                         *((k, v) for k, v in Counter(plain_computes).items() if v > 1)]))
