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

The search is pure; `frontends.capture.meta_capture.MetaCapturer` captures the steps it asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from solvers import get_solver
from solvers.base import SolverOptions
from solvers.checkmate.contract import classic_schedules
from solvers.checkmate.min_budget import peak_lower_bound
from solvers.ir.allocator import AllocatorModel
from solvers.ir.graph import RematGraph
from solvers.ir.simulator import simulate
from solvers.planning.parallel import map_forked
from solvers.planning.sweep import SweepPoint

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
    """Captures made (sizes the fitted graphs answered took none; parallel workers capture apart)."""


def search_max_batch(fits: Callable[[int], bool], limit: int = DEFAULT_LIMIT,
                     start: int = 1, high: int | None = None) -> tuple[int, bool, tuple]:
    """Largest b in [1, limit] with ``fits(b)``, assuming fits is monotone (true, then false).

    Starts at ``start`` (the example's batch is a good guess), doubles while it fits or halves
    until it does, then bisects between the last batch that fits and the first that does not.
    ``high``: a batch already known not to fit (no probe at or above it).
    Returns (batch, capped, probes): batch 0 when not even 1 fits; capped when ``limit`` fits.
    """
    probes: list[tuple[int, bool]] = []

    def probe(b: int) -> bool:
        ok = fits(b)
        probes.append((b, ok))
        return ok

    if limit < 1 or high is not None and high <= 1:
        return 0, False, ()
    known_unfit = high if high is not None and high <= limit else None
    low, high = 0, known_unfit  # fits(low) (0 stands for "nothing yet"), not fits(high)
    b = max(1, min(start, limit, (high or limit + 1) - 1))
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
    return _bisect(probe, low, high), False, tuple(probes)


def _bisect(probe: Callable[[int], bool], low: int, high: int) -> int:
    """The last batch that fits between ``low`` (fits) and ``high`` (does not)."""
    while high - low > 1:
        mid = (low + high) // 2
        if probe(mid):
            low = mid
        else:
            high = mid
    return low


def search_near(fits: Callable[[int], bool], limit: int = DEFAULT_LIMIT, start: int = 1,
                high: int | None = None) -> tuple[int, bool, tuple]:
    """`search_max_batch` for a good guess ``start``: steps of 1, 2, 4, ... away from it, then
    bisection, so an answer d away costs about 2 log2(d) + 2 probes (2 when the guess is right)."""
    probes: list[tuple[int, bool]] = []

    def probe(b: int) -> bool:
        ok = fits(b)
        probes.append((b, ok))
        return ok

    top = min(limit, high - 1) if high is not None else limit
    if top < 1:
        return 0, False, ()
    b = max(1, min(start, top))
    step = 1
    if probe(b):
        low, high = b, None
        while high is None:
            if low == top:
                return low, top == limit, tuple(probes)
            b = min(low + step, top)
            step *= 2
            if probe(b):
                low = b
            else:
                high = b
    else:
        low, high = 0, b
        while low == 0 and high > 1:
            b = max(1, high - step)
            step *= 2
            if probe(b):
                low = b
            else:
                high = b
        if low == 0:
            return 0, False, tuple(probes)
    return _bisect(probe, low, high), False, tuple(probes)


RECENTRE = 3
"""How often a stand-in search is re-centred on the evaluation at its answer before confirming."""


class BatchCapturer(Protocol):
    """What the search needs of a capture at any batch size (`frontends.capture.meta_capture.MetaCapturer`
    is the torch implementation): the graph at a batch (predicted where a checked fit covers
    it), the captured step where a strategy needs torch's graph, and the example's batch."""

    batch_dim: int | None
    base_batch: int | None

    def at(self, batch: int | None = None) -> Any: ...

    def graph_at(self, batch: int | None = None) -> RematGraph: ...

    @property
    def captures(self) -> int: ...


class ProbeStep:
    """One probe's step: ``graph`` (predicted or captured, as `BatchCapturer.graph_at` gives it)
    and, only when asked for, ``captured`` (a real capture at that batch)."""

    def __init__(self, capturer: BatchCapturer, batch: int) -> None:
        self.capturer, self.batch = capturer, batch

    @property
    def graph(self) -> RematGraph:
        return self.capturer.graph_at(self.batch)

    @property
    def captured(self) -> Any:
        return self.capturer.at(self.batch)


Evaluate = Callable[[ProbeStep, str, int], "SweepPoint | None"]


