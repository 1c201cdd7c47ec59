"""Live memory over a schedule's steps: the curve behind the peak, and who is live at the peak.

A plan's peak is one number; where it happens and which tensors make it is what users act on
(a huge logits tensor at the forward/backward boundary calls for a different fix than a wide
activation deep in backward). `memory_timeline` records, through the simulator's step
observer, the bytes live while each step runs, so the curve is the simulator's own memory
model and its maximum the simulator's peak. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from solvers.ir.graph import NodeKind, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate


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
    curve: list[int] = []
    best = (-1, -1, frozenset[str]())  # (bytes, index, live set)

    def record(index: int, live_bytes: int, live: set[str], width: int) -> None:
        nonlocal best
        curve.extend([live_bytes] * width)
        if live_bytes > best[0]:
            best = (live_bytes, index, frozenset(live))

    sim = simulate(graph, schedule, observe=record)
    peak_bytes, peak_index, peak_live = best
    if peak_bytes != sim.peak_bytes:
        raise AssertionError(f"timeline peak {peak_bytes} != simulated peak {sim.peak_bytes}: a bug")
    resident = {n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)}
    largest = sorted(
        (LiveTensor(n, graph[n].bytes, graph[n].op, graph[n].module, graph[n].kind.value)
         for n in peak_live - resident),
        key=lambda t: (-t.bytes, t.name),
    )[:top]
    return Timeline(label, tuple(curve), len(schedule.forward), peak_bytes, peak_index,
                    graph.resident_bytes, tuple(largest), budget_bytes)
