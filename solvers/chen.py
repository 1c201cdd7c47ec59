"""Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost": segment checkpointing.

The forward graph is linearised at its articulation values (`solvers.linearize`): each
stage between two of them is one layer of a chain. Chen's schedule splits the chain into
k segments, keeps the value that ends each segment, and recomputes a segment's interior once,
right before its backward. With n layers and k = sqrt(n) segments the live activations are
about k checkpoints plus one segment of n/k layers: O(sqrt n) memory for one extra forward
pass. The last segment is never dropped: backward starts there, so recomputing it would buy
nothing.

``chen`` is the uniform split; ``chen-greedy`` is Chen's budget-driven variant: walk the
layers, close a segment once its memory passes a threshold, and try thresholds (and uniform
splits) until the cheapest schedule that fits the budget is found.
"""

from __future__ import annotations

import math
import time

from optimizer.ir.graph import RematGraph
from optimizer.ir.schedule import Schedule
from optimizer.ir.simulator import SimulationResult, simulate
from solvers.base import SolveResult, SolverOptions, heuristic_result
from solvers.linearize import Linearization, linearize
from solvers.segments import pinned_values, segment_schedule

_GREEDY_THRESHOLDS = 48
"""Thresholds tried by chen-greedy, geometrically spaced between one stage and the whole net."""


def stage_weights(graph: RematGraph, lin: Linearization) -> list[int]:
    """Bytes a stage holds when its interior is live (values that may be dropped)."""
    pinned = pinned_values(graph)
    return [sum(graph[v].bytes for v in s.values if v not in pinned) for s in lin.stages]


def uniform_checkpoints(graph: RematGraph, lin: Linearization, segments: int) -> tuple[str, ...]:
    """Articulation values that split the stages into ``segments`` parts of about equal bytes."""
    cut_stages = [s.index for s in lin.stages if s.boundary]
    if segments <= 1 or not cut_stages:
        return ()
    weights = stage_weights(graph, lin)
    prefix = [sum(weights[: i + 1]) for i in range(len(weights))]
    total = prefix[-1] or 1
    chosen: list[int] = []
    for j in range(1, segments):
        target = j * total / segments
        candidates = [i for i in cut_stages if not chosen or i > chosen[-1]]
        if not candidates:
            break
        best = min(candidates, key=lambda i: (abs(prefix[i] - target), i))
        chosen.append(best)
    return tuple(lin.stages[i].boundary for i in chosen)


def greedy_checkpoints(graph: RematGraph, lin: Linearization, threshold: float) -> tuple[str, ...]:
    """Chen's greedy: close a segment at the first articulation value past ``threshold`` bytes."""
    weights = stage_weights(graph, lin)
    chosen: list[str] = []
    held = 0
    for stage, weight in zip(lin.stages, weights):
        held += weight
        if held > threshold and stage.boundary:
            chosen.append(stage.boundary)
            held = 0
    return tuple(chosen)


def chen_schedule(graph: RematGraph, lin: Linearization, checkpoints: tuple[str, ...]) -> Schedule:
    """Keep ``checkpoints`` and the last segment; recompute every other segment once."""
    stage_of = lin.stage_of
    cut_stage = sorted(stage_of[c] for c in checkpoints)
    segment_of: dict[str, int] = {}
    for stage in lin.stages:
        seg = sum(1 for c in cut_stage if c < stage.index)
        for v in stage.values:
            segment_of[v] = seg
    last = len(cut_stage)
    kept = set(checkpoints) | {v for v, seg in segment_of.items() if seg == last}
    return segment_schedule(graph, kept, segment_of)


def default_segments(lin: Linearization) -> int:
    """Chen's k = sqrt(n) for n articulation values (n layers of a chain)."""
    return max(1, round(math.sqrt(len(lin.articulation))))


def solve_chen(
    graph: RematGraph, budget_bytes: int, options: SolverOptions, *, segments: int | None = None
) -> SolveResult:
    """Uniform segments over the articulation values (``segments`` defaults to sqrt(n))."""
    start = time.perf_counter()
    lin = linearize(graph)
    k = segments if segments is not None else default_segments(lin)
    checkpoints = uniform_checkpoints(graph, lin, k)
    schedule = chen_schedule(graph, lin, checkpoints)
    sim = simulate(graph, schedule)
    detail = f"{len(checkpoints) + 1} segments over {len(lin.articulation)} articulation values"
    return heuristic_result("chen", budget_bytes, schedule, sim, start, detail)


def solve_chen_greedy(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """The cheapest Chen schedule (greedy thresholds and uniform splits) that fits the budget."""
    start = time.perf_counter()
    lin = linearize(graph)
    weights = [w for w in stage_weights(graph, lin) if w > 0]
    candidates: dict[tuple[str, ...], str] = {}
    for k in range(1, len(lin.articulation) + 2):
        candidates.setdefault(uniform_checkpoints(graph, lin, k), f"{k} uniform segments")
    if weights:
        low, high = min(weights), sum(weights)
        for i in range(_GREEDY_THRESHOLDS):
            threshold = low * (high / low) ** (i / (_GREEDY_THRESHOLDS - 1))
            candidates.setdefault(greedy_checkpoints(graph, lin, threshold),
                                  f"greedy threshold {threshold:.0f} bytes")
    best: tuple[float, int, Schedule, SimulationResult, str] | None = None
    smallest: SimulationResult | None = None
    for checkpoints, how in candidates.items():
        if time.perf_counter() - start > options.time_limit_s and best is not None:
            break
        schedule = chen_schedule(graph, lin, checkpoints)
        sim = simulate(graph, schedule)
        if smallest is None or sim.peak_bytes < smallest.peak_bytes:
            smallest = sim
        if sim.peak_bytes <= budget_bytes:
            key = (sim.total_cost, sim.peak_bytes)
            if best is None or key < best[:2]:
                best = (sim.total_cost, sim.peak_bytes, schedule, sim, how)
    if best is None:
        peak = smallest.peak_bytes if smallest is not None else None
        return heuristic_result("chen-greedy", budget_bytes, None, None, start,
                              f"chen-greedy peaks at {peak} bytes at best")
    _, _, schedule, sim, how = best
    return heuristic_result("chen-greedy", budget_bytes, schedule, sim, start,
                          f"{how}, {len(candidates)} candidates")
