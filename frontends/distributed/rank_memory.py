"""What one data-parallel rank really holds: the measured side of `plan_for_rank`'s prediction.

`measured_rank_peak` adds the storages a wrapped module keeps resident (DDP replicas or FSDP2's
local shards, buffers, the batch) to the live peak of one forward+backward, FSDP2's in-place
parameter resizes included (`frontends.measure.resize_tracker`). `ddp_bucket_bytes` is the reducer's
gradient buckets as DDP itself reports them. Both are deterministic: an allocator delta across
DDP's constructor is not, since gloo frees its parameter-broadcast buffer on a worker thread,
sometimes after the constructor returned (it once counted as a second copy of the buckets).
"""

from __future__ import annotations

import gc

import torch

from frontends.measure.resize_tracker import track_live_memory_with_resizes


def ddp_bucket_bytes(ddp: torch.nn.Module) -> int:
    """Bytes of the gradient buckets of a `DistributedDataParallel` module (0 with
    ``gradient_as_bucket_view``, whose buckets are the gradients themselves)."""
    data = ddp._get_ddp_logging_data()
    if data.get("gradient_as_bucket_view"):
        return 0
    return sum(int(size) for size in str(data["bucket_sizes"]).split(",") if size)


def measured_rank_peak(wrapped: torch.nn.Module, batch: tuple, extra_resident_bytes: int = 0) -> int:
    """Resident storages + ``extra_resident_bytes`` (DDP's buckets) + the live peak of one step,
    with the output held through backward as a training loop holds (loss, logits)."""
    tensors = [getattr(t, "_local_tensor", t) for t in (*wrapped.parameters(), *wrapped.buffers(), *batch)]
    storages = {id(s): s.nbytes() for s in (t.untyped_storage() for t in tensors)}
    resident = sum(storages.values()) + extra_resident_bytes
    for p in wrapped.parameters():
        p.grad = None
    gc.collect()
    with track_live_memory_with_resizes() as tracker:
        out = wrapped(*batch)
        out[0].backward()
        del out
    return resident + tracker.peak_bytes
