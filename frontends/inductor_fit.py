"""Fit a graph's plan to what Inductor will allocate: re-plan until the compiled peak meets the budget.

The solver plans unfused aten ops; Inductor fuses pointwise chains (their intermediates never
reach memory) and reuses dead buffers, so a plan made for budget ``B`` compiles to a step that
peaks below ``B``, and the gap is recomputation the user paid for and did not need. The fit
measures instead of modelling Inductor: plan at a *planning* budget, read the compiled peak of
that plan from Inductor's own buffer plan (`frontends.inductor_memory.probe_compiled_peak`, no
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

Of the plans tried, the cheapest (recomputation under the cost model) whose compiled peak meets
``B`` is kept, so the fit never costs more than the unfitted plan and never exceeds ``B`` as
Inductor's plan counts it; when none does, `InfeasibleBudgetError` names the smallest compiled
peak seen (Inductor can compile a plan above its unfused peak: layout copies, kernel workspace). Plans whose schedule repeats one already probed are not probed again.
Pure search logic: planning and probing are the caller's callables.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from optimizer.ir.plan import Plan
from solvers.base import InfeasibleBudgetError

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
             *, iterations: int = 4, tolerance: float = 0.02) -> tuple[Plan, InductorFit]:
    """Search the planning budget as the module says; returns the plan kept and the record.

    ``plan_at(b)`` plans the graph for ``b`` bytes (`InfeasibleBudgetError` for a ``b`` too
    small: at ``budget_bytes`` the leanest plan it names is tried instead, and the error reaches
    the caller only when that plan compiles above the budget too; below it, it ends the search);
    ``compiled_peak_of(plan)`` probes it.
    """
    if iterations < 1:
        raise ValueError(f"fit_iterations must be at least 1, got {iterations}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"fit_tolerance must be in [0, 1), got {tolerance}")
    tried: list[tuple[Plan, FitIteration]] = []
    probed: dict[tuple, int | None] = {}

    def attempt(planning_budget: int) -> tuple[Plan, FitIteration]:
        start = time.perf_counter()
        plan = plan_at(planning_budget)
        planned = time.perf_counter()
        key = (plan.saved, plan.recomputed)
        fresh = key not in probed
        if fresh:
            probed[key] = compiled_peak_of(plan)
        it = FitIteration(planning_budget_bytes=planning_budget, planned_peak_bytes=plan.predicted_peak_bytes,
                          compiled_peak_bytes=probed[key], extra_time_s=plan.extra_time_s,
                          extra_flops=plan.extra_flops, plan_seconds=planned - start,
                          probe_seconds=time.perf_counter() - planned, probed=fresh)
        tried.append((plan, it))
        return plan, it

    try:
        first, it = attempt(budget_bytes)
    except InfeasibleBudgetError as err:
        # Too small to plan unfused; the leanest unfused plan may still compile under it.
        leanest = err.smallest_feasible_bytes
        if leanest is None or leanest <= budget_bytes:
            raise
        first, it = attempt(leanest)
        if it.compiled_peak_bytes is None or it.compiled_peak_bytes > budget_bytes:
            raise err from None
    if it.compiled_peak_bytes is None:  # Inductor's plan unreadable: the unfused plan bounds it
        return first, InductorFit(budget_bytes, (it,), 0, "Inductor's buffer plan could not be read")
    store_all = first.store_all_peak_bytes
    reason = f"{iterations} iterations"
    for _ in range(iterations - 1):
        fits = [t for _, t in tried if t.compiled_peak_bytes is not None and t.compiled_peak_bytes <= budget_bytes]
        over = [t for _, t in tried if t.compiled_peak_bytes is not None and t.compiled_peak_bytes > budget_bytes]
        lo = max(fits, key=lambda t: t.planning_budget_bytes, default=None)
        hi = min(over, key=_ceiling, default=None)
        if lo is not None and budget_bytes - lo.compiled_peak_bytes <= tolerance * budget_bytes:
            reason = "within tolerance"
            break
        if lo is not None and lo.extra_time_s == 0:
            reason = "stores everything"
            break
        nxt = _next_budget(budget_bytes, lo, hi, tried[-1][1], tried[-2][1] if len(tried) > 1 else None)
        if lo is not None and hi is not None and _ceiling(hi) - lo.planning_budget_bytes <= max(
                1, tolerance * budget_bytes / 4):
            reason = "bracket closed"
            break
        if lo is not None:
            nxt = min(nxt, max(store_all, lo.planning_budget_bytes + 1))
        if nxt in {t.planning_budget_bytes for _, t in tried}:
            reason = "no new planning budget"
            break
        try:
            attempt(nxt)
        except InfeasibleBudgetError:  # stepping down below what the solver can plan ends the search
            reason = f"nothing plans at {nxt} B"
            break
    feasible = [i for i, (_, t) in enumerate(tried)
                if t.compiled_peak_bytes is not None and t.compiled_peak_bytes <= budget_bytes]
    if not feasible:  # even the plan for the budget itself compiles above it: the step would not fit
        compiled = [t.compiled_peak_bytes for _, t in tried if t.compiled_peak_bytes is not None]
        raise InfeasibleBudgetError(
            budget_bytes, min(compiled), f" (every plan tried compiles above it with Inductor: "
            f"{len(tried)} plans, planning budgets {min(t.planning_budget_bytes for _, t in tried)}-"
            f"{max(t.planning_budget_bytes for _, t in tried)} B)")
    chosen = min(feasible, key=lambda i: (tried[i][1].extra_time_s, -tried[i][1].compiled_peak_bytes))
    return tried[chosen][0], InductorFit(budget_bytes, tuple(t for _, t in tried), chosen, reason)


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
        return last.planning_budget_bytes - (last.compiled_peak_bytes - target)
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
