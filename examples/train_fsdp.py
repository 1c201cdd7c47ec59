"""Train examples/gpt.py with a remat-opt plan on local CPU ranks under FSDP2 or DDP.

    python examples/train_fsdp.py --strategy fsdp --world-size 2 --budget 70% --steps 5

Each rank captures its own micro-batch's step, plans it for a per-rank budget (the strategy's
resident parameters, gradients and communication buffers deducted, see
`solvers.planning.distributed_budget`), wraps the remat module with ``fully_shard`` or
``DistributedDataParallel`` and trains with SGD. Rank 0 prints the per-rank budget, the planned
and the measured rank peak (`frontends.measure.resize_tracker`, which sees FSDP2's in-place parameter
storage resizes, plus DDP's buckets measured when DDP wraps the module), and the losses.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _gpt():
    spec = importlib.util.spec_from_file_location("_gpt_example", os.path.join(ROOT, "examples", "gpt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(rank: int, world_size: int, strategy: str, budget: str, steps: int) -> list[float]:
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from frontends.capture.costed_capture import capture_with_costs
    from frontends.distributed.rank_memory import ddp_bucket_bytes, measured_rank_peak
    from frontends.graph_runtime.remat_module import RematModule
    from solvers.base import SolverOptions
    from solvers.planning.distributed_budget import (
        DataParallelConfig,
        format_rank_breakdown,
        plan_for_rank,
    )

    gpt = _gpt()
    model = gpt.get_model(dropout=0.0)
    idx, targets = gpt.get_inputs()
    batch = ((idx + rank) % gpt.VOCAB_SIZE, (targets + rank) % gpt.VOCAB_SIZE)  # this rank's data
    config = DataParallelConfig(world_size=world_size, strategy=strategy)
    captured = capture_with_costs(model, batch, None)
    ranked = plan_for_rank(captured.graph, budget, config, solver="auto",
                           options=SolverOptions(time_limit_s=10))
    remat = RematModule(model, captured, ranked.plan, batch)
    wrapped = fully_shard(remat) if strategy == "fsdp" else DistributedDataParallel(remat)
    buckets = ddp_bucket_bytes(wrapped) if strategy == "ddp" else 0
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = wrapped(*batch)[0]
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    measured = measured_rank_peak(wrapped, batch, buckets)
    if rank == 0:
        print(format_rank_breakdown(ranked))
        print(f"  rank peak          {measured:,} B measured (rank 0, one more step; "
              f"{100 * (measured / ranked.predicted_rank_peak_bytes - 1):+.2f}% vs planned)")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=("fsdp", "ddp"), default="fsdp")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--budget", default="70%", help="per-rank budget: bytes, 3MB, or 70%%")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    from frontends.distributed.gloo_ranks import run_on_ranks

    losses = run_on_ranks(train, args.world_size, (args.strategy, args.budget, args.steps), timeout_s=600)
    for rank, rank_losses in enumerate(losses):
        print(f"rank {rank} losses: " + " ".join(f"{x:.4f}" for x in rank_losses))


if __name__ == "__main__":
    main()
