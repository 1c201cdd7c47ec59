"""Fit a graph's plan to what Inductor will allocate: re-plan until the compiled peak meets the budget.

The solver plans unfused aten ops; Inductor fuses pointwise chains (their intermediates never
reach memory) and reuses dead buffers, so a plan made for budget ``B`` compiles to a step that
peaks below ``B``, and the gap is recomputation the user paid for and did not need. The fit
measures instead of modelling Inductor: plan at a *planning* budget, read the compiled peak of
that plan from Inductor's own buffer plan (`frontends.compile.inductor_memory.probe_compiled_peak`, no
kernel built), and move the planning budget until the compiled peak sits within ``tolerance``
under ``B``:

* start at ``B`` (or, when nothing plans unfused at ``B``, at the smallest budget the solver
  names: Inductor may compile that leanest plan under ``B``); while every plan tried fits, step
  up by the slack left (``B - compiled peak``), or along the secant of the last two plans when it
  says more;
* once a plan overshoots, take the secant between the highest plan that fits and the lowest that
  does not (at its own unfused peak: a planning budget down to it most likely gets the same
  schedule), kept inside the middle 80% of that bracket (bisection when the secant is flat);
* stop after ``iterations`` plans, when the slack is within ``tolerance``, when a plan stores
  everything (nothing left to buy), or when the bracket is narrower than the tolerance.

Seeds come next: plans made another way (the backend passes torch's min-cut partitions, which
price fused pointwise recomputation as free, a view of fusion the unfused solver lacks). They
are probed cheapest first while they cost less than the cheapest plan known to fit, and the
first that fits ends it (none cheaper is left).

Of the plans tried, the cheapest (recomputation under the cost model) whose compiled peak meets
``B`` is kept, so the fit never costs more than the unfitted plan and never exceeds ``B`` as
Inductor's plan counts it; when none does, `InfeasibleBudgetError` names the smallest compiled
peak seen (Inductor can compile a plan above its unfused peak: layout copies, kernel workspace).
Plans whose schedule repeats one already probed are not probed again (unless the caller says
they compile to other graphs: ``variant_of``).
Pure search logic: planning and probing are the caller's callables.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from solvers.base import InfeasibleBudgetError
from solvers.ir.plan import Plan

FITS = ("inductor",)


@dataclass(frozen=True)
class FitIteration:
    """One plan the fit tried."""

    planning_budget_bytes: int
    """What the solver was asked to fit (unfused aten ops)."""
    planned_peak_bytes: int
    """The plan's own (unfused) peak."""
    compiled_peak_bytes: int | None
    """The compiled step's peak read from Inductor's buffer plan (None: unreadable)."""
    extra_time_s: float
    """Recomputation under the cost model."""
    extra_flops: float
    plan_seconds: float
    probe_seconds: float
    """The trial compile (0 when not probed)."""
    probed: bool
    """False when the schedule repeated an earlier one (its probe reused)."""
    source: str = "solver"
    """``solver`` (the search over planning budgets) or the strategy a seed plan came from
    (``torch-min-cut amb=0.5``); a seed's planning budget is its own unfused peak."""


@dataclass(frozen=True)
class InductorFit:
    """The fit of one graph: the iterations tried and which one was kept."""

    budget_bytes: int
    """The graph's budget (the user's, or its share after graph breaks)."""
    iterations: tuple[FitIteration, ...]
    chosen: int
    """Index into ``iterations`` of the plan kept."""
    stop_reason: str

    @property
    def compiled_peak_bytes(self) -> int | None:
        return self.iterations[self.chosen].compiled_peak_bytes

    @property
    def probes(self) -> int:
        """Trial compiles run (lowering and buffer planning, no kernel built)."""
        return sum(1 for it in self.iterations if it.probed)

    @property
    def seconds(self) -> float:
        """What the fit added to planning once: every probe and every re-plan."""
        return sum(it.probe_seconds for it in self.iterations) + sum(
            it.plan_seconds for it in self.iterations[1:])


