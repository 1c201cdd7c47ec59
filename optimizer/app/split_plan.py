"""Choose how many row chunks the LM head and loss (`frontends.row_split`) and the MLPs
(`frontends.mlp_split`) run in, by planning each candidate.

Why a search over k and not a solver variable: a split changes the graph (k chunks are k
logits values), so each candidate is captured and planned, and the cheapest plan that fits the
budget wins (ties go to fewer chunks). ``k = 1`` (unsplit) is always a candidate, so ``auto`` is
never worse than no split; it costs one capture and plan per candidate, which is why it is not
the default. ``auto`` searches the head first (k = 1, 2, 4, 8 with the MLPs unsplit), then the
MLPs (m = 2, 4, 8) with the head's best k: at most 7 candidates, not 16, and it stops as soon as
a plan recomputes nothing. Percentage budgets stay percentages of the unsplit step's store-all
peak (plain autograd's), whatever is chosen.
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
"""Row chunks ``split="auto"`` tries (for the head, then for the MLPs)."""


def check_split(split: object, name: str = "split") -> tuple[int, ...]:
    """The chunk counts ``split`` asks for: None -> (1,), ``"auto"`` -> `SPLIT_CHOICES`, k -> (k,)."""
    if split is None:
        return (1,)
    if split == "auto":
        return SPLIT_CHOICES
    try:
        return (check_chunks(split),)
    except RowSplitError:
        raise ValueError(f"{name} must be None, 'auto' or a positive number of row chunks, got {split!r}") \
            from None


def mlp_choices(split: object, split_mlp: object) -> tuple[int, ...]:
    """The MLP chunk counts to plan: ``split_mlp``'s, or, when it is None, all of `SPLIT_CHOICES`
    under ``split="auto"`` and none (1) otherwise."""
    if split_mlp is None:
        return SPLIT_CHOICES if split == "auto" else (1,)
    return check_split(split_mlp, "split_mlp")


def chunks_of(captured: CapturedStep) -> tuple[int, int]:
    """(head chunks, MLP chunks) the captured step runs in (1: unsplit)."""
    head = captured.row_splits[0].chunks if captured.row_splits else 1
    return head, captured.mlp_splits.chunks


Candidate = tuple[int, int]
"""(head chunks, MLP chunks)."""
_Result = Plan | InfeasibleBudgetError | RowSplitError


def plan_with_split(capture: Callable[[int, int], CapturedStep],
                    plan: Callable[[CapturedStep, int], Plan],
                    budget: int | str, split: object, allocator: AllocatorModel | None,
                    split_mlp: object = None) -> tuple[CapturedStep, Plan]:
    """The cheapest plan over the chunk counts ``split`` and ``split_mlp`` ask for, with its capture.

    ``capture(k, m)`` captures the step with the head in k and the MLPs in m row chunks;
    ``plan(captured, budget_bytes)`` plans it. An explicit split that cannot be made raises
    `frontends.row_split.RowSplitError`; ``auto`` then plans without it and says why in the
    plan's message. Raises the `InfeasibleBudgetError` naming the smallest budget any candidate
    needs when none fits.
    """
    heads, mlps = check_split(split), mlp_choices(split, split_mlp)
    auto = split == "auto" or split_mlp == "auto"
    first = (heads[0], mlps[0])
    unsplit = capture(1, 1) if first == (1, 1) or _is_percentage(budget) else None
    allocator = allocator or AllocatorModel(block_bytes=1)
    reference = 0 if unsplit is None else store_all_peak_bytes(unsplit.graph, allocator)
    budget = resolve_budget(budget, reference)  # a percentage is of the unsplit step
    tried: list[tuple[Candidate, CapturedStep | None, _Result]] = []

    def search(candidates: list[Candidate], may_refuse: bool) -> None:
        for k, m in candidates:
            try:
                captured = unsplit if (k, m) == (1, 1) and unsplit is not None else capture(k, m)
            except RowSplitError as err:
                if not may_refuse:
                    raise
                tried.append(((k, m), None, err))
                return  # the same chain is refused at every chunk count
            try:
                tried.append(((k, m), captured, plan(captured, budget)))
            except InfeasibleBudgetError as err:
                tried.append(((k, m), captured, err))
            if auto and isinstance(tried[-1][2], Plan) and tried[-1][2].extra_time_s == 0:
                return  # nothing recomputed: more chunks cannot make the step cheaper

    search([(k, mlps[0]) for k in heads], split == "auto")
    if len(mlps) > 1 and not _recomputes_nothing(tried):
        search([(_best_head(tried), m) for m in mlps[1:]], split_mlp in (None, "auto"))
    plans = [(c, cap, p) for c, cap, p in tried if isinstance(p, Plan)]
    if not plans:
        refused = [e for _, _, e in tried if isinstance(e, RowSplitError)]
        if len(refused) == len(tried):  # the one split asked for with every k (split_mlp=m) was refused
            raise refused[0]
        raise _smallest_infeasible(tried, budget)
    (k, m), captured, chosen = min(plans, key=lambda t: (t[2].objective, t[0][0] * t[0][1], t[0]))
    if not auto:
        return captured, chosen
    summary = ", ".join(_tried_text(c, result) for c, _, result in tried)
    mlp_text = f" and {m} for the MLPs" if len(mlps) > 1 else ""
    note = (f"split='auto' chose {k} row chunk{'s' if k > 1 else ''}{mlp_text}, the least step cost under "
            f"the cost model ({summary})")
    return captured, dataclasses.replace(chosen, message="; ".join(filter(None, (chosen.message, note))))


def _recomputes_nothing(tried) -> bool:
    return any(isinstance(p, Plan) and p.extra_time_s == 0 for _, _, p in tried)


def _best_head(tried) -> int:
    """The head's chunk count with the cheapest plan, else with the least smallest feasible budget."""
    plans = [(c, p) for c, _, p in tried if isinstance(p, Plan)]
    if plans:
        return min(plans, key=lambda t: (t[1].objective, t[0]))[0][0]
    errors = [(c, e) for c, _, e in tried if isinstance(e, InfeasibleBudgetError)]
    if not errors:
        return 1
    return min(errors, key=lambda t: (t[1].smallest_feasible_bytes is None,
                                      t[1].smallest_feasible_bytes or 0, t[0]))[0][0]


