"""PyTorch's min-cut partitioner as a strategy: its choices become schedules our simulator checks."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch
from e2e_helpers import example_path, load_example, small_mlp

from frontends.capture.meta_capture import MetaCapturer
from frontends.compile.torch_partitioner import partition_schedule, partition_schedules
from solvers.baselines import store_all_schedule
from solvers.ir.graph import Phase
from solvers.ir.simulator import simulate


def example_module(name: str):
    spec = importlib.util.spec_from_file_location(f"_tp_{name}", example_path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mlp_step():
    return MetaCapturer(*small_mlp()).at()


def test_budget_one_is_plain_autograd_and_lower_budgets_recompute(mlp_step):
    graph = mlp_step.graph
    store_all = simulate(graph, store_all_schedule(graph))
    full, half = partition_schedules(mlp_step, (1.0, 0.5))
    full_sim, half_sim = simulate(graph, full.schedule), simulate(graph, half.schedule)
    assert full.recomputed_ops == 0 and abs(full_sim.extra_cost) < 1e-15  # a float sum: -1.7e-21 seen on torch 2.11
    assert full_sim.peak_bytes == store_all.peak_bytes
    assert half.recomputed_ops > 0 and half_sim.extra_cost > 0
    assert half_sim.peak_bytes < store_all.peak_bytes
    assert half.label == "amb=0.5" and not half.message


def test_schedule_saves_what_torch_saves_and_recomputes_what_it_recomputes(mlp_step):
    graph = mlp_step.graph
    part = partition_schedule(mlp_step, 0.5)
    sim = simulate(graph, part.schedule)
    assert set(sim.saved) == set(part.saved)
    forward = set(part.schedule.computes("forward"))
    again = [n for n in part.schedule.computes("backward") if n in forward]
    assert len({graph[n].group for n in again}) == part.recomputed_ops > 0
    assert simulate(graph, part.schedule).extra_cost == pytest.approx(
        sum(graph[graph.groups[g][0]].cost for g in {graph[n].group for n in again}))
    assert all(graph[n].phase is Phase.FORWARD for n in part.schedule.computes("forward"))


def test_partitioner_does_not_change_the_captured_graph(mlp_step):
    before = [n.format_node() for n in mlp_step.gm.graph.nodes]
    partition_schedule(mlp_step, 0.3)
    assert [n.format_node() for n in mlp_step.gm.graph.nodes] == before


def test_random_ops_torch_replays_are_replayed():
    gpt = example_module("gpt")
    step = MetaCapturer(gpt.GPT(n_layers=1, dropout=0.1), gpt.get_inputs()).at()
    part = partition_schedule(step, 0.0)  # saves only inputs: torch replays dropout in backward
    assert part.schedule is not None, part.message
    assert not part.run_once_kept  # dropout replays its saved generator state (frontends.graph_runtime.rng_replay)
    counts = part.schedule.compute_counts()
    dropouts = [n.name for n in step.graph.ops if n.replays_rng]
    assert dropouts and all(counts[name] == 2 for name in dropouts)
    simulate(step.graph, part.schedule)


def test_random_ops_that_cannot_replay_are_kept_from_forward():
    gpt = example_module("gpt")
    step = MetaCapturer(gpt.GPT(n_layers=1, dropout=0.1), gpt.get_inputs()).at()
    states = {n.rng_state for n in step.graph.nodes if n.rng_state}
    nodes = tuple(replace(n, inputs=tuple(i for i in n.inputs if i != n.rng_state), rng_state="")
                  for n in step.graph.nodes if n.name not in states)  # as with replay_random=False
    step = replace(step, graph=replace(step.graph, nodes=nodes))
    part = partition_schedule(step, 0.0)
    assert part.schedule is not None, part.message
    assert part.run_once_kept and all(step.graph[n].random for n in part.run_once_kept)
    assert "kept from forward" in part.message
    counts = part.schedule.compute_counts()
    assert all(counts[name] == 1 for name in part.run_once_kept)
    simulate(step.graph, part.schedule)


def test_torch_failure_is_a_reported_result_not_an_error(mlp_step, monkeypatch):
    import frontends.compile.torch_partitioner as tp

    def broken(*args, **kwargs):
        raise RuntimeError("Cannot save running_mean: mutated in forward\nmore detail")

    monkeypatch.setattr(tp, "min_cut_rematerialization_partition", broken)
    part = partition_schedule(mlp_step, 0.5)
    assert part.schedule is None
    assert part.message == "torch's partitioner failed: RuntimeError: Cannot save running_mean: mutated in forward"


def test_batchnorm_model_gives_a_schedule_or_a_reason():
    model, inputs = load_example("convnet", torch.float32)
    step = MetaCapturer(model, inputs).at()
    for part in partition_schedules(step, (0.2, 1.0)):
        if part.schedule is None:
            assert part.message.startswith("torch's partitioner failed") or "does not run" in part.message
        else:
            simulate(step.graph, part.schedule)  # runs once, with running stats updated once


def test_fraction_outside_torch_range_is_rejected(mlp_step):
    with pytest.raises(ValueError, match="within \\[0, 1\\]"):
        partition_schedule(mlp_step, 1.5)


def test_torchs_own_graphs_come_back_only_when_the_schedule_is_exactly_them(mlp_step):
    """The compile backend compiles a min-cut seed as torch's own graphs (they may save a view
    where the rewrite of the schedule saves its base); only a partition taken unchanged qualifies."""
    assert partition_schedule(mlp_step, 0.5).graphs is None  # not asked: what-if keeps no graphs
    part = partition_schedule(mlp_step, 0.5, keep_graphs=True)
    fw, bw = part.graphs
    groups = mlp_step.graph.groups
    for module, phase in ((fw, "forward"), (bw, "backward")):  # the graphs the schedule was read from
        ops = [groups[n.name][0] for n in module.graph.nodes if n.op == "call_function" and n.name in groups]
        assert ops == list(part.schedule.computes(phase))
    gpt = example_module("gpt")
    step = MetaCapturer(gpt.GPT(n_layers=1, dropout=0.1), gpt.get_inputs()).at()
    adjusted = partition_schedule(step, 0.0, keep_graphs=True)  # dropout's generator states added
    assert adjusted.schedule is not None and adjusted.graphs is None
