"""What each gloo rank of tests/frontends/eager_runtime/test_eager_runtime.py's FSDP2 test runs.

Kept apart from the test module, and light (torch, the example file, the eager runtime's
run-time half, `frontends.distributed.gloo_ranks`), because every spawned rank imports it before it can start.
"""

from __future__ import annotations

import torch
from e2e_helpers import load_example

from frontends.distributed.gloo_ranks import full_gradients, run_on_ranks
from frontends.eager_runtime.eager_checkpoint import checkpointed_modules, load_checkpointing
from frontends.eager_runtime.eager_offload import offload_session


def fsdp_train(rank: int, world_size: int, plan_path: str, steps: int = 2) -> dict:
    """examples/gpt.py (float64, no dropout) under FSDP2 per block and at the root, ``steps`` SGD
    steps, without and with the loaded checkpointing plan (applied before fully_shard): per
    variant, the losses, full gradients, wrapped module paths and bytes offloaded regions
    brought back."""
    from torch.distributed.fsdp import fully_shard  # heavy: torch.distributed, ranks only

    results = {}
    for remat in (False, True):
        model, (idx, targets) = load_example("gpt", torch.float64, dropout=0.0)
        batch = ((idx + rank) % 256, (targets + 3 * rank) % 256)  # each rank its own micro-batch
        if remat:
            load_checkpointing(model, plan_path)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        losses, grads = [], []
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = model(*batch)[0]
            loss.backward()
            losses.append(loss.detach().clone())
            grads.append(full_gradients(model, strip=()))
            optimizer.step()
        session = offload_session(model)
        reloaded = session.counts.reloaded_bytes if session is not None else 0
        results[remat] = (losses, grads, sorted(checkpointed_modules(model)), reloaded)
    return results


def run_fsdp_ranks(plan_path: str, world_size: int = 2, timeout_s: float = 180.0) -> list[dict]:
    """`fsdp_train` on ``world_size`` gloo ranks."""
    return run_on_ranks(fsdp_train, world_size, (plan_path,), timeout_s=timeout_s)
