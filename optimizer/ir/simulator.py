"""The simulator: the single source of truth for a schedule's validity, peak memory and cost.

Memory model (what the rewritten module does when it runs):
- parameters, buffers, lifted constants (all `NodeKind.PARAMETER`) and user inputs are
  resident for the whole step: live before the first step, never freed or computed;
- computing an op allocates all its outputs (siblings) plus its unused outputs (temp bytes)
  while its inputs are still live; the unused outputs are dropped right after;
- output gradients (tangents) arrive when backward starts;
- a value stays live until its free step.
Random ops run once, in order; one that replays a saved generator state (`Node.replays_rng`)
may be recomputed, but its first run (the one that draws) is in forward, in that order.
Every solver's schedule is simulated before it is used or reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from optimizer.ir.graph import NodeKind, Phase, RematGraph
from optimizer.ir.schedule import Schedule, StepKind


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


StepObserver = Callable[[int, int, "set[str]", int], None]
"""``observe(index, live_bytes, live, width)``: called at the boundary (``index`` = the first
backward step, ``width`` 0, after the tangents arrive), after each free (``width`` 1, bytes left)
and during each compute (``width`` = its siblings, bytes while it runs, temporaries included).
``live`` is the simulator's own set: read it, do not keep or change it."""


def simulate(graph: RematGraph, schedule: Schedule, observe: StepObserver | None = None) -> SimulationResult:
    """Walk the schedule; raise InvalidScheduleError on the first rule it breaks.

    ``observe`` sees the live bytes and values at every step (`optimizer.ir.timeline` draws the
    curve with it), so nothing else has to re-walk a schedule to know what is live when."""
    live: set[str] = {n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)}
    live_bytes = graph.resident_bytes
    peak, peak_step, peak_phase, peak_node = live_bytes, -1, Phase.FORWARD, ""
    counts: Counter[str] = Counter()
    total_cost = total_flops = 0.0
    curve: list[int] = []
    boundary_bytes = 0
    saved: tuple[str, ...] = ()
    steps = schedule.steps
    n_forward = len(schedule.forward)
    last_once = -1

    def fail(index: int, message: str) -> None:
        phase = "forward" if index < n_forward else "backward"
        raise InvalidScheduleError(f"{phase} step {index} ({steps[index]}): {message}")

    i = 0
    while i <= len(steps):
        if i == n_forward:  # the boundary: forward outputs must exist, tangents arrive
            missing = [o for o in graph.forward_outputs if o not in live]
            if missing:
                raise InvalidScheduleError(f"forward ends without outputs {missing[:5]}")
            boundary_bytes = live_bytes
            saved = tuple(
                n.name for n in graph.ops if n.name in live and n.name not in graph.user_outputs
            )
            for t in graph.tangents:
                live.add(t)
                live_bytes += graph[t].bytes
            if live_bytes > peak:
                peak, peak_step, peak_phase, peak_node = live_bytes, -1, Phase.BACKWARD, ""
            if observe is not None:
                observe(i, live_bytes, live, 0)
        if i == len(steps):
            break
        step = steps[i]
        phase = Phase.FORWARD if i < n_forward else Phase.BACKWARD
        if step.node not in graph:
            fail(i, "unknown value")
        node = graph[step.node]
        if step.kind is StepKind.FREE:
            if step.node not in live:
                fail(i, "frees a value that is not live")
            if node.kind in (NodeKind.PARAMETER, NodeKind.INPUT):
                fail(i, "parameters and inputs are resident and cannot be freed")
            if step.node in graph.user_outputs:
                fail(i, "user outputs are held by the caller and cannot be freed")
            live.discard(step.node)
            live_bytes -= node.bytes
            curve.append(live_bytes)
            if observe is not None:
                observe(i, live_bytes, live, 1)
            i += 1
            continue
        # A compute step runs the whole op: all siblings must follow, in order.
        if not node.is_op:
            fail(i, f"{node.kind.value} values are given, not computed")
        members = graph.group_of(step.node)
        if step.node != members[0]:
            fail(i, f"siblings of {node.group!r} must be computed together, first {members[0]!r}")
        run = steps[i : i + len(members)]
        if any(s.kind is not StepKind.COMPUTE for s in run) or tuple(s.node for s in run) != members:
            fail(i, f"siblings {list(members)} must be computed in consecutive steps")
        if phase is Phase.FORWARD and node.phase is Phase.BACKWARD:
            fail(i, "backward op scheduled in forward")
        if node.compute_once:
            if counts[step.node] or phase is not node.phase:
                fail(i, "random or mutating op must run exactly once, in its own phase")
            if graph.position(step.node) < last_once:
                fail(i, "random or mutating ops must keep their original order")
            last_once = graph.position(step.node)
        elif node.replays_rng and not counts[step.node]:  # the run that draws from the stream
            if phase is not Phase.FORWARD or graph.position(step.node) < last_once:
                fail(i, "a replayable random op must first run in forward, in the original order "
                        "of the random and mutating ops")
            last_once = graph.position(step.node)
        for inp in node.inputs:
            if inp not in live:
                fail(i, f"input {inp!r} is not live")
        throwaway = 0  # a user output recomputed with its siblings: the copy is dropped at once
        for m in members:
            if m in live:
                if m not in graph.user_outputs:
                    fail(i, f"{m!r} is computed again while still live")
                throwaway += graph[m].bytes
        allocated = sum(graph[m].bytes for m in members if m not in live)
        during = live_bytes + allocated + throwaway + node.temp_bytes
        if during > peak:
            peak, peak_step, peak_phase, peak_node = during, i, phase, step.node
        for m in members:
            live.add(m)
            counts[m] += 1
        live_bytes += allocated
        total_cost += node.cost
        total_flops += node.flops
        curve.extend([live_bytes] * len(members))
        if observe is not None:
            observe(i, during, live, len(members))
        i += len(members)

    missing = [o for o in (*graph.backward_outputs, *graph.user_outputs) if o not in live]
    if missing:
        raise InvalidScheduleError(f"backward ends without outputs {missing[:5]}")
    never = [n.name for n in graph.ops if (n.compute_once and counts[n.name] != 1) or (n.replays_rng
                                                                                  and not counts[n.name])]
    if never:
        raise InvalidScheduleError(f"random or mutating ops not run exactly once: {never[:5]}")
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
        recomputed=tuple(sorted((k, v) for k, v in counts.items() if v > 1)),
        live_curve=tuple(curve),
    )
