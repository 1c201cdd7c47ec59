"""The training loop's terms in a plan (solvers.planning.training_loop): optimizer state and
accumulated gradients held beside forward and backward, and the optimizer step's own peak."""

from __future__ import annotations

import dataclasses

import pytest
from graphs import random_graph, store_and_lean_peaks, tiny_chain

from solvers.base import InfeasibleBudgetError
from solvers.baselines import store_all_schedule
from solvers.ir.simulator import simulate
from solvers.planning.planner import plan_graph
from solvers.planning.training_loop import OptimizerMemory, TrainingLoop, end_bytes

ADAM = OptimizerMemory(name="adam", state_bytes=20, step_bytes=10)


def _plain(graph):
    return simulate(graph, store_all_schedule(graph))


def test_state_is_held_through_every_phase_and_the_step_budget_is_what_is_left():
    graph = random_graph(3)
    store_all, lean = store_and_lean_peaks(graph)
    budget = (store_all + lean) // 2 + ADAM.state_bytes
    with_state = plan_graph(graph, budget, "milp", loop=TrainingLoop(ADAM))
    alone = plan_graph(graph, budget - ADAM.state_bytes, "milp")
    assert with_state.schedule.steps == alone.schedule.steps
    assert with_state.budget_bytes == budget
    b = with_state.breakdown
    assert b.forward_backward_peak_bytes == alone.predicted_peak_bytes + ADAM.state_bytes
    assert b.optimizer_bytes == ADAM.state_bytes and b.optimizer == "adam"
    assert with_state.predicted_peak_bytes == max(b.forward_backward_peak_bytes, b.optimizer_step_peak_bytes)
    assert with_state.predicted_peak_bytes <= budget
    assert b.activations_bytes == alone.breakdown.activations_bytes


def test_the_optimizer_step_runs_on_what_backward_leaves_less_the_output_gradients():
    graph = tiny_chain()
    sim = _plain(graph)
    tangents = sum(graph[t].bytes for t in graph.tangents)
    plan = plan_graph(graph, "100%", "store-all", loop=TrainingLoop(ADAM))
    # Backward ends with p, x, loss, gp (and the tangent, freed by autograd before the step).
    assert end_bytes(sim) == 100 + 10 + 1 + 100 + tangents
    assert plan.breakdown.optimizer_step_peak_bytes == end_bytes(sim) - tangents + 20 + 10


def test_accumulation_holds_one_more_copy_of_the_gradients():
    graph = random_graph(5)
    loop = TrainingLoop(grad_accumulation=2)
    assert loop.held_bytes(graph) == graph.gradient_bytes > 0
    plan = plan_graph(graph, "100%", "store-all", loop=loop)
    assert plan.breakdown.accumulated_gradients_bytes == graph.gradient_bytes
    assert plan.predicted_peak_bytes == _plain(graph).peak_bytes + graph.gradient_bytes
    assert plan.breakdown.optimizer_step_peak_bytes == 0  # no optimizer: no step counted


def test_a_percentage_is_of_plain_autograds_iteration_peak():
    graph = random_graph(7)
    plan = plan_graph(graph, "100%", "store-all", loop=TrainingLoop(ADAM))
    iteration = max(_plain(graph).peak_bytes + ADAM.state_bytes,
                    end_bytes(_plain(graph)) - sum(graph[t].bytes for t in graph.tangents) + 30)
    assert plan.budget_bytes == plan.store_all_peak_bytes == plan.predicted_peak_bytes == iteration


def test_a_budget_the_optimizer_step_alone_exceeds_is_refused_with_the_steps_peak():
    graph = tiny_chain()
    huge = OptimizerMemory(name="huge", state_bytes=1000, step_bytes=5000)
    step_peak = TrainingLoop(huge).step_peak_bytes(end_bytes(_plain(graph)), graph)
    with pytest.raises(InfeasibleBudgetError, match="the optimizer step alone peaks") as err:
        plan_graph(graph, step_peak - 1, "auto", loop=TrainingLoop(huge))
    assert err.value.lower_bound_bytes == step_peak


def test_an_infeasible_budget_names_the_iterations_smallest_budget():
    graph = tiny_chain()
    with pytest.raises(InfeasibleBudgetError) as alone:
        plan_graph(graph, 120, "auto")
    loop = TrainingLoop(OptimizerMemory("s", 20, 0))
    smallest = alone.value.smallest_feasible_bytes
    assert loop.step_peak_bytes(end_bytes(_plain(graph)), graph) < smallest + 20 - 1  # the step fits; the rest not
    with pytest.raises(InfeasibleBudgetError, match="optimizer state and accumulated gradients hold 20 ") as looped:
        plan_graph(graph, smallest + 20 - 1, "auto", loop=loop)
    assert looped.value.smallest_feasible_bytes == smallest + 20
    plan = plan_graph(graph, looped.value.smallest_feasible_bytes, "auto", loop=loop)
    assert plan.predicted_peak_bytes <= looped.value.smallest_feasible_bytes


def test_no_loop_counted_leaves_the_plan_as_it_was():
    graph = random_graph(2)
    plain, looped = plan_graph(graph, "80%", "auto"), plan_graph(graph, "80%", "auto", loop=TrainingLoop())
    assert dataclasses.replace(looped, solve_time_s=plain.solve_time_s) == plain
    assert plain.breakdown.optimizer == "not counted" and plain.breakdown.forward_backward_peak_bytes == 0


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_accumulation_is_a_positive_count(k):
    with pytest.raises(ValueError, match="grad_accumulation"):
        TrainingLoop(grad_accumulation=k)


def test_optimizer_bytes_are_not_negative():
    with pytest.raises(ValueError):
        OptimizerMemory("x", -1, 0)
