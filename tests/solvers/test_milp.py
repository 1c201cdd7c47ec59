"""The Checkmate MILP against an exhaustive search of the same schedule space, and the
simulator as the judge of every schedule it returns."""

import importlib.util

import pytest
from graphs import (
    B,
    F,
    chain,
    check_exact_result,
    op,
    random_graph,
    store_and_lean_peaks,
    tiny_chain,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from solvers.base import (
    InfeasibleBudgetError,
    SolverOptions,
    SolverUnavailableError,
    SolveStatus,
)
from solvers.baselines import recompute_all_schedule
from solvers.brute_force import MAX_VALUES, min_feasible_budget, solve_brute_force
from solvers.checkmate.milp import model_size, solve_milp, solve_milp_model
from solvers.ir.graph import Node, NodeKind, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate

CBC = SolverOptions(milp_engine="cbc", time_limit_s=60)
HYPOTHESIS = settings(max_examples=20, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TOL = 1e-6


def _values(graph: RematGraph) -> int:
    return len(graph.ops) + len(graph.tangents)




def _dropout_graph() -> RematGraph:
    """A random two-output op (output + mask) inside a small chain."""
    nodes = (
        Node("x", NodeKind.INPUT, F, 4),
        op("a", F, 8, ["x"]),
        op("d_out", F, 8, ["a"], group="d", random=True),
        Node("d_mask", NodeKind.OP, F, 2, ("a",), group="d", random=True),
        op("b", F, 8, ["d_out"], cost=3.0),
        op("loss", F, 1, ["b"]),
        Node("t", NodeKind.TANGENT, B, 1),
        op("gb", B, 8, ["t", "d_out"]),
        op("gd", B, 8, ["gb", "d_mask"]),
        op("ga", B, 8, ["gd", "x", "a"]),
    )
    return RematGraph(nodes, forward_outputs=("loss",), user_outputs=("loss",),
                      backward_outputs=("ga",))


@st.composite
def graph_and_budget(draw):
    graph = random_graph(draw(st.integers(0, 10_000)), draw(st.integers(4, 6)))
    assume(_values(graph) <= 15)
    store, lean = store_and_lean_peaks(graph)
    budget = draw(st.integers(min(store, lean), max(store, lean)))
    return graph, budget


# ------------------------------------------------------- the oracle: same optimum
@settings(HYPOTHESIS, max_examples=25)
@given(graph_and_budget())
def test_milp_model_matches_exhaustive_search(case):
    graph, budget = case
    model = solve_milp_model(graph, budget, CBC)
    try:
        exact = solve_brute_force(graph, budget, CBC)
    except InfeasibleBudgetError as exc:
        # Possible between the two classic peaks: recompute-all defers forward ops that
        # the Checkmate stages must run in forward. The model must agree.
        assert model.status is SolveStatus.INFEASIBLE
        assert exc.smallest_feasible_bytes > budget
        return
    assert model.status is SolveStatus.OPTIMAL
    assert model.model_cost == pytest.approx(exact.objective, abs=TOL)
    assert model.bound == pytest.approx(model.model_cost, abs=TOL)

    result = solve_milp(graph, budget, CBC)
    check_exact_result(graph, budget, result)
    assert result.status is SolveStatus.OPTIMAL
    # from_computes only drops computations nobody reads: never dearer than the model.
    assert result.objective <= model.model_cost + TOL


@settings(HYPOTHESIS, max_examples=25)
@given(graph_and_budget())
def test_every_milp_schedule_passes_the_simulator(case):
    graph, budget = case
    result = solve_milp(graph, budget, CBC)
    check_exact_result(graph, budget, result)
    assert result.status in (SolveStatus.OPTIMAL, SolveStatus.HEURISTIC)
    counts = result.schedule.compute_counts()
    for node in graph.ops:
        if node.compute_once:
            assert counts[node.name] == 1
    # The caller holds forward's user outputs: backward never frees and recomputes them.
    for name in graph.user_outputs:
        assert name not in result.schedule.computes("backward")


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.integers(0, 10_000), st.integers(4, 5))
def test_model_is_exact_at_the_smallest_feasible_budget(seed, n_forward):
    """Feasible at the exhaustive minimum, infeasible one byte below: the model's memory
    accounting is neither optimistic nor pessimistic."""
    graph = random_graph(seed, n_forward)
    assume(_values(graph) <= 14)
    smallest = min_feasible_budget(graph)
    assert solve_milp_model(graph, smallest, CBC).status is SolveStatus.OPTIMAL
    assert solve_milp_model(graph, smallest - 1, CBC).status is SolveStatus.INFEASIBLE


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.integers(0, 10_000), st.integers(4, 5))
def test_budgets_below_the_minimum_raise(seed, n_forward):
    graph = random_graph(seed, n_forward)
    assume(_values(graph) <= 14)
    budget = min(min_feasible_budget(graph), *store_and_lean_peaks(graph)) - 1
    with pytest.raises(InfeasibleBudgetError) as info:
        solve_milp(graph, budget, CBC)
    assert info.value.budget_bytes == budget
    assert info.value.smallest_feasible_bytes is not None
    assert info.value.smallest_feasible_bytes > budget
    # ... and that budget is feasible indeed.
    check_exact_result(graph, info.value.smallest_feasible_bytes,
           solve_milp(graph, info.value.smallest_feasible_bytes, CBC))


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(graph_and_budget())
def test_any_order_search_is_a_lower_bound(case):
    """The stage structure is a restriction: any-order schedules can only be cheaper."""
    graph, budget = case
    assume(_values(graph) <= 13)
    result = solve_milp(graph, budget, CBC)
    free_order = solve_brute_force(graph, budget, CBC, space="free")
    check_exact_result(graph, budget, free_order)
    assert free_order.objective <= result.objective + TOL


