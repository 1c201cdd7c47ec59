"""The search behind ``split="auto"``: plan each row-chunk count of the LM head + loss and of the
MLPs, and keep the cheapest plan that fits.

Why a search over k and not a solver variable: a split changes the graph (k chunks are k
logits values), so each candidate is captured and planned, and the cheapest plan that fits the
budget wins (ties go to fewer chunks). ``k = 1`` (unsplit) is always a candidate, so ``auto`` is
never worse than no split; it costs one capture and plan per candidate, which is why it is not
the default. ``auto`` searches the head first (k = 1, 2, 4, 8 with the MLPs unsplit), then the
MLPs (m = 2, 4, 8) with the head's best k: at most 7 candidates, not 16, and it stops as soon as
a plan recomputes nothing. Percentage budgets stay percentages of the unsplit step's store-all
peak (plain autograd's), whatever is chosen.

What a capture is (`optimize`'s `CapturedStep`, the compile backend's joint graph of one
dynamo graph) and which error says a split cannot be made (`frontends.split.row_split.RowSplitError`)
belong to the frontends; this module only needs the capture's ``graph`` (a `RematGraph`) and is
told the error type, so both `optimizer.split_plan` and `frontends.compile.auto_split` run the
same search, and read ``split`` / ``split_mlp`` the same way (`split_choices`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from solvers.base import InfeasibleBudgetError
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import Budget
from solvers.ir.graph import RematGraph
from solvers.ir.plan import Plan
from solvers.planning.planner import store_all_peak_bytes

SPLIT_CHOICES = (1, 2, 4, 8)
"""Row chunks ``split="auto"`` tries (for the head, then for the MLPs)."""

Candidate = tuple[int, int]
"""(head chunks, MLP chunks)."""


def split_choices(split: object, split_mlp: object,
                  check: Callable[[object, str], int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(head counts, MLP counts) to plan: None -> (1,), ``"auto"`` -> `SPLIT_CHOICES`, k ->
    (``check(k, name)``,); ``split_mlp`` None searches the MLPs too under ``split="auto"``.

    ``check`` is the caller's: `optimize` and the compile backend word a bad count their own way.
    """
    heads = _choices(split, "split", check)
    if split_mlp is None and split == "auto":
        return heads, SPLIT_CHOICES
    return heads, _choices(split_mlp, "split_mlp", check)


def _choices(chunks: object, name: str, check: Callable[[object, str], int]) -> tuple[int, ...]:
    if chunks is None:
        return (1,)
    if chunks == "auto":
        return SPLIT_CHOICES
    return (check(chunks, name),)


class _Captured(Protocol):
    graph: RematGraph


C = TypeVar("C", bound=_Captured)


@dataclass(frozen=True)
class SplitChoice(Generic[C]):
    """The candidate kept: its capture, its plan (the message says the choice under ``auto``)."""

    captured: C
    plan: Plan
    chunks: Candidate
    note: str = ""
    """``auto``: which k (and m) was chosen and what every candidate cost ('' otherwise)."""


def search_splits(capture: Callable[[int, int], C], plan: Callable[[C, int], Plan], budget: Budget | int | str,
                  heads: tuple[int, ...], mlps: tuple[int, ...], allocator: AllocatorModel | None,
                  refused: type[Exception]) -> SplitChoice[C]:
    """The cheapest plan over head chunk counts ``heads`` and MLP chunk counts ``mlps``.

    ``capture(k, m)`` captures the step with the head in k and the MLPs in m row chunks, raising
    ``refused`` where that split cannot be made; ``plan(captured, budget_bytes)`` plans it. More
    than one count (``auto``) searches the head first, then the MLPs with the head's best k; a
    refused candidate under ``auto`` is planned without that split and the note says why, an
    explicit count refused raises. Raises the `InfeasibleBudgetError` naming the smallest budget
    any candidate needs when none fits.
    """
    auto = len(heads) > 1 or len(mlps) > 1
    first = (heads[0], mlps[0])
    budget = Budget.of(budget)
    unsplit = capture(1, 1) if first == (1, 1) or budget.is_percentage else None
    allocator = allocator or AllocatorModel(block_bytes=1)
    reference = 0 if unsplit is None else store_all_peak_bytes(unsplit.graph, allocator)
    budget_bytes = budget.resolve(reference)  # a percentage is of the unsplit step
    tried: list[tuple[Candidate, C | None, Plan | Exception]] = []

    def search(candidates: list[Candidate], may_refuse: bool) -> None:
        for k, m in candidates:
            try:
                captured = unsplit if (k, m) == (1, 1) and unsplit is not None else capture(k, m)
            except refused as err:
                if not may_refuse:
                    raise
                tried.append(((k, m), None, err))
                return  # the same chain is refused at every chunk count
            try:
                tried.append(((k, m), captured, plan(captured, budget_bytes)))
            except InfeasibleBudgetError as err:
                tried.append(((k, m), captured, err))
            if auto and isinstance(tried[-1][2], Plan) and tried[-1][2].extra_time_s == 0:
                return  # nothing recomputed: more chunks cannot make the step cheaper

    search([(k, mlps[0]) for k in heads], len(heads) > 1)
    if len(mlps) > 1 and not _recomputes_nothing(tried):
        search([(_best_head(tried), m) for m in mlps[1:]], True)
    plans = [(c, cap, p) for c, cap, p in tried if isinstance(p, Plan)]
    if not plans:
        refusals = [e for _, _, e in tried if isinstance(e, refused)]
        if len(refusals) == len(tried):  # the one split asked for with every k (split_mlp=m) was refused
            raise refusals[0]
        raise _smallest_infeasible(tried, budget_bytes)
    (k, m), captured, chosen = min(plans, key=lambda t: (t[2].objective, t[0][0] * t[0][1], t[0]))
    if not auto:
        return SplitChoice(captured, chosen, (k, m))
    summary = ", ".join(_tried_text(c, result) for c, _, result in tried)
    mlp_text = f" and {m} for the MLPs" if len(mlps) > 1 else ""
    note = (f"split='auto' chose {k} row chunk{'s' if k > 1 else ''}{mlp_text}, the least step cost under "
            f"the cost model ({summary})")
    return SplitChoice(captured, dataclasses.replace(chosen, message="; ".join(filter(None, (chosen.message, note)))),
                       (k, m), note)


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


def _tried_text(candidate: Candidate, result: Plan | Exception) -> str:
    k, m = candidate
    name = f"k={k}" + (f"/mlp={m}" if m > 1 else "")
    if isinstance(result, Plan):
        # The candidates are compared by the whole step's cost (their plain steps differ: the
        # concatenations), so that is shown next to the extra share of each one's own step.
        step = f"step {result.objective:.4g} s, " if result.objective is not None else ""
        return f"{name}: {step}{result.extra_percent:.2f}% extra compute"
    if not isinstance(result, InfeasibleBudgetError):
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
