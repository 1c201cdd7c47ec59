"""Plan one training step: run a solver, simulate its schedule, summarise it as a `Plan`.

Pure Python over the IR (no torch), so what-if reports can plan without running anything.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import replace

from solvers import get_solver
from solvers.base import InfeasibleBudgetError, SolveResult, SolverOptions, SolveStatus
from solvers.baselines import store_all_schedule
from solvers.checkmate.min_budget import MinBudget, smallest_feasible_budget
from solvers.ir.allocator import AllocatorModel
from solvers.ir.graph import RematGraph
from solvers.ir.link import Link, get_link, offload_link_of
from solvers.ir.plan import BudgetBreakdown, ModuleSummary, Plan
from solvers.ir.schedule import Schedule, StepKind
from solvers.ir.simulator import SimulationResult, simulate
from solvers.offload import OffloadChoice
from solvers.offload_exact import best_offloads
from solvers.offload_shift import shifted_offloads
from solvers.planning.training_loop import TrainingLoop, end_bytes, iteration_error, loop_budget, with_loop
from solvers.remat_bound import base_cost_bound


def store_all_peak_bytes(graph: RematGraph, allocator: AllocatorModel) -> int:
    """Plain autograd's (store-all's) planned peak under ``allocator``: what percentage budgets
    are percentages of. ``graph`` is the graph as captured (the allocator's rounding is applied
    here)."""
    return allocator.planned_peak(simulate(allocator.apply(graph), store_all_schedule(graph)).peak_bytes)


def plan_graph(
    graph: RematGraph,
    budget: int | str,
    solver: str = "milp",
    options: SolverOptions = SolverOptions(),
    graph_nodes: int = 0,
    allocator: AllocatorModel | None = None,
    loop: TrainingLoop | None = None,
    *,
    offload: bool | str = False,
    link: Link | str | None = None,
    host_budget: int | None = None,
) -> Plan:
    """Solve for ``budget`` (bytes, a size string, or a percentage of store-all's peak) and
    return the simulated plan.

    With a ``loop`` that counts an optimizer or gradient accumulation, ``budget`` is the whole
    iteration's peak (`solvers.planning.training_loop`): the graph is planned for the budget less
    what the loop holds beside it, the optimizer step's own peak must fit too, and the plan's
    peaks, percentages and breakdown are the iteration's.

    With an ``allocator`` (a CUDA caching allocator's block rounding, workspace reserve and
    fragmentation margin), every value is rounded to whole blocks and the planned peak includes
    the reserve and margin; the solvers get the budget that leaves room for them.

    With ``offload="auto"`` (issue 39), saved values may also go to host memory and back over
    ``link`` (a `solvers.ir.link.Link` or preset name; default ``pcie5``), ``host_budget`` bytes of
    pinned host memory at most (None: unlimited): `solvers.offload_exact.best_offloads` chooses keep,
    recompute or offload per value (a local search from the solver's recompute-only plan, proven
    optimal by the exact model on graphs with few values to choose for), and the plan
    with the lower predicted step time (compute plus unhidden copy time) is returned. A budget no
    recompute-only schedule meets may still plan with offloads. The plan's bound is then the plain
    step's time (every op once, no stall), the floor of both kinds of plans.

    Raises InfeasibleBudgetError when nothing fits, naming the smallest feasible budget (exact
    when `solvers.checkmate.min_budget` proves it; its search is capped at 10 s).
    """
    offload_link = offload_link_of(offload, link)
    allocator = allocator or AllocatorModel(block_bytes=1)
    loop = loop or TrainingLoop()
    graph = allocator.apply(graph)
    store_all = simulate(graph, store_all_schedule(graph))
    budget_bytes, graph_budget = loop_budget(loop, graph, budget, allocator.planned_peak(store_all.peak_bytes),
                                             allocator.planned_peak(end_bytes(store_all)))
    solver_budget = allocator.solver_budget(graph_budget)
    start = time.perf_counter()
    try:
        result = _solve(graph, graph_budget, solver_budget, solver, options, allocator)
    except InfeasibleBudgetError as err:
        if offload_link is None:
            raise iteration_error(err, loop.held_bytes(graph)) from None
        result, infeasible = None, err
    if offload_link is not None:
        choice = offload_choice(graph, solver_budget, offload_link, host_budget, solver, options,
                                 None if result is None else result.schedule)
        if _offload_wins(graph, choice, result):
            assert choice is not None
            plan = _offload_plan(graph, graph_budget, solver, store_all, choice, allocator, graph_nodes,
                                 solve_time_s=time.perf_counter() - start, solved=result)
            return with_loop(plan, loop, graph, allocator.planned_peak(end_bytes(choice.result)),
                             allocator.planned_peak(end_bytes(store_all)))
        if result is None:
            raise iteration_error(infeasible, loop.held_bytes(graph)) from None
    assert result is not None
    sim = simulate(graph, result.schedule)
    if sim.peak_bytes > solver_budget:
        raise AssertionError(
            f"solver {result.solver} returned a schedule peaking at {sim.peak_bytes} bytes "
            f"for a budget of {budget_bytes}: this is a bug in the solver"
        )
    bound, gap = result.bound, result.gap
    if offload_link is not None:  # offloads were allowed: the proven floor is the plain step's
        bound, gap = _step_floor(graph, sim.total_cost)
    plan = _plan(graph, graph_budget, solver, result.status.value, store_all, sim, result.schedule,
                 allocator, graph_nodes, bound=bound, gap=gap,
                 solve_time_s=result.solve_time_s, message=result.message)
    return with_loop(plan, loop, graph, allocator.planned_peak(end_bytes(sim)),
                     allocator.planned_peak(end_bytes(store_all)))


SHIFT_SHARE = 0.5
"""Share of the time limit the budget shift (`solvers.offload_shift`) may take before the local
search (`solvers.offload_exact.best_offloads`) gets the rest."""


def offload_choice(graph: RematGraph, solver_budget: int, link: Link, host_budget: int | None, solver: str,
                    options: SolverOptions, seed: Schedule | None) -> OffloadChoice | None:
    """The faster of two keep / recompute / offload searches: the solver's own schedule for a
    larger budget with its earliest saved values offloaded (`shifted_offloads`), and the local
    search in the saved-set family from the recompute-only schedule (`best_offloads`)."""
    start = time.perf_counter()

    def solve(budget_bytes: int, seconds: float) -> Schedule | None:
        try:
            return get_solver(solver)(graph, budget_bytes, replace(options, time_limit_s=seconds)).schedule
        except InfeasibleBudgetError:
            return None

    shifted = shifted_offloads(graph, solver_budget, link, solve, host_budget_bytes=host_budget,
                               deadline=start + SHIFT_SHARE * options.time_limit_s)
    searched = best_offloads(graph, solver_budget, link, host_budget_bytes=host_budget, seed=seed,
                             deadline=start + options.time_limit_s)
    found = [c for c in (searched, shifted) if c is not None]
    return min(found, key=lambda c: c.step_time_s, default=None)


def _offload_wins(graph: RematGraph, choice: OffloadChoice | None, result: SolveResult | None) -> bool:
    """Whether the offload search's choice replaces the recompute-only solver's schedule: it
    offloads something and the step is faster (or the solver found nothing that fits)."""
    if choice is None or not choice.offloaded:
        return choice is not None and result is None
    if result is None:
        return True
    return choice.step_time_s < simulate(graph, result.schedule).total_cost * (1 - 1e-9)


def _step_floor(graph: RematGraph, objective: float) -> tuple[float, float]:
    """(bound, gap) with the plain step's time as the bound: every op runs once and nothing waits."""
    bound = min(graph.base_cost, objective)
    return bound, (objective - bound) / objective if objective > 0 else 0.0


def _offload_plan(graph: RematGraph, budget_bytes: int, solver: str, store_all: SimulationResult,
                  choice: OffloadChoice, allocator: AllocatorModel, graph_nodes: int, *, solve_time_s: float,
                  solved: SolveResult | None) -> Plan:
    """The plan of the offload search's choice, beside what the recompute-only solver found."""
    sim = choice.result
    objective = sim.step_time_s
    bound, gap = _step_floor(graph, objective)
    if solved is None:
        beside = f"no recompute-only schedule of {solver} fits"
    else:
        beside = f"{solver}'s recompute-only plan takes {simulate(graph, solved.schedule).total_cost:.4g} s"
    message = (f"keep / recompute / offload chosen by {choice.chosen_by} over {choice.evaluations} simulated "
               f"choices: the step takes "
               f"{objective:.4g} s with {len(sim.offloaded)} values offloaded ({beside})")
    plan = _plan(graph, budget_bytes, f"{solver}+offload", "optimal" if gap <= 1e-9 else "feasible", store_all,
                 sim, choice.schedule, allocator, graph_nodes, bound=bound, gap=gap, solve_time_s=solve_time_s,
                 message=message, link=choice.link)
    return replace(plan, fits_without_offload=solved is not None)


def plan_for_schedule(graph: RematGraph, schedule: Schedule, budget_bytes: int, like: Plan,
                      allocator: AllocatorModel | None = None, message: str = "",
                      link: Link | str | None = None) -> Plan:
    """The plan ``like``'s schedule makes on ``graph``: the same step at other input sizes
    (see `frontends.graph_runtime.shape_variants`). Simulated here, not solved: no bound or gap of its own.
    ``link`` prices the copies of an offloaded plan (the one it was planned on)."""
    return plan_from_schedule(graph, schedule, budget_bytes, solver=like.solver, status=like.status,
                              allocator=allocator, graph_nodes=like.graph_nodes, message=message, link=link)


def plan_from_schedule(graph: RematGraph, schedule: Schedule, budget_bytes: int, *, solver: str,
                       status: str, allocator: AllocatorModel | None = None, graph_nodes: int = 0,
                       message: str = "", link: Link | str | None = None) -> Plan:
    """The plan a schedule made elsewhere (another strategy, another size) makes on ``graph``,
    ``solver`` naming where it came from. Simulated here, not solved: no bound or gap.

    A compute-only schedule gets its frees re-derived (`Schedule.from_computes`: a schedule from
    elsewhere may free in another order than the rewritten module does). A schedule with offload
    and reload steps runs as it is, priced on ``link``: its frees wait for the copies, so where
    they stand is what the offload placement chose, and memory is exact by position, so the same
    steps on smaller values peak no higher."""
    allocator = allocator or AllocatorModel(block_bytes=1)
    graph = allocator.apply(graph)
    store_all = simulate(graph, store_all_schedule(graph))
    copies = any(step.kind in (StepKind.OFFLOAD, StepKind.RELOAD) for step in schedule.steps)
    if copies and link is None:
        raise ValueError(f"the schedule from {solver} offloads values: pass the link its copies were "
                         "planned on (link=, a solvers.ir.link.Link or preset name)")
    priced_on = get_link(link) if copies and link is not None else None
    if priced_on is None:
        schedule = Schedule.from_computes(graph, schedule.computes("forward"), schedule.computes("backward"))
    sim = simulate(graph, schedule, link=priced_on)
    return _plan(graph, budget_bytes, solver, status, store_all, sim, schedule, allocator,
                 graph_nodes, bound=None, gap=None, solve_time_s=0.0, message=message, link=priced_on)


def _plan(graph: RematGraph, budget_bytes: int, solver: str, status: str, store_all: SimulationResult,
          sim: SimulationResult, schedule: Schedule, allocator: AllocatorModel, graph_nodes: int, *,
          bound: float | None, gap: float | None, solve_time_s: float, message: str,
          link: Link | None = None) -> Plan:
    return Plan(
        status=status,
        solver=solver,
        cost_model=graph.cost_model,
        budget_bytes=budget_bytes,
        predicted_peak_bytes=allocator.planned_peak(sim.peak_bytes),
        store_all_peak_bytes=allocator.planned_peak(store_all.peak_bytes),
        extra_flops=sim.extra_flops,
        extra_time_s=sim.extra_cost + sim.stall_time_s,
        step_flops=graph.base_flops,
        step_time_s=graph.base_cost,
        objective=sim.total_cost + sim.stall_time_s,
        bound=bound,
        gap=gap,
        solve_time_s=solve_time_s,
        breakdown=breakdown(graph, budget_bytes),
        graph_nodes=graph_nodes or len(graph.nodes),
        graph_values=len(graph.ops),
        saved=sim.saved if not sim.saved_on_host else tuple(sorted({*sim.saved, *sim.saved_on_host},
                                                                   key=graph.position)),
        recomputed=sim.recomputed,
        modules=module_summaries(graph, sim, store_all),
        message=message,
        allocator=allocator.describe(),
        schedule=schedule,
        offloaded=tuple((name, graph[name].bytes) for name in sim.offloaded),
        transfer_time_s=sim.transfer_time_s,
        stall_time_s=sim.stall_time_s,
        host_peak_bytes=sim.host_peak_bytes,
        link=link.describe() if link is not None and sim.offloaded else "",
    )


SEARCHING_SOLVERS = ("auto", "hierarchical")
"""Solvers that promise the best schedule remat-opt can find: when they find none, the schedule
the smallest-budget search found is theirs too, so every budget an error names plans."""


def _solve(graph: RematGraph, budget_bytes: int, solver_budget: int, solver: str,
           options: SolverOptions, allocator: AllocatorModel) -> SolveResult:
    """``solver``'s schedule for ``solver_budget``; raises `InfeasibleBudgetError` naming the
    smallest feasible budget when there is none.

    For `SEARCHING_SOLVERS` the smallest-budget search is the last resort: its schedule is
    returned when it fits, so a budget at or above the one an earlier error named always plans
    (the heuristics and a time-limited exact model may miss the schedule that search proves)."""
    start = time.perf_counter()
    try:
        result = get_solver(solver)(graph, solver_budget, options)
    except InfeasibleBudgetError:
        result = None
    if result is not None and result.schedule is not None:
        return result
    message = "" if result is None else result.message
    found = smallest_feasible_budget(graph, options)
    if solver in SEARCHING_SOLVERS:
        sim = simulate(graph, found.schedule)
        if sim.peak_bytes <= solver_budget:
            why = f"{message}; " if message else ""
            # The solver's own bound when it proved one, else the step's cost (every op runs
            # once): either is a proven floor, so the plan's gap is always a proven figure.
            proven = result.bound if result is not None and result.bound is not None else \
                base_cost_bound(graph, "the smallest-budget search's schedule").bound
            return SolveResult(solver=solver, status=SolveStatus.FEASIBLE, schedule=found.schedule,
                               objective=sim.total_cost + sim.stall_time_s, bound=min(proven, sim.total_cost),
                               solve_time_s=time.perf_counter() - start,
                               message=f"{why}the smallest-budget search's schedule ({found.method})")
    raise _infeasible(found, budget_bytes, solver, allocator, message)


def _infeasible(found: MinBudget, budget_bytes: int, solver: str, allocator: AllocatorModel,
                message: str) -> InfeasibleBudgetError:
    """The error for a budget ``solver`` could not meet, naming the smallest feasible budget
    ``found`` (exact when `solvers.checkmate.min_budget` proves it, within its time limit)."""
    smallest = allocator.planned_peak(found.smallest_bytes)
    lower = allocator.planned_peak(found.lower_bytes)
    detail = f" ({message})" if message else ""
    if smallest <= budget_bytes:  # a schedule fits, but this solver did not find it
        detail += (f"; solver {solver!r} found no schedule, but one exists: try solver='milp' "
                   "or 'cpsat', or a longer time limit")
    return InfeasibleBudgetError(budget_bytes, smallest, detail, exact=found.exact,
                                 lower_bound_bytes=lower)


def breakdown(graph: RematGraph, budget_bytes: int) -> BudgetBreakdown:
    fixed = graph.parameter_bytes + graph.gradient_bytes + graph.input_bytes
    return BudgetBreakdown(
        budget_bytes=budget_bytes,
        parameters_bytes=graph.parameter_bytes,
        gradients_bytes=graph.gradient_bytes,
        inputs_bytes=graph.input_bytes,
        activations_bytes=budget_bytes - fixed,
    )


def block_of(module: str) -> str:
    """The module path cut after its first numbered child: 'blocks.0.attn.q' -> 'blocks.0',
    'layer2.1.conv1' -> 'layer2.1', 'ln_f' -> 'ln_f'; ops outside any submodule -> '<top>'."""
    if not module:
        return "<top>"
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]


def module_summaries(
    graph: RematGraph, plan: SimulationResult, store_all: SimulationResult
) -> tuple[ModuleSummary, ...]:
    """Saved and offloaded bytes and recomputation per block (see `block_of`)."""
    saved: dict[str, int] = defaultdict(int)
    offloaded: dict[str, int] = defaultdict(int)
    saved_before: dict[str, int] = defaultdict(int)
    ops: dict[str, int] = defaultdict(int)
    flops: dict[str, float] = defaultdict(float)
    for name in plan.saved:
        saved[block_of(graph[name].module)] += graph[name].bytes
    for name in store_all.saved:
        saved_before[block_of(graph[name].module)] += graph[name].bytes
    for name in plan.offloaded:
        offloaded[block_of(graph[name].module)] += graph[name].bytes
    for name, times in plan.recomputed:
        node = graph[name]
        ops[block_of(node.module)] += times - 1
        flops[block_of(node.module)] += (times - 1) * node.flops
    modules = sorted(set(saved) | set(saved_before) | set(ops) | set(offloaded))
    return tuple(
        ModuleSummary(m, saved[m], saved_before[m], ops[m], flops[m], offloaded[m]) for m in modules
    )
