"""Rotor's partial-tape options (`solvers.chain_model.TapeOptions`) on a generated ResNet.

On a CNN a stage's tape is convolution outputs (costly to recompute) beside batch-norm and ReLU
outputs (cheap); keeping the first and recomputing the rest before each backward is what the
bound's LP does, and rotor's none-or-all tape could not. These check that the options keep
rotor's own two, only add schedules to its DP, fit the budget when simulated, and beat the
whole-tape DP on the CNN; and that the bound stays below the exact optimum there.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import solvers.rotor
from solvers import get_solver
from solvers.base import SolverOptions, SolveStatus
from solvers.baselines import store_all_schedule
from solvers.chain_model import chain_model, cost_thresholds, tape_options, whole_tape_options
from solvers.ir.simulator import simulate
from solvers.remat_bound import lower_bound
from solvers.rotor import RotorDP, memory_step

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from cnn_graph import resnet_like  # noqa: E402  (benchmarks/ is on sys.path)


def _budget(graph, fraction: float) -> int:
    return int(fraction * simulate(graph, store_all_schedule(graph)).peak_bytes)


def test_thresholds_split_convolutions_from_elementwise_ops() -> None:
    graph = resnet_like(20)
    thresholds = cost_thresholds(graph, 2)
    assert len(thresholds) == 2 and thresholds[0] > thresholds[1]
    model = chain_model(graph)
    options = tape_options(graph, model, thresholds)
    kept = {v for stage in options.kept[-2] for v in stage}  # the widest partial option
    assert kept and all(v.startswith(("conv", "bn")) for v in kept)
    assert any(v.startswith("conv") for v in kept)
    assert not any(v.startswith("relu") for stage in options.kept[1] for v in stage)


def test_options_keep_rotors_own_two() -> None:
    graph = resnet_like(20)
    model = chain_model(graph)
    options = tape_options(graph, model, cost_thresholds(graph, 2))
    whole = whole_tape_options(model)
    assert options.count == 4
    for t_new, t_old in ((0, 0), (-1, -1)):
        assert options.kept[t_new] == whole.kept[t_old]
        assert options.held_bytes[t_new] == whole.held_bytes[t_old]
        assert options.advance[t_new] == whole.advance[t_old]
        assert options.rest[t_new] == whole.rest[t_old]
    for t in (1, 2):  # partial options: a subset of the tape, cheaper to complete than to retape
        for k in range(1, model.n + 1):
            assert set(options.kept[t][k]) <= set(model.tape[k])
            assert options.rest[t][k].cost <= model.retape[k].cost + 1e-12
            assert options.kept_bytes[t][k] <= model.tape_bytes[k]


def test_options_only_add_schedules_to_the_dp() -> None:
    """Same model, same memory unit: at every level the DP with the options costs at most the
    whole-tape DP's (its two options are among them), and less at some."""
    graph = resnet_like(20)
    budget = _budget(graph, 0.5)
    model = chain_model(graph)
    top = int(budget * 1.25)
    q = memory_step(model, top)
    plain = RotorDP(model, q, top)
    assert plain.run()
    rich = RotorDP(model, q, top, tape_options(graph, model, cost_thresholds(graph, 2)))
    assert rich.run()
    a, b = rich.spine[0], plain.spine[0]
    finite = np.isfinite(b)
    assert np.all(np.isfinite(a[finite]))
    assert np.all(a[finite] <= b[finite] * (1 + 1e-6) + 1e-6)
    assert np.any(a[finite] < b[finite] * (1 - 1e-3))


@pytest.mark.parametrize("fraction", [0.5, 0.6])
def test_rotor_with_options_fits_and_beats_the_whole_tape(monkeypatch, fraction: float) -> None:
    graph = resnet_like(20)
    budget = _budget(graph, fraction)
    options = SolverOptions(time_limit_s=20)
    rich = solvers.rotor.solve_rotor(graph, budget, options)
    monkeypatch.setattr(solvers.rotor, "TAPE_THRESHOLDS", 0)
    plain = solvers.rotor.solve_rotor(graph, budget, options)
    assert rich.schedule is not None and plain.schedule is not None
    sim = simulate(graph, rich.schedule)
    assert sim.peak_bytes <= budget
    assert sim.total_cost == pytest.approx(rich.objective)
    assert rich.objective < plain.objective * 0.99  # 1.177 against 1.223 at 0.5 (a step: 1)
    assert rich.objective >= lower_bound(graph, budget).bound * (1 - 1e-9)


@pytest.mark.parametrize("fraction", [0.9, 0.95])
def test_bound_and_rotor_against_the_exact_optimum(fraction: float) -> None:
    """resnet_like(4), 25 op groups: the MILP proves its optimum in seconds. The bound is below
    it and rotor's schedule (with the options) at or above it."""
    graph = resnet_like(4)
    budget = _budget(graph, fraction)
    exact = get_solver("milp")(graph, budget, SolverOptions(time_limit_s=60))
    assert exact.status is SolveStatus.OPTIMAL
    assert lower_bound(graph, budget).bound <= exact.objective * (1 + 1e-6)
    rotor = solvers.rotor.solve_rotor(graph, budget, SolverOptions(time_limit_s=10))
    if rotor.schedule is not None:
        assert simulate(graph, rotor.schedule).peak_bytes <= budget
        assert rotor.objective >= exact.objective * (1 - 1e-6)
