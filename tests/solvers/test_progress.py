"""`SolverOptions.progress`: the exact back-ends report incumbent and bound while they solve,
never an incumbent below its bound, and a last report that matches the returned result."""

from __future__ import annotations

import importlib.util

import pytest
from graphs import chain

from solvers import get_solver
from solvers.base import SolveProgress, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.ir.simulator import simulate

TOL = 1e-9
needs_highs = pytest.mark.skipif(importlib.util.find_spec("highspy") is None,
                                 reason="highspy is not installed")


def _case():
    """chain(10) halfway between recompute-all's and store-all's peaks: recomputation needed,
    several incumbents before the optimum, solved in about a second by every back-end."""
    graph = chain(10)
    store = simulate(graph, store_all_schedule(graph)).peak_bytes
    lean = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    return graph, (store + lean) // 2


def _solve(solver: str, **options):
    graph, budget = _case()
    events: list[SolveProgress] = []
    result = get_solver(solver)(graph, budget,
                                SolverOptions(time_limit_s=30, progress=events.append, **options))
    return result, events


def _check_reports(result, events: list[SolveProgress]) -> list[SolveProgress]:
    """Every report is consistent; the last one is final and is the result. Returns the
    reports made during the solve."""
    assert events, "no progress reported"
    *during, last = events
    assert last.final and not any(e.final for e in during)
    assert last.objective == pytest.approx(result.objective, abs=TOL)
    assert last.bound == pytest.approx(result.bound, abs=TOL)
    assert last.gap == pytest.approx(result.gap, abs=TOL)
    times = [e.elapsed_s for e in events]
    assert times == sorted(times) and times[0] >= 0
    for e in events:
        if e.objective is not None and e.bound is not None:
            assert e.objective >= e.bound - 1e-6 * max(1.0, abs(e.objective))
    return during


def test_cpsat_reports_each_incumbent_with_its_bound():
    result, events = _solve("cpsat")
    assert result.status is SolveStatus.OPTIMAL
    during = _check_reports(result, events)
    assert during and all(e.objective is not None and e.bound is not None for e in during)
    incumbents = [e.objective for e in during]
    assert incumbents == sorted(incumbents, reverse=True)  # each one improves on the last
    assert incumbents[-1] >= result.objective - TOL  # simulated cost: never above the model's


@needs_highs
def test_highs_reports_incumbent_and_bound_while_solving():
    result, events = _solve("milp", milp_engine="highs")
    assert result.status is SolveStatus.OPTIMAL
    during = _check_reports(result, events)
    with_incumbent = [e for e in during if e.objective is not None]
    assert with_incumbent, "HiGHS reported no incumbent"
    # The objective's constant (each stage's own group) is added back: the incumbents are
    # real costs, never below the optimum.
    assert min(e.objective for e in with_incumbent) >= result.objective - 1e-6


def test_cbc_reports_only_the_final_result():
    result, events = _solve("milp", milp_engine="cbc")
    assert result.status is SolveStatus.OPTIMAL
    assert _check_reports(result, events) == []


def test_auto_passes_progress_to_its_exact_stage_and_reports_the_result():
    result, events = _solve("auto")
    _check_reports(result, events)


def test_store_all_shortcut_reports_one_final_zero_gap():
    graph, _ = _case()
    store = simulate(graph, store_all_schedule(graph)).peak_bytes
    events: list[SolveProgress] = []
    result = get_solver("cpsat")(graph, store, SolverOptions(progress=events.append))
    assert [e.final for e in events] == [True]
    assert events[0].gap == 0.0 and result.gap == 0.0


@pytest.mark.parametrize("solver, backend", [("cpsat", "auto"),
                                             pytest.param("milp", "highs", marks=needs_highs)])
def test_an_exception_in_the_callback_reaches_the_caller(solver, backend):
    def fail(progress: SolveProgress) -> None:
        if not progress.final:
            raise KeyboardInterrupt("stop")

    graph, budget = _case()
    with pytest.raises(KeyboardInterrupt):
        get_solver(solver)(graph, budget, SolverOptions(milp_engine=backend, progress=fail))
