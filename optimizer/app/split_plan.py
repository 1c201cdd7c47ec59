"""Choose how many row chunks the LM head and loss run in (`frontends.row_split`) by planning each.

Why a search over k and not a solver variable: a split changes the graph (k chunks are k
logits values), so each candidate is captured and planned, and the cheapest plan that fits the
budget wins (ties go to fewer chunks). ``k = 1`` (unsplit) is always a candidate, so ``auto`` is
never worse than no split; it costs one capture and plan per candidate, which is why it is not
the default. Percentage budgets stay percentages of the unsplit step's store-all peak (plain
autograd's), whatever k is chosen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from frontends.capture import CapturedStep
from frontends.row_split import RowSplitError, check_chunks
from optimizer.ir.allocator import AllocatorModel
from optimizer.ir.budget import resolve_budget
from optimizer.ir.plan import Plan
from optimizer.planning.planner import store_all_peak_bytes
from solvers.base import InfeasibleBudgetError

SPLIT_CHOICES = (1, 2, 4, 8)
"""Row chunks ``split="auto"`` tries."""


def check_split(split: object) -> tuple[int, ...]:
    """The chunk counts ``split`` asks for: None -> (1,), ``"auto"`` -> `SPLIT_CHOICES`, k -> (k,)."""
    if split is None:
        return (1,)
    if split == "auto":
        return SPLIT_CHOICES
    try:
        return (check_chunks(split),)
    except RowSplitError:
        raise ValueError(f"split must be None, 'auto' or a positive number of row chunks, got {split!r}") \
            from None


def chunks_of(captured: CapturedStep) -> int:
    """Row chunks the captured step's heads run in (1: unsplit)."""
    return captured.row_splits[0].chunks if captured.row_splits else 1


def plan_with_split(capture: Callable[[int], CapturedStep], plan: Callable[[CapturedStep, int], Plan],
                    budget: int | str, split: object,
                    allocator: AllocatorModel | None) -> tuple[CapturedStep, Plan]:
    """The cheapest plan over the chunk counts ``split`` asks for, with its capture.

    ``capture(k)`` captures the step split into k row chunks; ``plan(captured, budget_bytes)``
    plans it. An explicit k that cannot split raises `frontends.row_split.RowSplitError`;
    ``auto`` then plans unsplit and says why in the plan's message. Raises the
    `InfeasibleBudgetError` naming the smallest budget any candidate needs when none fits.
    """
    choices = check_split(split)
    auto = split == "auto"
    unsplit = capture(1) if 1 in choices or _is_percentage(budget) else None
    allocator = allocator or AllocatorModel(block_bytes=1)
    reference = 0 if unsplit is None else store_all_peak_bytes(unsplit.graph, allocator)
    budget = resolve_budget(budget, reference)  # a percentage is of the unsplit step
    tried: list[tuple[int, CapturedStep | None, Plan | InfeasibleBudgetError | RowSplitError]] = []
    for k in choices:
        try:
            captured = unsplit if k == 1 else capture(k)
        except RowSplitError as err:
            if not auto:
                raise
            tried.append((k, None, err))
            break  # the same chain is refused at every k
        try:
            tried.append((k, captured, plan(captured, budget)))
        except InfeasibleBudgetError as err:
            tried.append((k, captured, err))
        if auto and isinstance(tried[-1][2], Plan) and tried[-1][2].extra_time_s == 0:
            break  # nothing recomputed: more chunks cannot make the step cheaper
    plans = [(k, c, p) for k, c, p in tried if isinstance(p, Plan)]
    if not plans:
        raise _smallest_infeasible(tried, budget)
    k, captured, chosen = min(plans, key=lambda t: (t[2].objective, t[0]))
    if not auto:
        return captured, chosen
    summary = ", ".join(_tried_text(k_, result) for k_, _, result in tried)
    note = f"split='auto' chose {k} row chunk{'s' if k > 1 else ''} ({summary})"
    return captured, dataclasses.replace(chosen, message="; ".join(filter(None, (chosen.message, note))))


def _is_percentage(budget: int | str) -> bool:
    return isinstance(budget, str) and budget.strip().endswith("%")


def _tried_text(k: int, result: Plan | InfeasibleBudgetError | RowSplitError) -> str:
    if isinstance(result, Plan):
        return f"k={k}: {result.extra_percent:.2f}% extra compute"
    if isinstance(result, RowSplitError):
        return f"k={k}: not split ({result})"
    needs = result.smallest_feasible_bytes
    return f"k={k}: infeasible" + (f" (needs {needs} B)" if needs is not None else "")


def _smallest_infeasible(tried, budget_bytes: int) -> InfeasibleBudgetError:
    """The error of the candidate whose smallest feasible budget is least, saying which k."""
    errors = [(k, e) for k, _, e in tried if isinstance(e, InfeasibleBudgetError)]
    k, best = min(errors, key=lambda t: (t[1].smallest_feasible_bytes is None,
                                         t[1].smallest_feasible_bytes or 0))
    lowers = [e.lower_bound_bytes for _, e in errors]
    lower = None if any(b is None for b in lowers) else min(lowers)
    detail = "" if len(errors) == 1 else \
        f" (row chunks tried: {', '.join(str(k_) for k_, _ in errors)}; the least needs k={k})"
    return InfeasibleBudgetError(budget_bytes, best.smallest_feasible_bytes, detail,
                                 exact=best.exact and len(errors) == 1, lower_bound_bytes=lower)
