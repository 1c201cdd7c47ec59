"""The smallest budget a graph can be planned for: a fast lower bound, and an exact search.

Why: when a budget is infeasible, the user needs the number that works, not just "no". The
planner's `InfeasibleBudgetError` carries `smallest_feasible_budget`'s answer.

- **Lower bound** (`peak_lower_bound`, instant, valid for every schedule): resident bytes plus
  the largest of (a) each needed op with its inputs live and its outputs and temporaries
  allocated, (b) the boundary, where every tangent and every forward output is live, (c) the
  last op producing a final output, when every final output (gradients, user outputs) is live.
- **Exact search** (graphs of at most ``EXACT_MAX_GROUPS`` op groups, OR-Tools installed): the
  CP-SAT Checkmate model with the peak as its objective (`solvers.checkmate.cpsat_model._build` with
  ``minimize_peak``), hinted with the leanest classic schedule, under a time limit. Its
  optimum, or the leanest classic schedule's peak if lower, is the smallest budget at which the
  exact solvers (``milp``, ``cpsat``, which search the Checkmate stages and fall back to the
  classic schedules) return a schedule, so ``exact`` means: no budget below ``smallest_bytes``
  is feasible for them. (`Schedule.from_computes` may drop an unread computation, so the
  witness schedule's simulated peak can be below ``smallest_bytes``.) When bytes had to be
  scaled lossily (more than 1e8 units of their gcd) the answer is feasible but not exact.
- **Large graphs, a time limit without proof, no OR-Tools**: the leanest classic schedule's
  peak with the best lower bound proven, ``exact=False``.
- **The schedule at that budget** is the cheapest found, not just one that fits: the near-floor
  repair (`solvers.repair`) searches for a cheaper one at the same peak (the leanest classic
  schedule is usually recompute-all, many times a step's compute).

One caveat for the MILP: it keeps a safety margin of 5e-6 of the graph's total bytes below the
budget (solver tolerances), so on large graphs it may need that much more than ``smallest_bytes``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from solvers.base import EXACT_MAX_GROUPS, SolverOptions
from solvers.checkmate.contract import classic_schedules
from solvers.checkmate.cpsat_model import build_cpsat_model, cp_model, hint_schedule, new_solver
from solvers.checkmate.data import TriviallyInfeasible, is_const, lower_bound_bytes, prepare
from solvers.checkmate.stages import stage_sequences
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate
from solvers.repair import repair_to_budget

TIME_LIMIT_S = 10.0
"""Longest the exact search runs (less when ``options.time_limit_s`` is less)."""
REPAIR_TIME_LIMIT_S = 10.0
"""Longest the near-floor repair looks for a cheaper schedule at the smallest budget found."""


@dataclass(frozen=True)
class MinBudget:
    """The smallest feasible budget found, how sure it is, and a schedule that fits it."""

    smallest_bytes: int
    """A budget the exact solvers can meet; ``schedule`` peaks at or below it."""
    lower_bytes: int
    """No schedule the exact solvers consider fits a smaller budget."""
    exact: bool
    """``lower_bytes == smallest_bytes``: proven smallest."""
    schedule: Schedule
    method: str
    solve_time_s: float


def peak_lower_bound(graph: RematGraph) -> int:
    """Bytes no schedule of ``graph`` avoids at its peak (see the module docstring)."""
    return lower_bound_bytes(prepare(graph))


def smallest_feasible_budget(graph: RematGraph, options: SolverOptions = SolverOptions(),
                             *, max_groups: int = EXACT_MAX_GROUPS) -> MinBudget:
    """The smallest budget ``graph`` can be planned for: exact when the search proves it.

    ``options``: ``time_limit_s`` (capped at ``TIME_LIMIT_S``), ``threads`` and ``seed`` of the
    CP-SAT search; deterministic with one thread.
    """
    start = time.perf_counter()
    data = prepare(graph)
    lower = lower_bound_bytes(data)
    leanest = min(classic_schedules(graph), key=lambda c: (c.peak, c.cost))

    def answer(smallest: int, proven: int, schedule: Schedule, method: str) -> MinBudget:
        proven = min(max(lower, proven), smallest)
        schedule, method = _cheapest_at(graph, smallest, schedule, method, options)
        return MinBudget(smallest, proven, proven == smallest, schedule, method,
                         time.perf_counter() - start)

    if leanest.peak <= lower:
        return answer(leanest.peak, leanest.peak, leanest.schedule,
                      f"{leanest.name} reaches the lower bound")
    if len(data.groups) > max_groups:
        return answer(leanest.peak, lower, leanest.schedule,
                      f"{leanest.name} ({len(data.groups)} op groups > {max_groups}: "
                      "no exact search)")
    if cp_model is None:
        return answer(leanest.peak, lower, leanest.schedule,
                      f"{leanest.name} (OR-Tools is not installed or cannot load: no exact search)")
    limit = min(options.time_limit_s, TIME_LIMIT_S)
    return _search(graph, data, lower, leanest, dataclasses.replace(options, time_limit_s=limit),
                   answer, start)


def _search(graph, data, lower: int, leanest, options: SolverOptions, answer, start: float):
    """CP-SAT minimizing the peak of the Checkmate stages, in ``[lower, leanest.peak]``."""
    try:
        m = build_cpsat_model(data, leanest.peak, minimize_peak=True, least_peak=lower)
    except TriviallyInfeasible:
        return answer(leanest.peak, leanest.peak, leanest.schedule,
                      f"{leanest.name} (the Checkmate stages cannot reach it)")
    hint_schedule(data, m, leanest.schedule)
    solver = new_solver(options, start)
    status = solver.solve(m.model)
    unit, exact_units = m.units.byte_unit, m.units.exact_bytes

    if status == cp_model.INFEASIBLE:  # no Checkmate schedule within the leanest classic's peak
        proven = leanest.peak if exact_units else lower
        return answer(leanest.peak, proven, leanest.schedule,
                      f"{leanest.name} (CP-SAT: the Checkmate stages need more)")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return answer(leanest.peak, lower, leanest.schedule,
                      f"{leanest.name} (CP-SAT stopped at {options.time_limit_s:g} s without "
                      "a schedule)")
    found = int(solver.objective_value) * unit
    bound = int(solver.best_objective_bound) * unit if exact_units else lower
    if status == cp_model.OPTIMAL and exact_units:
        bound = found
    if found >= leanest.peak:
        return answer(leanest.peak, min(bound, leanest.peak), leanest.schedule,
                      f"{leanest.name} (CP-SAT: the Checkmate stages do no better)")
    chosen = {key for key, x in m.R.items() if is_const(x) or solver.boolean_value(x)}
    forward, backward = stage_sequences(data, lambda t, g: (t, g) in chosen)
    schedule = Schedule.from_computes(graph, forward, backward)
    peak = simulate(graph, schedule).peak_bytes
    if peak > found:
        raise AssertionError(f"peak-minimizing CP-SAT schedule peaks at {peak} bytes, "
                             f"above the model's {found}: formulation bug")
    how = "optimal" if status == cp_model.OPTIMAL else "time limit"
    return answer(found, bound, schedule, f"CP-SAT peak minimization ({how})")


def _cheapest_at(graph: RematGraph, budget_bytes: int, schedule: Schedule, method: str,
                 options: SolverOptions) -> tuple[Schedule, str]:
    """``schedule``, or the near-floor repair's (`solvers.repair`) when it fits
    ``budget_bytes`` at less cost: the floor is often recompute-all's peak, and its schedule
    recomputes the forward for every backward op (12x a step on timm's regnetx_002), while a
    schedule that saves all but the last layers' values fits the same peak at about 1.06x."""
    found = repair_to_budget(graph, budget_bytes,
                             time.perf_counter() + min(options.time_limit_s, REPAIR_TIME_LIMIT_S),
                             up_first=True)
    if found is None or found.sim.total_cost >= simulate(graph, schedule).total_cost:
        return schedule, method
    return found.schedule, f"{method}; the near-floor repair's schedule at that peak"
