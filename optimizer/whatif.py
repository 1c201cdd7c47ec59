"""Offline what-if: capture once on the meta device, then sweep budgets, find the largest batch,
draw the timeline, and gather it all into one `WhatIfReport`.

Before a run users ask "what fits, at what cost?" and "which GPU should I rent?". Answering
needs no hardware: the step is captured with meta tensors (`frontends.capture.meta_capture.MetaCapturer`,
optionally cast to another dtype), costed with a roofline for the chosen device, and every
strategy's schedule is simulated. This module only orchestrates; the work is in
`solvers.planning.sweep`, `solvers.planning.batch_search`, `solvers.ir.timeline`, `optimizer.plots` and
`frontends.compile.torch_partitioner`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Callable

from frontends.capture.meta_capture import MetaCapturer
from frontends.compile.torch_partitioner import partition_schedules
from frontends.measure.optimizer_memory import training_loop
from optimizer.report import GraphFacts, WhatIfReport, WhatIfSettings
from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.baselines import store_all_schedule
from solvers.checkmate.min_budget import peak_lower_bound
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import Budget, format_bytes
from solvers.ir.link import Link, get_link
from solvers.ir.plan import Plan
from solvers.ir.simulator import simulate
from solvers.ir.timeline import memory_timeline
from solvers.planning.batch_scaling import ScalingMismatch
from solvers.planning.batch_search import (
    DEFAULT_LIMIT,
    BatchFit,
    MaxBatchResult,
    StrategyUnavailable,
    WhatIfError,
    cheap_fit,
    classic_floor,
    find_max_batches,
    lower_bound_ceiling,
)
from solvers.planning.planner import SEARCHING_SOLVERS, plan_from_schedule, store_all_peak_bytes
from solvers.planning.sweep import (
    ALL_STRATEGIES,
    KNOWN_STRATEGIES,
    OFFLOAD_STRATEGY,
    REMAT_OPT,
    TORCH_STRATEGY,
    ExternalSchedule,
    Status,
    SweepResult,
    offload_point,
    run_sweep,
)
from solvers.planning.training_loop import TrainingLoop, end_bytes, loop_budget

Progress = Callable[[str], None]

REMAT_STRATEGIES = (REMAT_OPT, OFFLOAD_STRATEGY)
"""remat-opt's own strategies: searched with its --solver, recompute-only and with offloads."""

SLOWEST_SEARCHES = {TORCH_STRATEGY: 3, OFFLOAD_STRATEGY: 3, "greedy": 2, REMAT_OPT: 2, "chain-dp": 1}
"""Which largest-batch searches to hand out first to parallel workers (torch runs its partitioner
at every batch it confirms; greedy and the exact solver solve at each probe)."""


@dataclass(frozen=True, kw_only=True)
class WhatIfRequest:
    """What to compute. Budgets are bytes, sizes or percentages of store-all's peak."""

    model_name: str
    budget: Budget | str | int | None = None
    """The budget of the plan, the timeline and the largest-batch search."""
    sweep: tuple[str | int, ...] = ()
    max_batch: bool = False
    strategies: tuple[str, ...] = ALL_STRATEGIES
    solver: str = "auto"
    """The solver behind the ``remat-opt`` strategy."""
    options: SolverOptions = SolverOptions()
    cost_model: str = "auto"
    allocator: AllocatorModel | None = None
    device: str | None = None
    dtype: str | None = None
    batch_dim: int | None = None
    batch_limit: int = DEFAULT_LIMIT
    torch_fractions: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    plots: bool = True
    bounds: bool = True
    """Answer largest-batch probes from cheap bounds where they settle them (`cheap_fit`), and
    predict each batch's graph from a fit checked by captures (`MetaCapturer.fit_scaling`)."""
    jobs: int = 1
    """Workers for the independent searches and solves (`solvers.planning.parallel`)."""
    optimizer: str | None = None
    """An optimizer description (`OPTIMIZERS`): the budget is then the whole iteration's
    (`solvers.planning.training_loop`), its memory measured on fake parameters of the device."""
    grad_accumulation: int = 1
    link: Link | str | None = None
    """Offload (issue 39): a device-host link (`solvers.ir.link`) adds the ``remat-opt+offload``
    strategy right after ``remat-opt``: every budget planned with and without offload, the
    plan at ``budget`` both ways, and (``max_batch``) the largest batch both ways. None: recompute
    only."""
    host_budget: int | None = None
    """Pinned host bytes offloaded values may hold at once (None: unlimited)."""