def _is_percentage(budget: int | str) -> bool:
    return isinstance(budget, str) and budget.strip().endswith("%")


def _tried_text(candidate: Candidate, result: _Result) -> str:
    k, m = candidate
    name = f"k={k}" + (f"/mlp={m}" if m > 1 else "")
    if isinstance(result, Plan):
        # The candidates are compared by the whole step's cost (their plain steps differ: the
        # concatenations), so that is shown next to the extra share of each one's own step.
        step = f"step {result.objective:.4g} s, " if result.objective is not None else ""
        return f"{name}: {step}{result.extra_percent:.2f}% extra compute"
    if isinstance(result, RowSplitError):
        return f"{name}: not split ({result})"
    needs = result.smallest_feasible_bytes
    return f"{name}: infeasible" + (f" (needs {needs} B)" if needs is not None else "")


def _smallest_infeasible(tried, budget_bytes: int) -> InfeasibleBudgetError:
    """The error of the candidate whose smallest feasible budget is least, saying which k."""
    errors = [(k, e) for k, _, e in tried if isinstance(e, InfeasibleBudgetError)]
    (k, m), best = min(errors, key=lambda t: (t[1].smallest_feasible_bytes is None,
                                              t[1].smallest_feasible_bytes or 0))
    lowers = [e.lower_bound_bytes for _, e in errors]
    lower = None if any(b is None for b in lowers) else min(lowers)
    least = f"k={k}" + (f", {m} MLP chunks" if m > 1 else "")
    detail = "" if len(errors) == 1 else \
        f" (row chunks tried: {', '.join(_name(c) for c, _ in errors)}; the least needs {least})"
    return InfeasibleBudgetError(budget_bytes, best.smallest_feasible_bytes, detail,
                                 exact=best.exact and len(errors) == 1, lower_bound_bytes=lower)


def _name(candidate: Candidate) -> str:
    k, m = candidate
    return str(k) if m == 1 else f"{k}/mlp {m}"
