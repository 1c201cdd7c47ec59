"""Measure the peak bytes of live tensor storages that a piece of eager code allocates.

The simulator predicts a schedule's peak memory; this tracker measures what eager PyTorch really
keeps alive, so tests and reports can compare the two on any device (CPU included, where no
allocator statistics exist). It counts *storages*, not tensors: a view shares its base's storage
and adds no bytes, exactly as the graph IR defines node sizes.

How it works: a ``TorchDispatchMode`` sees every aten op, in forward and in backward (autograd
propagates the mode to the threads that run backward). After each op it records the untyped
storages of the op's outputs with a weak reference whose callback notes when a storage dies
(storage Python objects are preserved while the C++ storage lives, so the callback fires when the
memory is released, not when a Python handle goes away). Deaths are applied before the next
record, so the running total is exact at every op boundary and the peak is the largest total seen
right after an op returned.

What is not counted, by design -- callers add these themselves:

* storages that existed before the tracker was entered (parameters, buffers, example inputs,
  gradients from an earlier step), including in-place updates and ``out=`` writes into them;
* memory an op allocates and frees internally (workspaces), which never reaches Python;
* allocator effects: caching, fragmentation and rounding to block sizes.

Gradients created inside the block (``param.grad`` on the first backward) *are* counted, and stay
in ``final_live_bytes`` while they are alive.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Callable

import torch

from frontends.torch_compat import TorchDispatchMode, is_traceable_wrapper_subclass, tree_leaves

__all__ = ["LiveMemoryTracker", "MemoryMeasurement", "track_live_memory"]


@dataclass(frozen=True)
class MemoryMeasurement:
    """Bytes of storages allocated inside a tracked block."""

    peak_bytes: int
    """Largest total of live tracked storages at any op boundary."""
    final_live_bytes: int
    """Tracked storages still alive when the block exited (e.g. gradients, returned outputs)."""


def _storages(tensor: torch.Tensor, fake: bool = False) -> list[torch.UntypedStorage]:
    """Untyped storages behind ``tensor``, looking through wrapper subclasses; none for meta
    unless ``fake`` (a FakeTensor's storage is a meta storage of the bytes it stands for)."""
    found: list[torch.UntypedStorage] = []
    pending: list[torch.Tensor] = [tensor]
    while pending:
        t = pending.pop()
        if is_traceable_wrapper_subclass(t):
            inner_names, _ = t.__tensor_flatten__()
            pending.extend(
                inner for name in inner_names if isinstance(inner := getattr(t, name), torch.Tensor)
            )
            continue
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            continue
        if fake or storage.device.type != "meta":
            found.append(storage)
    return found


def _tensor_storages(tree: Any, fake: bool = False) -> list[torch.UntypedStorage]:
    tensors = [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]
    return [storage for t in tensors for storage in _storages(t, fake)]


class _StorageLedger:
    """Live tracked storages keyed by ``id``, with their bytes, running total and peak.

    Weak-reference callbacks may run at awkward moments (during garbage collection, or on an
    autograd worker thread), so they only append to ``_dead``; the ledger applies deaths under
    its lock before each new record.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}
        self._dead: deque[int] = deque()
        self.live_bytes = 0
        self.peak_bytes = 0

    def _on_death(self, key: int, _ref: object) -> None:
        self._dead.append(key)  # deque.append is atomic; no lock, no re-entrancy hazard

    def _apply_deaths(self) -> None:
        while self._dead:
            key = self._dead.popleft()
            entry = self._entries.get(key)
            # The id may already belong to a newer storage: only drop an entry whose referent died.
            if entry is not None and entry[0]() is None:
                del self._entries[key]
                self.live_bytes -= entry[1]

    def record(
        self,
        outputs: list[torch.UntypedStorage],
        inputs: Callable[[], list[torch.UntypedStorage]],
    ) -> None:
        """Count ``outputs`` not seen before, except storages that came in as untracked inputs.

        ``inputs`` is called only when some output is new, to keep the common path cheap.
        """
        with self._lock:
            self._apply_deaths()
            foreign: set[int] | None = None
            for storage in outputs:
                key = id(storage)
                nbytes = storage.nbytes()
                entry = self._entries.get(key)
                if entry is not None and entry[0]() is storage:
                    if entry[1] != nbytes:  # resized in place (resize_, out= ops)
                        self._entries[key] = (entry[0], nbytes)
                        self.live_bytes += nbytes - entry[1]
                    continue
                if entry is not None:  # stale entry whose death is not applied yet
                    del self._entries[key]
                    self.live_bytes -= entry[1]
                if foreign is None:
                    foreign = {id(s) for s in inputs()}
                if key in foreign:  # pre-existing storage returned by an in-place or out= op
                    continue
                ref = weakref.ref(storage, partial(self._on_death, key))
                self._entries[key] = (ref, nbytes)
                self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def settle(self) -> int:
        """Apply pending deaths and return the live total."""
        with self._lock:
            self._apply_deaths()
            return self.live_bytes


class _StorageTrackingMode(TorchDispatchMode):
    """Runs each aten op unchanged and reports its output storages to the ledger."""

    def __init__(self, ledger: _StorageLedger, fake: bool = False) -> None:
        super().__init__()
        self._ledger = ledger
        self._fake = fake

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outputs = _tensor_storages(out, self._fake)
        if outputs:
            self._ledger.record(outputs, partial(_tensor_storages, (args, kwargs), self._fake))
        return out


class LiveMemoryTracker:
    """Context manager handle; ``result`` holds the measurement once the block has exited."""

    def __init__(self, fake: bool = False) -> None:
        self._ledger = _StorageLedger()
        self._fake = fake
        self._mode: _StorageTrackingMode | None = None
        self._result: MemoryMeasurement | None = None

    def __enter__(self) -> LiveMemoryTracker:
        if self._mode is not None or self._result is not None:
            raise RuntimeError("a LiveMemoryTracker can be entered once; create a new one")
        self._mode = _StorageTrackingMode(self._ledger, self._fake)
        self._mode.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._mode is not None
        self._mode.__exit__(exc_type, exc, tb)
        final = self._ledger.settle()
        self._result = MemoryMeasurement(peak_bytes=self._ledger.peak_bytes, final_live_bytes=final)

    @property
    def result(self) -> MemoryMeasurement:
        """The measurement; raises ``RuntimeError`` while the block is still running."""
        if self._result is None:
            raise RuntimeError("the measurement is available after the 'with' block exits")
        return self._result


def track_live_memory(fake: bool = False) -> LiveMemoryTracker:
    """Track storages allocated inside ``with track_live_memory() as m:``; read ``m.result``.
    ``fake=True`` counts FakeTensors' (meta) storages too: enter it inside the FakeTensorMode,
    to measure code run on fake tensors (an optimizer's step on a model too large to hold)."""
    return LiveMemoryTracker(fake)
