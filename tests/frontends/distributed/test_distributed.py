"""Issue 10: per-rank budgets for DDP and FSDP2, and remat modules trained under both.

Two gloo ranks on CPU train examples/gpt.py's model (float64, no dropout) for three SGD steps,
each rank on its own micro-batch, once as plain autograd and once through a remat-opt plan;
losses and full gradients must agree to ~1e-10 under DDP and under FSDP2 (``fully_shard``).
"""

from __future__ import annotations

import gc

import pytest
import torch
from e2e_helpers import clone, load_example, loss_of, max_relative_error
from graphs import toy_step_graph

from frontends.distributed.gloo_ranks import full_gradients, run_on_ranks
from optimizer import optimize
from solvers.base import InfeasibleBudgetError
from solvers.baselines import store_all_schedule
from solvers.planning.distributed_budget import (
    DataParallelConfig,
    RankOffsets,
    Strategy,
    format_rank_breakdown,
    phase_peaks,
    plan_for_rank,
    rank_breakdown,
    rank_offset,
    rank_offsets,
)

STEPS = 3


def test_fsdp_rank_keeps_shards_plus_the_gathered_unit():
    graph = toy_step_graph()
    one_unit = rank_breakdown(graph, 20_000, DataParallelConfig(world_size=4, strategy="fsdp"))
    assert (one_unit.parameters_bytes, one_unit.gradients_bytes) == (250, 250)
    assert one_unit.communication_bytes == 1000 + 1000  # all parameters gathered, their grads unsharded
    assert one_unit.activations_bytes == 20_000 - 250 - 250 - 2000 - 100
    units = DataParallelConfig(world_size=3, strategy=Strategy.FSDP, unit_bytes=(400, 600))
    split = rank_breakdown(graph, 20_000, units)
    assert (split.parameters_bytes, split.gradients_bytes) == (334, 334)  # padded to 3 ranks
    assert split.communication_bytes == 2 * 600 + 600  # two units in flight with prefetch


def test_ddp_rank_keeps_replicas_and_gradient_buckets():
    graph = toy_step_graph()
    ddp = rank_breakdown(graph, 20_000, DataParallelConfig(world_size=8, strategy="ddp"))
    assert (ddp.parameters_bytes, ddp.gradients_bytes, ddp.communication_bytes) == (1000, 1000, 1000)
    view = DataParallelConfig(world_size=8, strategy="ddp", gradient_as_bucket_view=True)
    assert rank_offset(graph, view) == 0


def test_fsdp_offsets_differ_by_phase():
    """One unit on 2 ranks: shards (500) always; the all-gather buffer (2 x 500) in forward;
    after backward the unsharded parameters (1000) go before the reduce-scatter input (2 x 500)."""
    graph = toy_step_graph()
    offsets = rank_offsets(graph, DataParallelConfig(world_size=2, strategy="fsdp"))
    assert offsets == RankOffsets(forward=1500, backward=500, end=500)
    assert rank_offset(graph, DataParallelConfig(world_size=2, strategy="fsdp")) == 1500
    peaks = phase_peaks(graph, store_all_schedule(graph))
    assert peaks.forward_bytes == 1100 + 3 * 2000 + 8  # every activation kept, and the loss
    assert offsets.rank_peak(peaks) == peaks.forward_bytes + 1500


def test_rank_plan_meets_the_per_rank_budget():
    graph = toy_step_graph()
    config = DataParallelConfig(world_size=2, strategy="fsdp")
    offsets = rank_offsets(graph, config)
    store_all = offsets.rank_peak(phase_peaks(graph, store_all_schedule(graph)))
    tight = store_all - 1500  # only fits by recomputing an activation
    ranked = plan_for_rank(graph, tight, config, solver="auto")
    assert ranked.predicted_rank_peak_bytes <= tight
    assert ranked.predicted_rank_peak_bytes == offsets.rank_peak(phase_peaks(graph, ranked.plan.schedule))
    assert ranked.plan.recomputed
    assert ranked.breakdown.activations_bytes == tight - ranked.breakdown.fixed_bytes
    with pytest.raises(InfeasibleBudgetError, match="per rank"):
        plan_for_rank(graph, store_all - 5000, config, solver="auto")
    report = format_rank_breakdown(ranked)
    assert "fsdp on 2 ranks" in report and "500 B (shards)" in report


@pytest.mark.parametrize("bad, message", [
    ({"world_size": 0, "strategy": "ddp"}, "positive integer"),
    ({"world_size": 2, "strategy": "zero3"}, "unknown strategy"),
    ({"world_size": 2, "strategy": "single"}, "one rank"),
])
def test_bad_configs_say_what_to_do(bad, message):
    with pytest.raises(ValueError, match=message):
        DataParallelConfig(**bad)


