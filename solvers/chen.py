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

import bisect
import itertools
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
_SIMULATE_ALL = 160
"""Up to this many candidates chen-greedy simulates them all (within its time limit)."""
_NEIGHBOURS = 12
"""Past that: candidates simulated on each side of the first fitting one in the ranking."""


def stage_weights(graph: RematGraph, lin: Linearization) -> list[int]:
    """Bytes a stage holds when its interior is live (values that may be dropped)."""
    pinned = pinned_values(graph)
    return [sum(graph[v].bytes for v in s.values if v not in pinned) for s in lin.stages]


def uniform_checkpoints(graph: RematGraph, lin: Linearization, segments: int,
                        weights: list[int] | None = None) -> tuple[str, ...]:
    """Articulation values that split the stages into ``segments`` parts of about equal bytes
    (``weights``: `stage_weights`, if already measured). O(segments log stages)."""
    cut_stages = [s.index for s in lin.stages if s.boundary]
    if segments <= 1 or not cut_stages:
        return ()
    weights = weights if weights is not None else stage_weights(graph, lin)
    prefix = list(itertools.accumulate(weights))
    cut_prefix = [prefix[i] for i in cut_stages]  # non-decreasing
    total = prefix[-1] or 1
    chosen: list[int] = []  # positions in cut_stages
    for j in range(1, segments):
        target = j * total / segments
        first = chosen[-1] + 1 if chosen else 0
        if first >= len(cut_stages):
            break
        # the candidates nearest the target (ties: the earlier stage)
        at = bisect.bisect_left(cut_prefix, target, lo=first)
        below = bisect.bisect_left(cut_prefix, cut_prefix[at - 1], lo=first) if at > first else -1
        near = [i for i in (below, at) if first <= i < len(cut_stages)]
        chosen.append(min(near, key=lambda i: (abs(cut_prefix[i] - target), i)))
    return tuple(lin.stages[cut_stages[i]].boundary for i in chosen)


def greedy_checkpoints(graph: RematGraph, lin: Linearization, threshold: float,
                       weights: list[int] | None = None) -> tuple[str, ...]:
    """Chen's greedy: close a segment at the first articulation value past ``threshold`` bytes."""
    weights = weights if weights is not None else stage_weights(graph, lin)
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
        seg = bisect.bisect_left(cut_stage, stage.index)  # checkpoints in earlier stages
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
    """The cheapest Chen schedule (greedy thresholds and uniform splits) that fits the budget.

    On a long chain the candidates (one per segment count, plus the thresholds) are too many to
    simulate: ranked by their recomputation (every segment but the last runs twice, so a long
    last segment is cheap and holds much), the first that fits is found by bisection, then its
    neighbours are simulated while time is left."""
    start = time.perf_counter()
    lin = linearize(graph)
    all_weights = stage_weights(graph, lin)
    weights = [w for w in all_weights if w > 0]
    candidates: dict[tuple[str, ...], str] = {}
    for k in range(1, len(lin.articulation) + 2):
        candidates.setdefault(uniform_checkpoints(graph, lin, k, all_weights), f"{k} uniform segments")
    if weights:
        low, high = min(weights), sum(weights)
        for i in range(_GREEDY_THRESHOLDS):
            threshold = low * (high / low) ** (i / (_GREEDY_THRESHOLDS - 1))
            candidates.setdefault(greedy_checkpoints(graph, lin, threshold, all_weights),
                                  f"greedy threshold {threshold:.0f} bytes")
    stage_cost = [sum(graph[v].cost for v in s.values) for s in lin.stages]
    after = list(itertools.accumulate(reversed(stage_cost)))[::-1] + [0.0]  # cost of stages i..
    stage_of = lin.stage_of

    def recomputed(checkpoints: tuple[str, ...]) -> float:
        """Cost of the stages before the last segment (run twice)."""
        last = max((stage_of[c] for c in checkpoints), default=-1)
        return after[0] - after[last + 1]

    ranked = sorted(candidates, key=lambda c: (recomputed(c), len(c)))
    sims: dict[int, tuple[Schedule, SimulationResult]] = {}

    def evaluate(i: int) -> SimulationResult:
        if i not in sims:
            schedule = chen_schedule(graph, lin, ranked[i])
            sims[i] = (schedule, simulate(graph, schedule))
        return sims[i][1]

    def out_of_time() -> bool:
        return time.perf_counter() - start > options.time_limit_s

    if len(ranked) <= _SIMULATE_ALL:
        for i in range(len(ranked)):
            if out_of_time() and any(s.peak_bytes <= budget_bytes for _, s in sims.values()):
                break
            evaluate(i)
    else:
        lo, hi = -1, len(ranked) - 1  # fit is about monotone along the ranking
        while hi - lo > 1:
            if out_of_time():  # a long chain's simulations are slow: the limit holds here
                break
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if evaluate(mid).peak_bytes <= budget_bytes else (mid, hi)
        if not out_of_time():
            evaluate(hi)
        for d in range(1, len(ranked)):  # the neighbours, nearest first
            if out_of_time() or d > _NEIGHBOURS:
                break
            for i in (hi - d, hi + d):
                if 0 <= i < len(ranked):
                    evaluate(i)
    best: tuple[float, int, int] | None = None
    smallest: SimulationResult | None = None
    for i, (_, sim) in sims.items():
        if smallest is None or sim.peak_bytes < smallest.peak_bytes:
            smallest = sim
        if sim.peak_bytes <= budget_bytes:
            key = (sim.total_cost, sim.peak_bytes, i)
            if best is None or key < best:
                best = key
    if best is None:
        peak = smallest.peak_bytes if smallest is not None else None
        return heuristic_result("chen-greedy", budget_bytes, None, None, start,
                              f"chen-greedy peaks at {peak} bytes at best")
    schedule, sim = sims[best[2]]
    return heuristic_result("chen-greedy", budget_bytes, schedule, sim, start,
                          f"{candidates[ranked[best[2]]]}, {len(sims)} of {len(candidates)} "
                          "candidates simulated")
