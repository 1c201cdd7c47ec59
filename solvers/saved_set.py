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

from solvers.greedy import live_at, recompute_cost, resave, schedule_from_saved
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate

RESAVE_CANDIDATES = 48
"""How many dropped values, most expensive first, the re-save pass tries to put back."""


def repair_saved_set(graph: RematGraph, saved: frozenset[str], budget_bytes: int, deadline: float,
                     order: Mapping[str, float] | None = None,
                     candidates: frozenset[str] | None = None) -> Schedule | None:
    """The cheapest schedule of the family found from ``saved`` within the budget, or None.

    ``order``: how much the guess wants each value kept (dropped last when high).
    ``candidates``: values the re-save pass may add (default: every value ever dropped).
    Repairs twice, recomputing each dropped closure per reader and once (see
    `schedule_from_saved`), and keeps the cheaper: neither variant dominates.
    """
    found = [r for once in (False, True)
             if (r := _repair(graph, saved, budget_bytes, deadline, order or {}, candidates, once)) is not None]
    return min(found, key=lambda r: r[1].total_cost, default=(None, None))[0]


def _repair(graph: RematGraph, saved: frozenset[str], budget_bytes: int, deadline: float,
            order: Mapping[str, float], candidates: frozenset[str] | None,
            once: bool) -> tuple[Schedule, SimulationResult] | None:
    kept = set(saved)
    schedule = schedule_from_saved(graph, frozenset(kept), once)
    sim = simulate(graph, schedule)
    dropped: set[str] = set()
    while sim.peak_bytes > budget_bytes:
        if not kept or time.perf_counter() > deadline:
            return None
        live = live_at(schedule, sim.peak_step)
        pool = [v for v in kept if v in live] or list(kept)
        victim = max(pool, key=lambda v: ((1.0 - order.get(v, 0.0)) + 1e-3)
                     * graph[v].bytes / recompute_cost(graph, v))
        kept.discard(victim)
        dropped.add(victim)
        schedule = schedule_from_saved(graph, frozenset(kept), once)
        sim = simulate(graph, schedule)
    return resave(graph, kept, schedule, sim, budget_bytes, deadline,
                  (candidates or frozenset()) | dropped, once, RESAVE_CANDIDATES)
