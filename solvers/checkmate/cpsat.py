"""The Checkmate model of `solvers.checkmate.milp`, solved with OR-Tools CP-SAT.

Same stages, same variables, same constraint families as the MILP (see `solvers.checkmate.milp` for
their meaning), so both back-ends have the same optimum; only the encoding differs:

- ``R``, ``S`` and ``FREE`` are booleans. ``FREE[t, v, k]`` is the AND of its negated hazards
  (``R[t, k]``, not kept, no later reader in the stage), stated as a reified ``add_bool_and``
  plus one clause: the same integer points as the MILP's linearization.
- ``U[t, g]`` are integer variables in ``[0, capacity]`` with the MILP's recurrence.

**Integer scaling.** CP-SAT needs integer coefficients.

- Bytes: the unit is the gcd of every byte count in the model (exact); if the model would
  still exceed ``_MAX_BYTE_UNITS`` units, the unit grows to ``ceil(total / _MAX_BYTE_UNITS)``.
  Every byte count is rounded UP to units and the budget DOWN (``floor(budget / unit)``), so
  the model is never optimistic: a model solution's true peak is at most the budget. With
  the gcd unit (every test graph, and real graphs below ~1e8 bytes per gcd) the scaling is exact.
- Costs: ``c -> floor(c * s)`` with ``s = _COST_RESOLUTION / min_positive_cost``, capped so
  that the largest cost is at most ``_MAX_COST_UNITS``. Integer-ish costs (1, 2, 5, ...)
  stay exact. Rounding DOWN makes ``best_objective_bound / s`` a valid lower bound on the true
  cost. ``MilpSolution.model_cost`` and every reported objective are recomputed in true cost
  units (``SolveResult.objective`` is the simulated cost).

Warm start: the schedule's stage assignment
(`solvers.checkmate.stages._start_assignment`), completed with ``U`` by its recurrence, is
given to CP-SAT as a full hint; if CP-SAT stops without a
solution, the hint itself (checked to fit the capacity) is returned as FEASIBLE, so a
warm-started solve is never worse than its hint.

Progress: each incumbent (its true cost) and CP-SAT's bound go to ``SolverOptions.progress``
(and are printed with ``verbose``) from a ``CpSolverSolutionCallback``.

Determinism: ``random_seed`` is ``options.seed`` (0 by default) and ``num_workers =
options.threads``; with one worker the same inputs give the same schedule (CP-SAT with several
workers is deterministic only when it finishes before the time limit).
"""

from __future__ import annotations

import time

from solvers.backends import cp_sat_backend
from solvers.base import (
    SolveResult,
    SolverOptions,
    SolverUnavailableError,
    SolveStatus,
)
from solvers.checkmate.contract import MilpSolution, solve_checkmate
from solvers.checkmate.cpsat_model import (
    CpsatModel,
    build_cpsat_model,
    cp_model,
    hint_schedule,
    new_solver,
)
from solvers.checkmate.data import CheckmateData, TriviallyInfeasible, is_const, prepare
from solvers.checkmate.stages import stage_sequences
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule

SOLVER_NAME = "checkmate-cpsat"
BACKEND = "cp-sat"


def _require_ortools() -> None:
    if cp_model is None:
        problem = cp_sat_backend().problem
        raise SolverUnavailableError(f"the CP-SAT back-end: {problem}" if problem
                                     else "the CP-SAT back-end needs OR-Tools: pip install ortools")


# =========================================================================== solve
class _Progress(cp_model.CpSolverSolutionCallback if cp_model is not None else object):
    """Each incumbent CP-SAT finds, with its best bound, in cost units: printed when the user
    asked for logs, and sent to `SolverOptions.progress`. The incumbent's cost is summed from
    its R values in true costs (the model's are rounded down); the bound is CP-SAT's.
    An exception from the user's callback stops the search and is re-raised after it."""

    def __init__(self, data: CheckmateData, m: CpsatModel, options: SolverOptions, start: float) -> None:
        super().__init__()
        self._data, self._m, self._options, self._start = data, m, options, start
        self._variables = [(x, data.cost[g]) for (_, g), x in m.R.items() if not is_const(x)]
        self._constant = sum(data.cost[g] for (_, g), x in m.R.items() if is_const(x) and x)
        self.error: BaseException | None = None

    def on_solution_callback(self) -> None:
        cost = self._constant + sum(c for x, c in self._variables if self.boolean_value(x))
        bound = min(cost, self.best_objective_bound / self._m.units.cost_scale)
        if self._options.verbose:
            print(f"[cp-sat {time.perf_counter() - self._start:7.2f}s] incumbent {cost:.6g}, "
                  f"bound {bound:.6g}", flush=True)
        try:
            self._options.report(self._start, cost, bound)
        except BaseException as exc:  # noqa: BLE001 - re-raised after the search
            self.error = exc
            self.stop_search()


