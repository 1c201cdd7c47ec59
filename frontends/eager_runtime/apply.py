"""The eager runtime: remat-opt chooses, ``torch.utils.checkpoint`` runs it, on the user's model.

Why: the graph runtime replaces the model's forward by captured graphs; many users want to keep
their own ``nn.Module`` (its Python, hooks, ``torch.compile``, FSDP wrapping) and only be told
where to checkpoint. `apply_checkpointing` captures the step once (for the plan only), plans the
family `optimizer.planning.eager_plan` describes, and changes the model in place: each chosen
submodule's forward runs under non-reentrant ``checkpoint(..., use_reentrant=False,
context_fn=...)`` with a selective-checkpoint policy that returns MUST_SAVE for the ops the plan
keeps and PREFER_RECOMPUTE for the rest. Ops are named as the policy sees them: (overload,
index of its call within the region). Checkpoint keeps gradients (and dropout, by replaying the
RNG) right whatever the policy says; a policy that does not line up with the model only moves
memory, and the wrapper warns once when a region's op counts differ from the plan's.
The wrappers, and plans as files, are in `frontends.eager_runtime.eager_checkpoint`. ``split_mlp=m`` runs the
MLP modules in m row chunks, each under its own checkpoint (`frontends.eager_runtime.eager_split`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch

from frontends.eager_runtime.eager_checkpoint import (
    CheckpointPlan,
    CheckpointPlanError,
    RegionPolicy,
    SplitPolicy,
    apply_regions,
    apply_splits,
    checkpointed_modules,
    describe,
    load_checkpointing,
    model_signature,
    remove_checkpointing,
    save_checkpointing_plan,
    split_modules,
    unchecked_chunks,
)
from frontends.eager_runtime.eager_ops import (
    EagerTrace,
    candidates,
    capture_for_eager,
    eager_graph,
    held_values,
    region_keys,
    trace_eager,
)
from frontends.eager_runtime.eager_split import EagerSplitError, chunk_labels, mlp_modules, with_modules
from frontends.guards.hf_training import cache_off_for_training
from frontends.split.row_split import RowSplitError, check_chunks
from optimizer.ir.budget import parse_bytes, resolve_budget
from optimizer.ir.simulator import simulate
from optimizer.planning.eager_plan import (
    CHUNKED,
    EagerSolution,
    chunk_group,
    fixed_choice_solution,
    solution_plan,
    solve_eager,
    with_holds,
)
from optimizer.planning.planner import plan_graph
from solvers.base import SolverOptions
from solvers.baselines import store_all_schedule
from solvers.blocks import find_blocks


# --------------------------------------------------------------------------- planning
def _policies(solution: EagerSolution, graph, trace: EagerTrace,
              found: list) -> tuple[RegionPolicy, ...]:
    mappable = {c.path: c.mappable for c in found}
    regions = []
    for choice in solution.choices:
        if choice.option == CHUNKED:  # a split MLP's chunk: its ChunkedForward checkpoints it
            continue
        keys = region_keys(graph, choice.path, trace.overloads)
        save: dict[str, list[int]] = {}
        for name in choice.saved:
            if name in keys and name in mappable[choice.path]:
                op, index = keys[name]
                save.setdefault(op, []).append(index)
        regions.append(RegionPolicy(
            path=choice.path, option=choice.option,
            save=tuple((op, tuple(sorted(idx))) for op, idx in sorted(save.items())),
            expected_ops=tuple(sorted(Counter(trace.region_ops(choice.path)).items())),
            saving_bytes=choice.saving_bytes, extra_flops=choice.extra_flops))
    return tuple(regions)


def _on_cpu(model: torch.nn.Module, inputs: tuple) -> bool:
    for t in [*model.parameters(), *inputs]:
        if isinstance(t, torch.Tensor):
            return t.device.type == "cpu"
    return True


def apply_checkpointing(
    model: torch.nn.Module,
    example_inputs: tuple = (),
    example_kwargs: dict | None = None,
    *,
    budget: int | str,
    solver: str = "auto",
    time_limit: float = 60.0,
    cost_model: str = "flops",
    grad_outputs: str = "losses",
    python_side_effects: str = "error",
    compare: bool = True,
    split: int | None = None,
    split_mlp: int | None = None,
) -> CheckpointPlan:
    """Plan ``model``'s training step for ``budget`` and checkpoint it in place.

    ``budget`` as in `optimizer.optimize` (bytes, ``"16GB"``, ``"60%"`` of plain autograd's
    peak). ``solver`` is the eager planner (``auto``; the family is small enough to solve on its
    Pareto front); ``compare`` also plans per-block checkpointing and the graph runtime at the
    same budget, for the plan's summary. Returns a `CheckpointPlan` (``runtime == "eager"``).
    Raises `InfeasibleBudgetError` (nothing applied) when no checkpointing plan fits.

    ``split_mlp=m`` runs every MLP module (linear -> pointwise -> linear, as the graph runtime's
    ``split_mlp`` finds them, the module's whole forward per-row) in m chunks of the flattened
    token rows, each chunk under its own checkpoint, unless a checkpointed region around it
    reruns it (`frontends.eager_runtime.eager_split`); the plan is made with the chunked forward in place.
    Raises `frontends.eager_runtime.eager_split.EagerSplitError` (an `MlpSplitError`) when no MLP module can be
    split, naming why (dropout inside, a forward that does more than the chain). ``split`` (the
    LM head and loss in row chunks) is the graph runtime's (`optimize(..., split=k)`): refused.
    """
    if solver not in ("auto", "eager"):
        raise ValueError(f"apply_checkpointing plans with solver='auto'; got {solver!r} (the graph "
                         "runtime's solvers are for optimize())")
    if not (isinstance(budget, str) and budget.strip().endswith("%")):
        parse_bytes(budget)
    if checkpointed_modules(model) or split_modules(model):
        raise ValueError("the model is already checkpointed: call remove_checkpointing(model) first")
    if split not in (None, 1):
        raise RowSplitError(f"split={split!r}: the eager runtime does not split the LM head and loss "
                            "(the head and the loss are two calls in the model's forward, not one module); "
                            "use the graph runtime, optimize(model, inputs, budget, split=k)")
    mlp_chunks = 1 if split_mlp is None else check_chunks(split_mlp, "split_mlp")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    captured, trace, labels, splits, notes = _capture_split(model, inputs, example_kwargs, mlp_chunks, cost_model,
                                                            grad_outputs, python_side_effects)
    unsplit_peak = None
    if splits and isinstance(budget, str) and budget.strip().endswith("%"):
        # A percentage stays one of the unsplit step's plain-autograd peak, as in the graph runtime.
        unsplit = capture_for_eager(model, inputs, example_kwargs, cost_model, grad_outputs, python_side_effects)
        unsplit_graph = eager_graph(unsplit.graph, unsplit.gm, _on_cpu(model, inputs))
        unsplit_peak = simulate(unsplit_graph, store_all_schedule(unsplit_graph)).peak_bytes
        budget = resolve_budget(budget, unsplit_peak)
    graph = eager_graph(with_modules(captured.graph, labels.modules), captured.gm, _on_cpu(model, inputs))
    found = candidates(graph, trace, model)
    base_graph = graph
    graph = with_holds(graph, held_values(graph, trace, found))
    solution = solve_eager(graph, found, budget, time_limit_s=time_limit, chunked=labels.chunks)
    plan = solution_plan(solution, graph, graph_nodes=len(captured.gm.graph.nodes))
    if captured.notes or notes:
        plan = dataclasses.replace(plan, message="; ".join((plan.message, *notes, *captured.notes)))
    regions = _policies(solution, graph, trace, found)
    checkpointed = {chunk_group(c.path).removesuffix(".<chunks>") for c in solution.choices if c.option == CHUNKED}
    splits = tuple(dataclasses.replace(sp, checkpoint=sp.path in checkpointed) for sp in splits)
    summary: dict[str, Any] = {
        "budget_bytes": plan.budget_bytes, "predicted_peak_bytes": plan.predicted_peak_bytes,
        "store_all_peak_bytes": plan.store_all_peak_bytes, "extra_flops": plan.extra_flops,
        "extra_time_s": plan.extra_time_s, "step_flops": plan.step_flops,
        "status": plan.status, "bound": plan.bound, "gap": plan.gap}
    if splits:
        summary["split_mlp"] = mlp_chunks
    if unsplit_peak is not None:
        summary["unsplit_store_all_peak_bytes"] = unsplit_peak
    if compare:
        summary.update(_comparisons(graph, base_graph, found, plan.budget_bytes, time_limit, labels.chunks))
    apply_regions(model, regions, splits)
    return CheckpointPlan(regions=regions, model_signature=model_signature(model),
                          model_class=type(model).__name__, plan=plan,
                          summary=tuple(summary.items()), splits=splits)


def _capture_split(model, inputs, kwargs, chunks: int, cost_model, grad_outputs, python_side_effects):
    """The step captured and traced for planning, with the MLP modules ``chunks > 1`` can split
    run in row chunks: (captured, trace, chunk labels, splits, notes on what was not split).
    The model is left as found."""
    splits: tuple[SplitPolicy, ...] = ()
    notes: list[str] = []
    if chunks > 1:
        with cache_off_for_training(model, dict(kwargs or {})) as cache_off:
            splits, skipped = mlp_modules(model, trace_eager(model, inputs, cache_off.kwargs), chunks)
        notes += [f"not split: {why}" for why in skipped]
    try:
        captured, trace, labels = _capture_chunked(model, inputs, kwargs, splits, cost_model, grad_outputs,
                                                   python_side_effects)
        if labels.refused:  # left whole: capture again without them
            notes += [f"not split: {why}" for why in labels.refused.values()]
            splits = tuple(sp for sp in splits if sp.path not in labels.refused)
            if not splits:
                raise EagerSplitError(f"split_mlp={chunks}: no MLP module of the model can run in row chunks "
                                      f"in the eager runtime ({'; '.join(labels.refused.values())}); leave "
                                      "split_mlp at 1, or use optimize(), which splits the chain itself")
            captured, trace, labels = _capture_chunked(model, inputs, kwargs, splits, cost_model, grad_outputs,
                                                       python_side_effects)
    finally:
        remove_checkpointing(model)  # the chunked forwards were in place for the capture only
    if splits:
        notes.insert(0, f"{len(splits)} MLP module{'s' if len(splits) > 1 else ''} "
                        f"({', '.join(sp.path for sp in splits[:3])}{', ...' if len(splits) > 3 else ''}) "
                        f"in {chunks} row chunks")
    return captured, trace, labels, splits, notes


def _capture_chunked(model, inputs, kwargs, splits, cost_model, grad_outputs, python_side_effects):
    """Capture and trace the step with ``splits`` applied (chunks without their own checkpoint,
    as the graph needs them), and label each chunk's values; the model keeps the wrappers."""
    remove_checkpointing(model)
    apply_splits(model, splits)
    with unchecked_chunks():
        captured = capture_for_eager(model, inputs, kwargs, cost_model, grad_outputs, python_side_effects)
        with cache_off_for_training(model, dict(kwargs or {})) as cache_off:
            trace = trace_eager(model, inputs, cache_off.kwargs)
    labels = chunk_labels(captured.graph, captured.gm, splits, trace.calls)
    return captured, trace, labels


def _comparisons(graph, base_graph, found, budget: int, time_limit: float,
                 chunked: tuple[str, ...] = ()) -> dict[str, Any]:
    """Per-block checkpointing (checkpoint every repeated block, save nothing) and the graph
    runtime's plan at the same budget, for the summary."""
    out: dict[str, Any] = {}
    blocks = [b.path for b in find_blocks(graph)]
    per_block = fixed_choice_solution(graph, found, blocks, "none", chunked) if blocks else None
    if per_block is not None:
        out["per_block_extra_flops"] = per_block.extra_flops
        out["per_block_extra_time_s"] = per_block.extra_cost
        out["per_block_peak_bytes"] = per_block.simulation.peak_bytes
    try:
        graph_plan = plan_graph(base_graph, budget, "auto", SolverOptions(time_limit_s=min(time_limit, 20.0)))
        out["graph_runtime_extra_flops"] = graph_plan.extra_flops
        out["graph_runtime_extra_time_s"] = graph_plan.extra_time_s
        out["graph_runtime_peak_bytes"] = graph_plan.predicted_peak_bytes
    except Exception as exc:  # the comparison must not stop the plan (infeasible, solver missing)
        out["graph_runtime_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return out


__all__ = ["apply_checkpointing", "remove_checkpointing", "load_checkpointing",
           "save_checkpointing_plan", "CheckpointPlan", "CheckpointPlanError", "RegionPolicy",
           "checkpointed_modules", "describe"]

