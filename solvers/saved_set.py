"""Turn a guess of which values forward saves into a schedule that fits the budget.

The family is greedy's (`solvers.greedy.schedule_from_saved`): forward runs once and keeps the
saved values; backward recomputes the rest just in time. A guess (an LP rounded, a block plan)
may overshoot the budget: `repair_saved_set` drops, one at a time, the saved value live at the
simulated peak that frees the most bytes per second of recomputation (values the guess wanted
least go first), then puts back, most expensive first, every dropped value that still fits.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from optimizer.graph import RematGraph
from optimizer.schedule import Schedule, StepKind
from optimizer.simulator import SimulationResult, simulate
from solvers.greedy import schedule_from_saved

RESAVE_CANDIDATES = 48
"""How many dropped values, most expensive first, the re-save pass tries to put back."""


def _live_at(schedule: Schedule, step: int) -> set[str]:
    stop = len(schedule.forward) if step < 0 else step
    live: set[str] = set()
    for s in schedule.steps[:stop]:
        if s.kind is StepKind.COMPUTE:
            live.add(s.node)
        else:
            live.discard(s.node)
    return live


def _group_cost(graph: RematGraph, name: str) -> float:
    return sum(graph[m].cost for m in graph.group_of(name)) or 1e-12


def repair_saved_set(graph: RematGraph, saved: frozenset[str], budget_bytes: int, deadline: float,
                     order: Mapping[str, float] | None = None,
                     candidates: frozenset[str] | None = None) -> Schedule | None:
    """The cheapest schedule of the family found from ``saved`` within the budget, or None.

    ``order``: how much the guess wants each value kept (dropped last when high).
    ``candidates``: values the re-save pass may add (default: every value ever dropped).
    Repairs twice, recomputing each dropped closure per reader and once (see
    `schedule_from_saved`), and keeps the cheaper: neither variant dominates.
    """
    found = [s for once in (False, True)
             if (s := _repair(graph, saved, budget_bytes, deadline, order or {}, candidates, once)) is not None]
    return min(found, key=lambda s: simulate(graph, s).total_cost, default=None)


def _repair(graph: RematGraph, saved: frozenset[str], budget_bytes: int, deadline: float,
            order: Mapping[str, float], candidates: frozenset[str] | None, once: bool) -> Schedule | None:
    kept = set(saved)
    schedule = schedule_from_saved(graph, frozenset(kept), once)
    sim = simulate(graph, schedule)
    dropped: set[str] = set()
    while sim.peak_bytes > budget_bytes:
        if not kept or time.perf_counter() > deadline:
            return None
        live = _live_at(schedule, sim.peak_step)
        pool = [v for v in kept if v in live] or list(kept)
        victim = max(pool, key=lambda v: ((1.0 - order.get(v, 0.0)) + 1e-3)
                     * graph[v].bytes / _group_cost(graph, v))
        kept.discard(victim)
        dropped.add(victim)
        schedule = schedule_from_saved(graph, frozenset(kept), once)
        sim = simulate(graph, schedule)
    return _resave(graph, kept, schedule, sim, budget_bytes, deadline,
                   (candidates or frozenset()) | dropped, once)


def _resave(graph: RematGraph, kept: set[str], schedule: Schedule, sim: SimulationResult,
            budget_bytes: int, deadline: float, pool: frozenset[str] | set[str], once: bool) -> Schedule:
    """Put back, most expensive recomputation first, each value that still fits and helps."""
    ranked = sorted((v for v in pool if v not in kept), key=lambda v: (-_group_cost(graph, v), v))
    for v in ranked[:RESAVE_CANDIDATES]:
        if time.perf_counter() > deadline:
            break
        trial = schedule_from_saved(graph, frozenset(kept | {v}), once)
        trial_sim = simulate(graph, trial)
        if trial_sim.peak_bytes <= budget_bytes and trial_sim.total_cost < sim.total_cost:
            kept.add(v)
            schedule, sim = trial, trial_sim
    return schedule
