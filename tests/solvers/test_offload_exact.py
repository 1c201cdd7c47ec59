"""The exact keep / recompute / offload model (issue 39 item 2): its optimum is brute force's, its
schedules simulate to what it reports, its bounds hold for every choice, and the planner uses it."""

from __future__ import annotations

import itertools
import random

import pytest
from graphs import chain, random_graph, small_offload_cases, store_and_lean_peaks, tiny_chain

from solvers.base import InfeasibleBudgetError, SolveStatus
from solvers.brute_force import brute_force_offload
from solvers.greedy import droppable
from solvers.ir.link import Link
from solvers.ir.simulator import simulate
from solvers.offload import choose_offloads
from solvers.offload_exact import (
    KEEP,
    OFFLOAD,
    RECOMPUTE,
    _evaluate,
    _facts,
    _Master,
    best_offloads,
    cp_model,
    solve_offload_exact,
)
from solvers.planning.planner import plan_graph

pytestmark = pytest.mark.skipif(cp_model is None, reason="the exact offload model needs OR-Tools")

SLOW = Link("slow", 10.0, 20.0, latency_s=0.5)


def _cases():
    """Brute force's own small cases (test_offload_planning), then graphs with siblings and a host budget."""
    for graph, budget, link in small_offload_cases():
        yield graph, budget, link, None
    for seed in (110, 113, 121, 164):  # siblings whose recomputation may make a saved value again
        graph = random_graph(seed, 3 + seed % 7)
        high, low = store_and_lean_peaks(graph)
        rng = random.Random(seed)
        link = Link("t", rng.choice([0.5, 2.0, 8.0, 50.0]), rng.choice([1.0, 4.0, 30.0]), latency_s=1.0)
        for budget in (low - 4, low, (low + high) // 2):
            for host in (None, 6):
                yield graph, budget, link, host
    yield tiny_chain(), 232, SLOW, None


def _check(graph, budget, link, host, result) -> None:
    """A result's schedule simulates to its step time and fits; its bound is below it."""
    sim = simulate(graph, result.choice.schedule, link=link)
    assert sim.step_time_s == result.step_time_s
    assert sim.peak_bytes <= budget
    assert host is None or sim.host_peak_bytes <= host
    assert set(sim.offloaded) == set(result.choice.offloaded)
    assert result.bound_s <= result.step_time_s * (1 + 1e-12)


def test_the_exact_model_reaches_the_brute_force_optimum():
    compared = offloading = infeasible = with_host = simulated = choices = 0
    for graph, budget, link, host in _cases():
        exact = brute_force_offload(graph, budget, link, host_budget_bytes=host)
        if exact is None:
            with pytest.raises(InfeasibleBudgetError, match="exact offload model"):
                solve_offload_exact(graph, budget, link, host_budget_bytes=host)
            infeasible += 1
            continue
        result = solve_offload_exact(graph, budget, link, host_budget_bytes=host)
        assert result.status is SolveStatus.OPTIMAL and result.gap < 1e-9
        assert result.step_time_s == pytest.approx(exact.step_time_s, rel=1e-9), (graph.name, budget, host)
        _check(graph, budget, link, host, result)
        compared += 1
        offloading += bool(exact.offloaded)
        with_host += host is not None
        simulated += result.choice.evaluations
        choices += 3 ** len(droppable(graph))
    assert compared > 50 and offloading > 15 and infeasible > 5 and with_host > 3
    assert simulated < choices / 5  # the bounds spare most of the 3^k simulations


def test_the_masters_bounds_hold_for_every_choice_that_fits():
    """Each choice fixed in the master: a choice that fits is not cut off by the memory bounds,
    and its simulated step time is at least the master's time for it."""
    checked = 0
    for seed, budget_at in ((103, 0.5), (8, 0.0), (28, 0.5)):
        graph = random_graph(seed, 3 + seed % 7 if seed == 103 else 4 + seed % 5)
        facts = _facts(graph)
        pool = facts.pool
        assert 4 <= len(pool) <= 7
        high, low = store_and_lean_peaks(graph)
        budget = int(low + budget_at * (high - low))
        link = Link("t", 4.0, 8.0, latency_s=0.2)
        picks = list(itertools.product((KEEP, RECOMPUTE, OFFLOAD), repeat=len(pool)))
        for options in random.Random(seed).sample(picks, min(len(picks), 60)):
            picked = dict(zip(pool, options))
            choice = _evaluate(graph, picked, link, budget)
            if choice.result.peak_bytes > budget:
                continue
            master = _Master(graph, facts, budget, link, None)
            for v, c in picked.items():
                master.model.add(master.choice[v][c] == 1)
            status, _, bound = master.solve(5.0, 1, 0)
            assert status == cp_model.OPTIMAL, picked
            assert master.seconds(bound) <= choice.step_time_s * (1 + 1e-12), picked
            checked += 1
    assert checked > 40


def test_the_exact_model_beats_the_local_search_where_it_falls_short():
    graph = chain(12, size=10)  # found by comparison: the local search stops 0.7 s above the optimum
    high, low = store_and_lean_peaks(graph)
    link = Link("t", 8.0, 8.0, latency_s=0.1)
    found = choose_offloads(graph, low, link)
    result = solve_offload_exact(graph, low, link, incumbent=found)
    assert found is not None and result.status is SolveStatus.OPTIMAL
    assert result.step_time_s < found.step_time_s - 0.5
    _check(graph, low, link, None, result)


def test_a_time_limit_returns_the_incumbent_with_a_proven_bound():
    graph = chain(12, size=10)
    high, low = store_and_lean_peaks(graph)
    link = Link("t", 8.0, 8.0, latency_s=0.1)
    found = choose_offloads(graph, low, link)
    result = solve_offload_exact(graph, low, link, incumbent=found, time_limit_s=0.05)
    assert result.status in (SolveStatus.FEASIBLE, SolveStatus.OPTIMAL)
    assert result.step_time_s <= found.step_time_s
    assert 0 < result.bound_s <= result.step_time_s
    if result.status is SolveStatus.FEASIBLE:
        assert "time limit, gap" in result.describe()


def test_an_infeasible_budget_names_the_lowest_peak_seen():
    graph = chain(6, size=10)
    high, low = store_and_lean_peaks(graph)
    link = Link("t", 100.0, 100.0, latency_s=0.0)
    lowest = brute_force_offload(graph, low, link, host_budget_bytes=0)
    assert lowest is not None  # recomputing everything needs no host memory
    with pytest.raises(InfeasibleBudgetError) as raised:
        solve_offload_exact(graph, graph.resident_bytes, link)
    assert raised.value.budget_bytes == graph.resident_bytes
    with pytest.raises(InfeasibleBudgetError, match="bytes on host"):
        solve_offload_exact(graph, low - 10, link, host_budget_bytes=0)


def test_the_planner_says_the_exact_model_made_the_choice():
    graph = chain(8, size=10, fwd_cost=1.0, bwd_cost=2.0)
    high, low = store_and_lean_peaks(graph)
    link = Link("fast", 1e3, 1e3, latency_s=0.0)
    plan = plan_graph(graph, (high + low) // 2, "greedy", offload="auto", link=link)
    assert plan.offloaded and "chosen by the exact model (optimal" in plan.message
    exact = brute_force_offload(graph, (high + low) // 2, link)
    assert simulate(graph, plan.schedule, link=link).step_time_s == pytest.approx(exact.step_time_s, rel=1e-9)


def test_best_offloads_falls_back_to_the_local_search_on_large_graphs(monkeypatch):
    graph = chain(6, size=10)
    high, low = store_and_lean_peaks(graph)
    link = Link("t", 20.0, 20.0, latency_s=0.0)
    monkeypatch.setattr("solvers.offload_exact.EXACT_MAX_VALUES", 3)
    choice = best_offloads(graph, (high + low) // 2, link)
    assert choice is not None and choice.chosen_by.startswith("local search (5 values to choose for")
