"""``auto``: the best schedule the installed back-ends find for this graph within the time limit.

Order of work, each step seeded by the best schedule so far:
1. store-all, when it fits (no recomputation is the minimum: every op runs at least once);
2. the fast heuristics: the greedy saved-set search and the classic chain/segment schedules
   (on a long chain of stages also rotor's DP and revolve, `solvers.hierarchical.CHAIN_SOLVERS`);
3. graphs of at most ``EXACT_MAX_GROUPS`` op groups: the exact Checkmate model, warm-started
   with that incumbent, on the best installed back-end (`exact_engine`: the MILP with HiGHS
   when highspy is installed, else CP-SAT when OR-Tools is, else the MILP with CBC, bundled
   with PuLP); it runs even when no heuristic fits. Its O(n^2) model is built in Python:
   past the threshold the build alone outlasts a sensible time limit, so larger graphs go
   straight to `solvers.hierarchical` (which runs the same heuristics itself, plus block-level
   plans, and proves a lower bound).
The answer is never worse than the best heuristic, and always simulated by the planner.
"""

from __future__ import annotations

import dataclasses
import time

from solvers import get_solver
from solvers.backends import cp_sat_backend
from solvers.base import EXACT_MAX_GROUPS, InfeasibleBudgetError, SolveResult, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule, recompute_all_within_cap, store_all_schedule
from solvers.checkmate.contract import SEED_HEURISTICS as HEURISTICS
from solvers.checkmate.cpsat import solve_cpsat_model
from solvers.checkmate.milp import solve_milp_model
from solvers.checkmate.milp_engines import highs_available
from solvers.hierarchical import CHAIN_SOLVERS, LONG_CHAIN_STAGES, solve_hierarchical
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate
from solvers.linearize import linearize


def exact_engine(options: SolverOptions) -> str:
    """The exact back-end ``auto`` uses: 'highs', 'cpsat' or 'cbc'.

    An explicit MILP back-end in ``options.milp_engine`` ('highs' or 'cbc') is used as asked (the
    MILP raises `SolverUnavailableError` with an install hint if it is missing); 'auto' takes
    the first installed of HiGHS (fastest on these models in benchmarks/solvers.md), CP-SAT
    and CBC (always there: PuLP bundles it).
    """
    if options.milp_engine != "auto":
        return options.milp_engine
    if highs_available():
        return "highs"
    if cp_sat_backend().module is not None:
        return "cpsat"
    return "cbc"


def _solve_exact(graph: RematGraph, budget_bytes: int, options: SolverOptions,
                 warm_start: Schedule):
    """The Checkmate model on `exact_engine`'s choice, seeded with ``warm_start``."""
    engine = exact_engine(options)
    if engine == "cpsat":
        return solve_cpsat_model(graph, budget_bytes, options, warm_start=warm_start)
    return solve_milp_model(graph, budget_bytes, dataclasses.replace(options, milp_engine=engine),
                            warm_start=warm_start)


