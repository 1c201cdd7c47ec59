"""The search behind ``split="auto"``: plan each row-chunk count of the LM head + loss and of the
MLPs, and keep the cheapest plan that fits.

Why a search over k and not a solver variable: a split changes the graph (k chunks are k
logits values), so each candidate is captured and planned, and the cheapest plan that fits the
budget wins (ties go to fewer chunks). ``k = 1`` (unsplit) is always a candidate, so ``auto`` is
never worse than no split; it costs one capture and plan per candidate, which is why it is not
run where the unsplit plan fits. ``auto`` searches the head first (k = 1, 2, 4, 8 with the MLPs unsplit), then the
MLPs (m = 2, 4, 8) with the head's best k: at most 7 candidates, not 16, and it stops as soon as
a plan recomputes nothing. Percentage budgets stay percentages of the unsplit step's store-all
peak (plain autograd's), whatever is chosen.

``split=None`` (the default) plans unsplit and only when no whole-tensor plan fits runs
`fallback_split`: the finest split that can be made (k = 8, m = 8) is probed first, so a budget
no split reaches either costs one more capture, not seven, and raises `SplitInfeasibleError`
naming both floors; where the probe fits, the search above picks the cheapest split that fits,
reusing the unsplit and probe plans. A fitting unsplit plan pays nothing. ``split=1`` opts out.

What a capture is (`optimize`'s `CapturedStep`, the compile backend's joint graph of one
dynamo graph) and which error says a split cannot be made (`frontends.split.row_split.RowSplitError`)
belong to the frontends; this module only needs the capture's ``graph`` (a `RematGraph`) and is
told the error type, so both `optimizer.split_plan` and `frontends.compile.auto_split` run the
same search, and read ``split`` / ``split_mlp`` the same way (`split_choices`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
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
Tried = tuple["_Captured | None", "Plan | Exception"]
"""A candidate's capture (None where it was refused) and its plan, or why it has none."""


def falls_back(split: object, split_mlp: object) -> bool:
    """Whether ``split`` / ``split_mlp`` as given leave the planner free to split the step when no
    whole-tensor plan fits: only when neither was given (None). An explicit value, ``1``
    included, is the user's choice and is never overridden."""
    return split is None and split_mlp is None


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
                  refused: type[Exception], *, known: Mapping[Candidate, Tried] | None = None,
                  why: str = "") -> SplitChoice[C]:
    """The cheapest plan over head chunk counts ``heads`` and MLP chunk counts ``mlps``.

    ``capture(k, m)`` captures the step with the head in k and the MLPs in m row chunks, raising
    ``refused`` where that split cannot be made; ``plan(captured, budget_bytes)`` plans it. More
    than one count (``auto``) searches the head first, then the MLPs with the head's best k; a
    refused candidate under ``auto`` is planned without that split and the note says why, an
    explicit count refused raises. Raises the `InfeasibleBudgetError` naming the smallest budget
    any candidate needs when none fits.

    ``known``: candidates already captured and planned at this budget (``fallback_split``'s
    unsplit plan and probe), used instead of planning them again (a known result with no
    capture must be infeasible: a percentage ``budget`` needs the unsplit capture). ``why``:
    said before the note (why the search ran).
    """
    known = known or {}
    auto = len(heads) > 1 or len(mlps) > 1
    first = (heads[0], mlps[0])
    budget = Budget.of(budget)
    if (1, 1) in known:
        unsplit = known[(1, 1)][0]
    else:
        unsplit = capture(1, 1) if first == (1, 1) or budget.is_percentage else None
    allocator = allocator or AllocatorModel(block_bytes=1)
    reference = 0 if unsplit is None else store_all_peak_bytes(unsplit.graph, allocator)
    budget_bytes = budget.resolve(reference)  # a percentage is of the unsplit step
    tried: list[tuple[Candidate, C | None, Plan | Exception]] = []

    def search(candidates: list[Candidate], may_refuse: bool) -> None:
        for k, m in candidates:
            if (k, m) in known:
                tried.append(((k, m), *known[k, m]))
            else:
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
    tried.extend((c, *result) for c, result in known.items() if c not in {t[0] for t in tried})
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
    if len(heads) > 1:
        chose = f"split='auto' chose {_chunks(k)}" + (f" and {m} for the MLPs" if len(mlps) > 1 else "")
    else:
        chose = f"split_mlp='auto' chose {_chunks(m)} for the MLPs"
    note = f"{why}{chose}, the least step cost under the cost model ({summary})"
    return SplitChoice(captured, dataclasses.replace(chosen, message="; ".join(filter(None, (chosen.message, note)))),
                       (k, m), note)


