"""What each gloo rank of tests/test_eager_runtime.py's FSDP2 test runs.

Kept apart from the test module, and light (torch, the example file, the eager runtime's
run-time half), because every spawned rank imports it before it can start.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from e2e_helpers import load_example

from frontends.eager_checkpoint import checkpointed_modules, load_checkpointing


def _full_gradients(model: torch.nn.Module) -> dict:
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is not None and hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()  # a collective: every rank calls it
        grads[name] = None if grad is None else grad.detach().clone()
    return grads


def fsdp_train(rank: int, world_size: int, plan_path: str, steps: int = 2) -> dict:
    """examples/gpt.py (float64, no dropout) under FSDP2 per block and at the root, ``steps`` SGD
    steps, without and with the loaded checkpointing plan (applied before fully_shard)."""
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
            grads.append(_full_gradients(model))
            optimizer.step()
        results[remat] = (losses, grads, sorted(checkpointed_modules(model)))
    return results


def _rank_main(rank: int, world_size: int, port: int, args: tuple, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    try:
        torch.save(fsdp_train(rank, world_size, *args), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_fsdp_ranks(plan_path: str, world_size: int = 2, timeout_s: float = 180.0) -> list[dict]:
    """`fsdp_train` on ``world_size`` gloo ranks (as `frontends.data_parallel.run_on_ranks`,
    whose module a rank would have to import with the whole capture stack)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_rank_main, args=(world_size, port, (plan_path,), out_dir),
                                     nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{world_size} ranks did not finish within {timeout_s:.0f} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                    process.join(5)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]
