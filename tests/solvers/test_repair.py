"""The near-floor repair (`solvers.repair`): fits, never worse than recompute-all, near the optimum."""

from __future__ import annotations

import time

import pytest
from graphs import B, F, op, random_graph, store_and_lean_peaks

from solvers.base import SolverOptions
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.brute_force import solve_brute_force
from solvers.checkmate.min_budget import smallest_feasible_budget
from solvers.greedy import greedy_saved_set, schedule_from_saved
from solvers.hierarchical import solve_hierarchical
from solvers.ir.graph import Node, NodeKind, RematGraph
from solvers.ir.simulator import simulate
from solvers.repair import FamilyState, guess_states, repair_to_budget

SECONDS = 5.0


def _deadline() -> float:
    return time.perf_counter() + SECONDS


def cnn_like(sizes: list[int], grads: list[int]) -> RematGraph:
    """conv -> relu layers, activations shrinking with depth, parameter gradients growing: the
    smallest budget is set at the end of backward, where every gradient is live beside the
    first layers' large activations. Layer i's input is read by its weight gradient and, later,
    by the previous layer's relu backward; between them the input gradient runs with a
    workspace twice its size (a convolution's), so holding the input in between overshoots."""
    nodes = [Node("x", NodeKind.INPUT, F, sizes[0]), Node("p", NodeKind.PARAMETER, F, 1)]
    prev = "x"
    for i, size in enumerate(sizes):
        nodes += [op(f"conv{i}", F, size, [prev, "p"]), op(f"relu{i}", F, size, [f"conv{i}"], cost=0.1)]
        prev = f"relu{i}"
    nodes += [op("loss", F, 1, [prev]), Node("t", NodeKind.TANGENT, B, 1)]
    grad, outputs = "t", []
    for i in reversed(range(len(sizes))):
        layer_input = "x" if i == 0 else f"relu{i - 1}"
        nodes += [op(f"grelu{i}", B, sizes[i], [grad, f"relu{i}"], cost=0.1),
                  op(f"gw{i}", B, grads[i], [f"grelu{i}", layer_input])]
        outputs.append(f"gw{i}")
        if i > 0:
            nodes.append(op(f"gx{i}", B, sizes[i - 1], [f"grelu{i}", "p"], temp_bytes=2 * sizes[i - 1]))
            grad = f"gx{i}"
    return RematGraph(tuple(nodes), forward_outputs=("loss",), user_outputs=("loss",),
                      backward_outputs=tuple(outputs))


CNN = dict(sizes=[40, 40, 20, 20, 10, 10, 5, 5], grads=[1, 2, 4, 8, 16, 32, 64, 64])