def find_max_batches(
    capturer: BatchCapturer,
    budget_bytes: int,
    strategies: Sequence[str],
    evaluate: Evaluate,
    *,
    limit: int = DEFAULT_LIMIT,
    progress: Callable[[str], None] | None = None,
    decide: Callable[[ProbeStep, str, int], bool | None] | None = None,
    ceiling: int | None = None,
    approximate: Callable[[str], Evaluate | None] | None = None,
    near: Mapping[str, int] | None = None,
    jobs: int = 1,
    slowest_first: Mapping[str, int] | None = None,
    in_parent: Sequence[str] = (),
) -> MaxBatchResult:
    """For each strategy, the largest batch whose plan fits ``budget_bytes``.

    ``evaluate(step, strategy, budget_bytes)`` returns the strategy's cheapest simulated plan
    within the budget, or None when it has none (see `solvers.planning.sweep.run_sweep` and
    `SweepResult.best_at`); it raises `StrategyUnavailable` when the strategy cannot run at all.
    ``decide(step, strategy, budget_bytes)`` answers a probe without solving where a cheap
    bound settles it (`cheap_fit`), or returns None; the plan at the answer is always solved, and
    a strategy whose solved plan there does not fit is searched again without shortcuts.
    ``ceiling``: a batch no schedule fits (`lower_bound_ceiling`): no probe reaches it, and the
    searches start just below it. ``approximate(strategy)``: a cheap stand-in for ``evaluate``
    (torch's partitions of the last batch it evaluated, judged on each batch's graph): the search
    runs on it, ``evaluate`` re-centres it at its answer (up to `RECENTRE` times) and `search_near`
    confirms, or moves, the answer with ``evaluate`` itself. ``near``: strategy -> a batch its
    answer is expected next to (the largest batch a classic schedule fits, for the exact
    solver), searched from by `search_near`. ``jobs > 1`` searches the strategies on forked
    workers (`solvers.planning.parallel`), ``slowest_first`` (strategy -> weight) ordering them;
    strategies in ``in_parent`` (those that run torch kernels) are searched in this process.
    """
    if capturer.batch_dim is None:
        raise WhatIfError("no batch dimension: the inputs have no tensor to grow; give --batch-dim")
    tick = progress or (lambda _: None)
    start = capturer.base_batch if ceiling is None else max(1, ceiling - 1)

    def search_one(strategy: str) -> tuple[BatchFit, int]:
        plans: dict[int, SweepPoint | None] = {}
        before = capturer.captures

        def fits(batch: int, shortcuts: bool = True, judge: Evaluate = evaluate) -> bool:
            step = ProbeStep(capturer, batch)
            quick = decide(step, strategy, budget_bytes) if decide and shortcuts else None
            if quick is not None:
                return quick
            plan = judge(step, strategy, budget_bytes)
            if judge is evaluate:
                plans[batch] = plan
                if jobs <= 1:  # a worker's progress would interleave with the parent's display
                    tick(f"{strategy} at batch {batch}")
            return plan is not None

        guess = (near or {}).get(strategy)
        search, first = (search_near, guess) if guess else (search_max_batch, start)
        stand_in = approximate(strategy) if approximate else None
        try:
            if stand_in is not None:
                first, _, _ = search(lambda b: fits(b, judge=stand_in), limit, start=first, high=ceiling)
                for _ in range(RECENTRE):
                    fits(max(first, 1))  # evaluated there: the stand-in now judges with that batch's choices
                    moved, _, _ = search_near(lambda b: fits(b, judge=stand_in), limit, start=max(first, 1),
                                              high=ceiling)
                    if moved == first:
                        break
                    first = moved
                best, capped, probes = search_near(fits, limit, start=max(first, 1), high=ceiling)
            else:
                best, capped, probes = search(fits, limit, start=first, high=ceiling)
            if best and best not in plans:  # decided by a bound: the plan there is still solved
                if not fits(best, shortcuts=False):
                    plans.clear()
                    best, capped, probes = search(lambda b: fits(b, shortcuts=False), limit,
                                                  start=first, high=ceiling)
        except StrategyUnavailable as err:
            return BatchFit(strategy, 0, False, None, None, (), f"not applicable: {err}",
                            applicable=False), capturer.captures - before
        point = plans.get(best) if best else None
        step = capturer.graph_at(best).base_cost if best else None
        message = "" if best else "not even a batch of 1 fits the budget"
        if capped:
            message = f"still fits at the search limit {limit}: the peak may not grow with this batch dimension"
        return BatchFit(strategy, best, capped, point, step, probes, message), capturer.captures - before

    order = sorted(strategies, key=lambda s: -(slowest_first or {}).get(s, 0))
    if jobs > 1:
        tick(f"searching {len(order)} strategies on {min(jobs, len(order))} workers")
    done = dict(zip(order, map_forked(search_one, order, jobs, here=lambda s: s in in_parent)))
    results = [done[s][0] for s in strategies]
    captures = capturer.captures + (sum(done[s][1] for s in strategies) if jobs > 1 else 0)
    return MaxBatchResult(budget_bytes, capturer.batch_dim, capturer.base_batch, limit, tuple(results), captures)


def lower_bound_ceiling(graph_at: Callable[[int], RematGraph], budget_bytes: int, allocator: AllocatorModel,
                        limit: int = DEFAULT_LIMIT, start: int = 1) -> int | None:
    """The smallest batch at which the lower bound on every schedule's peak exceeds the budget
    (no strategy fits there or, the peak growing with the batch, above); None when even
    ``limit`` passes the bound."""
    room = allocator.solver_budget(budget_bytes)

    def passes(batch: int) -> bool:
        return peak_lower_bound(allocator.apply(graph_at(batch))) <= room

    best, capped, _ = search_max_batch(passes, limit, start=start)
    return None if capped else best + 1


def classic_floor(graph_at: Callable[[int], RematGraph], budget_bytes: int, allocator: AllocatorModel,
                  limit: int = DEFAULT_LIMIT, start: int = 1, high: int | None = None) -> int:
    """The largest batch at which store-all or recompute-all fits (0: not even 1): a searching
    solver fits there too, and its answer is usually right above (two simulations per probe).
    Note: on a long chain recompute-all is past its cap and skipped (`classic_schedules`), so
    the floor is store-all's there: lower, still a batch a searching solver fits."""
    room = allocator.solver_budget(budget_bytes)

    def fits(batch: int) -> bool:
        return min(c.peak for c in classic_schedules(allocator.apply(graph_at(batch)))) <= room

    return search_max_batch(fits, limit, start=start, high=high)[0]


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