def fit_plan(budget_bytes: int, plan_at: Callable[[int], Plan], compiled_peak_of: Callable[[Plan], int | None],
             *, iterations: int = 4, tolerance: float = 0.02,
             seeds: Callable[[], Iterable[Plan]] | None = None,
             variant_of: Callable[[Plan], object] | None = None) -> tuple[Plan, InductorFit]:
    """Search the planning budget as the module says; returns the plan kept and the record.

    ``plan_at(b)`` plans the graph for ``b`` bytes (`InfeasibleBudgetError` for a ``b`` too
    small: at ``budget_bytes`` the leanest plan it names is tried instead; below it, it ends the
    search); ``compiled_peak_of(plan)`` probes it. ``seeds()`` yields plans made another way
    (torch's min-cut partitions): after the search, each seed cheaper than the best plan that
    fits is probed too. `InfeasibleBudgetError` when no plan tried compiles within the budget.
    ``variant_of(plan)``: what besides the schedule decides the graphs compiled (the backend:
    whether a seed compiles as torch's own graphs); a probe is reused for the same schedule and
    variant only.
    """
    if iterations < 1:
        raise ValueError(f"fit_iterations must be at least 1, got {iterations}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"fit_tolerance must be in [0, 1), got {tolerance}")
    tried: list[tuple[Plan, FitIteration]] = []
    probed: dict[tuple, int | None] = {}

    def probe(plan: Plan, planning_budget: int, plan_seconds: float, source: str) -> FitIteration:
        start = time.perf_counter()
        key = (variant_of(plan) if variant_of else None, _schedule_key(plan))
        fresh = key not in probed
        if fresh:
            probed[key] = compiled_peak_of(plan)
        it = FitIteration(planning_budget_bytes=planning_budget, planned_peak_bytes=plan.predicted_peak_bytes,
                          compiled_peak_bytes=probed[key], extra_time_s=plan.extra_time_s,
                          extra_flops=plan.extra_flops, plan_seconds=plan_seconds,
                          probe_seconds=time.perf_counter() - start, probed=fresh, source=source)
        tried.append((plan, it))
        return it

    def attempt(planning_budget: int) -> FitIteration:
        start = time.perf_counter()
        plan = plan_at(planning_budget)
        return probe(plan, planning_budget, time.perf_counter() - start, "solver")

    refusal: InfeasibleBudgetError | None = None
    try:
        reason = _search_planning_budgets(budget_bytes, attempt, tried, iterations, tolerance)
    except InfeasibleBudgetError as err:  # the solver plans nothing that compiles within it
        refusal, reason = err, "the solver's plans compile above the budget"
    if tried and tried[0][1].compiled_peak_bytes is None:  # unreadable: the unfused plan bounds it
        return tried[0][0], InductorFit(budget_bytes, (tried[0][1],), 0, "Inductor's buffer plan could not be read")
    if seeds is not None:
        _probe_cheaper_seeds(budget_bytes, seeds, probe, tried)
    feasible = [i for i, (_, t) in enumerate(tried)
                if t.compiled_peak_bytes is not None and t.compiled_peak_bytes <= budget_bytes]
    if not feasible:  # every plan compiles above it: the step would not fit
        compiled = [t.compiled_peak_bytes for _, t in tried if t.compiled_peak_bytes is not None]
        if refusal is not None and not compiled:
            raise refusal
        raise InfeasibleBudgetError(
            budget_bytes, min(compiled), f" (every plan tried compiles above it with Inductor: "
            f"{len(tried)} plans, unfused peaks {min(t.planned_peak_bytes for _, t in tried)}-"
            f"{max(t.planned_peak_bytes for _, t in tried)} B)")
    chosen = min(feasible, key=lambda i: (tried[i][1].extra_time_s, -tried[i][1].compiled_peak_bytes))
    return tried[chosen][0], InductorFit(budget_bytes, tuple(t for _, t in tried), chosen, reason)


def _search_planning_budgets(budget_bytes: int, attempt: Callable[[int], FitIteration],
                             tried: list[tuple[Plan, FitIteration]], iterations: int, tolerance: float) -> str:
    """The search over planning budgets (see the module); returns why it stopped.
    `InfeasibleBudgetError` when not even the leanest plan the solver names compiles within it."""
    try:
        it = attempt(budget_bytes)
    except InfeasibleBudgetError as err:
        # Too small to plan unfused; the leanest unfused plan may still compile under it.
        leanest = err.smallest_feasible_bytes
        if leanest is None or leanest <= budget_bytes:
            raise
        it = attempt(leanest)
        if it.compiled_peak_bytes is None or it.compiled_peak_bytes > budget_bytes:
            raise err from None
    if it.compiled_peak_bytes is None:
        return "Inductor's buffer plan could not be read"
    store_all = tried[0][0].store_all_peak_bytes
    reason = f"{iterations} iterations"
    for _ in range(iterations - 1):
        fits = [t for _, t in tried if t.compiled_peak_bytes is not None and t.compiled_peak_bytes <= budget_bytes]
        over = [t for _, t in tried if t.compiled_peak_bytes is not None and t.compiled_peak_bytes > budget_bytes]
        lo = max(fits, key=lambda t: t.planning_budget_bytes, default=None)
        hi = min(over, key=_ceiling, default=None)
        if lo is not None and budget_bytes - lo.compiled_peak_bytes <= tolerance * budget_bytes:
            return "within tolerance"
        if lo is not None and lo.extra_time_s == 0:
            return "stores everything"
        nxt = _next_budget(budget_bytes, lo, hi, tried[-1][1], tried[-2][1] if len(tried) > 1 else None)
        if lo is not None and hi is not None and _ceiling(hi) - lo.planning_budget_bytes <= max(
                1, tolerance * budget_bytes / 4):
            return "bracket closed"
        if lo is not None:
            nxt = min(nxt, max(store_all, lo.planning_budget_bytes + 1))
        if nxt in {t.planning_budget_bytes for _, t in tried}:
            return "no new planning budget"
        try:
            attempt(nxt)
        except InfeasibleBudgetError:  # stepping down below what the solver can plan ends the search
            return f"nothing plans at {nxt} B"
    return reason


def _probe_cheaper_seeds(budget_bytes: int, seeds: Callable[[], Iterable[Plan]],
                         probe: Callable[[Plan, int, float, str], FitIteration],
                         tried: list[tuple[Plan, FitIteration]]) -> None:
    """Probe the seeds cheapest first while they cost less than the cheapest plan known to
    fit: the first seed that fits is the cheapest that can, so the probing stops there."""
    best = min((t.extra_time_s for _, t in tried
                if t.compiled_peak_bytes is not None and t.compiled_peak_bytes <= budget_bytes), default=math.inf)
    if best == 0:  # a plan that recomputes nothing fits: no seed can be cheaper, none is made
        return
    start = time.perf_counter()
    ranked = sorted(seeds(), key=lambda plan: plan.extra_time_s)
    made = (time.perf_counter() - start) / max(1, len(ranked))  # each seed's share of making them
    for plan in ranked:
        if plan.extra_time_s >= best:
            return
        it = probe(plan, plan.predicted_peak_bytes, made, plan.solver)
        if it.compiled_peak_bytes is not None and it.compiled_peak_bytes <= budget_bytes:
            return


def _schedule_key(plan: Plan) -> tuple:
    """What the compiled step depends on: the computes in order, per phase. The saved set and the
    recomputed ops alone are not enough: two plans that agree on them but recompute in another
    order compile to other peaks (a min-cut seed beside a solver plan: 276 KB apart on ViT)."""
    schedule = getattr(plan, "schedule", None)
    if schedule is None:
        return (plan.saved, plan.recomputed)
    return (schedule.computes("forward"), schedule.computes("backward"))


def _next_budget(target: int, lo: FitIteration | None, hi: FitIteration | None,
                 last: FitIteration, before: FitIteration | None) -> int:
    """The next planning budget: slack step, secant, or bracketed secant (see the module)."""
    if lo is not None and hi is not None:
        a, b = lo.planning_budget_bytes, _ceiling(hi)
        guess = _secant(target, lo, dataclasses.replace(hi, planning_budget_bytes=b))
        if guess is None:
            return (a + b) // 2
        return int(min(max(guess, a + 0.1 * (b - a)), b - 0.1 * (b - a)))
    if lo is None:  # every plan compiles above the budget: step down by the overshoot
        # (at least to 1 byte: an overshoot larger than the planning budget, as Inductor gives
        # examples/convnet.py at 60%, asked the planner for a negative budget)
        return max(1, last.planning_budget_bytes - (last.compiled_peak_bytes - target))
    step = lo.planning_budget_bytes + (target - lo.compiled_peak_bytes)
    guess = _secant(target, before, last) if before is not None else None
    return int(max(step, guess)) if guess is not None else step


def _ceiling(over: FitIteration) -> int:
    """Where an overshooting plan starts: a planning budget down to its own (unfused) peak most
    likely gets the same schedule back, so the bracket's upper end moves down to that peak."""
    return min(over.planning_budget_bytes, over.planned_peak_bytes)


def _secant(target: int, a: FitIteration, b: FitIteration) -> float | None:
    """Planning budget where the line through ``a`` and ``b`` reaches ``target`` (None: flat)."""
    if a.compiled_peak_bytes is None or b.compiled_peak_bytes is None:
        return None
    db = b.planning_budget_bytes - a.planning_budget_bytes
    dp = b.compiled_peak_bytes - a.compiled_peak_bytes
    if db == 0 or dp <= 0:
        return None
    return a.planning_budget_bytes + (target - a.compiled_peak_bytes) * db / dp