def swept_strategies(request: WhatIfRequest) -> tuple[str, ...]:
    """The request's strategies, with ``remat-opt+offload`` after ``remat-opt`` when it gives a link."""
    strategies = request.strategies
    if request.link is None:
        if OFFLOAD_STRATEGY in strategies:
            raise WhatIfError(f"{OFFLOAD_STRATEGY} needs a device-host link: give --offload [LINK] "
                              "(WhatIfRequest(link=...))")
        return strategies
    if OFFLOAD_STRATEGY in strategies or REMAT_OPT not in strategies:
        return strategies
    at = strategies.index(REMAT_OPT) + 1
    return (*strategies[:at], OFFLOAD_STRATEGY, *strategies[at:])


def what_if(model, inputs: tuple, request: WhatIfRequest, progress: Progress | None = None) -> WhatIfReport:
    """Compute every part of the report ``request`` asks for (captures never allocate)."""
    tick = progress or (lambda _: None)
    strategies = swept_strategies(request)
    allocator = request.allocator or AllocatorModel(block_bytes=1)
    capturer = MetaCapturer(model, inputs, batch_dim=request.batch_dim, dtype=request.dtype,
                            cost_model=request.cost_model)
    captured = capturer.at()
    tick("captured the training step")
    graph = captured.graph
    store_all_peak = store_all_peak_bytes(graph, allocator)
    loop = training_loop(list(model.parameters()), request.optimizer, request.grad_accumulation,
                         device="cuda" if request.device else "cpu")
    held = loop.held_bytes(graph)
    optimizer_step_peak = _optimizer_step_peak(loop, graph, allocator)
    budget_bytes = step_budget = None
    step_refused = ""
    if request.budget is not None:
        end = _end(graph, allocator)
        try:
            budget_bytes, step_budget = loop_budget(loop, allocator.apply(graph), request.budget,
                                                    store_all_peak, end)
        except InfeasibleBudgetError as err:
            if not request.max_batch or err.lower_bound_bytes is None:
                raise
            # "Which batch fits?" has an answer: none, because of the optimizer step, which
            # no schedule and no batch changes. The report says so beside the breakdown.
            budget_bytes = err.budget_bytes
            step_refused = _step_refusal(model, request, graph, allocator, end, optimizer_step_peak,
                                         budget_bytes)
    settings = WhatIfSettings(
        model=request.model_name, cost_model=graph.cost_model, solver=request.solver,
        time_limit_s=request.options.time_limit_s, device=request.device, dtype=request.dtype,
        allocator=allocator.describe(), budget_bytes=budget_bytes,
        optimizer=_loop_name(loop), loop_bytes=held, optimizer_step_peak_bytes=optimizer_step_peak,
    )
    facts = GraphFacts(
        nodes=len(captured.gm.graph.nodes), values=len(graph.ops), store_all_peak_bytes=store_all_peak,
        step_time_s=graph.base_cost, step_flops=graph.base_flops, parameters_bytes=graph.parameter_bytes,
        gradients_bytes=graph.gradient_bytes, inputs_bytes=graph.input_bytes,
    )

    def sweep_at(step, budgets) -> SweepResult:
        def externals():  # torch's partitioner runs in this process while the workers solve
            return _torch_points(step, request.torch_fractions)

        return run_sweep(step.graph, budgets, strategies=strategies, solver=request.solver,
                         options=request.options, allocator=allocator, externals=externals, progress=tick,
                         jobs=request.jobs, link=request.link, host_budget=request.host_budget)

    sweep = sweep_at(captured, request.sweep) if request.sweep else None
    timeline_sweep = sweep
    plans: tuple[Plan, ...] = ()
    if step_budget is not None:  # the plan at --budget, unless it recomputes nothing
        at_budget = _swept_at(sweep, step_budget, _remat_strategies(strategies)) or run_sweep(
            graph, [step_budget], strategies=_remat_strategies(strategies), solver=request.solver,
            options=request.options, allocator=allocator, progress=tick, link=request.link,
            host_budget=request.host_budget)
        if sweep is None or any(p.extra_time_s for p in at_budget.curve(REMAT_OPT)):
            timeline_sweep = at_budget
        plans = _plans_at(graph, at_budget, allocator, request, len(captured.gm.graph.nodes))
    timelines = _timelines(allocator.apply(graph), timeline_sweep, request.solver, store_all_peak)

    max_batch = None
    if request.max_batch and step_refused:
        max_batch = MaxBatchResult(
            budget_bytes, capturer.batch_dim, capturer.base_batch, request.batch_limit,
            (BatchFit(EVERY_STRATEGY if len(strategies) > 1 else strategies[0],
                      0, False, None, None, (), step_refused),),
            capturer.captures)
    elif request.max_batch:
        if budget_bytes is None:
            raise WhatIfError("the largest-batch search needs a budget: give --budget (or --device)")

        def step_fits(step) -> bool:
            """The optimizer step at this batch fits (it grows only with the outputs held)."""
            return not loop.optimizer or _optimizer_step_peak(loop, step.graph, allocator) <= budget_bytes

        def decide(step, strategy: str, budget: int):
            if not step_fits(step):
                return False
            if strategy == TORCH_STRATEGY:
                return None
            searching = strategy in REMAT_STRATEGIES and request.solver in SEARCHING_SOLVERS
            return cheap_fit(step.graph, budget, allocator, searching, request.options)

        def evaluate(step, strategy: str, budget: int):
            if not step_fits(step):
                return None
            externals = torch_partitions(step.batch) if strategy == TORCH_STRATEGY else ()
            result = run_sweep(step.graph, [budget], strategies=(strategy,), solver=request.solver,
                               options=request.options, allocator=allocator, externals=externals,
                               link=request.link, host_budget=request.host_budget)
            unusable = [p for p in result.points if p.status in (Status.NOT_APPLICABLE, Status.FAILED)]
            if unusable and len(unusable) == len(result.points):
                raise StrategyUnavailable(unusable[0].message)
            return result.best_at(strategy, budget)

        partitions: dict[int, tuple[ExternalSchedule, ...]] = {}
        latest: list[int] = []

        def torch_partitions(batch: int) -> tuple[ExternalSchedule, ...]:
            if batch not in partitions:
                partitions[batch] = _torch_points(capturer.at(batch), request.torch_fractions)
            latest[:] = [batch]
            return partitions[batch]

        def torch_stand_in(step, strategy: str, budget: int):
            """torch's partitions of the last batch it ran at (the example's at first), judged on
            this batch's graph: the search re-centres and confirms it with torch itself."""
            source = latest[0] if latest else capturer.base_batch
            if _value_names(capturer.graph_at(source)) != _value_names(step.graph):
                source = step.batch  # batch 1 can lack a copy larger batches make: torch's own
            externals = torch_partitions(source)
            result = run_sweep(step.graph, [budget], strategies=(strategy,), options=request.options,
                               allocator=allocator, externals=externals)
            return result.best_at(strategy, budget)

        ceiling = (_scaled_ceiling(capturer, step_budget, allocator, request.batch_limit, tick)
                   if request.bounds else None)
        near = {}
        if ceiling is not None and request.solver in SEARCHING_SOLVERS:
            floor = classic_floor(capturer.graph_at, step_budget, allocator, request.batch_limit,
                                  start=ceiling - 1, high=ceiling) or 1
            near = {strategy: floor for strategy in REMAT_STRATEGIES}

        def search(wanted: tuple[str, ...], evaluate_with, decide_with, near_batches) -> MaxBatchResult:
            return find_max_batches(
                capturer, step_budget, wanted, evaluate_with, limit=request.batch_limit, progress=tick,
                decide=decide_with if request.bounds else None, ceiling=ceiling,
                approximate=(lambda s: torch_stand_in if s == TORCH_STRATEGY else None)
                if capturer.scaling is not None else None,
                near=near_batches, jobs=request.jobs, slowest_first=SLOWEST_SEARCHES, in_parent=(TORCH_STRATEGY,),
            )

        max_batch = search(tuple(s for s in strategies if s != OFFLOAD_STRATEGY), evaluate, decide, near)
        if OFFLOAD_STRATEGY in strategies:
            max_batch = _search_with_offload(max_batch, strategies, search, evaluate, decide, near, capturer,
                                             request, allocator)
    report = WhatIfReport(settings, facts, sweep, max_batch, timelines, plans=plans)
    return replace(report, plots=_plots(report)) if request.plots else report


