"""``auto``: the best schedule the installed back-ends find for this graph within the time limit.

Order of work, each step seeded by the best schedule so far:
1. store-all, when it fits (no recomputation is the minimum: every op runs at least once);
2. the fast heuristics: the greedy saved-set search and the classic chain/segment schedules;
3. the exact Checkmate MILP, warm-started with that incumbent, when the graph is small enough
   for it to finish (its O(n^2) model is built in Python; past ``MILP_MAX_GROUPS`` op groups the
   build alone outlasts a sensible time limit). Its proven bound, when any, is reported.
The answer is never worse than the best heuristic, and always simulated by the planner.
"""

from __future__ import annotations

import time

from optimizer.graph import RematGraph
from optimizer.simulator import simulate
from solvers.base import InfeasibleBudgetError, SolveResult, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule, store_all_schedule

MILP_MAX_GROUPS = 80
HEURISTICS = ("greedy", "chain-dp", "chen-greedy", "blocks")


def solve_auto(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    from solvers import get_solver

    start = time.perf_counter()
    store_all = store_all_schedule(graph)
    store_sim = simulate(graph, store_all)

    def result(status, schedule, cost, bound, message) -> SolveResult:
        return SolveResult(solver="auto", status=status, schedule=schedule, objective=cost,
                           bound=bound, solve_time_s=time.perf_counter() - start, message=message)

    if store_sim.peak_bytes <= budget_bytes:
        return result(SolveStatus.OPTIMAL, store_all, store_sim.total_cost, store_sim.total_cost,
                      "store-all fits the budget: no recomputation needed")
    lean = recompute_all_schedule(graph)
    lean_sim = simulate(graph, lean)
    best = ("recompute-all", lean, lean_sim.total_cost) if lean_sim.peak_bytes <= budget_bytes else None
    share = SolverOptions(time_limit_s=max(1.0, options.time_limit_s / 4), threads=options.threads,
                          verbose=options.verbose, backend=options.backend)
    for name in HEURISTICS:
        try:
            answer = get_solver(name)(graph, budget_bytes, share)
        except ValueError:  # a chain solver on a graph that is not a chain
            continue
        if answer.schedule is not None and (best is None or answer.objective < best[2]):
            best = (name, answer.schedule, answer.objective)
    if best is None:
        raise InfeasibleBudgetError(budget_bytes, min(store_sim.peak_bytes, lean_sim.peak_bytes),
                                    " (no heuristic fits; recompute-all is the leanest known)")
    left = options.time_limit_s - (time.perf_counter() - start)
    if len(graph.groups) > MILP_MAX_GROUPS or left < 1.0:
        return result(SolveStatus.HEURISTIC, best[1], best[2], None,
                      f"best heuristic: {best[0]} ({len(graph.groups)} op groups: exact MILP skipped)")
    from solvers.milp import solve_milp_model

    milp_options = SolverOptions(time_limit_s=left, threads=options.threads,
                                 verbose=options.verbose, backend=options.backend)
    solution = solve_milp_model(graph, budget_bytes, milp_options, warm_start=best[1])
    if solution.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        from optimizer.schedule import Schedule

        schedule = Schedule.from_computes(graph, solution.forward, solution.backward)
        sim = simulate(graph, schedule)
        if sim.peak_bytes <= budget_bytes and sim.total_cost <= best[2] + 1e-15:
            bound = solution.bound if solution.bound is None else min(solution.bound, sim.total_cost)
            return result(solution.status, schedule, sim.total_cost, bound,
                          f"exact MILP ({solution.backend}), seeded by {best[0]}")
        bound = solution.bound
        return result(SolveStatus.FEASIBLE if bound is not None else SolveStatus.HEURISTIC,
                      best[1], best[2], None if bound is None else min(bound, best[2]),
                      f"{best[0]}; the MILP ({solution.backend}) found nothing cheaper")
    return result(SolveStatus.HEURISTIC, best[1], best[2], None,
                  f"best heuristic: {best[0]}; the MILP ({solution.backend}) stopped without a better schedule")
