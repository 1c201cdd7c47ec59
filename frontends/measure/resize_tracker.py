"""Live-storage tracking that also sees storages grown and shrunk in place (FSDP2's parameters).

`frontends.measure.memory_tracker` counts the storages aten ops create. FSDP2 never creates its unsharded
parameters inside a step: it keeps one storage per parameter and, around each all-gather, grows
it with ``untyped_storage().resize_(n)`` and frees it with ``resize_(0)`` (``alloc_storage`` /
``free_storage`` in ``torch.distributed.fsdp._fully_shard._fsdp_param``). Those calls do not go
through the dispatcher, so a dispatch-mode tracker misses the largest term of a sharded rank.

`track_live_memory_with_resizes` runs the same dispatch-mode ledger and, while it is open, wraps
``torch.UntypedStorage.resize_`` so every resize moves the ledger by the bytes it adds or
removes: a storage grown from nothing counts from then until it is shrunk or dies. The result is
deterministic (no allocator sampling); what it cannot see is memory allocated below the
dispatcher on other threads (the gloo worker's own scratch buffers).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from functools import partial

import torch

from frontends.measure.memory_tracker import (
    MemoryMeasurement,
    _StorageLedger,
    _StorageTrackingMode,
)

_patch_lock = threading.Lock()


class _ResizeAwareLedger(_StorageLedger):
    """The dispatch ledger, plus `resized`: bytes a ``resize_`` adds or removes."""

    def resized(self, storage: torch.UntypedStorage, before: int, after: int) -> None:
        delta = after - before
        if delta == 0:
            return
        with self._lock:
            self._apply_deaths()
            key = id(storage)
            entry = self._entries.get(key)
            if entry is not None and entry[0]() is storage:  # tracked: move its bytes
                self._entries[key] = (entry[0], entry[1] + delta)
            elif delta > 0:  # an untracked storage grows: the growth is new memory
                if entry is not None:  # stale entry of a dead storage with the same id
                    self.live_bytes -= entry[1]
                self._entries[key] = (weakref.ref(storage, partial(self._on_death, key)), delta)
            # an untracked storage shrinks: memory the caller counted as resident is released
            self.live_bytes += delta
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)


class ResizeAwareMeasurement:
    """Filled when the block exits; ``ledger`` is readable inside it (``live_bytes``)."""

    def __init__(self, ledger: _ResizeAwareLedger) -> None:
        self.ledger = ledger
        self.result: MemoryMeasurement | None = None

    @property
    def peak_bytes(self) -> int:
        if self.result is None:
            raise RuntimeError("the measurement is available after the 'with' block exits")
        return self.result.peak_bytes


@contextlib.contextmanager
def track_live_memory_with_resizes() -> Iterator[ResizeAwareMeasurement]:
    """Like `frontends.measure.memory_tracker.track_live_memory`, and storage resizes count too."""
    ledger = _ResizeAwareLedger()
    handle = ResizeAwareMeasurement(ledger)
    original = torch.UntypedStorage.resize_

    def resize_(storage: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        before = storage.nbytes()
        result = original(storage, size)
        ledger.resized(storage, before, storage.nbytes())
        return result

    if not _patch_lock.acquire(blocking=False):
        raise RuntimeError("another resize-aware measurement is open in this process")
    torch.UntypedStorage.resize_ = resize_
    try:
        with _StorageTrackingMode(ledger):
            yield handle
    finally:
        torch.UntypedStorage.resize_ = original
        _patch_lock.release()
        handle.result = MemoryMeasurement(peak_bytes=ledger.peak_bytes, final_live_bytes=ledger.settle())
