"""Offload by budget shift: the recompute-only solver's schedule for a larger budget, with its
earliest saved values sent to host until the real budget fits (issue 39).

Why beside `solvers.offload`'s local search: that search works in the saved-set family (forward
once, backward recomputes what forward did not save), whose schedules on a transformer cost more
than what the hierarchical solver finds (per-block retention, recompute-once), so on GPT-2 small
at 8 x 1024 and 40% of its peak on an H200 it found no offload that beat the solver's plan. Here
the solver plans for ``budget + X`` bytes; offloading the first saved values forward makes (read
last in backward, so their copies back have the whole backward to hide in) brings the peak down
by about X at the forward/backward boundary. Forward's compute hides ``forward seconds x link
bandwidth`` bytes of copies (`hideable_bytes`): X is tried at fractions of that, and each
candidate is judged by the simulator with the link (compute plus the copy time compute does not
hide). Torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from solvers.ir.graph import Phase, RematGraph
from solvers.ir.link import Link, get_link
from solvers.ir.schedule import Schedule, StepKind
from solvers.ir.simulator import SimulationResult, simulate
from solvers.offload import OffloadChoice, saved_by
from solvers.offload_placement import place_offloads

SHIFT_FRACTIONS = (0.5, 0.75, 1.0, 0.25)
"""Budget shifts tried, as fractions of `hideable_bytes`, in this order (while time is left).
Measured on GPT-2 small (8 x 1024, H200 roofline, PCIe Gen5, 40% of its peak): 1.76 GiB offloaded
(0.66 of the hideable 2.66 GB) cost nothing, 2.86 GiB stalled 7.9 ms."""

Solve = Callable[[int, float], Schedule | None]
"""``solve(budget_bytes, seconds)``: the recompute-only solver's schedule for that budget, or None."""


def hideable_bytes(graph: RematGraph, link: Link) -> int:
    """Bytes the link copies to host while forward computes: the most an offload can move
    without making forward wait (by the graph's cost model)."""
    forward_s = sum(n.cost for n in graph.nodes if n.phase is Phase.FORWARD)
    return int(forward_s * link.device_to_host_bytes_per_s)


def shifted_offloads(graph: RematGraph, budget_bytes: int, link: Link | str, solve: Solve, *,
                     host_budget_bytes: int | None = None, deadline: float) -> OffloadChoice | None:
    """The fastest budget-shifted choice that fits ``budget_bytes`` (and ``host_budget_bytes``),
    or None when none does (or no shift could be tried before ``deadline``)."""
    link = get_link(link)
    hideable = hideable_bytes(graph, link)
    best: OffloadChoice | None = None
    evaluations = 0
    shifts = [x for x in dict.fromkeys(int(f * hideable) for f in SHIFT_FRACTIONS) if x > 0]
    for i, shift in enumerate(shifts):
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        schedule = solve(budget_bytes + shift, left / (len(shifts) - i))
        if schedule is None:
            continue
        found = _fewest_offloads(graph, schedule, budget_bytes, link, host_budget_bytes)
        if found is None:
            continue
        offloaded, sched, result, tried = found
        evaluations += tried
        if best is None or result.step_time_s < best.step_time_s:
            best = OffloadChoice(sched, result, saved_by(graph, schedule), offloaded, link, 0,
                                 chosen_by=f"budget shift (+{shift:,} B planned, then offloaded)",
                                 shift_bytes=shift)
    if best is None:
        return None
    return replace(best, evaluations=evaluations)


def _fewest_offloads(graph: RematGraph, schedule: Schedule, budget_bytes: int, link: Link,
                     host_budget_bytes: int | None
                     ) -> tuple[frozenset[str], Schedule, SimulationResult, int] | None:
    """The shortest prefix (in forward order) of ``schedule``'s saved forward values (those a
    backward step reads: `place_offloads` takes no other) whose offload makes it fit, by bisection
    (offloading more lowers the boundary); None when all of them do not."""
    read_in_backward = {i for s in schedule.backward if s.kind is StepKind.COMPUTE for i in graph[s.node].inputs}
    order = sorted((v for v in saved_by(graph, schedule)
                    if graph[v].phase is Phase.FORWARD and v in read_in_backward), key=graph.position)
    tried = 0

    def attempt(k: int) -> tuple[Schedule, SimulationResult] | None:
        nonlocal tried
        tried += 1
        placed = place_offloads(graph, schedule, order[:k], link, budget_bytes)
        result = simulate(graph, placed, link=link)
        fits = result.peak_bytes <= budget_bytes and (
            host_budget_bytes is None or result.host_peak_bytes <= host_budget_bytes)
        return (placed, result) if fits else None

    found = attempt(len(order))
    if found is None:
        return None
    low, high = 0, len(order)  # attempt(high) fits
    while low < high:
        middle = (low + high) // 2
        fitting = attempt(middle)
        if fitting is not None:
            high, found = middle, fitting
        else:
            low = middle + 1
    placed, result = found
    return frozenset(order[:high]), placed, result, tried
