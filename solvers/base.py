"""What every solver shares: options, the result type, statuses and errors.

A solver is a function ``solve(graph, budget_bytes, options) -> SolveResult``. It never
touches torch. Budgets are bytes of peak memory of the whole step, resident parameters and
inputs included (see `solvers.ir.simulator`).
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult

EXACT_MAX_GROUPS = 80
"""Largest graph (op groups) the exact Checkmate model is built for: ``auto`` sends larger graphs
to ``hierarchical``, which also runs the exact MILP on graphs this small, and the exact
smallest-budget search stops here. The O(n^2) model's Python build outlasts a sensible time limit
past it."""


class SolveStatus(enum.Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # a schedule within budget, optimality not proven (time limit)
    HEURISTIC = "heuristic"  # a classic schedule: no optimality claim at all
    INFEASIBLE = "infeasible"


@dataclass(frozen=True)
class SolveProgress:
    """What an exact solver knows while it runs: its incumbent and its proven bound.

    Reported through `SolverOptions.progress` so a caller can show the gap closing, or stop
    waiting when it is small enough. ``final`` marks the last report, which matches the
    returned `SolveResult` (its objective, bound and gap).
    """

    elapsed_s: float
    objective: float | None
    """Cost of the best schedule found so far (None until there is one)."""
    bound: float | None
    """Proven lower bound on the optimal cost (None while the solver has none)."""
    final: bool = False

    @property
    def gap(self) -> float | None:
        """Relative gap (objective - bound) / objective, as `SolveResult.gap`."""
        return _relative_gap(self.objective, self.bound)


ProgressCallback = Callable[[SolveProgress], None]


def _relative_gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None or not math.isfinite(bound):
        return None
    if objective <= 0:
        return 0.0
    return max(0.0, (objective - bound) / objective)


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
    milp_engine: str = "auto"
    """What solves the MILP: 'cbc' (bundled with PuLP), 'highs' (if highspy is installed) or 'auto'.
    (Not to be confused with `optimizer.remat_backend`, the torch.compile backend.)"""
    progress: ProgressCallback | None = None
    """Called with a `SolveProgress` while an exact solver runs (CP-SAT: each incumbent; MILP
    with HiGHS: each incumbent and about every half second as the bound moves; CBC, run as a
    separate program by PuLP, reports nothing while it runs) and once more, ``final=True``,
    with the returned result's objective and bound. Heuristic solvers report nothing."""

    def report(self, start: float, objective: float | None, bound: float | None,
               final: bool = False) -> None:
        """Send a `SolveProgress` to ``progress`` (no-op without one); ``start`` is the
        `time.perf_counter()` at which the solve began."""
        if self.progress is not None:
            self.progress(SolveProgress(time.perf_counter() - start, objective, bound, final))


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
        return _relative_gap(self.objective, self.bound)


class InfeasibleBudgetError(ValueError):
    """No schedule fits the budget; carries the smallest budget known to be feasible.

    ``exact``: ``smallest_feasible_bytes`` is proven smallest (see `solvers.checkmate.min_budget`), not
    just a budget known to work; ``lower_bound_bytes``: no schedule fits below it (if known).
    """

    def __init__(self, budget_bytes: int, smallest_feasible_bytes: int | None, detail: str = "",
                 *, exact: bool = False, lower_bound_bytes: int | None = None):
        self.budget_bytes = budget_bytes
        self.detail = detail
        self.smallest_feasible_bytes = smallest_feasible_bytes
        self.exact = exact and smallest_feasible_bytes is not None
        self.lower_bound_bytes = lower_bound_bytes
        if smallest_feasible_bytes is None:
            hint = ""
        elif self.exact:
            hint = f"; the smallest feasible budget is {smallest_feasible_bytes} bytes (exact)"
        else:
            hint = f"; the smallest feasible budget found is {smallest_feasible_bytes} bytes"
            if lower_bound_bytes is not None:
                hint += f" (none fits below {lower_bound_bytes} bytes)"
        super().__init__(f"no schedule fits a budget of {budget_bytes} bytes{hint}{detail}")


class ScheduleTooLongError(ValueError):
    """A solver refuses to build a schedule too long to build or simulate (recompute-all on a
    long chain: hundreds of millions of recomputations); the message names the estimate and a
    solver to use instead. A ValueError, as for a solver that does not apply to the graph: the
    classic-schedule phases of ``auto`` and ``hierarchical`` skip it."""


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


@contextlib.contextmanager
def stdout_silenced():
    """Point file descriptor 1 at /dev/null: HiGHS (a C++ library) prints its banner there,
    not to sys.stdout, whatever its options say."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
