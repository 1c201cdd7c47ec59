"""`optimizer.split_plan`'s offload paths, shared by `optimize`/`plan_only` and the --meta path
(`plan_step`): when the unsplit step fits only with offloads, the faster of that plan and the
split fallback is kept, and the plan says which it beat; when a recompute-only plan fits, the
offload plan stands (the planner already weighed the two); the split fallback plans its
candidates recompute-only and offloads on the chosen split alone (`split_then_offload`)."""

from __future__ import annotations

import dataclasses

import pytest
from e2e_helpers import load_example

from frontends.capture.costed_capture import capture_with_costs
from optimizer.split_plan import offload_or_split, plan_step, split_then_offload
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


def _recompute_only(captured, budget):
    return plan_graph(captured.graph, budget, "greedy", SolverOptions(time_limit_s=5))


def _refuse_unsplit(captured, budget):
    """No recompute-only plan for the unsplit step; split steps plan as usual."""
    if not (captured.row_splits or captured.mlp_splits.chunks > 1):
        _refuse(captured, budget)
    return _recompute_only(captured, budget)


@pytest.mark.parametrize("offload_wins", [True, False])
def test_the_faster_of_offloading_and_splitting_is_kept_and_named(gpt2, offload_wins):
    unsplit = gpt2(1, 1)
    plan = _planner(Link("instant", 1e15, 1e15, latency_s=0.0))
    offloaded = plan(unsplit, "75%")
    assert offloaded.offloaded
    # the offload plan priced far below or far above any split (its objective is all that is
    # compared), and as if no recompute-only plan fitted the unsplit step
    offloaded = dataclasses.replace(offloaded, objective=1e-12 if offload_wins else 1e3,
                                    fits_without_offload=False)
    captured, chosen = offload_or_split(unsplit, offloaded, gpt2, plan, _refuse_unsplit, offloaded.budget_bytes,
                                        None)
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
    assert offloaded.fits_without_offload  # the planner says so: nothing is planned again

    captured, chosen = offload_or_split(unsplit, offloaded, gpt2, plan, _refuse, "75%", None)
    assert captured is unsplit and chosen is offloaded


def test_the_split_fallback_offloads_on_the_chosen_split_only(gpt2):
    """Split candidates are planned recompute-only; the chosen one alone gets the (slow) offload
    planning, and its plan is the faster of the two."""
    unsplit = gpt2(1, 1)
    offload_plans = []
    plan = _planner(Link("instant", 1e15, 1e15, latency_s=0.0))

    def plan_offload(captured, budget):
        offload_plans.append(captured)
        return plan(captured, budget)

    budget = _recompute_only(unsplit, "75%").budget_bytes
    error = InfeasibleBudgetError(budget, None, "the unsplit step does not fit (test)")
    captured, chosen = split_then_offload(gpt2, plan_offload, _recompute_only, unsplit, error, None)
    assert captured.row_splits or captured.mlp_splits.chunks > 1
    assert offload_plans == [captured]
    searched = _recompute_only(captured, budget)
    assert chosen.objective <= searched.objective * (1 + 1e-9) and chosen.predicted_peak_bytes <= budget
    assert "split the step" in chosen.message


def test_plan_step_weighs_splitting_only_where_the_plan_fits_only_with_offloads(gpt2):
    plan = _planner(Link("instant", 1e15, 1e15, latency_s=0.0))
    captured, chosen = plan_step(gpt2, plan, "75%", None, None, None, _refuse)  # would refuse if asked
    assert chosen.offloaded and chosen.fits_without_offload
    assert not (captured.row_splits or captured.mlp_splits.chunks > 1)
