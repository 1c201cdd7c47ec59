"""The smallest feasible budget: the fast lower bound holds for every schedule, the exact search
matches the exhaustive one, and the planner's infeasible-budget error names that budget."""

from __future__ import annotations

import pytest
from graphs import chain, random_graph
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from solvers.base import EXACT_MAX_GROUPS, InfeasibleBudgetError, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.brute_force import min_feasible_budget
from solvers.checkmate.cpsat import solve_cpsat
from solvers.checkmate.min_budget import peak_lower_bound, smallest_feasible_budget
from solvers.ir.simulator import simulate
from solvers.planning.planner import plan_graph

HYPOTHESIS = settings(max_examples=15, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
OPTIONS = SolverOptions(time_limit_s=10)


def _classic_peak(graph) -> int:
    return min(simulate(graph, store_all_schedule(graph)).peak_bytes,
               simulate(graph, recompute_all_schedule(graph)).peak_bytes)


def _small_graph(seed: int, n_forward: int):
    graph = random_graph(seed, n_forward)
    assume(len(graph.ops) + len(graph.tangents) <= 14)
    return graph


@HYPOTHESIS
@given(st.integers(0, 10_000), st.integers(3, 5))
def test_exact_search_matches_the_exhaustive_search(seed, n_forward):
    graph = _small_graph(seed, n_forward)
    found = smallest_feasible_budget(graph, OPTIONS)
    expected = min(min_feasible_budget(graph), _classic_peak(graph))
    assert found.exact and found.smallest_bytes == expected == found.lower_bytes
    assert simulate(graph, found.schedule).peak_bytes <= found.smallest_bytes
    # The fast bound holds for every schedule, in any order (not only the Checkmate stages).
    assert peak_lower_bound(graph) <= min_feasible_budget(graph, space="free")
    # The exact solvers meet that budget and no smaller one.
    result = solve_cpsat(graph, found.smallest_bytes, OPTIONS)
    assert result.schedule is not None
    assert simulate(graph, result.schedule).peak_bytes <= found.smallest_bytes
    with pytest.raises(InfeasibleBudgetError):
        solve_cpsat(graph, found.smallest_bytes - 1, OPTIONS)


def test_large_graphs_get_the_leanest_classic_peak_and_a_lower_bound():
    graph = random_graph(7, 6)
    found = smallest_feasible_budget(graph, OPTIONS, max_groups=2)
    assert found.smallest_bytes == _classic_peak(graph)
    assert found.lower_bytes == min(peak_lower_bound(graph), found.smallest_bytes)
    assert found.exact is (found.lower_bytes == found.smallest_bytes)
    assert "no exact search" in found.method
    assert simulate(graph, found.schedule).peak_bytes == found.smallest_bytes


def _tight_graph():
    """A random graph whose smallest feasible budget is below both classic schedules' peaks."""
    for seed in range(200):
        graph = random_graph(seed, 5)
        if len(graph.ops) + len(graph.tangents) > 14:
            continue
        if min_feasible_budget(graph) < _classic_peak(graph):
            return graph
    raise AssertionError("no random graph where the exact search beats the classic schedules")


def test_planner_error_names_the_exact_smallest_budget():
    graph = _tight_graph()
    smallest = min_feasible_budget(graph)
    for solver in ("cpsat", "milp", "auto"):
        with pytest.raises(InfeasibleBudgetError) as info:
            plan_graph(graph, smallest - 1, solver, OPTIONS)
        err = info.value
        assert err.smallest_feasible_bytes == smallest and err.exact
        assert err.lower_bound_bytes == smallest
        assert f"{smallest} bytes (exact)" in str(err)
    plan = plan_graph(graph, smallest, "cpsat", OPTIONS)
    assert plan.status in (SolveStatus.OPTIMAL.value, SolveStatus.HEURISTIC.value)
    assert plan.predicted_peak_bytes <= smallest


def test_planner_error_for_a_heuristic_says_a_schedule_exists():
    """recompute-all cannot meet a budget the Checkmate stages meet: the error says so."""
    graph = _tight_graph()
    smallest = min_feasible_budget(graph)
    with pytest.raises(InfeasibleBudgetError) as info:
        plan_graph(graph, smallest, "recompute-all", OPTIONS)
    assert info.value.smallest_feasible_bytes == smallest
    assert "one exists" in str(info.value)


def _named_budget(graph, solver: str = "auto") -> int:
    with pytest.raises(InfeasibleBudgetError) as err:
        plan_graph(graph, 1, solver, SolverOptions(time_limit_s=2))
    assert err.value.smallest_feasible_bytes is not None
    return err.value.smallest_feasible_bytes


@pytest.mark.parametrize("length", [90, 120])
def test_the_budget_an_error_names_plans_on_a_graph_too_large_for_the_exact_search(length, monkeypatch):
    """A chain past the exact solvers' size (auto hands it to hierarchical; min-budget names the
    leanest classic peak without a proof): asked for exactly the named budget, auto plans it,
    by itself (the planner's last resort switched off), at no more than that budget."""
    import solvers.planning.planner as planner

    graph = chain(length)
    assert len(graph.groups) > EXACT_MAX_GROUPS
    named = _named_budget(graph)
    monkeypatch.setattr(planner, "SEARCHING_SOLVERS", ())
    # A time limit too short for the LP rounding and the block plans: what is left must fit.
    plan = plan_graph(graph, named, "auto", SolverOptions(time_limit_s=0.01))
    assert plan.predicted_peak_bytes <= named
    assert "hierarchical" in plan.message


def test_when_a_searching_solver_finds_nothing_the_planner_returns_the_named_schedule(monkeypatch):
    """Whatever auto misses (a time-limited exact model, a heuristic family that cannot reach
    the budget), the smallest-budget search's schedule is the plan at the budget it names; an
    explicitly chosen classic solver still raises (its family is what the user asked for)."""
    import solvers.planning.planner as planner
    from solvers.base import SolveResult

    def finds_nothing(graph, budget_bytes, options):
        return SolveResult("auto", SolveStatus.INFEASIBLE, None, None, None, 0.0, "time limit")

    graph = random_graph(3, n_forward=8)
    found = smallest_feasible_budget(graph, SolverOptions(time_limit_s=2))  # time-limited: fixed once
    monkeypatch.setattr(planner, "smallest_feasible_budget", lambda graph, options: found)
    named = _named_budget(graph)
    monkeypatch.setattr(planner, "get_solver", lambda name: finds_nothing)
    plan = plan_graph(graph, named, "auto", SolverOptions(time_limit_s=2))
    assert plan.predicted_peak_bytes <= named
    assert plan.status == SolveStatus.FEASIBLE.value
    assert "smallest-budget search" in plan.message
    # its gap is proven against the step's own cost (every op runs once), a valid floor
    assert plan.gap is not None and 0 <= plan.gap < 1
    assert plan.bound <= sum(n.cost for n in graph.ops) <= plan.objective
    with pytest.raises(InfeasibleBudgetError, match="found no schedule, but one exists"):
        plan_graph(graph, named, "chen", SolverOptions(time_limit_s=2))
