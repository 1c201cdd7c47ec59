"""Every registered solver, on random graphs and budgets: the simulator accepts its schedule and
the schedule never exceeds a budget the solver claims to meet (or the solver says infeasible).
The exact back-ends agree with each other and with the exhaustive search, are deterministic,
and ``auto`` picks what is installed and is never worse than a heuristic."""

from __future__ import annotations

import pytest
from graphs import chain, random_graph
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from solvers import SOLVERS, get_solver
from solvers.base import InfeasibleBudgetError, SolverOptions, SolverUnavailableError, SolveStatus
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.brute_force import min_feasible_budget, solve_brute_force
from solvers.ir.simulator import simulate

OPTIONS = SolverOptions(time_limit_s=5.0, milp_engine="highs")
NOT_CHAIN_SOLVERS = {"revolve"}  # raises ValueError on graphs that are not chains, by design


@pytest.mark.parametrize("name", sorted(SOLVERS))
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(3, 6), fraction=st.floats(0.0, 1.2))
def test_every_solver_returns_valid_schedules_within_budget(name, seed, size, fraction):
    graph = random_graph(seed, size)
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    low = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    budget = max(1, int(low + fraction * (high - low)))
    try:
        result = get_solver(name)(graph, budget, OPTIONS)
    except InfeasibleBudgetError as err:
        assert err.smallest_feasible_bytes is None or err.smallest_feasible_bytes > budget
        return
    except ValueError:
        assert name in NOT_CHAIN_SOLVERS
        return
    if result.status is SolveStatus.INFEASIBLE:
        assert result.schedule is None
        return
    sim = simulate(graph, result.schedule)
    assert sim.peak_bytes <= budget
    assert result.objective == pytest.approx(sim.total_cost, rel=1e-9, abs=1e-12)
    if result.bound is not None:
        assert result.bound <= result.objective + 1e-9


# ------------------------------------------------ the exact back-ends against each other
EXACT = {"milp-highs": ("milp", SolverOptions(time_limit_s=20, milp_engine="highs")),
         "milp-cbc": ("milp", SolverOptions(time_limit_s=20, milp_engine="cbc")),
         "cpsat": ("cpsat", SolverOptions(time_limit_s=20))}


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(seed=st.integers(0, 10_000), size=st.integers(3, 6), fraction=st.floats(0.0, 1.0))
def test_milp_cpsat_and_brute_force_agree_on_the_optimum(seed, size, fraction):
    """Random DAGs of up to ~13 nodes: both back-ends and the exhaustive search of the same
    schedule space give the same optimum (or all say infeasible), and every schedule fits."""
    graph = random_graph(seed, size)
    assume(len(graph.ops) + len(graph.tangents) <= 14)
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    low = min(high, simulate(graph, recompute_all_schedule(graph)).peak_bytes)
    floor = int(0.9 * min_feasible_budget(graph))  # a tenth below the smallest feasible budget
    budget = int(floor + fraction * (high - floor))
    try:
        exact = solve_brute_force(graph, budget, OPTIONS)
    except InfeasibleBudgetError:
        exact = None
    free = None if exact is None else solve_brute_force(graph, budget, OPTIONS, space="free")
    for label in ("milp-highs", "cpsat"):
        name, options = EXACT[label]
        try:
            result = get_solver(name)(graph, budget, options)
        except InfeasibleBudgetError as err:
            assert exact is None and budget < low, label  # infeasible for both, and truly
            assert err.smallest_feasible_bytes > budget
            continue
        sim = simulate(graph, result.schedule)
        assert sim.peak_bytes <= budget and result.objective == pytest.approx(sim.total_cost)
        if exact is None:  # outside the Checkmate space: a classic schedule that fits
            assert result.status is SolveStatus.HEURISTIC, label
            continue
        assert result.status is SolveStatus.OPTIMAL, label
        # The returned schedule drops unread computations, so it may beat the stages' optimum,
        # never the optimum over every schedule order.
        assert free.objective - 1e-9 <= result.objective <= exact.objective + 1e-9, label


@pytest.mark.parametrize("label", sorted(EXACT) + ["auto"])
def test_same_graph_budget_and_options_give_the_same_schedule(label):
    graph = chain(8)
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    budget = (min_feasible_budget(graph) + high) // 2
    name, options = EXACT.get(label, (label, SolverOptions(time_limit_s=20)))
    first, second = (get_solver(name)(graph, budget, options) for _ in range(2))
    assert first.schedule == second.schedule and first.objective == second.objective
    assert first.status is SolveStatus.OPTIMAL
    assert first.objective > graph.base_cost  # a real solve: recomputation was needed


# ------------------------------------------------ auto: what is installed, never worse
def test_auto_uses_the_first_installed_exact_back_end(monkeypatch):
    import solvers.auto as auto
    from solvers.auto import exact_engine
    from solvers.backends import Backend

    monkeypatch.setattr(auto, "highs_available", lambda: True)
    assert exact_engine(SolverOptions()) == "highs"
    assert exact_engine(SolverOptions(milp_engine="cbc")) == "cbc"
    monkeypatch.setattr(auto, "highs_available", lambda: False)
    assert exact_engine(SolverOptions()) == "cpsat"
    monkeypatch.setattr(auto, "cp_sat_backend", lambda: Backend(None, "clash"))
    assert exact_engine(SolverOptions()) == "cbc"


@pytest.mark.parametrize("backend", ["highs", "cpsat", "cbc"])
def test_auto_is_never_worse_than_the_best_heuristic(backend, monkeypatch):
    import solvers.auto as auto

    monkeypatch.setattr(auto, "exact_engine", lambda options: backend)
    graph = random_graph(3, 6)
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    budget = (min_feasible_budget(graph) + high) // 2
    result = get_solver("auto")(graph, budget, SolverOptions(time_limit_s=20))
    heuristics = []
    for name in auto.HEURISTICS:
        try:
            answer = get_solver(name)(graph, budget, OPTIONS)
        except ValueError:
            continue
        if answer.schedule is not None:
            heuristics.append(answer.objective)
    assert simulate(graph, result.schedule).peak_bytes <= budget
    assert all(result.objective <= cost + 1e-12 for cost in heuristics)
    assert result.status is SolveStatus.OPTIMAL, result.message
    assert {"highs": "highs", "cbc": "cbc", "cpsat": "cp-sat"}[backend] in result.message


def test_unavailable_back_ends_fail_with_an_install_hint(monkeypatch):
    import solvers.checkmate.cpsat as cpsat
    import solvers.checkmate.milp_engines as backend

    graph = chain(4)  # room below store-all (52 vs 62 bytes): the exact back-ends must run
    store = simulate(graph, store_all_schedule(graph)).peak_bytes
    budget = (min_feasible_budget(graph) + store) // 2
    monkeypatch.setattr(cpsat, "cp_model", None)
    with pytest.raises(SolverUnavailableError, match="pip install ortools"):
        get_solver("cpsat")(graph, budget, OPTIONS)
    monkeypatch.setattr(backend, "highs_available", lambda: False)
    with pytest.raises(SolverUnavailableError, match="pip install highspy"):
        get_solver("milp")(graph, budget, SolverOptions(milp_engine="highs"))