def _random_cases():
    for seed in range(30):
        graph = random_graph(seed, n_forward=6)
        store, lean = store_and_lean_peaks(graph)
        if lean < store:
            yield seed, graph, sorted({lean, (lean + store) // 2, store - 1})


def test_the_leanest_state_is_recompute_all() -> None:
    """Nothing saved or held is recompute-all's schedule: the up search starts where the
    smallest-budget search's classic schedule is."""
    for graph in (cnn_like(**CNN), *(g for _, g, _ in _random_cases())):
        lean = simulate(graph, FamilyState(frozenset(), frozenset()).schedule(graph))
        reference = simulate(graph, recompute_all_schedule(graph))
        assert (lean.peak_bytes, lean.total_cost) == (reference.peak_bytes, pytest.approx(reference.total_cost))


def test_retain_none_is_greedys_family() -> None:
    graph = cnn_like(**CNN)
    saved = frozenset({"relu0", "conv3"})
    for once in (False, True):
        assert schedule_from_saved(graph, saved, once).steps == \
            schedule_from_saved(graph, saved, once, retain=None).steps


def test_on_random_graphs_it_fits_beats_recompute_all_and_nears_the_optimum() -> None:
    """At recompute-all's peak, halfway to store-all's and just under it: a plan always, within
    the budget, never costlier than recompute-all, within 5% of the exhaustive optimum (over
    every schedule, not only the family's; measured worst: 2.8%)."""
    worst = 1.0
    for seed, graph, budgets in _random_cases():
        everything = simulate(graph, recompute_all_schedule(graph)).total_cost
        for budget in budgets:
            found = repair_to_budget(graph, budget, _deadline())
            assert found is not None, (seed, budget)
            sim = simulate(graph, found.schedule)
            assert sim.peak_bytes <= budget
            assert sim.total_cost <= everything + 1e-9
            optimum = solve_brute_force(graph, budget, SolverOptions(), space="free").objective
            assert sim.total_cost >= optimum - 1e-9
            worst = max(worst, sim.total_cost / optimum)
    assert worst <= 1.05


def test_regression_greedy_fails_near_the_floor_repair_is_cheap() -> None:
    """Up to 1.05x the floor greedy's family overshoots; recompute-all fits at 3.75x a step's
    cost; the repair fits at the floor itself at 1.26x."""
    graph = cnn_like(**CNN)
    lean = simulate(graph, recompute_all_schedule(graph))
    assert lean.total_cost > 3.5 * graph.base_cost
    floor = smallest_feasible_budget(graph, max_groups=0)  # as on a graph past the exact search
    assert floor.smallest_bytes == lean.peak_bytes
    for factor in (1.0, 1.02, 1.05):
        budget = int(floor.smallest_bytes * factor)
        for once in (False, True):
            _, greedy = greedy_saved_set(graph, budget, _deadline(), once=once)
            assert greedy.peak_bytes > budget
        found = repair_to_budget(graph, budget, _deadline())
        assert found.sim.peak_bytes <= budget
        assert found.sim.total_cost <= 1.3 * graph.base_cost
    # The smallest-budget search names the floor with the cheap schedule, not recompute-all's.
    at_floor = simulate(graph, floor.schedule)
    assert at_floor.peak_bytes <= floor.smallest_bytes
    assert at_floor.total_cost <= 1.3 * graph.base_cost
    assert "near-floor repair" in floor.method


def test_hierarchical_takes_the_repair_with_a_proven_gap() -> None:
    graph = cnn_like(**CNN)
    budget = int(simulate(graph, recompute_all_schedule(graph)).peak_bytes * 1.01)
    answer = solve_hierarchical(graph, budget, SolverOptions(time_limit_s=3))
    assert simulate(graph, answer.schedule).peak_bytes <= budget
    assert answer.objective <= 1.3 * graph.base_cost
    assert answer.bound is not None and answer.gap <= 0.25
    assert "repair " in answer.message.split("tried: ")[1]  # the repair ran, and fit


def test_guess_states_start_the_down_search_from_a_saved_set() -> None:
    graph = cnn_like(**CNN)
    store = simulate(graph, store_all_schedule(graph)).peak_bytes
    budget = (store + simulate(graph, recompute_all_schedule(graph)).peak_bytes) // 2
    starts = guess_states(graph, frozenset({"relu5", "relu6", "not-a-value"}))
    assert all(s.saved == {"relu5", "relu6"} for s in starts)
    found = repair_to_budget(graph, budget, _deadline(), starts)
    assert found.sim.peak_bytes <= budget


def test_an_expired_deadline_returns_none_rather_than_overshooting() -> None:
    graph = cnn_like(**CNN)
    budget = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    assert repair_to_budget(graph, budget, time.perf_counter() - 1.0) is None


def test_up_first_still_answers_at_recompute_alls_peak_when_time_is_up() -> None:
    """The smallest-budget search's way: the up search starts from recompute-all, which fits
    its own peak, so even an expired deadline returns a plan, never costlier than it."""
    graph = cnn_like(**CNN)
    lean = simulate(graph, recompute_all_schedule(graph))
    found = repair_to_budget(graph, lean.peak_bytes, time.perf_counter() - 1.0, up_first=True)
    assert found is not None and found.direction == "up"
    assert found.sim.peak_bytes <= lean.peak_bytes
    assert found.sim.total_cost <= lean.total_cost + 1e-9