def _search_with_offload(recompute_only: MaxBatchResult, strategies: tuple[str, ...], search, evaluate, decide,
                         near: dict, capturer: MetaCapturer, request: WhatIfRequest,
                         allocator: AllocatorModel) -> MaxBatchResult:
    """The ``remat-opt+offload`` search, after the recompute-only ones: it fits wherever remat-opt
    fits (an offload plan keeps the recompute-only schedule when no offload is faster, so a
    batch remat-opt fits is decided without a solve), so it starts at remat-opt's answer, whose
    solved plan seeds the offload search there, and probes upward only."""
    plain = next((f for f in recompute_only.fits if f.strategy == REMAT_OPT), None)
    known = plain.max_batch if plain is not None and plain.point is not None else 0
    link = get_link(request.link)

    def decide_offload(step, strategy: str, budget: int):
        return True if step.batch <= known else decide(step, strategy, budget)

    def evaluate_offload(step, strategy: str, budget: int):
        if step.batch == known and plain is not None:
            return offload_point(step.graph, request.solver, budget, request.options, allocator, link,
                                 request.host_budget, seed=plain.point)
        return evaluate(step, strategy, budget)

    before = capturer.captures
    offloaded = search((OFFLOAD_STRATEGY,), evaluate_offload, decide_offload,
                       {OFFLOAD_STRATEGY: known} if known else near)
    fits = {f.strategy: f for f in (*recompute_only.fits, *offloaded.fits)}
    return replace(recompute_only, fits=tuple(fits[s] for s in strategies),
                   captures=recompute_only.captures + offloaded.captures - before)


