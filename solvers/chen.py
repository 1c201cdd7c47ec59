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
from collections.abc import Callable
from dataclasses import dataclass

from solvers.base import SolveResult, SolverOptions, heuristic_result
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate
from solvers.linearize import Linearization, linearize
from solvers.segments import pinned_values, segment_schedule

_GREEDY_THRESHOLDS = 48
"""Thresholds tried by chen-greedy, geometrically spaced between one stage and the whole net."""
_SIMULATE_ALL = 160
"""Up to this many candidates chen-greedy builds and simulates them all (within its time limit)."""
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


@dataclass(frozen=True)
class _Candidate:
    """A chen-greedy candidate: ranked by ``key`` (recomputation, checkpoints); a uniform split
    (``segments`` > 0) is built only when simulated, a greedy one (``checkpoints``) at once."""

    key: tuple[float, int]
    label: str
    segments: int = 0
    checkpoints: tuple[str, ...] = ()


def _greedy_candidates(graph: RematGraph, lin: Linearization, weights: list[int]
                       ) -> dict[tuple[str, ...], str]:
    """Chen's greedy splits at `_GREEDY_THRESHOLDS` thresholds, geometrically spaced."""
    sizes = [w for w in weights if w > 0]
    found: dict[tuple[str, ...], str] = {}
    if sizes:
        low, high = min(sizes), sum(sizes)
        for i in range(_GREEDY_THRESHOLDS):
            threshold = low * (high / low) ** (i / (_GREEDY_THRESHOLDS - 1))
            found.setdefault(greedy_checkpoints(graph, lin, threshold, weights),
                             f"greedy threshold {threshold:.0f} bytes")
    return found


def _last_uniform_stages(lin: Linearization, weights: list[int]) -> Callable[[int], int]:
    """k -> the stage of the last checkpoint of `uniform_checkpoints`' k segments (-1: none),
    in O(log stages) without building the split: the articulation value nearest (k - 1) / k
    of the bytes. Exact unless earlier choices crowd it (about as many segments as values)."""
    cut_stages = [s.index for s in lin.stages if s.boundary]
    prefix = list(itertools.accumulate(weights))
    cut_prefix = [prefix[i] for i in cut_stages]
    total = (prefix[-1] if prefix else 0) or 1

    def last(k: int) -> int:
        if k <= 1 or not cut_stages:
            return -1
        target = (k - 1) * total / k
        at = bisect.bisect_left(cut_prefix, target)
        near = [i for i in (at - 1, at) if 0 <= i < len(cut_stages)]
        return cut_stages[min(near, key=lambda i: (abs(cut_prefix[i] - target), i))]

    return last


def _leanest_segments(graph: RematGraph, lin: Linearization, weights: list[int]) -> int:
    """The segment count whose uniform split peaks lowest in the simple model: k - 1 checkpoints
    of the mean articulation value's bytes plus one segment's total / k (k = sqrt(total / mean));
    chen-greedy's first simulation on a long chain, the candidate most likely to fit."""
    total = sum(weights)
    mean = sum(graph[v].bytes for v in lin.articulation) / max(len(lin.articulation), 1)
    k = round(math.sqrt(total / mean)) if total > 0 and mean > 0 else 1
    return min(max(k, 1), len(lin.articulation) + 1)


