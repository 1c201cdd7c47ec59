"""Offload by budget shift (`solvers.offload_shift`): the solver's schedule for a larger budget with
its earliest saved values offloaded. These check that a choice fits and simulates to what it
reports, that it offloads the shortest prefix that fits, that it beats recompute-only where the
link hides the copies, and that the planner keeps the faster of the shift and the local search."""

from __future__ import annotations

import time

import pytest
from graphs import chain, store_and_lean_peaks

from solvers import get_solver
from solvers.base import SolverOptions
from solvers.ir.graph import Phase
from solvers.ir.link import Link
from solvers.ir.simulator import simulate
from solvers.offload_exact import best_offloads
from solvers.offload_placement import place_offloads
from solvers.offload_shift import hideable_bytes, shifted_offloads
from solvers.planning.planner import plan_graph

FAST = Link("fast", 1e3, 1e3, latency_s=0.0)
"""1,000 B/s each way: a chain layer's 10 B copy takes 0.01 s beside 1 s of compute."""


def greedy(graph):
    def solve(budget_bytes: int, seconds: float):
        return get_solver("greedy")(graph, budget_bytes, SolverOptions(time_limit_s=seconds)).schedule
    return solve


@pytest.fixture(scope="module")
def case():
    graph = chain(12, size=10, fwd_cost=1.0, bwd_cost=2.0)
    high, low = store_and_lean_peaks(graph)
    return graph, (high + low) // 2


def test_a_shifted_choice_fits_and_simulates_to_what_it_reports(case):
    graph, budget = case
    found = shifted_offloads(graph, budget, FAST, greedy(graph), deadline=time.perf_counter() + 30)
    assert found is not None and found.offloaded
    again = simulate(graph, found.schedule, link=FAST)
    assert again.peak_bytes == found.result.peak_bytes <= budget
    assert again.step_time_s == pytest.approx(found.step_time_s)
    assert set(found.offloaded) == set(again.offloaded) <= found.saved
    assert all(graph[v].phase is Phase.FORWARD for v in found.offloaded)
    recompute_only = simulate(graph, get_solver("greedy")(graph, budget, SolverOptions()).schedule)
    assert found.step_time_s < recompute_only.total_cost
    assert "budget shift" in found.chosen_by and found.evaluations > 0


def test_the_shift_offloads_the_shortest_prefix_that_fits(case):
    graph, budget = case
    found = shifted_offloads(graph, budget, FAST, greedy(graph), deadline=time.perf_counter() + 30)
    assert found is not None
    assert found.shift_bytes > 0 and f"+{found.shift_bytes:,} B" in found.chosen_by
    base = greedy(graph)(budget + found.shift_bytes, 10.0)
    order = sorted((v for v in found.saved if graph[v].phase is Phase.FORWARD), key=graph.position)
    k = len(found.offloaded)
    assert set(order[:k]) == set(found.offloaded)
    one_fewer = simulate(graph, place_offloads(graph, base, order[:k - 1], FAST, budget), link=FAST)
    assert one_fewer.peak_bytes > budget


def test_no_time_no_choice(case):
    graph, budget = case
    assert shifted_offloads(graph, budget, FAST, greedy(graph), deadline=time.perf_counter() - 1) is None


def test_hideable_bytes_is_forward_time_times_bandwidth(case):
    graph, _ = case
    assert hideable_bytes(graph, FAST) == int((12 + 1) * 1.0 * 1e3)  # 12 layers and the loss, 1 s each


def test_the_planner_keeps_the_faster_of_the_shift_and_the_local_search(case):
    graph, budget = case
    planned = plan_graph(graph, budget, "greedy", offload="auto", link=FAST, options=SolverOptions(time_limit_s=20))
    shifted = shifted_offloads(graph, budget, FAST, greedy(graph), deadline=time.perf_counter() + 30)
    searched = best_offloads(graph, budget, FAST, deadline=time.perf_counter() + 30)
    best = min(c.step_time_s for c in (shifted, searched) if c is not None)
    assert planned.offloaded and planned.predicted_peak_bytes <= budget
    assert graph.base_cost + planned.extra_time_s == pytest.approx(best)