def solve_cpsat_model(graph: RematGraph, budget_bytes: int, options: SolverOptions,
                      warm_start: Schedule | None = None) -> MilpSolution:
    """Build and solve the Checkmate model with CP-SAT; no shortcuts, no simulation.

    ``warm_start`` (a schedule that fits the budget) becomes a full hint; if CP-SAT stops
    without a solution the hint is returned as FEASIBLE, so the result is never worse.
    """
    _require_ortools()
    start = time.perf_counter()
    data = prepare(graph)

    def done(status, forward=(), backward=(), cost=None, bound=None, warm=False) -> MilpSolution:
        return MilpSolution(status, tuple(forward), tuple(backward), cost, bound, BACKEND,
                            time.perf_counter() - start, warm)

    def cost_of(chosen: set[tuple[int, int]]) -> float:
        return sum(data.cost[g] for _, g in chosen)

    try:
        m = build_cpsat_model(data, budget_bytes)
    except TriviallyInfeasible:
        return done(SolveStatus.INFEASIBLE)
    hinted = hint_schedule(data, m, warm_start) if warm_start is not None else None
    warm = hinted is not None

    solver = new_solver(options, start)
    wants_progress = options.verbose or options.progress is not None
    callback = _Progress(data, m, options, start) if wants_progress else None
    status = solver.solve(m.model, callback)
    if callback is not None and callback.error is not None:
        raise callback.error

    def bound_in_cost(cost: float) -> float:
        # Coefficients are rounded down, so the bound holds in cost units; the 1e-9 guard
        # against float noise may round one up by a hair: that excess is taken off per term.
        excess = max((m.units.cost(data.cost[g]) - data.cost[g] * m.units.cost_scale
                      for (_, g) in m.R), default=0.0)
        slack = max(0.0, excess) * len(m.R)
        return min(cost, (solver.best_objective_bound - slack) / m.units.cost_scale)

    # ---- branch on every status CP-SAT reports
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        chosen = {key for key, x in m.R.items() if is_const(x) or solver.boolean_value(x)}
        forward, backward = stage_sequences(data, lambda t, g: (t, g) in chosen)
        cost = cost_of(chosen)
        if status == cp_model.OPTIMAL:
            return done(SolveStatus.OPTIMAL, forward, backward, cost, cost, warm)
        return done(SolveStatus.FEASIBLE, forward, backward, cost, bound_in_cost(cost), warm)
    if status == cp_model.INFEASIBLE:
        return done(SolveStatus.INFEASIBLE, warm=warm)
    if status == cp_model.MODEL_INVALID:
        raise AssertionError(f"invalid CP-SAT model: {m.model.validate()}")
    # UNKNOWN: stopped (time limit) without a solution; the hint is one if it fit.
    if hinted is not None:
        chosen = {key for key, x in hinted.items() if x}
        forward, backward = stage_sequences(data, lambda t, g: (t, g) in chosen)
        cost = cost_of(chosen)  # CP-SAT's bound is proven even without a solution
        return done(SolveStatus.FEASIBLE, forward, backward, cost, bound_in_cost(cost), warm)
    return done(None, warm=warm)


def solve_cpsat(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """Cheapest schedule whose simulated peak fits ``budget_bytes`` (Checkmate model, CP-SAT).

    The same contract as `solvers.checkmate.milp.solve_milp`: store-all fits -> OPTIMAL at once;
    solved -> OPTIMAL; time limit with an incumbent -> FEASIBLE (never worse than the classic
    seed) with CP-SAT's bound; no incumbent -> HEURISTIC classic schedule; nothing fits ->
    `InfeasibleBudgetError` with the smallest classic peak. ``objective`` is simulated.
    """
    _require_ortools()
    return solve_checkmate(graph, budget_bytes, options, solver_name=SOLVER_NAME,
                           solve_model=solve_cpsat_model)