def solve_chen_greedy(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """The cheapest Chen schedule (greedy thresholds and uniform splits) that fits the budget.

    Candidates are ranked by their recomputation (every segment but the last runs twice, so a
    long last segment is cheap and holds much). A short chain's are all simulated. A long
    chain has one per segment count, too many to build (quadratic in its length) or simulate:
    uniform splits are ranked by where their last checkpoint will fall and built only when
    simulated. The leanest uniform split (`_leanest_segments`) is simulated first, then the
    first candidate that fits is bisected for on its side and its neighbours simulated. Each
    simulation walks the whole graph (seconds at 10,000 steps), so none starts that would end
    past the time limit; the first always runs (an answer needs one)."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    lin = linearize(graph)
    all_weights = stage_weights(graph, lin)
    stage_cost = [sum(graph[v].cost for v in s.values) for s in lin.stages]
    after = list(itertools.accumulate(reversed(stage_cost)))[::-1] + [0.0]  # cost of stages i..
    stage_of = lin.stage_of

    def recomputed(checkpoints: tuple[str, ...]) -> float:
        """Cost of the stages before the last segment (run twice)."""
        last = max((stage_of[c] for c in checkpoints), default=-1)
        return after[0] - after[last + 1]

    counts = range(1, len(lin.articulation) + 2)
    greedy = _greedy_candidates(graph, lin, all_weights)
    lazy = len(counts) + len(greedy) > _SIMULATE_ALL
    ranked: list[_Candidate] = []
    if lazy:
        last_stage = _last_uniform_stages(lin, all_weights)
        ranked += [_Candidate((after[0] - after[last_stage(k) + 1], k - 1), f"{k} uniform segments", k)
                   for k in counts]
    else:
        for k in counts:
            greedy.setdefault(uniform_checkpoints(graph, lin, k, all_weights), f"{k} uniform segments")
    ranked += [_Candidate((recomputed(c), len(c)), label, 0, c) for c, label in greedy.items()]
    ranked.sort(key=lambda c: c.key)
    sims: dict[tuple[str, ...], tuple[Schedule, SimulationResult]] = {}
    chosen: dict[int, tuple[str, ...]] = {}
    durations: list[float] = []

    def checkpoints(i: int) -> tuple[str, ...]:
        if i not in chosen:
            c = ranked[i]
            chosen[i] = c.checkpoints if not c.segments else uniform_checkpoints(
                graph, lin, c.segments, all_weights)
        return chosen[i]

    def affordable() -> bool:
        """Time for one more simulation (as long as the longest so far) before the deadline."""
        return not durations or time.perf_counter() + max(durations) <= deadline

    def evaluate(i: int) -> SimulationResult | None:
        """Simulate candidate ``i`` (None: no time left for it)."""
        key = checkpoints(i)
        if key not in sims:
            if not affordable():
                return None
            began = time.perf_counter()
            schedule = chen_schedule(graph, lin, key)
            sims[key] = (schedule, simulate(graph, schedule))
            durations.append(time.perf_counter() - began)
        return sims[key][1]

    if not lazy:
        for i in range(len(ranked)):
            if evaluate(i) is None:
                break
    else:
        leanest = _leanest_segments(graph, lin, all_weights)
        seed = next(i for i, c in enumerate(ranked) if c.segments == leanest)
        lo, hi = -1, len(ranked) - 1  # fit is about monotone along the ranking on each side
        (lo, hi) = (lo, seed) if evaluate(seed).peak_bytes <= budget_bytes else (seed, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = evaluate(mid)
            if found is None:
                break
            lo, hi = (lo, mid) if found.peak_bytes <= budget_bytes else (mid, hi)
        evaluate(hi)
        for d in range(1, _NEIGHBOURS + 1):  # the neighbours, nearest first
            if not affordable():
                break
            for i in (hi - d, hi + d):
                if 0 <= i < len(ranked):
                    evaluate(i)
    fitting = [(sim.total_cost, sim.peak_bytes, i) for i, key in chosen.items() if key in sims
               for sim in (sims[key][1],) if sim.peak_bytes <= budget_bytes]
    if not fitting:
        peak = min((sim.peak_bytes for _, sim in sims.values()), default=None)
        return heuristic_result("chen-greedy", budget_bytes, None, None, start,
                                f"chen-greedy peaks at {peak} bytes at best ({len(sims)} of "
                                f"{len(ranked)} candidates simulated)")
    best = min(fitting)
    schedule, sim = sims[chosen[best[2]]]
    return heuristic_result("chen-greedy", budget_bytes, schedule, sim, start,
                            f"{ranked[best[2]].label}, {len(sims)} of {len(ranked)} "
                            "candidates simulated")
