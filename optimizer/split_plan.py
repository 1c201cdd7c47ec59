"""Choose how many row chunks the LM head and loss (`frontends.split.row_split`) and the MLPs
(`frontends.split.mlp_split`) run in, by capturing and planning each candidate.

The search itself (which candidates, in which order, the cheapest plan that fits, the message)
is `solvers.planning.split_search`, shared with the compile backend's ``split="auto"``; this
module checks `optimize`'s arguments and runs the search on `CapturedStep`s: the one asked for
(`plan_with_split`), or, with ``split`` and ``split_mlp`` left at None, the fallback when no
whole-tensor plan fits (`split_when_infeasible`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

from frontends.capture.step import CapturedStep
from frontends.split.row_split import RowSplitError, check_chunks
from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.ir.allocator import AllocatorModel
from solvers.ir.plan import Plan
from solvers.planning.planner import plan_graph
from solvers.planning.split_search import (
    SPLIT_CHOICES,
    Candidate,
    SplitInfeasibleError,
    fallback_split,
    falls_back,
    search_splits,
    split_choices,
)
from solvers.planning.training_loop import TrainingLoop

__all__ = ["SPLIT_CHOICES", "Candidate", "SplitInfeasibleError", "check_split", "chunks_of", "falls_back",
           "offload_or_split", "plan_step", "plan_with_split", "split_then_offload", "split_when_infeasible",
           "step_planners"]


def check_split(split: object, split_mlp: object) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(head counts, MLP counts) ``split`` and ``split_mlp`` ask for (see `split_choices`); a
    ValueError for a bad one, before anything is captured."""
    return split_choices(split, split_mlp, _check_chunks)


def _check_chunks(chunks: object, name: str) -> int:
    """`check_chunks`, as `optimize`'s ValueError: a bad argument, not a split that cannot be made."""
    try:
        return check_chunks(chunks, name)
    except RowSplitError:
        raise ValueError(f"{name} must be None, 'auto' or a positive number of row chunks, got {chunks!r}") \
            from None


def chunks_of(captured: CapturedStep) -> tuple[int, int]:
    """(head chunks, MLP chunks) the captured step runs in (1: unsplit)."""
    head = captured.row_splits[0].chunks if captured.row_splits else 1
    return head, captured.mlp_splits.chunks


def plan_with_split(capture: Callable[[int, int], CapturedStep],
                    plan: Callable[[CapturedStep, int], Plan],
                    budget: int | str, split: object, allocator: AllocatorModel | None,
                    split_mlp: object = None) -> tuple[CapturedStep, Plan]:
    """The cheapest plan over the chunk counts ``split`` and ``split_mlp`` ask for, with its capture.

    ``capture(k, m)`` captures the step with the head in k and the MLPs in m row chunks;
    ``plan(captured, budget_bytes)`` plans it. An explicit split that cannot be made raises
    `frontends.split.row_split.RowSplitError`; ``auto`` then plans without it and says why in the
    plan's message. Raises the `InfeasibleBudgetError` naming the smallest budget any candidate
    needs when none fits.
    """
    heads, mlps = check_split(split, split_mlp)
    choice = search_splits(capture, plan, budget, heads, mlps, allocator, refused=RowSplitError)
    return choice.captured, choice.plan


def split_when_infeasible(capture: Callable[[int, int], CapturedStep],
                          plan: Callable[[CapturedStep, int], Plan], unsplit: CapturedStep,
                          unsplit_error: InfeasibleBudgetError,
                          allocator: AllocatorModel | None) -> tuple[CapturedStep, Plan]:
    """``split=None``: the unsplit step (``unsplit``) raised ``unsplit_error``, so plan the
    cheapest split that fits the same budget (`solvers.planning.split_search.fallback_split`;
    the plan's message says so). Raises `SplitInfeasibleError` (an `InfeasibleBudgetError`)
    naming the unsplit floor and the finest split's when that does not fit either."""
    choice = fallback_split(capture, plan, unsplit, unsplit_error, allocator, refused=RowSplitError)
    return choice.captured, choice.plan


Planner = Callable[[CapturedStep, str | int], Plan]
"""Plans a captured step at a budget (a string `Budget.of` reads, or bytes)."""


def step_planners(solver: str, options: SolverOptions, allocator: AllocatorModel | None, loop: TrainingLoop,
                  offload_settings: Mapping[str, object]) -> tuple[Planner, Planner | None]:
    """`plan_step`'s two planners for `plan_graph`'s settings: the one that plans with
    ``offload_settings`` (`PlanRequest.offload_settings`), and the recompute-only one, None when
    offload is off (then the first plans recompute only)."""
    def plan(captured: CapturedStep, budget: str | int, **offload: object) -> Plan:
        return plan_graph(captured.graph, budget, solver, options, graph_nodes=len(captured.gm.graph.nodes),
                          allocator=allocator, loop=loop, **offload)

    return functools.partial(plan, **offload_settings), plan if offload_settings.get("offload") else None


