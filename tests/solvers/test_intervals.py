"""The retention-interval model (`solvers.checkmate.intervals`): its schedules fit, its optimum
is the exhaustive one (backward in order) and never above the Checkmate MILP's, seeds are
solutions of it, its bound never exceeds its objective, and past the exact limit it beats the heuristics."""

from __future__ import annotations

import time

import pytest
from exhaustive import exhaustive_optimum
from graphs import chain, check_exact_result, random_graph, store_and_lean_peaks

from solvers import get_solver
from solvers.base import InfeasibleBudgetError, SolverOptions, SolveStatus
from solvers.brute_force import solve_brute_force
from solvers.checkmate.data import prepare
from solvers.checkmate.interval_lns import improve, model_cost
from solvers.checkmate.interval_model import build_interval_model, recomputable
from solvers.checkmate.interval_placement import hint, placed_schedule, placements
from solvers.checkmate.intervals import cp_model, solve_interval_model, solve_intervals
from solvers.checkmate.milp import solve_milp
from solvers.hierarchical import solve_hierarchical
from solvers.ir.simulator import simulate

pytestmark = pytest.mark.skipif(cp_model is None, reason="needs OR-Tools")
QUICK = SolverOptions(time_limit_s=10)


def _cases(count: int, n_forward: int = 6):
    for seed in range(count):
        graph = random_graph(seed, n_forward=n_forward)
        store, lean = store_and_lean_peaks(graph)
        yield seed, graph, sorted({lean, (lean + store) // 2, store - 1})


def test_optimum_is_the_brute_force_optimum_of_the_checkmate_space() -> None:
    """Same stage order as Checkmate (enough copies for these graphs): the literal cost of every
    computation placed is the exhaustive optimum of that space; the simulated cost (unread
    computations dropped) is at most that and at least the optimum over every order."""
    checked = 0
    for seed, graph, budgets in _cases(25):
        for budget in budgets:
            try:
                expected = solve_brute_force(graph, budget, QUICK)
            except InfeasibleBudgetError:
                expected = None
            got = solve_interval_model(graph, budget, QUICK, copies=5, backward_copies=4)
            if expected is None:
                assert got.schedule is None, (seed, budget)
                continue
            assert got.status is SolveStatus.OPTIMAL, (seed, budget)
            assert got.model_cost == pytest.approx(expected.objective), (seed, budget)
            assert got.objective <= expected.objective + 1e-9
            assert got.bound <= got.objective + 1e-9
            if not any(n.compute_once for n in graph.ops):
                assert exhaustive_optimum(graph, budget) <= got.objective + 1e-9
            checked += 1
    assert checked >= 35


def test_never_above_the_checkmate_milp_and_always_within_budget() -> None:
    for seed, graph, budgets in _cases(12, n_forward=7):
        for budget in budgets:
            got = solve_interval_model(graph, budget, QUICK, copies=4, backward_copies=3)
            try:
                milp = solve_milp(graph, budget, SolverOptions(time_limit_s=20))
            except InfeasibleBudgetError:
                assert got.schedule is None
                continue
            assert got.schedule is not None, (seed, budget)
            assert simulate(graph, got.schedule).peak_bytes <= budget
            if milp.status is SolveStatus.OPTIMAL:
                assert got.objective <= milp.objective + 1e-9, (seed, budget)


@pytest.mark.parametrize("heuristic", ["greedy", "chen-greedy", "recompute-all"])
def test_a_heuristic_schedule_is_a_solution_of_the_model(heuristic) -> None:
    """Each variable fixed to the seed's hint: the model accepts it (its memory is not stricter
    than the simulator's) at no higher cost."""
    tried = 0
    for _, graph, budgets in _cases(15, n_forward=7):
        for budget in budgets:
            try:
                seed = get_solver(heuristic)(graph, budget, QUICK)
            except ValueError:
                continue
            if seed.schedule is None:
                continue
            data = prepare(graph)
            stages = placements(data, seed.schedule)
            assert stages is not None
            copies = {g: max(2, len(stages[g])) if recomputable(data, g) else 1 for g in stages}
            m = build_interval_model(cp_model, data, budget, copies)
            hint(m, stages)
            solver = cp_model.CpSolver()
            solver.parameters.fix_variables_to_their_hinted_value = True
            solver.parameters.max_time_in_seconds = 10
            assert solver.solve(m.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
            assert simulate(graph, placed_schedule(graph, data, m, stages)).total_cost <= seed.objective + 1e-9
            tried += 1
    assert tried >= 10


def test_the_neighbourhood_search_keeps_a_fitting_placement_and_never_raises_its_cost() -> None:
    graph = chain(40, sizes=[10 + (i % 7) for i in range(40)])
    store, lean = store_and_lean_peaks(graph)
    budget = (2 * lean + store) // 3
    seed = get_solver("chen-greedy")(graph, budget, QUICK)
    data = prepare(graph)
    stages = placements(data, seed.schedule)
    copies = {g: max(2, len(stages[g])) if recomputable(data, g) else 1 for g in stages}
    m = build_interval_model(cp_model, data, budget, copies)
    found = improve(cp_model, data, m, stages, time.perf_counter() + 3.0, QUICK)
    assert found.cost_units <= model_cost(data, m, stages)
    sim = simulate(graph, placed_schedule(graph, data, m, found.stages))
    assert sim.peak_bytes <= budget
    assert sim.total_cost <= seed.objective + 1e-9


def test_the_solver_bounds_its_objective_and_fits() -> None:
    graph = chain(12, sizes=[5, 9, 3, 8, 8, 2, 7, 4, 6, 9, 3, 5])
    store, lean = store_and_lean_peaks(graph)
    for budget in (lean, (lean + store) // 2):
        result = solve_intervals(graph, budget, QUICK)
        check_exact_result(graph, budget, result)
        assert result.bound is not None and result.bound <= result.objective + 1e-9


def test_past_the_exact_limit_the_model_improves_on_the_best_heuristic() -> None:
    """91 op groups (past EXACT_MAX_GROUPS, where auto has no exact model): seeded with
    hierarchical's schedule, the model finds a cheaper one within its time limit. (It is opt-in,
    ``solver="intervals"``: in hierarchical's portfolio it took the whole time limit for a
    0.4-point gain on a 1,045-group CNN, see benchmarks/exact_scale.md.)"""
    graph = chain(45, sizes=[10 + (i * 7) % 13 for i in range(45)])
    budget = 160
    heuristic = solve_hierarchical(graph, budget, SolverOptions(time_limit_s=5))
    answer = solve_interval_model(graph, budget, SolverOptions(time_limit_s=10),
                                  warm_start=heuristic.schedule, require_seed=True)
    assert answer.schedule is not None
    sim = simulate(graph, answer.schedule)
    assert sim.peak_bytes <= budget
    assert sim.total_cost < heuristic.objective
