"""Run a function on N local gloo CPU ranks, and gather gradients across them.

`run_on_ranks` checks that remat-opt composes with DDP and FSDP2 (and the eager runtime with
FSDP2) without a cluster: it starts gloo ranks with ``torch.multiprocessing`` (spawn) on a free
port and fails with a clear error instead of hanging when a rank dies or the run exceeds its
timeout. `full_gradients` gathers gradients whether they are plain tensors (DDP) or FSDP2's
sharded DTensors. Light on purpose (no capture code): every spawned rank imports the module that
defines its function, and the modules that function imports.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RanksFailedError(RuntimeError):
    """A rank raised, died or did not finish in time."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple,
               out_dir: str, timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn: Callable[..., Any], world_size: int = 2, args: tuple = (),
                 timeout_s: float = 180.0) -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; returns each rank's result.

    ``fn`` must be importable by name (a module-level function): spawn pickles it.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _rank_main, args=(world_size, free_port(), fn, args, out_dir, timeout_s),
            nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise RanksFailedError(f"{world_size} ranks did not finish within {timeout_s:.0f} s")
        except mp.ProcessRaisedException as err:
            raise RanksFailedError(f"a rank raised: {str(err).strip().splitlines()[-1]}") from err
        except mp.ProcessExitedException as err:
            raise RanksFailedError(f"a rank died: {err}") from err
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                    process.join(5)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]


def full_gradients(module: torch.nn.Module, strip: tuple[str, ...] = ("module.", "model.")) -> dict:
    """``{name: full gradient}`` of ``module``'s parameters, wrapper prefixes stripped; FSDP2
    shards are all-gathered (a collective: every rank must call it)."""
    grads = {}
    for name, param in module.named_parameters():
        for prefix in strip:
            name = name.removeprefix(prefix)
        grad = param.grad
        if grad is not None and hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        grads[name] = None if grad is None else grad.detach().clone()
    return grads