# ------------------------------------------------------------------ chains
@pytest.mark.parametrize("length", [4, 5, 6])
def test_chain_objective_is_monotone_in_the_budget(length):
    graph = chain(length)
    store, _ = store_and_lean_peaks(graph)
    low = min_feasible_budget(graph)
    previous = None
    for budget in range(low, store + 1, 3):
        result = solve_milp(graph, budget, CBC)
        check_exact_result(graph, budget, result)
        if previous is not None:
            assert result.objective <= previous + TOL
        previous = result.objective
    assert previous is not None


@pytest.mark.parametrize("length", [3, 5])
def test_chain_matches_exhaustive_search(length):
    graph = chain(length)
    store, _ = store_and_lean_peaks(graph)
    for budget in range(min_feasible_budget(graph), store + 1, 2):
        exact = solve_brute_force(graph, budget, CBC)
        model = solve_milp_model(graph, budget, CBC)
        assert model.model_cost == pytest.approx(exact.objective, abs=TOL)


def test_tight_budgets_cost_recomputation_on_a_chain():
    """chain(4) at its smallest feasible budget recomputes; at store-all's peak it does not."""
    graph = chain(4)
    low = min_feasible_budget(graph)
    result = solve_milp(graph, low, CBC)
    check_exact_result(graph, low, result)
    assert result.objective > graph.base_cost  # tight budgets cost recomputation
    assert solve_milp(graph, store_and_lean_peaks(graph)[0], CBC).objective == graph.base_cost


