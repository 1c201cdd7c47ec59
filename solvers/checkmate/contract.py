"""One contract around every back-end that solves the Checkmate model (MILP, CP-SAT).

`solve_checkmate` takes a back-end's ``solve_model`` (a `MilpSolution`: what each stage
computes) and adds what users rely on: the store-all shortcut, the cheapest fitting one of
store-all, recompute-all, the greedy saved-set schedule and the chain DP's as the seed (warm
start) and the fallback, the simulator's verdict on every schedule, and a never-optimistic bound.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from solvers import get_solver
from solvers.base import InfeasibleBudgetError, SolveResult, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_within_cap, store_all_schedule
from solvers.checkmate.data import lower_bound_bytes, prepare
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate


@dataclass(frozen=True)
class MilpSolution:
    """The solved model, before `Schedule.from_computes`: what each stage computes."""

    status: SolveStatus | None
    """OPTIMAL, FEASIBLE (time limit, incumbent), INFEASIBLE, or None (time limit, nothing)."""
    forward: tuple[str, ...]
    """Literal compute order of the forward stages (every member of every group computed)."""
    backward: tuple[str, ...]
    model_cost: float | None
    """The model's objective: the cost of every computation the stages make."""
    bound: float | None
    """Proven lower bound on the model's optimum (== model_cost when OPTIMAL)."""
    engine: str
    """What solved the model: 'highs', 'cbc' (the MILP) or 'cp-sat'."""
    solve_time_s: float
    warm_started: bool = False


@dataclass(frozen=True)
class ClassicSchedule:
    name: str
    schedule: Schedule
    peak: int
    cost: float


def classic_schedules(graph: RematGraph) -> list[ClassicSchedule]:
    """store-all and recompute-all, simulated. recompute-all is left out past its cap
    (`solvers.baselines.recompute_all_refusal`: a long chain, where it would take practically
    forever to build); store-all is then the leanest classic schedule."""
    out = []
    classic = (("store-all", store_all_schedule), ("recompute-all", recompute_all_within_cap))
    for name, build in classic:
        schedule = build(graph)
        if schedule is None:
            continue
        sim = simulate(graph, schedule)
        out.append(ClassicSchedule(name, schedule, sim.peak_bytes, sim.total_cost))
    return out


SEED_HEURISTICS = ("greedy", "chain-dp", "chen-greedy", "blocks")
"""Fast heuristics whose schedule for the budget can seed the exact model (under a few seconds
on the examples): usually far better seeds than store-all or recompute-all."""


def _heuristic_seeds(graph: RematGraph, budget_bytes: int,
                     options: SolverOptions) -> list[ClassicSchedule]:
    """The schedules of `SEED_HEURISTICS` that fit the budget, so a time-limited solve starts
    from, and never returns worse than, the best of them."""
    quiet = dataclasses.replace(options, progress=None, verbose=False)
    seeds = []
    for name in SEED_HEURISTICS:
        try:
            answer = get_solver(name)(graph, budget_bytes, quiet)
        except ValueError:  # not a chain, or nothing fits: no seed from this one
            continue
        if answer.schedule is not None:
            peak = simulate(graph, answer.schedule).peak_bytes
            seeds.append(ClassicSchedule(name, answer.schedule, peak, answer.objective))
    return seeds


def solve_checkmate(graph: RematGraph, budget_bytes: int, options: SolverOptions, *,
                    solver_name: str, solve_model) -> SolveResult:
    """The contract of `solve_milp`, around any back-end that solves the Checkmate model
    (``solve_model(graph, budget, options, warm_start=...) -> MilpSolution``)."""
    start = time.perf_counter()
    data = prepare(graph)
    classics = classic_schedules(graph)
    smallest = min(c.peak for c in classics)
    fitting = sorted((c for c in classics if c.peak <= budget_bytes), key=lambda c: c.cost)

    def result(status, schedule, cost, bound, message) -> SolveResult:
        options.report(start, cost, bound, final=True)
        return SolveResult(solver=solver_name, status=status, schedule=schedule, objective=cost,
                           bound=bound, solve_time_s=time.perf_counter() - start, message=message)

    store_all = classics[0]
    if store_all.peak <= budget_bytes:
        return result(SolveStatus.OPTIMAL, store_all.schedule, store_all.cost, store_all.cost,
                      "store-all fits the budget: no recomputation needed")
    if budget_bytes < lower_bound_bytes(data):
        raise InfeasibleBudgetError(budget_bytes, smallest,
                                    " (below the boundary's or one op's unavoidable bytes)")
    fitting = sorted(fitting + _heuristic_seeds(graph, budget_bytes, options),
                     key=lambda c: c.cost)

    solution = solve_model(graph, budget_bytes, options,
                           warm_start=fitting[0].schedule if fitting else None)
    engine = solution.engine
    if solution.status is SolveStatus.INFEASIBLE:
        if fitting:  # outside the Checkmate space, or within the capacity margin
            best = fitting[0]
            return result(SolveStatus.HEURISTIC, best.schedule, best.cost, None,
                          f"the Checkmate model ({engine}) has no schedule within the budget; "
                          f"{best.name} fits and is returned")
        raise InfeasibleBudgetError(budget_bytes, smallest, f" (proven by {engine})")
    if solution.status is None:
        limit = f"{engine} stopped after {options.time_limit_s} s without a schedule"
        if fitting:
            best = fitting[0]
            return result(SolveStatus.HEURISTIC, best.schedule, best.cost, None,
                          f"{limit}; returning {best.name}")
        raise InfeasibleBudgetError(budget_bytes, smallest,
                                    f" ({limit}; a smaller feasible budget may exist)")

    schedule = Schedule.from_computes(graph, solution.forward, solution.backward)
    sim = simulate(graph, schedule)
    if sim.peak_bytes > budget_bytes:
        raise AssertionError(
            f"{solver_name} schedule peaks at {sim.peak_bytes} bytes > budget {budget_bytes} "
            f"(step {sim.peak_step}, {sim.peak_phase.value}, node {sim.peak_node!r}; "
            f"model cost {solution.model_cost}, {engine}): formulation bug")
    if solution.status is SolveStatus.OPTIMAL:
        if fitting and fitting[0].cost < sim.total_cost - 1e-12 * max(1.0, sim.total_cost):
            # The MILP keeps a few bytes of safety margin below the budget (solver tolerances);
            # a seed that fills the budget to the byte can be cheaper than its optimum. The
            # model's optimum is then no bound for the full budget: none is claimed.
            best = fitting[0]
            return result(SolveStatus.FEASIBLE, best.schedule, best.cost, None,
                          f"{best.name} fills the budget to within the model's safety margin and "
                          f"is cheaper than its optimum ({engine}); no bound is claimed")
        return result(SolveStatus.OPTIMAL, schedule, sim.total_cost, sim.total_cost,
                      f"optimal ({engine}, model cost {solution.model_cost:g})")

    cost, message = sim.total_cost, f"{engine} stopped at the time limit with a schedule"
    if fitting and fitting[0].cost < cost:
        schedule, cost = fitting[0].schedule, fitting[0].cost
        message += f"; {fitting[0].name} is cheaper and returned"
    floor = store_all.cost  # every needed op runs at least once
    bound = floor if solution.bound is None else max(floor, solution.bound)
    return result(SolveStatus.FEASIBLE, schedule, cost, min(bound, cost), message)