def plan_step(capture_split: Callable[[int, int], CapturedStep], plan_captured: Planner, budget: str | int,
              split: object, split_mlp: object, allocator: AllocatorModel | None,
              recompute_only: Planner | None = None) -> tuple[CapturedStep, Plan]:
    """The step's capture and plan, as `optimize`, `plan_only` and the --meta path make them: with
    the splits asked for (`plan_with_split`), or with none asked for, unsplit where a whole-tensor
    plan fits and split where none does (`split_when_infeasible`).

    ``recompute_only`` is given when ``plan_captured`` may offload: the split fallback then
    searches the splits recompute-only and offloads on the chosen one (`split_then_offload`),
    and an unsplit plan that fits only with offloads is weighed against splitting
    (`offload_or_split`)."""
    if not falls_back(split, split_mlp):
        return plan_with_split(capture_split, plan_captured, budget, split, allocator, split_mlp)
    captured = capture_split(1, 1)
    try:
        plan = plan_captured(captured, budget)
    except InfeasibleBudgetError as err:
        if recompute_only is None:
            return split_when_infeasible(capture_split, plan_captured, captured, err, allocator)
        return split_then_offload(capture_split, plan_captured, recompute_only, captured, err, allocator)
    if recompute_only is not None and plan.offloaded:  # it weighs a split where only offloads fit
        return offload_or_split(captured, plan, capture_split, plan_captured, recompute_only, budget, allocator)
    return captured, plan


def split_then_offload(capture_split: Callable[[int, int], CapturedStep], plan_offload: Planner,
                       recompute_only: Planner, unsplit: CapturedStep,
                       unsplit_error: InfeasibleBudgetError,
                       allocator: AllocatorModel | None) -> tuple[CapturedStep, Plan]:
    """The split fallback when offloads are allowed. Planning with offloads runs the solver
    several times (the budget shift, the local search): over every split candidate it took
    more than 10 minutes for a bf16 Llama at 40% of its peak. So the candidates are planned
    recompute-only and only the chosen split is planned again with offloads, the faster of
    the two kept. Only where no split fits without offloads are the candidates planned with
    them (`split_when_infeasible`; the finest split first, so a step that does not fit split
    and offloaded is refused after one plan)."""
    try:
        captured, plan = split_when_infeasible(capture_split, recompute_only, unsplit, unsplit_error, allocator)
    except InfeasibleBudgetError:
        return split_when_infeasible(capture_split, plan_offload, unsplit, unsplit_error, allocator)
    offloaded = plan_offload(captured, unsplit_error.budget_bytes)
    if offloaded.objective is not None and plan.objective is not None and offloaded.objective < plan.objective:
        return captured, dataclasses.replace(offloaded, message="; ".join(filter(None, (
            plan.message, f"offloads planned on that split: {offloaded.message}"))))
    return captured, plan


def offload_or_split(unsplit: CapturedStep, offloaded: Plan, capture_split: Callable[[int, int], CapturedStep],
                     plan_captured: Planner, recompute_only: Planner, budget: str | int,
                     allocator: AllocatorModel | None) -> tuple[CapturedStep, Plan]:
    """The unsplit step fits with offloads: where it fits no other way (``offloaded`` says so:
    `Plan.fits_without_offload`), splitting (what the planner does without offload) is the
    other way to fit, and may well be cheaper (a tiny step cannot hide a copy's latency), so the
    faster of the two is kept; where a recompute-only plan fits, the planner already chose
    offload over it. ``recompute_only`` gives the unsplit step's error (the floor the split
    search names), then plans the split candidates (`split_then_offload`)."""
    if offloaded.fits_without_offload:
        return unsplit, offloaded
    try:
        recompute_only(unsplit, budget)
        return unsplit, offloaded  # the solver fit it this time (its time limit, a heuristic's luck)
    except InfeasibleBudgetError as err:
        unsplit_error = err
    try:
        split_captured, split_plan = split_then_offload(capture_split, plan_captured, recompute_only, unsplit,
                                                        unsplit_error, allocator)
    except InfeasibleBudgetError:
        return unsplit, offloaded
    if split_plan.objective < offloaded.objective:
        return split_captured, dataclasses.replace(split_plan, message="; ".join(filter(None, (
            split_plan.message, f"the unsplit step fits only with offloads, and takes "
                                f"{offloaded.objective:.4g} s that way"))))
    return unsplit, dataclasses.replace(offloaded, message="; ".join(filter(None, (
        offloaded.message, f"faster than splitting the step ({split_plan.objective:.4g} s)"))))
