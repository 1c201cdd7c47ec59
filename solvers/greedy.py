"""A fast saved-set heuristic: forward runs once, backward recomputes what was not saved.

The schedule family is the one PyTorch's partitioner uses (choose the values forward saves),
with each unsaved value recomputed just in time from the saved ones, right before the first
backward op that reads it, and kept until its last backward read (the other values of that
recomputation die at once). The search starts from plain autograd's saved set and
drops, one at a time, the value live at the peak whose removal lowers the peak the most per
second of recomputation, until the budget is met; then it re-saves what still fits. Every
candidate is judged by the simulator, so the result is exact for the schedule it returns.

It scales to thousands of values (each step simulates a few candidates), seeds the exact solvers
with an incumbent, and is the answer when they time out.
"""

from __future__ import annotations

import time

from solvers.base import SolveResult, SolverOptions, heuristic_result
from solvers.baselines import forward_closure, kept_through_backward
from solvers.ir.derived import per_graph
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate

CANDIDATES_PER_STEP = 8
"""How many of the best-looking values are simulated before dropping one."""


class _FamilyTables:
    """What `schedule_from_saved` and the search read off the graph, built once per graph (see
    `per_graph`) instead of once per candidate."""

    def __init__(self, graph: RematGraph) -> None:
        self.forward = tuple(n.name for n in graph.ops if n.phase is Phase.FORWARD)
        self.kept = frozenset(kept_through_backward(graph))
        self.members = {n.name: graph.group_of(n.name) for n in graph.ops}
        self.backward_groups = tuple(
            (members, graph[members[0]].inputs) for members in graph.groups.values()
            if graph[members[0]].phase is Phase.BACKWARD)
        """(members, the first member's inputs) of each backward op group, in graph order."""
        read_in_backward = {
            i for n in graph.ops if n.phase is Phase.BACKWARD for i in n.inputs
            if graph[i].is_op and graph[i].phase is Phase.FORWARD
        }
        self.droppable = frozenset(read_in_backward - self.kept)


def schedule_from_saved(graph: RematGraph, saved: frozenset[str], recompute_once: bool = False,
                        retain: frozenset[str] | None = None) -> Schedule:
    """Forward computes everything once; backward recomputes unsaved inputs just in time.

    ``recompute_once``: a recomputed closure stays available to later readers (a shared
    producer, such as a qkv projection read through q, k and v, runs once, as PyTorch's min-cut
    partitioner runs it) instead of being recomputed for each reader; it costs memory between
    readers, so neither variant dominates.
    ``retain``: only these recomputed values stay available to later readers (None: all that
    the variant keeps); the others are recomputed for every reader and die right after it, as
    recompute-all's do. Near the smallest budget that is what fits: at the end of backward,
    where almost every gradient is live, a recomputed value held between two readers is what
    overshoots (`solvers.repair`)."""
    tables = per_graph(graph, _FamilyTables)
    members_of = tables.members
    available = set(tables.kept)
    available.update(saved)
    backward: list[str] = []
    for members, inputs in tables.backward_groups:
        for i in inputs:
            if i not in available:
                missing = [i for i in inputs if i not in available]
                # Per reader: only the values this op reads stay available, the rest of the closure
                # dies after it (a later reader recomputes it). Once: the whole closure stays.
                closure = forward_closure(graph, missing, available)
                backward.extend(closure)
                for name in closure if recompute_once else missing:
                    if retain is None or name in retain:
                        available.update(members_of.get(name) or graph.group_of(name))
                break
        backward.extend(members)
        available.update(members)
    return Schedule.from_computes(graph, tables.forward, backward)


def droppable(graph: RematGraph) -> frozenset[str]:
    """Forward values backward reads that a schedule may decline to save."""
    return per_graph(graph, _FamilyTables).droppable


def drop_rank(before: SimulationResult, after: SimulationResult, name: str) -> tuple:
    """How good a move from ``before`` to ``after`` is, larger first: any peak drop, then the
    drop per second of added recomputation, then the lower peak (``name`` breaks ties)."""
    gain = before.peak_bytes - after.peak_bytes
    extra = max(after.total_cost - before.total_cost, 1e-15)
    return (gain > 0, gain / extra, -after.peak_bytes, name)


def recompute_cost(graph: RematGraph, name: str) -> float:
    """What recomputing ``name``'s op costs (never 0, so it can divide)."""
    return sum(graph[m].cost for m in graph.group_of(name)) or 1e-12


def greedy_saved_set(graph: RematGraph, budget_bytes: int, deadline: float,
                     once: bool = False) -> tuple[Schedule, SimulationResult]:
    """The cheapest schedule of this family found for the budget (or the leanest one found);
    ``once``: the recompute-once variant of the family (`schedule_from_saved`)."""
    saved = set(droppable(graph))
    best_schedule = schedule_from_saved(graph, frozenset(saved), once)
    best = simulate(graph, best_schedule)
    while best.peak_bytes > budget_bytes and saved and time.perf_counter() < deadline:
        live_at_peak = live_at(best_schedule, best.peak_step)
        pool = [v for v in saved if v in live_at_peak] or list(saved)
        pool.sort(key=lambda v: (-graph[v].bytes / recompute_cost(graph, v), v))
        trial_best = None
        for v in pool[:CANDIDATES_PER_STEP]:
            trial = frozenset(saved - {v})
            schedule = schedule_from_saved(graph, trial, once)
            result = simulate(graph, schedule)
            key = drop_rank(best, result, v)
            if trial_best is None or key > trial_best[0]:
                trial_best = (key, v, schedule, result)
        _, dropped, best_schedule, best = trial_best
        saved.discard(dropped)
    if best.peak_bytes <= budget_bytes:
        best_schedule, best = resave(graph, saved, best_schedule, best, budget_bytes, deadline,
                                     droppable(graph), once)
    return best_schedule, best


def resave(graph: RematGraph, saved: set[str], schedule: Schedule, result: SimulationResult,
           budget_bytes: int, deadline: float, pool, once: bool,
           limit: int | None = None) -> tuple[Schedule, SimulationResult]:
    """Put back into ``saved``, most expensive recomputation first, each value of ``pool`` (the
    first ``limit`` not saved) that still fits the budget and makes the schedule cheaper."""
    ranked = sorted((v for v in pool if v not in saved), key=lambda v: (-recompute_cost(graph, v), v))
    for v in ranked[:limit]:
        if time.perf_counter() >= deadline:
            break
        candidate = schedule_from_saved(graph, frozenset(saved | {v}), once)
        sim = simulate(graph, candidate)
        if sim.peak_bytes <= budget_bytes and sim.total_cost < result.total_cost:
            saved.add(v)
            schedule, result = candidate, sim
    return schedule, result


def live_at(schedule: Schedule, step: int) -> set[str]:
    """Values live when step ``step`` runs (-1: the boundary)."""
    steps = schedule.steps
    stop = len(schedule.forward) if step < 0 else step
    live: set[str] = set()
    for s in steps[:stop]:
        if s.kind.value == "compute":
            live.add(s.node)
        else:
            live.discard(s.node)
    return live


def solve_greedy(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    schedule, result = greedy_saved_set(graph, budget_bytes, deadline)
    if time.perf_counter() < deadline:  # the recompute-once variant in the time left
        other, other_result = greedy_saved_set(graph, budget_bytes, deadline, once=True)
        if other_result.peak_bytes <= budget_bytes and (
                result.peak_bytes > budget_bytes or other_result.total_cost < result.total_cost):
            schedule, result = other, other_result
    return heuristic_result("greedy", budget_bytes, schedule, result, start)
