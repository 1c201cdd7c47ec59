"""Swaps from a chain solver's winner (`solvers.repair.improve_schedule`).

rotor keeps or drops a stretch's tape with its checkpoint; the swaps save single values it
recomputes and demote others to make room. These check that the family's state read off
rotor's schedule is that schedule, that a swap result fits the budget when simulated and is
strictly cheaper than its seed, that a seed nothing beats gives None (never worse), and that
the tie-break starts are deterministic and never end worse than any one of them alone.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from solvers import get_solver
from solvers.base import SolverOptions
from solvers.baselines import store_all_schedule
from solvers.ir.simulator import simulate
from solvers.repair import (
    SWAP_START_SIMULATIONS,
    SWAP_START_TRIES,
    _passes,
    _Search,
    improve_schedule,
    seed_state,
    tie_orders,
)

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from cnn_graph import resnet_like  # noqa: E402  (benchmarks/ is on sys.path)


@pytest.fixture(scope="module")
def seeded():
    graph = resnet_like(20)
    budget = int(0.5 * simulate(graph, store_all_schedule(graph)).peak_bytes)
    seed = get_solver("rotor")(graph, budget, SolverOptions(time_limit_s=20)).schedule
    assert seed is not None
    return graph, budget, seed


def test_seed_state_is_rotors_schedule(seeded):
    graph, _, seed = seeded
    sim = simulate(graph, seed)
    same = simulate(graph, seed_state(graph, sim).schedule(graph))
    assert same.total_cost == pytest.approx(sim.total_cost)
    assert same.peak_bytes == sim.peak_bytes


def test_swaps_fit_and_beat_the_seed(seeded):
    graph, budget, seed = seeded
    seed_cost = simulate(graph, seed).total_cost
    found = improve_schedule(graph, budget, time.perf_counter() + 30, seed)
    assert found is not None
    again = simulate(graph, found.schedule)  # a fresh walk of the returned schedule
    assert again.peak_bytes <= budget
    assert again.total_cost == pytest.approx(found.sim.total_cost)
    assert again.total_cost < seed_cost
    assert found.direction == "swap"


def test_nothing_beats_store_all():
    graph = resnet_like(6)
    store_all = store_all_schedule(graph)
    budget = simulate(graph, store_all).peak_bytes
    assert improve_schedule(graph, budget, time.perf_counter() + 10, store_all) is None


def test_past_deadline_returns_nothing_worse(seeded):
    graph, budget, seed = seeded
    found = improve_schedule(graph, budget, time.perf_counter() - 1.0, seed)
    assert found is None or found.sim.total_cost < simulate(graph, seed).total_cost


def test_tie_orders_are_fixed(seeded):
    graph, _, _ = seeded
    orders = tie_orders(graph, 5)
    names = [n.name for n in graph.nodes]
    assert len(orders) == 5
    assert sorted(orders[0], key=orders[0].get) == names
    assert sorted(orders[1], key=orders[1].get) == names[::-1]
    assert all(set(o) == set(names) for o in orders)
    assert len({tuple(sorted(o, key=o.get)) for o in orders}) == 5  # every start differs
    assert tie_orders(graph, 5) == orders  # no hash order, no clock


def test_starts_never_worse_than_any_one(seeded):
    """The result is at most the cheapest single start (continuing passes only lower it)."""
    graph, budget, seed = seeded
    found = improve_schedule(graph, budget, time.perf_counter() + 60, seed)
    assert found is not None
    search = _Search(graph, budget, time.perf_counter() + 60)
    state = seed_state(graph, simulate(graph, seed))
    start = (state, *search.run(state))
    singles = []
    for order in tie_orders(graph):
        limit = search.simulations + SWAP_START_SIMULATIONS
        singles.append(_passes(search, start, order, SWAP_START_TRIES, limit)[2].total_cost)
    assert found.sim.total_cost <= min(singles) * (1 + 1e-12)
    one = improve_schedule(graph, budget, time.perf_counter() + 60, seed, starts=1)
    assert one is not None and one.sim.total_cost <= singles[0] * (1 + 1e-12)
    assert simulate(graph, found.schedule).peak_bytes <= budget


def test_swaps_are_deterministic(seeded):
    graph, budget, seed = seeded
    first = improve_schedule(graph, budget, time.perf_counter() + 60, seed)
    second = improve_schedule(graph, budget, time.perf_counter() + 60, seed)
    assert first is not None and second is not None
    assert first.sim.total_cost == second.sim.total_cost
    assert first.state == second.state
    assert first.simulations == second.simulations