class SplitInfeasibleError(InfeasibleBudgetError):
    """No whole-tensor plan fits, and the finest split that can be made does not fit either
    (``split=None``'s fallback, `fallback_split`). The message gives both floors and what to do;
    ``smallest_feasible_bytes`` is the smaller of the two budgets found to fit (where the split's
    is smaller, the step is split by itself at that budget); ``lower_bound_bytes`` the lesser of
    the two bounds known."""

    def __init__(self, unsplit: InfeasibleBudgetError, chunks: Candidate | None, split: InfeasibleBudgetError | None):
        self.unsplit_smallest_bytes = unsplit.smallest_feasible_bytes
        """The least budget an unsplit plan was found to fit (None: none found)."""
        self.unsplit_lower_bound_bytes = unsplit.lower_bound_bytes
        """No unsplit plan fits below it (None: not known)."""
        self.split_chunks = chunks
        """(head chunks, MLP chunks) of the split probed; None: the step has nothing to split."""
        self.split_smallest_bytes = split.smallest_feasible_bytes if split is not None else None
        """The least budget that split was found to fit (None: none found, or nothing to split)."""
        if split is None:  # nothing to split: the unsplit figures are the step's
            super().__init__(unsplit.budget_bytes, unsplit.smallest_feasible_bytes,
                             f"{unsplit.detail}; the step has no LM head + loss or MLP chain to split",
                             exact=unsplit.exact, lower_bound_bytes=unsplit.lower_bound_bytes)
            return
        found = [b for b in (self.unsplit_smallest_bytes, self.split_smallest_bytes) if b is not None]
        bounds = [b for b in (unsplit.lower_bound_bytes, split.lower_bound_bytes) if b is not None]
        smallest = min(found) if found else None
        super().__init__(unsplit.budget_bytes, smallest, self._detail(unsplit, split, smallest),
                         lower_bound_bytes=min(bounds) if len(bounds) == 2 else None)

    @property
    def split_summary(self) -> str:
        """Both floors in a few words, for a one-line report (the CLI's)."""
        if self.split_chunks is None:
            return "the step has no LM head + loss or MLP chain to split"
        return (f"unsplit the least plan found needs {_bytes_or_none(self.unsplit_smallest_bytes)}, "
                f"split ({self._split_text()}) {_bytes_or_none(self.split_smallest_bytes)}")

    def _split_text(self) -> str:
        k, m = self.split_chunks
        parts = ([f"the LM head + loss in {_chunks(k)}"] if k > 1 else []) + (
            [f"the MLPs in {_chunks(m)}"] if m > 1 else [])
        return " and ".join(parts)

    def _detail(self, unsplit: InfeasibleBudgetError, split: InfeasibleBudgetError, smallest: int | None) -> str:
        text = (f"; unsplit (whole tensors): {_least(unsplit)}{unsplit.detail}; split finest "
                f"({self._split_text()}): {_least(split)}")
        if smallest is None:
            return text
        if smallest == self.split_smallest_bytes and smallest != self.unsplit_smallest_bytes:
            return f"{text}; at a budget of {smallest} bytes the step is split by itself and fits"
        return f"{text}; splitting does not lower the floor: raise the budget to {smallest} bytes"


def _bytes_or_none(n: int | None) -> str:
    return "no plan found" if n is None else f"{n} bytes"


def _least(err: InfeasibleBudgetError) -> str:
    """What a candidate's `InfeasibleBudgetError` says it needs, in a few words."""
    text = (f"the least plan found needs {err.smallest_feasible_bytes} bytes" if err.smallest_feasible_bytes
            is not None else "no plan found")
    return text + (f", none fits below {err.lower_bound_bytes} bytes" if err.lower_bound_bytes is not None else "")


def fallback_split(capture: Callable[[int, int], C], plan: Callable[[C, int], Plan],
                   unsplit: C | None, unsplit_error: InfeasibleBudgetError, allocator: AllocatorModel | None,
                   refused: type[Exception], heads: tuple[int, ...] = SPLIT_CHOICES,
                   mlps: tuple[int, ...] = SPLIT_CHOICES) -> SplitChoice[C]:
    """``split=None`` when the unsplit step (``unsplit``, its capture if at hand) raised
    ``unsplit_error``: split the step the cheapest way that fits the same budget in bytes.

    The finest split that can be made is probed first (max ``heads`` x max ``mlps``, then the
    head alone, then the MLPs alone, as ``refused`` allows): splitting lowers the floor the most
    there, so where it does not fit no coarser split is searched and `SplitInfeasibleError`
    names both floors. Where it fits, `search_splits` picks the cheapest candidate that fits
    (the unsplit plan and the probe are not planned again); the plan's message says that the
    planner split the step and how to opt out (``split=1``)."""
    budget_bytes = unsplit_error.budget_bytes
    known: dict[Candidate, Tried] = {(1, 1): (unsplit, unsplit_error)}
    finest = [(max(heads), max(mlps)), (max(heads), 1), (1, max(mlps))]
    for chunks in dict.fromkeys(c for c in finest if c != (1, 1)):  # in order, without repeats
        try:
            captured = capture(*chunks)
        except refused:
            continue
        try:
            known[chunks] = (captured, plan(captured, budget_bytes))
        except InfeasibleBudgetError as err:
            raise SplitInfeasibleError(unsplit_error, chunks, err) from None
        break
    else:
        raise SplitInfeasibleError(unsplit_error, None, None) from None
    needs = unsplit_error.smallest_feasible_bytes
    why = (f"no whole-tensor plan fits {budget_bytes} bytes"
           + (f" (unsplit, the least plan needs {needs} bytes)" if needs is not None else "")
           + ", so the planner split the step (split=1 never splits): ")
    return search_splits(capture, plan, budget_bytes, heads, mlps, allocator, refused, known=known, why=why)


def _chunks(n: int) -> str:
    return f"{n} row chunk{'s' if n > 1 else ''}"


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