def _remat_strategies(strategies: tuple[str, ...]) -> tuple[str, ...]:
    """remat-opt, and remat-opt+offload where swept: the plans the report shows per module at --budget."""
    return (REMAT_OPT, *(s for s in strategies if s == OFFLOAD_STRATEGY))


def _swept_at(sweep: SweepResult | None, budget: int, wanted: tuple[str, ...]) -> SweepResult | None:
    """The sweep's answers at ``budget`` when it planned every ``wanted`` strategy there: each one's
    fastest schedule that fits (`SweepResult.best_at`), so the plans at --budget are the ones its
    tables show, not a second solve that may land elsewhere."""
    if sweep is None or budget not in sweep.budgets or not set(wanted) <= set(sweep.strategies):
        return None
    best = (sweep.best_at(strategy, budget) for strategy in wanted)  # what the sweep's tables show
    return replace(sweep, budgets=(budget,), points=tuple(replace(p, budget_bytes=budget) for p in best if p))


def _plans_at(graph, at_budget: SweepResult, allocator: AllocatorModel, request: WhatIfRequest,
              graph_nodes: int) -> tuple[Plan, ...]:
    """Each remat-opt strategy's plan at --budget as a `Plan` (keep / recompute / offload per
    module), simulated from its sweep point's schedule; none for a budget it could not meet."""
    plans = []
    for point in at_budget.points:
        if not point.ok or point.schedule is None:
            continue
        solver = request.solver + ("+offload" if point.strategy == OFFLOAD_STRATEGY else "")
        plans.append(plan_from_schedule(graph, point.schedule, point.budget_bytes, solver=solver, status="feasible",
                                        allocator=allocator, graph_nodes=graph_nodes, message=point.message,
                                        link=request.link if point.offloaded_bytes else None))
    return tuple(plans)


def _value_names(graph) -> list[str]:
    return [n.name for n in graph.ops]


def _end(graph, allocator: AllocatorModel) -> int:
    """Live bytes when plain autograd's backward ends (what the optimizer step starts from)."""
    checked = allocator.apply(graph)
    return allocator.planned_peak(end_bytes(simulate(checked, store_all_schedule(checked))))


def _optimizer_step_peak(loop: TrainingLoop, graph, allocator: AllocatorModel) -> int:
    return loop.step_peak_bytes(_end(graph, allocator), allocator.apply(graph)) if loop.optimizer else 0


EVERY_STRATEGY = "every strategy"
"""The one row of a largest-batch answer that no strategy changes (the optimizer step's)."""
LIGHTER_STEPS = {"adamw": ("adamw-fused", "adamw-8bit"), "adam": ("adamw-fused", "adamw-8bit"),
                 "adamw-fused": ("adamw-8bit",), "sgd-momentum": ("sgd",)}
"""Optimizers whose step needs less memory than the key's, offered when the key's does not fit
(the fused kernel updates in place: no copy of the moments; 8-bit state is a quarter)."""


def _step_refusal(model, request: WhatIfRequest, graph, allocator: AllocatorModel, end: int, peak: int,
                  budget_bytes: int) -> str:
    """Why no batch fits: the optimizer step's ``peak`` (from ``end``, what backward leaves), and
    the lighter optimizers that would fit."""
    fitting = []
    for name in LIGHTER_STEPS.get(request.optimizer if isinstance(request.optimizer, str) else "", ()):
        lighter = training_loop(list(model.parameters()), name, request.grad_accumulation,
                                device="cuda" if request.device else "cpu")
        lighter_peak = lighter.step_peak_bytes(end, allocator.apply(graph))
        if lighter_peak <= budget_bytes:
            fitting.append(f"{name} ({format_bytes(lighter_peak)})")
    hint = f"; these fit: {', '.join(fitting)}" if fitting else ""
    return (f"the optimizer step alone peaks at {format_bytes(peak)} > {format_bytes(budget_bytes)}, "
            f"at every batch{hint}")


