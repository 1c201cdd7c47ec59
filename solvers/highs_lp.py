"""A small sparse LP/MIP builder on HiGHS (highspy), for the bound and block models.

PuLP builds its model in Python objects, one expression per constraint: fine for the Checkmate
MILP's few thousand rows, slow for the bound LP's hundred thousand coefficients. This builder
collects rows as index/value lists and hands HiGHS one column-wise matrix.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

import numpy as np

from solvers.backends import highspy_backend
from solvers.base import stdout_silenced


class LpStatus(enum.Enum):
    OPTIMAL = "optimal"
    INFEASIBLE = "infeasible"
    TIME_LIMIT = "time limit"
    OTHER = "other"
    UNAVAILABLE = "HiGHS could not be loaded"
    """highspy failed to load in this process (`solvers.backends`, which warned once)."""


@dataclass(frozen=True)
class LpSolution:
    status: LpStatus
    objective: float | None
    """Objective of the solution found (None when there is none)."""
    bound: float | None
    """Proven lower bound on the optimum (the objective for an optimal LP; the MIP dual
    bound otherwise; +inf when proven infeasible)."""
    values: np.ndarray | None


class LinearProgram:
    """min c.x subject to lb <= A x <= ub and variable bounds; some variables integer."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self.rows: list[tuple[list[int], list[float]]] = []

    def add_var(self, cost: float = 0.0, lower: float = 0.0, upper: float = 1.0,
                integer: bool = False) -> int:
        self.cost.append(float(cost))
        self.lower.append(float(lower))
        self.upper.append(float(upper))
        self.integer.append(integer)
        return len(self.cost) - 1

    def add_row(self, coefs: dict[int, float], lower: float = -np.inf, upper: float = np.inf) -> None:
        self.rows.append((list(coefs), [float(v) for v in coefs.values()]))
        self.row_lower.append(float(lower))
        self.row_upper.append(float(upper))

    @property
    def nonzeros(self) -> int:
        """Coefficients of the constraint matrix."""
        return sum(len(index) for index, _ in self.rows)

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows as a column-wise matrix (starts, row indices, values), rows in order within
        each column: one stable sort in numpy (a long chain's bound LP has 14 million
        coefficients; a Python loop over them took 16 s)."""
        n, total = len(self.cost), sum(len(index) for index, _ in self.rows)
        lengths = np.fromiter((len(index) for index, _ in self.rows), dtype=np.int64,
                              count=len(self.rows))
        cols = np.fromiter(itertools.chain.from_iterable(index for index, _ in self.rows),
                           dtype=np.int64, count=total)
        values = np.fromiter(itertools.chain.from_iterable(value for _, value in self.rows),
                             dtype=float, count=total)
        order = np.argsort(cols, kind="stable")
        rows = np.repeat(np.arange(len(self.rows), dtype=np.int32), lengths)[order]
        starts = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.bincount(cols, minlength=n), out=starts[1:])
        return starts, rows, values[order]

    def solve(self, time_limit_s: float = 60.0, threads: int = 1,
              primal_simplex: bool = False) -> LpSolution:
        """``primal_simplex``: HiGHS's primal simplex instead of its default dual simplex (about
        2x faster on the bound LP of a long chain, benchmarks/long_chains.md)."""
        highspy = highspy_backend().module
        if highspy is None:
            return LpSolution(LpStatus.UNAVAILABLE, None, None, None)
        with stdout_silenced():
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", max(0.1, float(time_limit_s)))
        h.setOptionValue("threads", max(1, threads))
        if primal_simplex:
            h.setOptionValue("simplex_strategy", 4)  # kSimplexStrategyPrimal
        lp = highspy.HighsLp()
        n = len(self.cost)
        lp.num_col_, lp.num_row_ = n, len(self.rows)
        lp.col_cost_ = np.asarray(self.cost)
        lp.col_lower_ = np.asarray(self.lower)
        lp.col_upper_ = np.asarray(self.upper)
        lp.row_lower_ = np.asarray(self.row_lower)
        lp.row_upper_ = np.asarray(self.row_upper)
        starts, index, value = self._columns()
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = index
        lp.a_matrix_.value_ = value
        if any(self.integer):
            lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                               for i in self.integer]
        h.passModel(lp)
        h.run()
        status = h.getModelStatus()
        mip = any(self.integer)
        if status == highspy.HighsModelStatus.kInfeasible:
            return LpSolution(LpStatus.INFEASIBLE, None, float("inf"), None)
        info = h.getInfo()
        has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
        values = np.asarray(h.getSolution().col_value) if has_solution else None
        objective = float(info.objective_function_value) if has_solution else None
        if status == highspy.HighsModelStatus.kOptimal:
            bound = float(info.mip_dual_bound) if mip else objective
            return LpSolution(LpStatus.OPTIMAL, objective, bound, values)
        if status == highspy.HighsModelStatus.kTimeLimit:
            bound = float(info.mip_dual_bound) if mip else None
            return LpSolution(LpStatus.TIME_LIMIT, objective, bound, values)
        return LpSolution(LpStatus.OTHER, objective, None, values)
