"""CP-SAT on the Checkmate model: same optimum as the MILP and the exhaustive search, every
schedule judged by the simulator, deterministic, and never worse than its warm start."""

import pytest
from graphs import chain, check_exact_result, random_graph, store_and_lean_peaks
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from solvers import get_solver
from solvers.base import InfeasibleBudgetError, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule
from solvers.brute_force import min_feasible_budget, solve_brute_force
from solvers.checkmate.cpsat import solve_cpsat, solve_cpsat_model
from solvers.checkmate.milp import solve_milp, solve_milp_model
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate

CPSAT = SolverOptions(time_limit_s=30)
HIGHS = SolverOptions(milp_engine="highs", time_limit_s=30)
HYPOTHESIS = settings(max_examples=20, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TOL = 1e-6




@st.composite
def graph_and_budget(draw):
    graph = random_graph(draw(st.integers(0, 10_000)), draw(st.integers(4, 6)))
    assume(len(graph.ops) + len(graph.tangents) <= 15)
    store, lean = store_and_lean_peaks(graph)
    budget = draw(st.integers(min(store, lean), max(store, lean)))
    return graph, budget


@HYPOTHESIS
@given(graph_and_budget())
def test_cpsat_matches_milp_and_exhaustive_search(case):
    graph, budget = case
    cpsat = solve_cpsat_model(graph, budget, CPSAT)
    milp = solve_milp_model(graph, budget, HIGHS)
    assert cpsat.status is milp.status
    try:
        exact = solve_brute_force(graph, budget, CPSAT)
    except InfeasibleBudgetError:
        assert cpsat.status is SolveStatus.INFEASIBLE
        try:  # a classic schedule outside the Checkmate space may still fit
            result = solve_cpsat(graph, budget, CPSAT)
        except InfeasibleBudgetError as exc:
            assert exc.smallest_feasible_bytes > budget
        else:
            assert result.status is SolveStatus.HEURISTIC
            check_exact_result(graph, budget, result)
        return
    assert cpsat.status is SolveStatus.OPTIMAL
    assert cpsat.model_cost == pytest.approx(milp.model_cost, abs=TOL)
    assert cpsat.model_cost == pytest.approx(exact.objective, abs=TOL)
    assert cpsat.bound == pytest.approx(cpsat.model_cost, abs=TOL)

    result = solve_cpsat(graph, budget, CPSAT)
    check_exact_result(graph, budget, result)
    assert result.status in (SolveStatus.OPTIMAL, SolveStatus.HEURISTIC)
    assert result.objective <= cpsat.model_cost + TOL


@settings(HYPOTHESIS, max_examples=6)
@given(st.integers(0, 10_000), st.integers(4, 5))
def test_budgets_below_the_minimum_are_infeasible_for_both(seed, n_forward):
    graph = random_graph(seed, n_forward)
    assume(len(graph.ops) + len(graph.tangents) <= 14)
    smallest = min_feasible_budget(graph)
    assert solve_cpsat_model(graph, smallest, CPSAT).status is SolveStatus.OPTIMAL
    assert solve_cpsat_model(graph, smallest - 1, CPSAT).status is SolveStatus.INFEASIBLE
    assert solve_milp_model(graph, smallest - 1, HIGHS).status is SolveStatus.INFEASIBLE
    budget = min(smallest, *store_and_lean_peaks(graph)) - 1
    for solve, options in ((solve_cpsat, CPSAT), (solve_milp, HIGHS)):
        with pytest.raises(InfeasibleBudgetError) as info:
            solve(graph, budget, options)
        assert info.value.smallest_feasible_bytes > budget


def test_store_all_fitting_is_optimal_at_once():
    graph = random_graph(1, 5)
    result = solve_cpsat(graph, store_and_lean_peaks(graph)[0], CPSAT)
    check_exact_result(graph, store_and_lean_peaks(graph)[0], result)
    assert result.status is SolveStatus.OPTIMAL
    assert result.objective == pytest.approx(graph.base_cost)


def test_same_inputs_give_the_same_schedule():
    graph = chain(8)
    budget = min_feasible_budget(graph) + 4
    first = solve_cpsat(graph, budget, CPSAT)
    second = solve_cpsat(graph, budget, CPSAT)
    assert first.schedule == second.schedule
    assert first.objective == second.objective


def test_warm_started_time_limited_solve_is_never_worse_than_its_hint():
    graph = chain(12)
    store, lean = store_and_lean_peaks(graph)
    budget = (store + lean) // 2
    hint = recompute_all_schedule(graph)
    assert simulate(graph, hint).peak_bytes <= budget
    hinted_cost = simulate(graph, hint).total_cost
    quick = SolverOptions(time_limit_s=0.05)
    solution = solve_cpsat_model(graph, budget, quick, warm_start=hint)
    assert solution.warm_started
    assert solution.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)
    assert solution.model_cost <= hinted_cost + TOL
    if solution.bound is not None:
        assert solution.bound <= solution.model_cost + TOL
    schedule = Schedule.from_computes(graph, solution.forward, solution.backward)
    sim = simulate(graph, schedule)
    assert sim.peak_bytes <= budget
    assert sim.total_cost <= hinted_cost + TOL
    result = solve_cpsat(graph, budget, quick)
    check_exact_result(graph, budget, result)
    assert result.objective <= hinted_cost + TOL


def test_large_byte_counts_are_scaled_conservatively():
    """Megabyte values with an odd byte: the unit rounds every count up, the budget down."""
    graph = chain(6, sizes=[10**9 + 1, 3 * 10**9, 10**9 + 7, 2 * 10**9, 10**9, 10**9 + 3])
    store, lean = store_and_lean_peaks(graph)
    for budget in (lean, (store + lean) // 2, store - 1):
        result = solve_cpsat(graph, budget, CPSAT)
        check_exact_result(graph, budget, result)


def test_registered_and_verbose_progress(capsys):
    graph = chain(5)
    budget = min_feasible_budget(graph) + 2
    result = get_solver("cpsat")(graph, budget, SolverOptions(time_limit_s=10, verbose=True))
    check_exact_result(graph, budget, result)
    assert "incumbent" in capsys.readouterr().out
