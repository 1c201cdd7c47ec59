"""Refuse FSDP units inside a model remat-opt captures: only the remat module as a whole can be
sharded (capture and the remat module both check, so neither runs a graph whose hooks never fire).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist


class ShardedSubmoduleError(ValueError):
    """``fully_shard`` (or FSDP1) was applied inside the model a remat module runs."""


def check_no_sharded_submodules(model: torch.nn.Module,
                                named_modules: Iterable[tuple[str, torch.nn.Module]] | None = None) -> None:
    """Refuse a model with FSDP-wrapped modules inside: the remat module runs one captured
    graph and never calls their ``forward``, so their hooks would never all-gather the
    parameters (the step would read shards, or fail). Sharding the remat module as a whole
    (``fully_shard(rm)``) is honoured. ``named_modules``: the model's, when the caller has
    walked the tree already."""
    if not dist.is_available():  # a torch built without distributed has no FSDP
        return
    from torch.distributed.fsdp import (  # heavy: FSDP, only to recognise sharded modules
        FSDPModule,
        FullyShardedDataParallel,
    )

    modules = model.named_modules() if named_modules is None else named_modules
    wrapped = [name or "the model itself" for name, module in modules
               if isinstance(module, (FSDPModule, FullyShardedDataParallel))]
    if wrapped:
        shown = ", ".join(repr(n) for n in wrapped[:3]) + (" ..." if len(wrapped) > 3 else "")
        raise ShardedSubmoduleError(
            f"fully_shard was applied to {shown} inside the model given to remat-opt, whose captured "
            "graph never calls their forward (no all-gather): optimize the unwrapped model and "
            "apply fully_shard to the module optimize() returns")
