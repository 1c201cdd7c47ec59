"""Choose how many row chunks the LM head and loss (`frontends.split.row_split`) and the MLPs
(`frontends.split.mlp_split`) run in, by capturing and planning each candidate.

The search itself (which candidates, in which order, the cheapest plan that fits, the message)
is `solvers.planning.split_search`, shared with the compile backend's ``split="auto"``; this
module checks `optimize`'s arguments and runs the search on `CapturedStep`s.
"""

from __future__ import annotations

from collections.abc import Callable

from frontends.capture.step import CapturedStep
from frontends.split.row_split import RowSplitError, check_chunks
from solvers.ir.allocator import AllocatorModel
from solvers.ir.plan import Plan
from solvers.planning.split_search import SPLIT_CHOICES, Candidate, search_splits, split_choices

__all__ = ["SPLIT_CHOICES", "Candidate", "check_split", "chunks_of", "plan_with_split"]


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
