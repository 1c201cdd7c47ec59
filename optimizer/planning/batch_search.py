"""The largest batch that fits a budget, per strategy, without allocating a single activation.

Remat trades compute for memory; what users buy with the memory is usually a bigger batch, and
a bigger batch can raise throughput even after paying for the recomputation. For each strategy
this finds the largest batch whose plan fits the budget: from the example's batch, an
exponential search (doubling while it fits, halving until it does), then a binary search between
the last batch that fits and the first that does not. Each batch size is captured once (shared
by every strategy) on the meta device:
the model's parameters and the inputs become meta tensors, so capture allocates nothing and a
batch of 10^6 costs what a batch of 1 does. The search assumes what holds for training steps:
a batch that does not fit is not followed by a larger one that does.

The search is pure; `frontends.meta_capture.MetaCapturer` captures the steps it asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from optimizer.ir.allocator import AllocatorModel
from optimizer.ir.graph import RematGraph
from optimizer.ir.simulator import simulate
from optimizer.planning.sweep import SweepPoint
from solvers import get_solver
from solvers.base import SolverOptions
from solvers.checkmate.contract import classic_schedules
from solvers.checkmate.min_budget import peak_lower_bound

DEFAULT_LIMIT = 1 << 20
"""Largest batch the search tries: a model whose peak does not grow with the batch stops here."""

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}
"""The ``--dtype`` names a what-if accepts, and the torch dtype each stands for."""


class WhatIfError(ValueError):
    """A what-if question that cannot be answered as asked; the message says what to give."""


class StrategyUnavailable(Exception):
    """The strategy does not apply to this model at all (revolve on a graph that is not a chain,
    torch's partitioner failing): no batch size would change that."""


@dataclass(frozen=True)
class BatchFit:
    """One strategy's largest batch within the budget, and what a step at that batch costs."""

    strategy: str
    max_batch: int
    """0 when not even a batch of 1 fits."""
    capped: bool
    """The search limit was reached: the true maximum may be larger."""
    point: SweepPoint | None
    """The strategy's plan at ``max_batch`` (peak, extra time); None when ``max_batch`` is 0."""
    step_time_s: float | None
    """A plain step at ``max_batch`` under the cost model (recomputation not included)."""
    probes: tuple[tuple[int, bool], ...]
    """(batch, fits) in the order the search tried them."""
    message: str = ""
    applicable: bool = True
    """False when the strategy does not apply to this model (``message`` says why)."""

    @property
    def samples_per_s(self) -> float | None:
        """Estimated throughput: batch / (plain step time + recomputation time)."""
        if not self.max_batch or self.point is None or self.step_time_s is None:
            return None
        seconds = self.step_time_s + (self.point.extra_time_s or 0.0)
        return self.max_batch / seconds if seconds > 0 else None


@dataclass(frozen=True)
class MaxBatchResult:
    budget_bytes: int
    batch_dim: int
    base_batch: int
    """The batch size of the example inputs."""
    limit: int
    fits: tuple[BatchFit, ...]
    captures: int
    """Distinct batch sizes captured (every strategy shares them)."""


def search_max_batch(fits: Callable[[int], bool], limit: int = DEFAULT_LIMIT,
                     start: int = 1) -> tuple[int, bool, tuple]:
    """Largest b in [1, limit] with ``fits(b)``, assuming fits is monotone (true, then false).

    Starts at ``start`` (the example's batch is a good guess), doubles while it fits or halves
    until it does, then bisects between the last batch that fits and the first that does not.
    Returns (batch, capped, probes): batch 0 when not even 1 fits; capped when ``limit`` fits.
    """
    probes: list[tuple[int, bool]] = []

    def probe(b: int) -> bool:
        ok = fits(b)
        probes.append((b, ok))
        return ok

    if limit < 1:
        return 0, False, ()
    low, high = 0, None  # fits(low) (0 stands for "nothing yet"), not fits(high)
    b = max(1, min(start, limit))
    if probe(b):
        low = b
        while high is None:
            if low == limit:
                return low, True, tuple(probes)
            b = min(low * 2, limit)
            if probe(b):
                low = b
            else:
                high = b
    else:
        high = b
        while low == 0 and high > 1:
            b = high // 2
            if probe(b):
                low = b
            else:
                high = b
        if low == 0:
            return 0, False, tuple(probes)
    while high - low > 1:
        mid = (low + high) // 2
        if probe(mid):
            low = mid
        else:
            high = mid
    return low, False, tuple(probes)


class BatchCapturer(Protocol):
    """What the search needs of a capture at any batch size (`frontends.meta_capture.MetaCapturer`
    is the torch implementation): the step at a batch, and the batch the example inputs have."""

    batch_dim: int | None
    base_batch: int | None

    def at(self, batch: int | None = None) -> Any: ...

    @property
    def captures(self) -> int: ...


def find_max_batches(
    capturer: BatchCapturer,
    budget_bytes: int,
    strategies: Sequence[str],
    evaluate: Callable[[Any, str, int], SweepPoint | None],
    *,
    limit: int = DEFAULT_LIMIT,
    progress: Callable[[str], None] | None = None,
    decide: Callable[[Any, str, int], bool | None] | None = None,
) -> MaxBatchResult:
    """For each strategy, the largest batch whose plan fits ``budget_bytes``.

    ``evaluate(captured, strategy, budget_bytes)`` returns the strategy's cheapest simulated plan
    within the budget, or None when it has none (see `optimizer.planning.sweep.run_sweep` and
    `SweepResult.best_at`); it raises `StrategyUnavailable` when the strategy cannot run at all.
    ``decide(captured, strategy, budget_bytes)`` answers a probe without solving where a cheap
    bound settles it (`cheap_fit`), or returns None; the plan at the answer is always solved, and
    a strategy whose solved plan there does not fit is searched again without shortcuts.
    """
    if capturer.batch_dim is None:
        raise WhatIfError("no batch dimension: the inputs have no tensor to grow; give --batch-dim")
    tick = progress or (lambda _: None)
    results: list[BatchFit] = []
    for strategy in strategies:
        plans: dict[int, SweepPoint | None] = {}

        def fits(batch: int, shortcuts: bool = True) -> bool:
            quick = decide(capturer.at(batch), strategy, budget_bytes) if decide and shortcuts else None
            if quick is not None:
                return quick
            plans[batch] = evaluate(capturer.at(batch), strategy, budget_bytes)
            tick(f"{strategy} at batch {batch}")
            return plans[batch] is not None

        try:
            best, capped, probes = search_max_batch(fits, limit, start=capturer.base_batch)
            if best and best not in plans:  # decided by a bound: the plan there is still solved
                if not fits(best, shortcuts=False):
                    plans.clear()
                    best, capped, probes = search_max_batch(lambda b: fits(b, shortcuts=False), limit,
                                                            start=capturer.base_batch)
        except StrategyUnavailable as err:
            results.append(BatchFit(strategy, 0, False, None, None, (), f"not applicable: {err}",
                                    applicable=False))
            continue
        point = plans.get(best) if best else None
        step = capturer.at(best).graph.base_cost if best else None
        message = "" if best else "not even a batch of 1 fits the budget"
        if capped:
            message = f"still fits at the search limit {limit}: the peak may not grow with this batch dimension"
        results.append(BatchFit(strategy, best, capped, point, step, probes, message))
    return MaxBatchResult(budget_bytes, capturer.batch_dim, capturer.base_batch, limit, tuple(results),
                          capturer.captures)


def cheap_fit(graph: RematGraph, budget_bytes: int, allocator: AllocatorModel, searching: bool,
              options: SolverOptions) -> bool | None:
    """Whether a plan of ``graph`` fits ``budget_bytes``, when a cheap bound settles it; else None.

    False when the lower bound on every schedule's peak (`peak_lower_bound`) is above the budget:
    no strategy fits. True, for a ``searching`` solver (`SEARCHING_SOLVERS`: it returns a fitting
    plan whenever any schedule it tries fits), when store-all, recompute-all or the greedy
    saved-set schedule fits: it tries all three. Exact implications, so the search's answer is the
    one full solves would give; only the solves in between are spent.
    """
    checked = allocator.apply(graph)
    room = allocator.solver_budget(budget_bytes)
    if peak_lower_bound(checked) > room:
        return False
    if not searching:
        return None
    if min(c.peak for c in classic_schedules(checked)) <= room:
        return True
    try:
        greedy = get_solver("greedy")(checked, room, options)
    except ValueError:  # InfeasibleBudgetError: greedy found nothing under the budget
        return None
    return True if greedy.schedule is not None and simulate(checked, greedy.schedule).peak_bytes <= room else None