def _loop_name(loop: TrainingLoop) -> str:
    if not loop.counts_anything:
        return "optimizer state not counted (give --optimizer)"
    name = loop.optimizer.name if loop.optimizer else "no optimizer"
    return name + (f", {loop.grad_accumulation} micro-batches" if loop.grad_accumulation > 1 else "")


def _scaled_ceiling(capturer: MetaCapturer, budget_bytes: int, allocator: AllocatorModel, limit: int,
                    tick: Progress) -> int | None:
    """The batch no schedule fits, from the fitted graphs (`MetaCapturer.fit_scaling`), with the
    fit checked by a capture at that batch; None (and every batch captured) where the fit fails.

    The lower bound is searched on the fit's extrapolation, the fit is checked at the ceiling it
    finds, and the bound is confirmed on both sides of it on graphs the check covers."""
    if not capturer.fit_scaling():
        return None
    try:
        guess = lower_bound_ceiling(capturer.predicted_at, budget_bytes, allocator, limit, start=capturer.base_batch)
    except ScalingMismatch as err:  # the extrapolation left whole numbers: the fit cannot be right
        tick(f"sizes are not affine in the batch ({err}): every batch is captured")
        capturer.scaling = None
        return None
    if not capturer.check_scaling(min(guess or limit, limit)):
        tick(capturer.scaling_note)
        return None
    tick(f"sizes fitted over the batch and checked up to batch {capturer.scaling.checked[1]}")
    if guess is None or guess <= 1:
        return guess
    room = allocator.solver_budget(budget_bytes)
    below, at = (peak_lower_bound(allocator.apply(capturer.graph_at(b))) for b in (guess - 1, guess))
    return guess if below <= room < at else None


def _torch_points(step, fractions: tuple[float, ...]) -> tuple[ExternalSchedule, ...]:
    return tuple(ExternalSchedule(TORCH_STRATEGY, p.label, p.schedule, p.message)
                 for p in partition_schedules(step, fractions))


def _timelines(graph, sweep: SweepResult | None, solver: str, store_all_peak: int):
    """Store-all and remat-opt's leanest plan of ``sweep`` (the plan at --budget when it recomputes)."""
    lines = [memory_timeline(graph, store_all_schedule(graph), "store-all")]
    if sweep is None:
        return tuple(lines)
    ours = sweep.curve(REMAT_OPT)
    if ours and ours[0].schedule is not None and ours[0].extra_time_s > 0:
        plan = ours[0]
        label = f"remat-opt ({solver}) at {100 * plan.budget_bytes / store_all_peak:.0f}%"
        lines.append(memory_timeline(graph, plan.schedule, label, budget_bytes=plan.budget_bytes))
    return tuple(lines)


def _plots(report: WhatIfReport) -> dict[str, bytes]:
    from optimizer import plots  # heavy: matplotlib, needed only when plots are asked for

    out: dict[str, bytes] = {}
    if report.sweep is not None:
        out["pareto"] = plots.pareto_png(report.sweep)
    if report.timelines:
        out["timeline"] = plots.timeline_png(report.timelines)
    if report.max_batch is not None:
        out["max_batch"] = plots.max_batch_png(report.max_batch)
    return out


def parse_strategies(text: str | None) -> tuple[str, ...]:
    """``--strategies``: a comma list of `ALL_STRATEGIES` and ``remat-opt+offload`` (None or
    empty: `ALL_STRATEGIES`)."""
    if not text:
        return ALL_STRATEGIES
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in KNOWN_STRATEGIES]
    if unknown or not names:
        raise WhatIfError(f"unknown strategies {', '.join(unknown) or '(none given)'}: choose from "
                          f"{', '.join(KNOWN_STRATEGIES)}")
    return names


def parse_fractions(text: str) -> tuple[float, ...]:
    """``--torch-budgets``: START:STOP:STEP (``0:1:0.1``) or a comma list, each within [0, 1]."""
    try:
        if ":" in text:
            start, stop, step = (Decimal(p) for p in text.split(":"))
            if not step > 0 or stop < start:
                raise InvalidOperation
            values = [start + i * step for i in range(int((stop - start) / step) + 1)]
        else:
            values = [Decimal(p) for p in text.split(",") if p.strip()]
    except (InvalidOperation, ValueError):
        raise WhatIfError(f"--torch-budgets {text!r}: use START:STOP:STEP (0:1:0.1) or a comma list "
                          "(0,0.5,1)") from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise WhatIfError(f"--torch-budgets {text!r}: torch's activation_memory_budget is within [0, 1]")
    return tuple(float(v) for v in values)
