"""A small sparse LP/MIP builder on HiGHS (highspy), for the bound and block models.

PuLP builds its model in Python objects, one expression per constraint: fine for the Checkmate
MILP's few thousand rows, slow for the bound LP's hundred thousand coefficients. This builder
collects rows as index/value lists and hands HiGHS one column-wise matrix.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from solvers.base import stdout_silenced


class LpStatus(enum.Enum):
    OPTIMAL = "optimal"
    INFEASIBLE = "infeasible"
    TIME_LIMIT = "time limit"
    OTHER = "other"


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

    def solve(self, time_limit_s: float = 60.0, threads: int = 1,
              primal_simplex: bool = False) -> LpSolution:
        """``primal_simplex``: HiGHS's primal simplex instead of its default dual simplex (about
        2x faster on the bound LP of a long chain, benchmarks/long_chains.md)."""
        import highspy  # optional: highspy (HiGHS)

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
        columns: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for r, (index, value) in enumerate(self.rows):
            for i, v in zip(index, value):
                columns[i].append((r, v))
        starts, index, value = [0], [], []
        for col in columns:
            index.extend(r for r, _ in col)
            value.extend(v for _, v in col)
            starts.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(value, dtype=float)
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
