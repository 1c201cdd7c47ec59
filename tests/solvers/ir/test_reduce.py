"""Lossless graph reduction: fusion only where the docstring's argument holds, and schedules
of the reduced graph map back to the original with the same cost and peak."""

import pytest
from graphs import B, F, chain, op, random_graph

from solvers import get_solver
from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.ir.graph import Node, NodeKind, RematGraph
from solvers.ir.reduce import reduce_graph
from solvers.ir.simulator import simulate


def _fusible_graph(v_bytes: int = 8) -> RematGraph:
    """``pos`` reads only a parameter and feeds one op: fusible when ``v_bytes <= 16``."""
    nodes = (
        Node("p", NodeKind.PARAMETER, F, 40),
        Node("x", NodeKind.INPUT, F, 10),
        op("pos", F, 16, ["p"], cost=1.0),
        op("h", F, v_bytes, ["pos", "x"], cost=2.0),
        op("a", F, 20, ["h"], cost=3.0),
        op("loss", F, 1, ["a"]),
        Node("t", NodeKind.TANGENT, B, 1),
        op("ga", B, 20, ["t", "a", "h"], cost=2.0),
        op("gp", B, 40, ["ga", "x"], cost=2.0),
    )
    return RematGraph(nodes, forward_outputs=("loss",), user_outputs=("loss",), backward_outputs=("gp",))


def _round_trip(graph: RematGraph) -> None:
    reduction = reduce_graph(graph)
    for build in (store_all_schedule, recompute_all_schedule):
        reduced = simulate(reduction.graph, build(reduction.graph))
        expanded = simulate(graph, reduction.expand(build(reduction.graph)))
        assert expanded.peak_bytes == reduced.peak_bytes
        assert expanded.total_cost == pytest.approx(reduced.total_cost)


def test_fuses_resident_fed_single_reader_op_and_reports_counts():
    graph = _fusible_graph()
    reduction = reduce_graph(graph, fx_nodes=42)
    assert "pos" not in reduction.graph
    assert reduction.absorbed == {"h": ("pos",)}
    assert reduction.graph["h"].cost == 3.0 and reduction.graph["h"].temp_bytes == 16
    counts = reduction.counts
    assert (counts.values_before, counts.values_after, counts.fused) == (6, 5, 1)
    assert "42 fx nodes" in counts.describe()
    _round_trip(graph)


def test_no_fusion_when_the_reader_is_larger_and_the_op_costs_something():
    reduction = reduce_graph(_fusible_graph(v_bytes=32))
    assert "pos" in reduction.graph and not reduction.absorbed


@pytest.mark.parametrize("seed", range(6))
def test_random_graphs_round_trip(seed):
    _round_trip(random_graph(seed, 6))


@pytest.mark.parametrize("graph", [_fusible_graph(), chain(5)], ids=["fusible", "chain"])
def test_reduced_optimum_equals_original_optimum(graph):
    reduction = reduce_graph(graph)
    low = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    milp = get_solver("milp")
    for budget in sorted({low, (low + high) // 2, high - 1}):
        try:
            original = milp(graph, budget, SolverOptions(time_limit_s=30)).objective
        except InfeasibleBudgetError:
            original = None
        try:
            reduced = milp(reduction.graph, budget, SolverOptions(time_limit_s=30))
            schedule, cost = reduced.schedule, reduced.objective
        except InfeasibleBudgetError:
            schedule, cost = None, None
        assert (original is None) == (cost is None)
        if cost is not None:
            assert cost == pytest.approx(original)
            expanded = simulate(graph, reduction.expand(schedule))
            assert expanded.peak_bytes <= budget and expanded.total_cost == pytest.approx(cost)
