"""The training loop one data-parallel rank runs: its optimizer measured over what it steps.

DDP's optimizer steps the full replica, so a rank's optimizer memory is one process's. FSDP2's
steps the DTensor shards: its state is made by ``zeros_like`` of each local shard (rank 0 holds
the largest, ``ceil(dim0 / N)`` rows of each parameter) and its step's temporaries are per shard,
so `rank_training_loop` measures the optimizer (`frontends.measure.optimizer_memory`, fake
tensors) over meta tensors of those shapes. Measured against two gloo ranks in
tests/frontends/distributed/test_distributed_optimizer.py.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from frontends.measure.optimizer_memory import OptimizerSpecError, check_optimizer, training_loop
from solvers.planning.distributed_budget import DataParallelConfig, Strategy
from solvers.planning.training_loop import TrainingLoop


def shard_like(param: torch.Tensor, world_size: int) -> torch.Tensor:
    """A meta tensor shaped like rank 0's FSDP2 shard of ``param`` (dim 0 split in ``world_size``
    chunks, as ``torch.chunk`` splits it), with its ``requires_grad``."""
    shape = (-(-param.shape[0] // world_size), *param.shape[1:]) if param.dim() else param.shape
    return torch.empty(shape, dtype=param.dtype, device="meta").requires_grad_(param.requires_grad)


def rank_training_loop(parameters: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer | str | None,
                       grad_accumulation: int, config: DataParallelConfig,
                       device: torch.device | str | None = None) -> TrainingLoop:
    """The `TrainingLoop` one rank under ``config`` runs: ``optimizer`` (an instance over the
    unwrapped model's ``parameters``, or a description) measured over the full parameters (DDP)
    or the rank's shards (FSDP). ``device``: where the rank trains (default: where they are)."""
    check_optimizer(optimizer)
    parameters = list(parameters)
    if config.strategy is not Strategy.FSDP or optimizer is None:
        return training_loop(parameters, optimizer, grad_accumulation, device=device)
    target = device if device is not None else next((p.device for p in parameters), None)
    if isinstance(optimizer, str):
        shards = [shard_like(p, config.world_size) for p in parameters]
        return training_loop(shards, optimizer, grad_accumulation, device=target)
    if any(hasattr(p, "_local_tensor") for g in optimizer.param_groups for p in g["params"]):
        raise OptimizerSpecError("the optimizer already steps FSDP2 shards: pass one over the unwrapped "
                                 "model's parameters, or a description such as 'adamw'")
    # optimizer_memory reads only the class and the param groups (it rebuilds the optimizer over
    # fake tensors): a shallow copy whose groups hold the shards stands for the rank's optimizer.
    over_shards = copy.copy(optimizer)
    over_shards.param_groups = [{**g, "params": [shard_like(p, config.world_size) for p in g["params"]]}
                                for g in optimizer.param_groups]
    return training_loop([], over_shards, grad_accumulation, device=target)
