"""Solving the PuLP Checkmate model: back-end choice (HiGHS or CBC), MIP starts, time
limits, the proven bound, and each status the back-ends report, as a `MilpSolution`.
"""

from __future__ import annotations

import math
import time

import pulp

from solvers.backends import highspy_backend
from solvers.base import (
    SolverOptions,
    SolverUnavailableError,
    SolveStatus,
    stdout_silenced,
)
from solvers.checkmate.contract import MilpSolution
from solvers.checkmate.data import TriviallyInfeasible, is_const, prepare
from solvers.checkmate.milp_model import MilpModel, build_milp_model, set_mip_start
from solvers.checkmate.stages import stage_sequences
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule


def _objective_offset(model: MilpModel) -> float:
    """The objective's constant (each stage's own group, R[t, t] = 1), in model cost units.
    PuLP does not hand it to HiGHS, so HiGHS's objective values and bounds leave it out."""
    return float(model.prob.objective.constant or 0.0)


class _HighsProgress:
    """Forwards HiGHS's MIP callbacks to `SolverOptions.progress`, in cost units.

    PuLP's HiGHS interface keeps the ``highspy.Highs`` object it solves (``lp.solverModel``),
    so its callbacks can be subscribed before the run: each improving solution is reported at
    once, and the periodic interrupt callback reports the bound at most every ``INTERVAL_S``.
    An exception raised by the user's callback is kept and re-raised after the solve (it must
    not unwind through HiGHS's C++ frames).
    """

    INTERVAL_S = 0.5

    def __init__(self, options: SolverOptions, start: float, model: MilpModel) -> None:
        self.options, self.start, self.cost_scale = options, start, model.cost_scale
        self.offset = _objective_offset(model)
        self.error: BaseException | None = None
        self._last_time = -math.inf
        self._last_sent: tuple | None = None

    def attach(self, highs) -> None:
        highs.cbMipImprovingSolution += self._improved
        highs.cbMipInterrupt += self._tick

    def _improved(self, event) -> None:
        self._send(event.data_out, force=True)

    def _tick(self, event) -> None:
        if time.perf_counter() - self._last_time >= self.INTERVAL_S:
            self._send(event.data_out, force=False)

    def _send(self, out, force: bool) -> None:
        if self.error is not None:
            return
        self._last_time = time.perf_counter()
        primal, dual = out.mip_primal_bound, out.mip_dual_bound
        objective = (primal + self.offset) / self.cost_scale if math.isfinite(primal) else None
        bound = (dual + self.offset) / self.cost_scale if math.isfinite(dual) else None
        if objective is not None and bound is not None:
            bound = min(bound, objective)  # HiGHS's tolerances may leave a hair above
        if not force and (objective, bound) == self._last_sent:
            return
        self._last_sent = (objective, bound)
        try:
            self.options.report(self.start, objective, bound)
        except BaseException as exc:  # noqa: BLE001 - re-raised after the solve
            self.error = exc


class _HiGHS(pulp.HiGHS):
    """PuLP's HiGHS interface, plus a MIP start from the variables' initial values and the
    progress callbacks of `_HighsProgress`."""

    mip_start = False
    progress: _HighsProgress | None = None

    def createAndConfigureSolver(self, lp):
        # highspy prints a banner to the process's stdout when a model is created, whatever
        # the options say: keep it off the user's terminal unless they asked for solver logs.
        if self.msg:
            return super().createAndConfigureSolver(lp)
        with stdout_silenced():
            return super().createAndConfigureSolver(lp)

    def callSolver(self, lp):
        if self.mip_start:
            highspy = highspy_backend().module  # loaded: highs_available() chose this engine

            highs = lp.solverModel
            start = highspy.HighsSolution()
            values = [0.0] * highs.getNumCol()
            for var in lp.variables():
                values[var.index] = var.varValue or 0.0
            start.col_value = values
            start.value_valid = True
            highs.setSolution(start)
        if self.progress is not None:
            self.progress.attach(lp.solverModel)
        super().callSolver(lp)
        if self.progress is not None and self.progress.error is not None:
            raise self.progress.error


def highs_available() -> bool:
    """Whether PuLP can run HiGHS: highspy installed and loadable beside OR-Tools (else the MILP
    runs on CBC, and `solvers.backends` has warned once why)."""
    # PuLP decides whether HiGHS works when it is imported: ask it too, not the file system.
    return highspy_backend().module is not None and pulp.HiGHS(msg=False).available()


