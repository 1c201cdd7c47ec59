"""MILP (HiGHS) and CP-SAT on the example graphs at three budgets: each schedule fits, and the two
objectives agree within the gaps the solvers report (each objective is at least the other's
proven bound).

The graphs have 41 (MLP), 70 (conv net) and 71 (one-block GPT) op groups; the full GPT example
(177 groups) is past the exact solvers' range within a test's time (auto skips it too), so its
largest sub-case, one transformer block (`GPT(n_layers=1)`), stands in. Time limits are short:
the check is consistency of what each solver claims, not optimality.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from e2e_helpers import example_path, load_example

from frontends.capture.costed_capture import capture_with_costs
from solvers.base import SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.checkmate.cpsat import solve_cpsat
from solvers.checkmate.milp import solve_milp
from solvers.ir.simulator import simulate

TIME_LIMIT_S = 1.0
FRACTIONS = (0.2, 0.5, 0.8)
"""Budgets between the leanest classic schedule's peak (0) and store-all's (1)."""
TOL = 1e-9

pytestmark = pytest.mark.skipif(importlib.util.find_spec("highspy") is None,
                                reason="the MILP side of the cross-check runs on HiGHS")


def _gpt_one_block():
    spec = importlib.util.spec_from_file_location("_example_gpt_1", example_path("gpt"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = example.GPT(n_layers=1, dropout=0.1)
    return model, tuple(example.get_inputs())


@pytest.fixture(scope="module", params=["mlp", "convnet", "gpt-1-block"])
def example_graph(request):
    if request.param == "gpt-1-block":
        model, inputs = _gpt_one_block()
    else:
        model, inputs = load_example(request.param, torch.float32)
    return request.param, capture_with_costs(model, inputs, None).graph


@pytest.mark.parametrize("fraction", FRACTIONS)
def test_milp_and_cpsat_agree_within_their_gaps(example_graph, fraction):
    name, graph = example_graph
    store = simulate(graph, store_all_schedule(graph)).peak_bytes
    lean = min(store, simulate(graph, recompute_all_schedule(graph)).peak_bytes)
    budget = int(lean + fraction * (store - lean))
    milp = solve_milp(graph, budget, SolverOptions(milp_engine="highs", time_limit_s=TIME_LIMIT_S))
    cpsat = solve_cpsat(graph, budget, SolverOptions(time_limit_s=TIME_LIMIT_S))
    for result in (milp, cpsat):
        assert result.schedule is not None, (name, result.message)
        sim = simulate(graph, result.schedule)
        assert sim.peak_bytes <= budget
        assert result.objective == pytest.approx(sim.total_cost, rel=1e-9)
        assert result.objective >= graph.base_cost - TOL  # every op runs at least once
    assert cpsat.bound is not None  # CP-SAT always proves a bound
    scale = max(milp.objective, cpsat.objective)
    for result, other in ((milp, cpsat), (cpsat, milp)):
        if other.bound is not None:
            assert result.objective >= other.bound - 1e-9 * scale, (name, result.solver)
    gaps = [r.gap for r in (milp, cpsat) if r.gap is not None]
    assert abs(milp.objective - cpsat.objective) <= max(gaps) * scale + 1e-9 * scale
    if milp.status is SolveStatus.OPTIMAL and cpsat.status is SolveStatus.OPTIMAL:
        assert milp.objective == pytest.approx(cpsat.objective, rel=1e-9)
