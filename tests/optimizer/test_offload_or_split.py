"""`optimizer.split_plan.offload_or_split`, shared by `optimize`/`plan_only` and the --meta path:
when the unsplit step fits only with offloads, the faster of that plan and the split fallback is
kept, and the plan says which it beat; when a recompute-only plan fits, the offload plan stands
(the planner already weighed the two)."""

from __future__ import annotations

import dataclasses

import pytest
from e2e_helpers import load_example

from frontends.capture.costed_capture import capture_with_costs
from optimizer.split_plan import offload_or_split
from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.ir.link import Link
from solvers.planning.planner import plan_graph


@pytest.fixture(scope="module")
def gpt2():
    model, inputs = load_example("gpt2", dropout=0.0)

    def capture_split(chunks: int, mlp_chunks: int):
        return capture_with_costs(model, inputs, None, split_rows=chunks, split_mlp=mlp_chunks)

    return capture_split


def _planner(link):
    def plan(captured, budget):
        return plan_graph(captured.graph, budget, "greedy", SolverOptions(time_limit_s=5), offload="auto", link=link)
    return plan


def _refuse(captured, budget: int):
    raise InfeasibleBudgetError(budget, None, "no recompute-only plan (test)")


@pytest.mark.parametrize("offload_wins", [True, False])
def test_the_faster_of_offloading_and_splitting_is_kept_and_named(gpt2, offload_wins):
    unsplit = gpt2(1, 1)
    plan = _planner(Link("instant", 1e15, 1e15, latency_s=0.0))
    offloaded = plan(unsplit, "75%")
    assert offloaded.offloaded
    # the offload plan priced far below or far above any split (its objective is all that is compared)
    offloaded = dataclasses.replace(offloaded, objective=1e-12 if offload_wins else 1e3)
    captured, chosen = offload_or_split(unsplit, offloaded, gpt2, plan, _refuse, offloaded.budget_bytes, None)
    if offload_wins:
        assert captured is unsplit and chosen.schedule == offloaded.schedule
        assert "faster than splitting the step" in chosen.message
    else:
        assert captured.row_splits or captured.mlp_splits.chunks > 1
        assert chosen.objective < offloaded.objective and chosen.predicted_peak_bytes <= offloaded.budget_bytes
        assert "the unsplit step fits only with offloads" in chosen.message


def test_where_a_recompute_only_plan_fits_the_offload_plan_stands(gpt2):
    unsplit = gpt2(1, 1)
    plan = _planner(Link("instant", 1e15, 1e15, latency_s=0.0))
    offloaded = plan(unsplit, "75%")

    def recompute_only(captured, budget):
        return plan_graph(captured.graph, budget, "greedy", SolverOptions(time_limit_s=5))

    captured, chosen = offload_or_split(unsplit, offloaded, gpt2, plan, recompute_only, "75%", None)
    assert captured is unsplit and chosen is offloaded