def test_large_byte_counts_are_scaled_safely():
    """Megabyte-sized values: the model works in scaled units with a safety margin."""
    small, large = chain(6), chain(6, size=10**7)
    for graph in (small, large):
        store, lean = store_and_lean_peaks(graph)
        budget = (store + lean) // 2
        result = solve_milp(graph, budget, CBC)
        check_exact_result(graph, budget, result)
        assert result.status is SolveStatus.OPTIMAL
    # Same shape, same trade-off: the large chain's middle budget buys the same recomputation.
    assert (solve_milp(large, sum(store_and_lean_peaks(large)) // 2, CBC).objective
            == solve_milp(small, sum(store_and_lean_peaks(small)) // 2, CBC).objective)


# ---------------------------------------------------------------- store-all fits
@pytest.mark.parametrize("graph", [tiny_chain(), chain(5), random_graph(3, 6), _dropout_graph()],
                         ids=["tiny_chain", "chain5", "random3", "dropout"])
def test_store_all_fitting_returns_zero_extra_cost(graph):
    store, _ = store_and_lean_peaks(graph)
    result = solve_milp(graph, store, CBC)
    check_exact_result(graph, store, result)
    assert result.status is SolveStatus.OPTIMAL
    assert simulate(graph, result.schedule).extra_cost == 0
    assert result.bound == result.objective


# ------------------------------------------------------------- run-once and siblings
def test_random_op_runs_once_and_siblings_are_computed_together():
    graph = _dropout_graph()
    store, _ = store_and_lean_peaks(graph)
    low = min_feasible_budget(graph)
    assert low < store
    for budget in range(low, store):
        result = solve_milp(graph, budget, CBC)
        check_exact_result(graph, budget, result)
        exact = solve_brute_force(graph, budget, CBC)
        model = solve_milp_model(graph, budget, CBC)
        assert model.model_cost == pytest.approx(exact.objective, abs=TOL)
        counts = result.schedule.compute_counts()
        assert counts["d_out"] == counts["d_mask"] == 1
        assert "d_out" not in result.schedule.computes("backward")


# ---------------------------------------------------------------- statuses and options
def test_time_limit_returns_a_schedule_with_a_bound():
    graph = chain(16)
    store, lean = store_and_lean_peaks(graph)
    budget = (store + lean) // 2
    result = solve_milp(graph, budget, SolverOptions(milp_engine="cbc", time_limit_s=1))
    check_exact_result(graph, budget, result)
    assert result.status in (SolveStatus.FEASIBLE, SolveStatus.OPTIMAL)
    assert result.bound is not None and result.bound >= graph.base_cost - TOL
    lean_cost = simulate(graph, recompute_all_schedule(graph)).total_cost
    assert result.objective <= lean_cost + TOL  # never worse than a classic schedule


def test_same_inputs_give_the_same_schedule():
    graph = random_graph(11, 6)
    store, lean = store_and_lean_peaks(graph)
    budget = (store + lean) // 2
    first = solve_milp(graph, budget, CBC)
    second = solve_milp(graph, budget, CBC)
    assert first.schedule == second.schedule
    assert first.objective == second.objective


def _highs_available() -> bool:
    import pulp

    return importlib.util.find_spec("highspy") is not None and pulp.HiGHS(msg=False).available()


def test_auto_backend_prefers_highs():
    graph = chain(4)
    solution = solve_milp_model(graph, store_and_lean_peaks(graph)[1], SolverOptions())
    assert solution.engine == ("highs" if _highs_available() else "cbc")


@pytest.mark.skipif(not _highs_available(), reason="highspy is not installed")
@pytest.mark.parametrize("seed", [1, 3, 7, 12])
def test_highs_backend_matches_exhaustive_search(seed):
    graph = random_graph(seed, 5)
    store, lean = store_and_lean_peaks(graph)
    budget = (store + lean) // 2
    highs = SolverOptions(milp_engine="highs", time_limit_s=60)
    model = solve_milp_model(graph, budget, highs)
    exact = solve_brute_force(graph, budget, highs)
    assert model.status is SolveStatus.OPTIMAL
    assert model.model_cost == pytest.approx(exact.objective, abs=TOL)
    check_exact_result(graph, budget, solve_milp(graph, budget, highs))


@pytest.mark.skipif(not _highs_available(), reason="highspy is not installed")
def test_highs_time_limit_keeps_the_mip_start():
    graph = chain(16)
    store, lean = store_and_lean_peaks(graph)
    budget = (store + lean) // 2
    result = solve_milp(graph, budget, SolverOptions(milp_engine="highs", time_limit_s=0.5))
    check_exact_result(graph, budget, result)
    assert result.status in (SolveStatus.FEASIBLE, SolveStatus.OPTIMAL)


def test_highs_backend_needs_highspy():
    if _highs_available():
        pytest.skip("highspy is installed")
    graph = chain(4)
    with pytest.raises(SolverUnavailableError, match="pip install highspy"):
        solve_milp(graph, store_and_lean_peaks(graph)[1], SolverOptions(milp_engine="highs"))


def test_unknown_backend_is_rejected():
    graph = chain(4)
    with pytest.raises(ValueError, match="back-end"):
        solve_milp(graph, store_and_lean_peaks(graph)[1], SolverOptions(milp_engine="gurobi"))


def test_model_size_is_quadratic_in_the_groups():
    graph = chain(8)
    size = model_size(graph, store_and_lean_peaks(graph)[1])
    groups = len(graph.groups)
    assert size["R"] <= groups * (groups - 1) // 2
    assert size["U"] <= groups * (groups + 1) // 2
    assert size["S"] <= _values(graph) * groups
    assert size["variables"] == size["R"] + size["S"] + size["FREE"] + size["U"]


def test_brute_force_refuses_large_graphs():
    with pytest.raises(ValueError, match="tiny graphs"):
        solve_brute_force(chain(MAX_VALUES), 10**9, CBC)


def test_brute_force_schedule_is_explicit_and_simulated():
    graph = tiny_chain()
    result = solve_brute_force(graph, 232, CBC)
    assert isinstance(result.schedule, Schedule)
    check_exact_result(graph, 232, result)
    assert result.objective == graph.base_cost
