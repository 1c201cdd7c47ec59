"""The scale path: meta/fake captures equal real ones, the bound never exceeds the exact
optimum, and ``hierarchical`` lands within 2% of the MILP optimum where that is known."""

import pytest
import torch
from graphs import chain, random_graph

from examples import gpt, gpt2, mlp
from frontends.capture.step import capture
from optimizer.meta_plan import plan_without_hardware
from solvers import get_solver
from solvers.base import InfeasibleBudgetError, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.block_plan import block_kinds
from solvers.ir.simulator import simulate
from solvers.remat_bound import lower_bound

EXACT = SolverOptions(time_limit_s=60)
FAST = SolverOptions(time_limit_s=40)


def _sizes(step) -> tuple[int, int, int, int]:
    graph = step.graph
    return (len(step.gm.graph.nodes), len(graph.ops), len(graph.groups),
            simulate(graph, store_all_schedule(graph)).peak_bytes)


@pytest.fixture(scope="module")
def mlp_graph():
    return capture(mlp.get_model(), mlp.get_inputs()).graph


@pytest.mark.parametrize("example", [mlp, gpt], ids=["mlp-mse-loss", "gpt-tied-weights"])
def test_meta_and_fake_captures_match_a_real_capture(example):
    real = _sizes(capture(example.get_model(), example.get_inputs()))
    with torch.device("meta"):
        meta_model = example.get_model()
    meta_inputs = tuple(t.to("meta") for t in example.get_inputs())
    assert _sizes(capture(meta_model, meta_inputs)) == real
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake_model, fake_inputs = example.get_model(), example.get_inputs()
    assert _sizes(capture(fake_model, fake_inputs)) == real


def _budgets(graph, count=3):
    low = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    low = min(low, high)
    return sorted({low + (high - low) * k // (count + 1) for k in range(1, count + 1)})


def _check_against_milp(graph, budget) -> bool:
    """Compare hierarchical with the MILP at ``budget``; False (nothing compared) when the MILP
    proves the budget infeasible. Callers assert that some budget was compared."""
    try:
        exact = get_solver("milp")(graph, budget, EXACT)
    except InfeasibleBudgetError:
        return False
    assert exact.status is SolveStatus.OPTIMAL
    ours = get_solver("hierarchical")(graph, budget, FAST)
    assert ours.schedule is not None
    sim = simulate(graph, ours.schedule)
    assert sim.peak_bytes <= budget and sim.total_cost == pytest.approx(ours.objective)
    extra_opt = exact.objective - graph.base_cost
    assert ours.objective - exact.objective <= 0.02 * exact.objective + 1e-9, (
        f"hierarchical {ours.objective} vs optimum {exact.objective} (extra {extra_opt})")
    assert ours.bound is not None and ours.bound <= exact.objective + 1e-9
    assert ours.gap is not None and ours.gap >= 0
    return True


@pytest.mark.parametrize("case", ["chain8", "hetero", "random3", "random5"])
def test_hierarchical_within_two_percent_of_milp_on_small_graphs(case):
    graph = {
        "chain8": lambda: chain(8),
        "hetero": lambda: chain(7, sizes=[5, 20, 8, 30, 10, 12, 40], costs=[1, 3, 1, 2, 5, 1, 2]),
        "random3": lambda: random_graph(3, 7),
        "random5": lambda: random_graph(5, 7),
    }[case]()
    assert sum(_check_against_milp(graph, budget) for budget in _budgets(graph)) >= 1


def test_hierarchical_within_two_percent_of_milp_on_the_mlp(mlp_graph):
    assert len(block_kinds(mlp_graph)) >= 1  # the six Linear+GELU layers are one kind
    assert sum(_check_against_milp(mlp_graph, budget) for budget in _budgets(mlp_graph, count=1)) >= 1


@pytest.mark.parametrize("seed", range(6))
def test_bound_never_exceeds_the_exact_optimum(seed):
    graph = random_graph(seed, 7)
    for budget in _budgets(graph, count=4):
        bound = lower_bound(graph, budget)
        try:
            optimum = get_solver("milp")(graph, budget, EXACT).objective
        except InfeasibleBudgetError:
            continue  # the bound may or may not prove it; it must never claim the reverse
        assert not bound.proven_infeasible
        assert bound.bound <= optimum + 1e-9


def test_budget_below_what_is_always_live_is_proven_infeasible():
    graph = chain(6)
    result = get_solver("hierarchical")(graph, 5, FAST)
    assert result.status is SolveStatus.INFEASIBLE and result.schedule is None
    assert "every schedule" in result.message or "infeasible" in result.message


def test_plan_without_hardware_reports_a_meta_model():
    cfg = gpt2.get_config("tiny", n_layers=2)
    planned = plan_without_hardware(lambda: gpt2.get_model(cfg, device="meta"),
                                    gpt2.get_inputs(cfg, device="meta"), "80%", time_limit=20)
    assert planned.plan.predicted_peak_bytes <= planned.plan.budget_bytes
    assert planned.plan.solver == "hierarchical" and planned.plan.bound is not None
    assert "planned from shapes alone" in planned.report