def solve_auto(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    start = time.perf_counter()
    store_all = store_all_schedule(graph)
    store_sim = simulate(graph, store_all)

    def result(status, schedule, cost, bound, message) -> SolveResult:
        options.report(start, cost, bound, final=True)
        return SolveResult(solver="auto", status=status, schedule=schedule, objective=cost,
                           bound=bound, solve_time_s=time.perf_counter() - start, message=message)

    if store_sim.peak_bytes <= budget_bytes:
        return result(SolveStatus.OPTIMAL, store_all, store_sim.total_cost, store_sim.total_cost,
                      "store-all fits the budget: no recomputation needed")
    if len(graph.groups) > EXACT_MAX_GROUPS:  # hierarchical runs the heuristics itself
        return result(*_solve_large(graph, budget_bytes, options))
    lean = recompute_all_schedule(graph)
    lean_sim = simulate(graph, lean)
    best = None
    if lean_sim.peak_bytes <= budget_bytes:
        best = ("recompute-all", lean, lean_sim.total_cost)
    share = dataclasses.replace(options, time_limit_s=max(1.0, options.time_limit_s / 4),
                                progress=None)
    # A long chain of stages (a time-stepping loop) also gets rotor and revolve.
    chains = CHAIN_SOLVERS if len(linearize(graph).stages) >= LONG_CHAIN_STAGES else ()
    for name in (*HEURISTICS, *chains):
        try:
            answer = get_solver(name)(graph, budget_bytes, share)
        except ValueError:  # a chain solver on a graph that is not a chain; InfeasibleBudgetError
            continue
        if answer.schedule is not None and (best is None or answer.objective < best[2]):
            best = (name, answer.schedule, answer.objective)
    smallest_known = min(store_sim.peak_bytes, lean_sim.peak_bytes)
    left = options.time_limit_s - (time.perf_counter() - start)
    if best is not None and left < 1.0:
        return result(SolveStatus.HEURISTIC, best[1], best[2], None,
                      f"best heuristic: {best[0]} (no time left for the exact model)")

    # The exact model, seeded with the best heuristic; unseeded when none fits (it searches a
    # larger space, so it may still find a schedule).
    solution = _solve_exact(graph, budget_bytes,
                            dataclasses.replace(options, time_limit_s=max(1.0, left)),
                            None if best is None else best[1])
    if best is None:
        if solution.status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
            stopped = "proves none" if solution.status is SolveStatus.INFEASIBLE else "found none"
            raise InfeasibleBudgetError(
                budget_bytes, smallest_known,
                f" (no heuristic fits; the exact model ({solution.engine}) {stopped})")
        best = ("nothing", None, float("inf"))
    if solution.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        schedule = Schedule.from_computes(graph, solution.forward, solution.backward)
        sim = simulate(graph, schedule)
        if sim.peak_bytes > budget_bytes:
            raise AssertionError(f"auto: the exact model's schedule peaks at {sim.peak_bytes} "
                                 f"bytes > budget {budget_bytes}: formulation bug")
        if sim.total_cost <= best[2] + 1e-15:
            bound = None if solution.bound is None else min(solution.bound, sim.total_cost)
            seed = f", seeded by {best[0]}" if best[1] is not None else ""
            return result(solution.status, schedule, sim.total_cost, bound,
                          f"exact Checkmate model ({solution.engine}){seed}")
        bound = solution.bound
        return result(SolveStatus.FEASIBLE if bound is not None else SolveStatus.HEURISTIC,
                      best[1], best[2], None if bound is None else min(bound, best[2]),
                      f"{best[0]}; the exact model ({solution.engine}) found nothing cheaper")
    return result(SolveStatus.HEURISTIC, best[1], best[2], None,
                  f"best heuristic: {best[0]}; the exact model ({solution.engine}) stopped "
                  "without a better schedule")


def _solve_large(graph: RematGraph, budget_bytes: int, options: SolverOptions):
    """Graphs past EXACT_MAX_GROUPS: `solvers.hierarchical` (block plans, the LP-rounded saved
    set and the classic heuristics, so never worse than them) with its proven bound."""
    user_progress = options.progress

    def progress(update) -> None:  # auto reports the final result itself
        if user_progress is not None and not update.final:
            user_progress(update)

    answer = solve_hierarchical(graph, budget_bytes, dataclasses.replace(options, progress=progress))
    if answer.schedule is None:
        smallest = simulate(graph, store_all_schedule(graph)).peak_bytes
        lean = recompute_all_within_cap(graph)
        if lean is not None:
            smallest = min(smallest, simulate(graph, lean).peak_bytes)
        raise InfeasibleBudgetError(budget_bytes, smallest, f" ({answer.message})")
    return (answer.status, answer.schedule, answer.objective, answer.bound,
            f"hierarchical ({len(graph.groups)} op groups > {EXACT_MAX_GROUPS}): {answer.message}")