# ------------------------------------------------------------------ two real gloo ranks
def _train(rank: int, world_size: int) -> dict:
    """Per strategy, remat on/off: losses and full gradients of three SGD steps; with remat and
    DDP, also the rank's planned and measured peaks."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from frontends.capture.costed_capture import capture_with_costs
    from frontends.distributed.rank_memory import ddp_bucket_bytes, measured_rank_peak
    from frontends.graph_runtime.remat_module import RematModule

    model, (idx, targets) = load_example("gpt", dropout=0.0)
    batch = ((idx + rank) % 256, (targets + 3 * rank) % 256)  # each rank its own micro-batch
    captured = capture_with_costs(clone(model), batch, None)
    ddp = DataParallelConfig(world_size=world_size, strategy="ddp")
    ranked = plan_for_rank(captured.graph, "70%", ddp, solver="greedy")
    remat_module = RematModule(clone(model), captured, ranked.plan, batch)  # a capture compiles once
    results: dict = {"recomputed": len(ranked.plan.recomputed)}
    for strategy in ("ddp", "fsdp"):  # the remat module goes from DDP (unwrapped again) to FSDP2
        for remat in (False, True):
            module = clone(model)
            if remat:
                module = remat_module
                module.load_state_dict(model.state_dict())  # undo the DDP run's updates
            wrapped = DistributedDataParallel(module) if strategy == "ddp" else fully_shard(module)
            optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.5)
            losses, grads = [], []
            for _ in range(STEPS):
                optimizer.zero_grad(set_to_none=True)
                loss = wrapped(*batch)[0]
                loss.backward()
                losses.append(loss.detach().clone())
                grads.append(full_gradients(wrapped))
                optimizer.step()
            results[strategy, remat] = (losses, grads)
            if remat:  # the same plan's rank peak under this strategy, and the measured one
                config = DataParallelConfig(world_size=world_size, strategy=strategy)
                predicted = rank_offsets(captured.graph, config).rank_peak(
                    phase_peaks(captured.graph, ranked.plan.schedule))
                buckets = ddp_bucket_bytes(wrapped) if strategy == "ddp" else 0
                results[strategy, "peaks"] = (predicted, measured_rank_peak(wrapped, batch, buckets))
            del wrapped, optimizer  # DDP's reducer removes its hooks when collected
            gc.collect()
    return results


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_train, world_size=2, timeout_s=240)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_remat_trains_like_plain_autograd_on_two_ranks(ranks, strategy):
    for rank, results in enumerate(ranks):
        assert results["recomputed"] > 0  # the plan really recomputes
        plain_losses, plain_grads = results[strategy, False]
        remat_losses, remat_grads = results[strategy, True]
        for step in range(STEPS):
            assert torch.allclose(remat_losses[step], plain_losses[step], rtol=1e-12, atol=0), (rank, step)
            assert max_relative_error(remat_grads[step], plain_grads[step]) <= 1e-10, (rank, step)
        assert plain_losses[-1] < plain_losses[0]  # it trains


def test_ranks_agree_on_the_averaged_gradients(ranks):
    """DDP averages gradients across ranks: both ranks see the same gradient, unlike their
    micro-batches' own (the losses differ), and FSDP2's gathered gradients agree with DDP's."""
    (losses0, grads0), (losses1, grads1) = ranks[0]["ddp", True], ranks[1]["ddp", True]
    assert not torch.equal(losses0[0], losses1[0])
    assert max_relative_error(grads0[0], grads1[0]) == 0.0
    assert max_relative_error(ranks[0]["fsdp", True][1][0], grads0[0]) <= 1e-10


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_rank_peak_matches_the_prediction(ranks, strategy):
    """DDP: the plan's peak plus the reducer's buckets (one more copy of the gradients,
    allocated when DDP wraps the module). FSDP2 (one unit): the parameter shards, and in
    forward the unsharded parameters plus the all-gather buffer (`rank_offsets`); measured
    with the resize-aware tracker, since FSDP2 grows its unsharded parameters in place."""
    for results in ranks:
        predicted, measured = results[strategy, "peaks"]
        assert abs(measured - predicted) <= 0.02 * predicted, (measured, predicted)


def test_fully_shard_inside_the_optimized_model_is_refused_with_what_to_do():
    """FSDP hooks on a submodule never run in the remat module's captured graph: refuse it,
    also when the submodule is sharded after the remat module has run (its last walk of the
    module tree no longer holds: the module's class changed)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from frontends.distributed.gloo_ranks import free_port
    from frontends.guards.sharding import ShardedSubmoduleError, check_no_sharded_submodules

    model, inputs = load_example("mlp")
    check_no_sharded_submodules(model)  # nothing sharded: fine
    rm = optimize(clone(model), inputs, "85%", solver="greedy")
    loss_of(rm(*inputs)).backward()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        expected = r"'layers\.1' .*apply fully_shard to the module optimize\(\) returns"
        for root in (model, rm.model):
            fully_shard([m for m in root.modules() if isinstance(m, torch.nn.Linear)][1])
        with pytest.raises(ShardedSubmoduleError, match=expected):
            check_no_sharded_submodules(model)
        with pytest.raises(ShardedSubmoduleError, match=expected):
            rm(*inputs)
    finally:
        dist.destroy_process_group()
