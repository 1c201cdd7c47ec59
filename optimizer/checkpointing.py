"""The eager runtime: remat-opt chooses, ``torch.utils.checkpoint`` runs it, on the user's model.

Why: the graph runtime replaces the model's forward by captured graphs; many users want to keep
their own ``nn.Module`` (its Python, hooks, ``torch.compile``, FSDP wrapping) and only be told
where to checkpoint. `apply_checkpointing` captures the step once (for the plan only), plans the
family `solvers.planning.eager_plan` describes, and changes the model in place: each chosen
submodule's forward runs under non-reentrant ``checkpoint(..., use_reentrant=False,
context_fn=...)`` with a selective-checkpoint policy that returns MUST_SAVE for the ops the plan
keeps and PREFER_RECOMPUTE for the rest. Ops are named as the policy sees them: (overload,
index of its call within the region). Checkpoint keeps gradients (and dropout, by replaying the
RNG) right whatever the policy says; a policy that does not line up with the model only moves
memory, and the wrapper warns once when a region's op counts differ from the plan's.
The wrappers, and plans as files, are in `frontends.eager_runtime.eager_checkpoint`; the capture
with MLPs in row chunks in `frontends.eager_runtime.split_capture`. ``split_mlp=m`` runs the
MLP modules in m row chunks, each under its own checkpoint (`frontends.eager_runtime.eager_split`);
left at None, the MLPs are split only where no plan with whole MLPs fits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from frontends.eager_runtime.checkpoint_timing import measured_candidates
from frontends.eager_runtime.eager_checkpoint import (
    CheckpointPlan,
    CheckpointPlanError,
    RegionPolicy,
    apply_regions,
    checkpointed_modules,
    describe,
    load_checkpointing,
    model_signature,
    remove_checkpointing,
    save_checkpointing_plan,
    split_modules,
)
from frontends.eager_runtime.eager_ops import (
    EagerTrace,
    candidates,
    capture_for_eager,
    eager_graph,
    held_arguments,
    held_values,
    region_policy,
)
from frontends.eager_runtime.eager_split import with_modules
from frontends.eager_runtime.split_capture import capture_split, on_cpu
from frontends.measure.link_bandwidth import measured_link_settings
from frontends.measure.optimizer_memory import check_optimizer, training_loop
from frontends.split.row_split import RowSplitError, check_chunks
from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.baselines import store_all_schedule
from solvers.blocks import find_blocks
from solvers.ir.budget import Budget
from solvers.ir.graph import RematGraph
from solvers.ir.link import Link, offload_link_of
from solvers.ir.plan import Plan
from solvers.ir.simulator import simulate
from solvers.planning.eager_plan import (
    CHUNKED,
    EagerSolution,
    chunk_group,
    fixed_choice_solution,
    solution_plan,
    solve_eager,
    with_argument_holds,
    with_holds,
)
from solvers.planning.planner import plan_graph
from solvers.planning.request import PlanRequest, SettingsError
from solvers.planning.split_search import SPLIT_CHOICES, fallback_split, falls_back
from solvers.planning.training_loop import TrainingLoop, end_bytes, iteration_error, loop_budget, with_loop


def _policies(solution: EagerSolution, graph, trace: EagerTrace,
              found: list) -> tuple[RegionPolicy, ...]:
    mappable = {c.path: c.mappable for c in found}
    return tuple(region_policy(choice, graph, trace, mappable[choice.path])
                 for choice in solution.choices if choice.option != CHUNKED)  # chunks: ChunkedForward's


EAGER_SETTINGS = ("solver", "time_limit", "cost_model", "grad_outputs", "python_side_effects", "split", "split_mlp",
                  "optimizer", "grad_accumulation", "offload", "link", "host_budget")
"""The `PlanRequest` settings the eager runtime honours (the rest are the graph runtime's)."""


def apply_checkpointing(
    model: torch.nn.Module,
    example_inputs: tuple = (),
    example_kwargs: dict | None = None,
    *,
    budget: PlanRequest | Budget | int | str,
    compare: bool = True,
    **settings: Any,
) -> CheckpointPlan:
    """Plan ``model``'s training step for ``budget`` and checkpoint it in place.

    ``budget`` as in `optimizer.optimize` (bytes, ``"16GB"``, ``"60%"`` of plain autograd's
    peak, or a whole `PlanRequest`). ``settings``: `EAGER_SETTINGS`, as `optimize` takes them;
    another raises `SettingsError`. ``solver`` is the eager planner (``auto``; the family is
    small enough to solve on its Pareto front); ``compare`` also plans per-block checkpointing
    and the graph runtime at the same budget, for the plan's summary. Returns a
    `CheckpointPlan` (``runtime == "eager"``). Raises `InfeasibleBudgetError` (nothing applied)
    when no checkpointing plan fits.

    ``split_mlp=m`` runs every MLP module (linear -> pointwise -> linear, as the graph runtime's
    ``split_mlp`` finds them, the module's whole forward per-row) in m chunks of the flattened
    token rows, each chunk under its own checkpoint, unless a checkpointed region around it
    reruns it (`frontends.eager_runtime.eager_split`); the plan is made with the chunked forward in place.
    Raises `frontends.eager_runtime.eager_split.EagerSplitError` (an `MlpSplitError`) when no MLP module can be
    split, naming why (dropout inside, a forward that does more than the chain). ``split`` (the
    LM head and loss in row chunks) is the graph runtime's (`optimize(..., split=k)`): refused.
    ``split_mlp=None`` (default) keeps the MLPs whole unless no plan with whole MLPs fits: then
    m = 8 is planned, and where it fits m = 2, 4, 8, and the cheapest plan that fits is applied,
    its message saying so (`solvers.planning.split_search.fallback_split`); where m = 8 does not
    fit either, `SplitInfeasibleError` (an `InfeasibleBudgetError`) names both floors.
    ``split_mlp=1`` never splits.

    ``offload="auto"`` (with ``link``: a preset name, a `solvers.ir.link.Link`, or ``"measured"``
    on the model's device; ``host_budget``) also lets a region send what its autograd saves to host
    memory instead of recomputing (`frontends.eager_runtime.eager_offload`: saved-tensor hooks,
    each region's values brought back when its backward starts, the previous region's prefetched).
    The plan keeps the faster of its recompute-only and its offloading selection, as simulated.
    """
    if settings.get("solver", "auto") not in ("auto", "eager"):
        raise ValueError(f"apply_checkpointing plans with solver='auto'; got {settings['solver']!r} (the graph "
                         "runtime's solvers are for optimize())")
    settings.pop("solver", None)
    request = PlanRequest.of(budget, "apply_checkpointing", EAGER_SETTINGS, **measured_link_settings(model, settings))
    offload = request.offload_settings
    link = offload_link_of(request.offload, request.link)
    if checkpointed_modules(model) or split_modules(model):
        raise ValueError("the model is already checkpointed: call remove_checkpointing(model) first")
    if request.split not in (None, 1):
        raise RowSplitError(f"split={request.split!r}: the eager runtime does not split the LM head and loss "
                            "(the head and the loss are two calls in the model's forward, not one module); "
                            "use the graph runtime, optimize(model, inputs, budget, split=k)")
    mlp_chunks = 1 if request.split_mlp is None else check_chunks(request.split_mlp, "split_mlp")
    check_optimizer(request.optimizer)
    loop = training_loop(list(model.parameters()), request.optimizer, request.grad_accumulation)
    capture_settings = (request.cost_model, request.grad_outputs, request.python_side_effects)
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    on_cpu_ = on_cpu(model, inputs)
    solved: dict[int, _Solved] = {}

    def capture(_head: int, chunks: int) -> _EagerStep:
        return _capture_step(model, inputs, example_kwargs, chunks, capture_settings, on_cpu_)

    def plan_step(step: _EagerStep, budget: Budget | int) -> Plan:
        solved[id(step)] = _solve(step, budget, loop, request.time_limit, link, offload["host_budget"])
        return solved[id(step)].plan

    step = capture(1, mlp_chunks)
    planning_budget: Budget | int = request.budget
    unsplit_peak = None
    if step.splits and request.budget.is_percentage:
        # A percentage stays one of the unsplit step's plain-autograd peak, as in the graph runtime.
        unsplit = capture_for_eager(model, inputs, example_kwargs, *capture_settings)
        unsplit_graph = eager_graph(unsplit.graph, unsplit.gm, on_cpu_)
        unsplit_peak = simulate(unsplit_graph, store_all_schedule(unsplit_graph)).peak_bytes
        planning_budget = request.budget.resolve(unsplit_peak)
    try:
        plan_step(step, planning_budget)
    except InfeasibleBudgetError as err:
        if not falls_back(request.split, request.split_mlp):
            raise
        # No plan with whole MLPs fits: split them (the search optimize(split_mlp="auto") runs).
        choice = fallback_split(capture, plan_step, step, err, None, refused=RowSplitError,
                                heads=(1,), mlps=SPLIT_CHOICES)
        step, mlp_chunks = choice.captured, choice.chunks[1]
        solved[id(step)] = dataclasses.replace(solved[id(step)], plan=choice.plan)
    solution, plan = solved[id(step)].solution, solved[id(step)].plan
    graph, trace, found, splits, labels = step.graph, step.trace, step.found, step.splits, step.labels
    if step.captured.notes or step.notes:
        plan = dataclasses.replace(plan, message="; ".join((plan.message, *step.notes, *step.captured.notes)))
    regions = _policies(solution, graph, trace, found)
    checkpointed = {chunk_group(c.path).removesuffix(".<chunks>") for c in solution.choices if c.option == CHUNKED}
    splits = tuple(dataclasses.replace(sp, checkpoint=sp.path in checkpointed) for sp in splits)
    summary: dict[str, Any] = {
        "budget_bytes": plan.budget_bytes, "predicted_peak_bytes": plan.predicted_peak_bytes,
        "store_all_peak_bytes": plan.store_all_peak_bytes, "extra_flops": plan.extra_flops,
        "extra_time_s": plan.extra_time_s, "step_flops": plan.step_flops,
        "status": plan.status, "bound": plan.bound, "gap": plan.gap}
    if plan.offloaded:
        summary.update(offloaded_bytes=sum(b for _, b in plan.offloaded), transfer_time_s=plan.transfer_time_s,
                       stall_time_s=plan.stall_time_s, host_peak_bytes=plan.host_peak_bytes, link=plan.link)
    if splits:
        summary["split_mlp"] = mlp_chunks
    if unsplit_peak is not None:
        summary["unsplit_store_all_peak_bytes"] = unsplit_peak
    if compare:
        summary.update(_comparisons(graph, step.captured.graph, found, plan.budget_bytes, request.time_limit,
                                    labels.chunks, loop))
    apply_regions(model, regions, splits)
    return CheckpointPlan(regions=regions, model_signature=model_signature(model),
                          model_class=type(model).__name__, plan=plan,
                          summary=tuple(summary.items()), splits=splits)


@dataclasses.dataclass(frozen=True)
class _EagerStep:
    """The step captured for the eager planner, its MLP modules in ``splits``' row chunks (none:
    whole): what `fallback_split` captures and plans per MLP chunk count."""

    graph: RematGraph
    """What the planner solves: module labels (chunks included) and the values regions hold."""
    captured: Any
    trace: EagerTrace
    labels: Any
    splits: tuple
    notes: tuple[str, ...]
    found: tuple


@dataclasses.dataclass(frozen=True)
class _Solved:
    solution: EagerSolution
    plan: Plan


def _capture_step(model, inputs: tuple, kwargs: dict | None, mlp_chunks: int, capture_settings: tuple,
                  cpu: bool) -> _EagerStep:
    captured, trace, labels, splits, notes = capture_split(model, inputs, kwargs, mlp_chunks, *capture_settings)
    base_graph = eager_graph(with_modules(captured.graph, labels.modules), captured.gm, cpu)
    found = candidates(base_graph, trace, model)
    graph, arguments = with_argument_holds(with_holds(base_graph, held_values(base_graph, trace, found)),
                                           held_arguments(base_graph, trace, found))
    found = [dataclasses.replace(c, arguments=arguments.get(c.path, ())) for c in found]
    if not splits:  # each checkpoint option timed alone (a split MLP's chunks would run whole)
        found, timing = measured_candidates(graph, trace, model, inputs, kwargs, found)
        if timing is not None:
            notes = (*notes, timing.describe())
    return _EagerStep(graph, captured, trace, labels, tuple(splits), tuple(notes), tuple(found))


def _solve(step: _EagerStep, budget: Budget | int, loop: TrainingLoop, time_limit: float,
           link: Link | None = None, host_budget: int | None = None) -> _Solved:
    """The eager plan of ``step`` for ``budget`` (the whole iteration's, with the ``loop``'s
    optimizer and accumulation counted); with a ``link``, regions may offload. Raises
    `InfeasibleBudgetError` in the iteration's bytes."""
    graph = step.graph
    store_all = simulate(graph, store_all_schedule(graph))
    if loop.counts_anything:
        budget = loop_budget(loop, graph, budget, store_all.peak_bytes, end_bytes(store_all))[1]
    try:
        solution = solve_eager(graph, step.found, budget, time_limit_s=time_limit, chunked=step.labels.chunks,
                               link=link, host_budget=host_budget)
    except InfeasibleBudgetError as err:
        raise iteration_error(err, loop.held_bytes(graph)) from None
    plan = with_loop(solution_plan(solution, graph, graph_nodes=len(step.captured.gm.graph.nodes)), loop, graph,
                     end_bytes(solution.simulation), end_bytes(store_all), in_place_accumulation=solution.graph)
    return _Solved(solution, plan)


def _comparisons(graph, captured_graph, found, budget: int, time_limit: float,
                 chunked: tuple[str, ...] = (), loop: TrainingLoop | None = None) -> dict[str, Any]:
    """Per-block checkpointing (checkpoint every repeated block, save nothing) and the graph
    runtime's plan at the same budget, for the summary; with the ``loop``'s optimizer and
    accumulation counted as in the plan. The graph runtime plans ``captured_graph``, the step it
    would run (not the eager planner's graph, whose release points are eager autograd's)."""
    loop = loop or TrainingLoop()
    out: dict[str, Any] = {}
    blocks = [b.path for b in find_blocks(graph)]
    per_block = fixed_choice_solution(graph, found, blocks, "none", chunked) if blocks else None
    if per_block is not None:
        out["per_block_extra_flops"] = per_block.extra_flops
        out["per_block_extra_time_s"] = per_block.extra_cost
        out["per_block_peak_bytes"] = max(per_block.simulation.peak_bytes + loop.held_bytes(graph),
                                          loop.step_peak_bytes(end_bytes(per_block.simulation), graph))
    try:
        graph_plan = plan_graph(captured_graph, budget, "auto", SolverOptions(time_limit_s=min(time_limit, 20.0)),
                                loop=loop)
        out["graph_runtime_extra_flops"] = graph_plan.extra_flops
        out["graph_runtime_extra_time_s"] = graph_plan.extra_time_s
        out["graph_runtime_peak_bytes"] = graph_plan.predicted_peak_bytes
    except Exception as exc:  # the comparison must not stop the plan (infeasible, solver missing)
        out["graph_runtime_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return out


__all__ = ["apply_checkpointing", "EAGER_SETTINGS", "SettingsError", "remove_checkpointing", "load_checkpointing",
           "save_checkpointing_plan", "CheckpointPlan", "CheckpointPlanError", "RegionPolicy",
           "checkpointed_modules", "describe"]

