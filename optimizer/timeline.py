"""Live memory over a schedule's steps: the curve behind the peak, and who is live at the peak.

A plan's peak is one number; where it happens and which tensors make it is what users act on
(a huge logits tensor at the forward/backward boundary calls for a different fix than a wide
activation deep in backward). `memory_timeline` walks a schedule with the simulator's memory
model (resident parameters and inputs; an op's outputs and unused temporaries allocated while
its inputs are live; tangents arriving at the boundary) and records, per step, the bytes live
while the step runs, so the curve's maximum is the simulator's peak. It does not replace the
simulator: it runs it first, so an invalid schedule raises there, and its numbers are checked
against it by the tests. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.graph import NodeKind, RematGraph
from optimizer.schedule import Schedule, StepKind
from optimizer.simulator import simulate


@dataclass(frozen=True)
class LiveTensor:
    """A value live at the peak, for naming the largest ones."""

    name: str
    bytes: int
    op: str
    module: str
    kind: str
    """``op`` (an activation or gradient), ``tangent`` (an output gradient)."""


@dataclass(frozen=True)
class Timeline:
    """Live bytes at every step of one schedule."""

    label: str
    live_bytes: tuple[int, ...]
    """Bytes live while each step runs (a compute step counts what it allocates, temporaries
    included; a free step counts what is left after it)."""
    forward_steps: int
    """Steps before the forward/backward boundary."""
    peak_bytes: int
    peak_index: int
    """Index of the step where the peak is first reached (``forward_steps`` when it is the
    output gradients' arrival at the boundary)."""
    resident_bytes: int
    """Parameters, buffers and inputs: the floor of the curve."""
    largest_at_peak: tuple[LiveTensor, ...]
    """The largest non-resident values live at the peak, largest first."""
    budget_bytes: int | None = None
    """The budget the schedule was planned for (None: no budget, e.g. store-all)."""

    @property
    def peak_phase(self) -> str:
        return "forward" if self.peak_index < self.forward_steps else "backward"


def memory_timeline(graph: RematGraph, schedule: Schedule, label: str = "", top: int = 5,
                    budget_bytes: int | None = None) -> Timeline:
    """The live-memory curve of ``schedule`` on ``graph`` and the ``top`` largest tensors at its peak."""
    sim = simulate(graph, schedule)
    resident = {n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)}
    live: set[str] = set(resident)
    live_bytes = graph.resident_bytes
    curve: list[int] = []
    best = (-1, -1, frozenset[str]())  # (bytes, index, live set)
    steps = schedule.steps
    n_forward = len(schedule.forward)
    i = 0
    while i <= len(steps):
        if i == n_forward:  # the boundary: output gradients arrive
            for tangent in graph.tangents:
                live.add(tangent)
                live_bytes += graph[tangent].bytes
            if live_bytes > best[0]:
                best = (live_bytes, i, frozenset(live))
        if i == len(steps):
            break
        step = steps[i]
        node = graph[step.node]
        if step.kind is StepKind.FREE:
            live.discard(step.node)
            live_bytes -= node.bytes
            curve.append(live_bytes)
            if live_bytes > best[0]:
                best = (live_bytes, i, frozenset(live))
            i += 1
            continue
        members = graph.group_of(step.node)
        fresh = [m for m in members if m not in live]
        throwaway = sum(graph[m].bytes for m in members if m in live)
        during = live_bytes + sum(graph[m].bytes for m in fresh) + throwaway + node.temp_bytes
        live.update(members)
        live_bytes += sum(graph[m].bytes for m in fresh)
        curve.extend([during] * len(members))
        if during > best[0]:
            best = (during, i, frozenset(live))
        i += len(members)
    peak_bytes, peak_index, peak_live = best
    if peak_bytes != sim.peak_bytes:
        raise AssertionError(f"timeline peak {peak_bytes} != simulated peak {sim.peak_bytes}: a bug")
    largest = sorted(
        (LiveTensor(n, graph[n].bytes, graph[n].op, graph[n].module, graph[n].kind.value)
         for n in peak_live - resident),
        key=lambda t: (-t.bytes, t.name),
    )[:top]
    return Timeline(label, tuple(curve), n_forward, peak_bytes, peak_index, graph.resident_bytes,
                    tuple(largest), budget_bytes)
