"""The retention-interval model (`solvers.checkmate.interval_model`) solved with CP-SAT.

Why: it is the exact model that scales past `solvers.base.EXACT_MAX_GROUPS` (O(n) variables, one
cumulative constraint), so large graphs get a schedule searched beyond the heuristics' families
and a bound. Warm-started with a heuristic schedule (a full hint, and that schedule's copy
counts, so the model always contains it); the solution is simulated, and a simulated peak over
the budget is a formulation bug. The bound is CP-SAT's, over the model's family (the Checkmate
stage order, at most ``copies`` runs of a forward group and ``backward_copies`` of a backward one,
or the seed's counts).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from solvers import get_solver
from solvers.backends import cp_sat_backend
from solvers.base import InfeasibleBudgetError, SolveResult, SolverOptions, SolverUnavailableError, SolveStatus
from solvers.checkmate.contract import SEED_HEURISTICS, classic_schedules
from solvers.checkmate.data import prepare
from solvers.checkmate.interval_lns import improve
from solvers.checkmate.interval_model import build_interval_model, recomputable
from solvers.checkmate.interval_placement import hint, placed_schedule, placements, solution_stages
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate
from solvers.remat_bound import lower_bound

cp_model = cp_sat_backend().module
COPIES = 2
"""Runs of a group the model allows (Moccasin's C): the original and one recomputation; more
where the seed has more."""
MAX_COPIES = 4
"""A seed with more runs than this per group on average is not used (the model would grow with
it: near the floor a seed recomputes each group dozens of times)."""


@dataclass(frozen=True)
class IntervalSolution:
    """The model's answer, simulated."""

    status: SolveStatus | None
    """OPTIMAL (over the model's family), FEASIBLE (time limit), INFEASIBLE, None (nothing found)."""
    schedule: Schedule | None
    objective: float | None
    """Simulated total cost of ``schedule``."""
    bound: float | None
    """Proven lower bound on the model's optimum (total cost)."""
    seeded: bool
    build_s: float
    solve_s: float
    groups: int
    neighbourhoods: int = 0
    """Neighbourhoods the large-neighbourhood search solved."""
    model_cost: float | None = None
    """Cost of every computation the model placed (``objective`` drops the unread ones)."""
    message: str = ""


FULL_SHARE = 0.15
"""Share of the time for CP-SAT on the whole model (small graphs are solved to optimality
in it; its bound is the one reported), before the large-neighbourhood search gets the rest."""


def solve_interval_model(graph: RematGraph, budget_bytes: int, options: SolverOptions,
                         warm_start: Schedule | None = None, copies: int = COPIES,
                         backward_copies: int = COPIES, require_seed: bool = False) -> IntervalSolution:
    """Build, hint and solve the model (CP-SAT, then the neighbourhood search from its
    incumbent); simulate its schedule, which never exceeds the budget. ``require_seed``: give
    up at once when ``warm_start`` cannot be hinted (unseeded, a large model finds nothing)."""
    if cp_model is None:
        raise SolverUnavailableError("the interval model needs OR-Tools: pip install ortools")
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    data = prepare(graph)
    stages = placements(data, warm_start) if warm_start is not None else None
    if stages is not None and sum(map(len, stages.values())) > MAX_COPIES * len(stages):
        stages = None  # a seed that recomputes this much would make the model too large
    if stages is None and require_seed:
        return IntervalSolution(None, None, None, None, False, time.perf_counter() - start, 0.0,
                                0, 0, "the seed does not fit the model's stage order or copies")
    copies_of = {g: max(copies if g < data.n_forward else backward_copies,
                        len(stages[g]) if stages else 1) if recomputable(data, g) else 1
                 for g in range(data.n_groups) if data.needed[g]}
    m = build_interval_model(cp_model, data, budget_bytes, copies_of)
    if stages is not None:
        hint(m, stages)
    built = time.perf_counter()

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, FULL_SHARE * (deadline - built))
    solver.parameters.num_workers = max(1, options.threads)
    solver.parameters.random_seed = options.seed
    solver.parameters.log_search_progress = options.verbose
    status = solver.solve(m.model)
    base = sum(data.cost[g] for g in m.copies)

    def answer(st, schedule=None, objective=None, bound=None, rounds=0, placed=None) -> IntervalSolution:
        literal = None if placed is None else sum(data.cost[g] * len(ts) for g, ts in placed.items())
        return IntervalSolution(st, schedule, objective, bound, stages is not None, built - start,
                                time.perf_counter() - built, len(m.copies), rounds, literal)

    if status == cp_model.INFEASIBLE:
        return answer(SolveStatus.INFEASIBLE)
    if status == cp_model.MODEL_INVALID:
        raise AssertionError(f"invalid interval model: {m.model.validate()}")
    bound = base + solver.best_objective_bound / m.units.cost_scale
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return answer(None, bound=bound)
    found = solution_stages(m, solver)
    rounds = 0
    if status == cp_model.FEASIBLE:
        search = improve(cp_model, data, m, found, deadline, options)
        found, rounds = search.stages, search.neighbourhoods
        if search.cost_units <= solver.best_objective_bound:
            status = cp_model.OPTIMAL
    schedule = placed_schedule(graph, data, m, found)
    sim = simulate(graph, schedule)
    if sim.peak_bytes > budget_bytes:
        raise AssertionError(f"interval model: schedule peaks at {sim.peak_bytes} bytes > budget "
                             f"{budget_bytes} (step {sim.peak_step}, node {sim.peak_node!r}): "
                             "formulation bug")
    optimal = status == cp_model.OPTIMAL
    return answer(SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE, schedule,
                  sim.total_cost, min(bound, sim.total_cost), rounds, found)


def solve_intervals(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """The model as a solver: seeded with the cheapest fitting schedule of store-all,
    recompute-all and `SEED_HEURISTICS`, never worse than it; the bound is the larger of the LP
    bound (`solvers.remat_bound`, a quarter of the time) and the model's, capped at the answer."""
    start = time.perf_counter()
    quiet = dataclasses.replace(options, progress=None, verbose=False)
    seeds = [(c.cost, c.name, c.schedule) for c in classic_schedules(graph) if c.peak <= budget_bytes]
    for name in SEED_HEURISTICS:
        try:
            found = get_solver(name)(graph, budget_bytes, quiet)
        except ValueError:  # not a chain, or nothing fits
            continue
        if found.schedule is not None:
            seeds.append((found.objective, name, found.schedule))
    lp = lower_bound(graph, budget_bytes, time_limit_s=max(1.0, options.time_limit_s / 4))
    seed = min(seeds, key=lambda s: s[0], default=None)
    if seed is None or lp.proven_infeasible:
        raise InfeasibleBudgetError(budget_bytes, None, " (no seed schedule fits)")
    left = options.time_limit_s - (time.perf_counter() - start)
    solution = solve_interval_model(graph, budget_bytes, dataclasses.replace(options, time_limit_s=left),
                                    warm_start=seed[2])
    cost, schedule, source = seed[0], seed[2], seed[1]
    if solution.schedule is not None and solution.objective < cost:
        cost, schedule, source = solution.objective, solution.schedule, "the interval model"
    bound = min(cost, max(lp.bound, solution.bound if solution.bound is not None else 0.0))
    status = SolveStatus.OPTIMAL if cost <= bound * (1 + 1e-9) else SolveStatus.FEASIBLE
    options.report(start, cost, bound, final=True)
    return SolveResult("intervals", status, schedule, cost, bound, time.perf_counter() - start,
                       f"{source}; seed {seed[1]}; {solution.neighbourhoods} neighbourhoods")