def _engine(options: SolverOptions) -> str:
    highs = highs_available()
    if options.milp_engine == "auto":
        return "highs" if highs else "cbc"
    if options.milp_engine not in ("cbc", "highs"):
        raise ValueError(f"unknown MILP back-end {options.milp_engine!r} (cbc, highs or auto)")
    if options.milp_engine == "highs" and not highs:
        problem = highspy_backend().problem
        raise SolverUnavailableError(f"the HiGHS back-end: {problem}" if problem
                                     else "the HiGHS back-end needs highspy: pip install highspy")
    return options.milp_engine


def _solver(engine: str, options: SolverOptions, *, warm: bool = False, mip: bool = True,
            time_limit: float | None = None, progress: _HighsProgress | None = None):
    limit = options.time_limit_s if time_limit is None else time_limit
    if engine == "highs":
        solver = _HiGHS(mip=mip, msg=options.verbose, timeLimit=limit, threads=options.threads,
                        gapRel=0.0, random_seed=0)
        solver.mip_start = warm and mip
        solver.progress = progress if mip else None
        return solver
    return pulp.PULP_CBC_CMD(mip=mip, msg=options.verbose, timeLimit=limit,
                             threads=options.threads, warmStart=warm, gapRel=0.0)


def _best_bound(engine: str, model: MilpModel, options: SolverOptions) -> float | None:
    """The best bound HiGHS proves, or the LP relaxation's optimum for CBC (None if unknown).

    Call after the solution is read: the CBC relaxation solve overwrites variable values.
    """
    if engine == "highs":
        try:
            dual = model.prob.solverModel.getInfo().mip_dual_bound
            if not math.isfinite(dual):
                return None
            return (dual + _objective_offset(model)) / model.cost_scale
        except Exception:  # a highspy without that field
            return None
    relaxed = _solver(engine, options, mip=False, time_limit=max(1.0, 0.1 * options.time_limit_s))
    try:
        model.prob.solve(relaxed)
    except pulp.PulpSolverError:
        return None
    if model.prob.status == pulp.LpStatusOptimal:
        return pulp.value(model.prob.objective) / model.cost_scale
    return None



def solve_milp_model(graph: RematGraph, budget_bytes: int, options: SolverOptions,
                     warm_start: Schedule | None = None) -> MilpSolution:
    """Build and solve the Checkmate model; no shortcuts, no fallbacks, no simulation.

    ``warm_start`` seeds the search (a MIP start) with a schedule that fits the budget.
    """
    start = time.perf_counter()
    data = prepare(graph)
    engine = _engine(options)

    def done(status, forward=(), backward=(), cost=None, bound=None, warm=False) -> MilpSolution:
        return MilpSolution(status, tuple(forward), tuple(backward), cost, bound, engine,
                            time.perf_counter() - start, warm)

    try:
        model = build_milp_model(data, budget_bytes)
    except TriviallyInfeasible:
        return done(SolveStatus.INFEASIBLE)
    warm = warm_start is not None and set_mip_start(data, model, warm_start)
    progress = (_HighsProgress(options, start, model)
                if options.progress is not None and engine == "highs" else None)
    try:
        model.prob.solve(_solver(engine, options, warm=warm, progress=progress))
    except pulp.PulpSolverError:  # the back-end died (seen rarely with CBC at a time limit)
        if not warm:
            return done(None)
        left = options.time_limit_s - (time.perf_counter() - start)
        warm = False
        try:  # once more, without the MIP start, in the time left
            model.prob.solve(_solver(engine, options, time_limit=max(1.0, left),
                                     progress=progress))
        except pulp.PulpSolverError:
            return done(None)
    status, sol_status = model.prob.status, model.prob.sol_status

    # ---- branch on every status the back-ends report through PuLP
    if status == pulp.LpStatusInfeasible or sol_status == pulp.LpSolutionInfeasible:
        return done(SolveStatus.INFEASIBLE, warm=warm)
    if status == pulp.LpStatusUnbounded or sol_status == pulp.LpSolutionUnbounded:
        raise AssertionError("the Checkmate model cannot be unbounded (costs are >= 0)")
    if status != pulp.LpStatusOptimal or sol_status not in (pulp.LpSolutionOptimal,
                                                            pulp.LpSolutionIntegerFeasible):
        return done(None, warm=warm)  # stopped (time limit) without a solution
    chosen = {key for key, x in model.R.items() if is_const(x) or round(x.value() or 0) == 1}
    forward, backward = stage_sequences(data, lambda t, g: (t, g) in chosen)
    cost = sum(data.cost[g] for _, g in chosen)
    if sol_status == pulp.LpSolutionOptimal:
        return done(SolveStatus.OPTIMAL, forward, backward, cost, cost, warm)
    bound = _best_bound(engine, model, options)
    bound = None if bound is None else min(bound, cost)
    return done(SolveStatus.FEASIBLE, forward, backward, cost, bound, warm)
