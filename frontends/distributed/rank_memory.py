"""What one data-parallel rank really holds: the measured side of `plan_for_rank`'s prediction.

`measured_rank_peak` adds the storages a wrapped module keeps resident (DDP replicas or FSDP2's
local shards, buffers, the batch) to the live peak of one forward+backward, FSDP2's in-place
parameter resizes included (`frontends.measure.resize_tracker`). `measured_rank_loop` does the
same for whole training iterations (micro-batches, ``optimizer.step()``, ``zero_grad()``), the
optimizer's state (on FSDP2, DTensors: their local shards) counted as resident, and reports the
peak of each phase. `ddp_bucket_bytes` is the reducer's gradient buckets as DDP itself reports
them. All are deterministic: an allocator delta across DDP's constructor is not, since gloo
frees its parameter-broadcast buffer on a worker thread, sometimes after the constructor
returned (it once counted as a second copy of the buckets).
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

import torch

from frontends.measure.loop import state_tensors
from frontends.measure.resize_tracker import track_live_memory_with_resizes


def ddp_bucket_bytes(ddp: torch.nn.Module) -> int:
    """Bytes of the gradient buckets of a `DistributedDataParallel` module (0 with
    ``gradient_as_bucket_view``, whose buckets are the gradients themselves)."""
    data = ddp._get_ddp_logging_data()
    if data.get("gradient_as_bucket_view"):
        return 0
    return sum(int(size) for size in str(data["bucket_sizes"]).split(",") if size)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2's parameters, gradients and optimizer state); else itself."""
    return getattr(tensor, "_local_tensor", tensor)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (each storage once)."""
    storages = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = _local(t).untyped_storage()
            storages[id(storage)] = storage.nbytes()
    return sum(storages.values())


def measured_rank_peak(wrapped: torch.nn.Module, batch: tuple, extra_resident_bytes: int = 0) -> int:
    """Resident storages + ``extra_resident_bytes`` (DDP's buckets) + the live peak of one step,
    with the output held through backward as a training loop holds (loss, logits)."""
    resident = _storage_bytes((*wrapped.parameters(), *wrapped.buffers(), *batch)) + extra_resident_bytes
    for p in wrapped.parameters():
        p.grad = None
    gc.collect()
    with track_live_memory_with_resizes() as tracker:
        out = wrapped(*batch)
        out[0].backward()
        del out
    return resident + tracker.peak_bytes


@dataclass(frozen=True)
class RankLoopMeasurement:
    """Measured peaks of one rank's training iterations after the first (which creates the state)."""

    peak_bytes: int
    """The largest iteration peak."""
    iteration_peaks: tuple[int, ...]
    forward_backward_peak_bytes: int
    """The largest peak while a micro-batch's forward and backward ran (any measured iteration)."""
    step_peak_bytes: int
    """The largest peak while ``optimizer.step()`` ran."""
    optimizer_state_bytes: int
    """The optimizer's state on this rank (FSDP2: its local shards), each storage once."""


def _phase_peak(tracker, resident: int) -> int:
    """The peak since the last call (the tracker's own peak restarts from what is live now)."""
    ledger = tracker.ledger
    ledger.settle()
    peak = resident + ledger.peak_bytes
    ledger.peak_bytes = ledger.live_bytes
    return peak


def measured_rank_loop(wrapped: torch.nn.Module, batch: tuple, optimizer: torch.optim.Optimizer, *,
                       iterations: int = 3, grad_accumulation: int = 1, no_sync: bool = False,
                       extra_resident_bytes: int = 0, warmup: int | None = None) -> RankLoopMeasurement:
    """Train ``iterations`` iterations of ``grad_accumulation`` micro-batches on ``batch`` (the
    outputs held through backward, dropped before the next), then ``optimizer.step()`` and
    ``zero_grad()``; measure the iterations after ``warmup``. ``no_sync``: skip the gradient
    reduction on all micro-batches but the last (DDP's ``no_sync()``, FSDP2's
    ``set_requires_gradient_sync(False)``). ``extra_resident_bytes``: DDP's buckets.

    ``warmup`` (None: 2 for DDP, else 1): the first iteration creates the optimizer's state; DDP
    rebuilds its buckets in the second one's forward (in the order the first backward made the
    gradients), allocating new ones before it frees the old, untracked ones, which a storage
    ledger cannot see die (it would count the buckets twice)."""
    if warmup is None:
        warmup = 2 if hasattr(wrapped, "no_sync") else 1
    if warmup < 1 or iterations <= warmup or grad_accumulation < 1:
        raise ValueError("measured_rank_loop needs 1 <= warmup < iterations (the first iteration creates the "
                         "optimizer's state) and grad_accumulation >= 1")
    peaks, forward_backward, steps = [], [], []
    for iteration in range(iterations):
        gc.collect()
        resident = extra_resident_bytes + _storage_bytes(
            (*wrapped.parameters(), *wrapped.buffers(), *batch, *state_tensors(optimizer)))
        if iteration < warmup:  # not an iteration the plan models (see the docstring): not tracked
            _iteration(wrapped, batch, optimizer, grad_accumulation, no_sync, lambda: None)
            continue
        with track_live_memory_with_resizes() as tracker:
            marks = []
            _iteration(wrapped, batch, optimizer, grad_accumulation, no_sync,
                       lambda: marks.append(_phase_peak(tracker, resident)))
        forward_backward.extend(marks[:-1])
        steps.append(marks[-1])
        peaks.append(max(marks))
    return RankLoopMeasurement(peak_bytes=max(peaks), iteration_peaks=tuple(peaks),
                               forward_backward_peak_bytes=max(forward_backward), step_peak_bytes=max(steps),
                               optimizer_state_bytes=_storage_bytes(state_tensors(optimizer)))


def _iteration(wrapped: torch.nn.Module, batch: tuple, optimizer: torch.optim.Optimizer, grad_accumulation: int,
               no_sync: bool, mark) -> None:
    """One iteration; ``mark()`` after each micro-batch's backward and after the step."""
    for micro in range(grad_accumulation):
        with _gradient_sync(wrapped, not no_sync or micro == grad_accumulation - 1):
            outputs = wrapped(*batch)
            outputs[0].backward()
            del outputs
        mark()
    optimizer.step()
    mark()
    optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def _gradient_sync(wrapped: torch.nn.Module, sync: bool):
    """Reduce gradients in this micro-batch (``sync``) or keep accumulating them locally."""
    if sync:
        yield
    elif hasattr(wrapped, "no_sync"):  # DistributedDataParallel
        with wrapped.no_sync():
            yield
    elif hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        raise TypeError(f"{type(wrapped).__name__} is neither DDP nor FSDP2: it cannot skip gradient sync")
