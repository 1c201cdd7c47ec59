"""Swaps from a chain solver's winner (`solvers.repair.improve_schedule`).

rotor keeps or drops a stretch's tape with its checkpoint; the swaps save single values it
recomputes and demote others to make room. These check that the family's state read off
rotor's schedule is that schedule, that a swap result fits the budget when simulated and is
strictly cheaper than its seed, and that a seed nothing beats gives None (never worse).
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
from solvers.repair import improve_schedule, seed_state

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
