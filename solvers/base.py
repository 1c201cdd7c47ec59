"""What every solver shares: options, the result type, statuses and errors.

A solver is a function ``solve(graph, budget_bytes, options) -> SolveResult``. It never
touches torch. Budgets are bytes of peak memory of the whole step, resident parameters and
inputs included (see `optimizer.simulator`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import time

from optimizer.schedule import Schedule
from optimizer.simulator import SimulationResult


class SolveStatus(enum.Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # a schedule within budget, optimality not proven (time limit)
    HEURISTIC = "heuristic"  # a classic schedule: no optimality claim at all
    INFEASIBLE = "infeasible"


@dataclass(frozen=True, kw_only=True)
class SolverOptions:
    time_limit_s: float = 60.0
    """Wall-clock limit of the solve; the best schedule found by then is returned."""
    threads: int = 1
    """Solver threads (the exact solvers are deterministic with a fixed thread count)."""
    verbose: bool = False
    """Show the back-end's own log."""
    seed: int = 0
    """Random seed of solvers that search randomly (CP-SAT); fixed for reproducible plans."""
    backend: str = "auto"
    """MILP back-end: 'cbc' (bundled with PuLP), 'highs' (if highspy is installed) or 'auto'."""


@dataclass(frozen=True)
class SolveResult:
    """A solver's answer. ``schedule`` is None only when ``status`` is INFEASIBLE."""

    solver: str
    status: SolveStatus
    schedule: Schedule | None
    objective: float | None
    """Total compute cost (seconds under the graph's cost model) of the schedule."""
    bound: float | None
    """Proven lower bound on the optimal total cost (None when the solver proves none)."""
    solve_time_s: float
    message: str = ""

    @property
    def gap(self) -> float | None:
        """Relative optimality gap (objective - bound) / objective; 0 when optimal."""
        if self.objective is None or self.bound is None:
            return None
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)


class InfeasibleBudgetError(ValueError):
    """No schedule fits the budget; carries the smallest budget known to be feasible."""

    def __init__(self, budget_bytes: int, smallest_feasible_bytes: int | None, detail: str = ""):
        self.budget_bytes = budget_bytes
        self.smallest_feasible_bytes = smallest_feasible_bytes
        hint = (
            f"; the smallest feasible budget found is {smallest_feasible_bytes} bytes"
            if smallest_feasible_bytes is not None
            else ""
        )
        super().__init__(f"no schedule fits a budget of {budget_bytes} bytes{hint}{detail}")


class SolverUnavailableError(RuntimeError):
    """An optional back-end is not installed; the message says what to install."""


def heuristic_result(
    solver: str, budget_bytes: int, schedule: Schedule | None,
    sim: SimulationResult | None, start: float, detail: str = "",
) -> SolveResult:
    """A schedule with no optimality claim: HEURISTIC when its simulated peak fits the budget,
    else INFEASIBLE with that peak in the message."""
    if schedule is None or sim is None:
        return SolveResult(solver, SolveStatus.INFEASIBLE, None, None, None,
                           time.perf_counter() - start, detail)
    fits = sim.peak_bytes <= budget_bytes
    message = detail if fits else f"{solver} peaks at {sim.peak_bytes} bytes" + (
        f" ({detail})" if detail else "")
    return SolveResult(
        solver=solver,
        status=SolveStatus.HEURISTIC if fits else SolveStatus.INFEASIBLE,
        schedule=schedule if fits else None,
        objective=sim.total_cost if fits else None,
        bound=None,
        solve_time_s=time.perf_counter() - start,
        message=message,
    )
