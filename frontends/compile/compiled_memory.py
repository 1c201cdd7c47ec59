"""Measure the live bytes of a torch.compile'd training step from inside its compiled graphs.

A ``TorchDispatchMode`` entered around a compiled module makes dynamo fall back to eager, so the
usual tracker (`frontends.measure.memory_tracker`) would measure the eager model, not the compiled code.
Instead the backend wraps each compiled forward and backward callable; while a measurement is
open, each call enters the tracker's dispatch mode only for its own duration, *inside* the
compiled region, where dynamo no longer looks. One storage ledger spans all calls of the step,
so activations that forward saves stay counted until backward frees them.

Bytes created between the compiled calls (the output gradients that autograd and AOTAutograd's
runtime create before backward) are counted when backward receives them. Parameters, buffers and
user inputs (what the forward receives from outside, before any graph ran) are resident and left
to the caller, as in `frontends.measure.step`. This measures what an fx graph allocates through the
dispatcher: the eager compiler. Inductor's CPU code allocates its buffers below the dispatcher
(and reuses them), so with Inductor use `torch.profiler`'s memory events (`profiled_peak`),
which see every CPU allocation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from frontends.measure.memory_tracker import (
    MemoryMeasurement,
    _StorageLedger,
    _StorageTrackingMode,
    _tensor_storages,
)


@dataclass
class _OpenMeasurement:
    ledger: _StorageLedger
    resident: dict[int, torch.UntypedStorage]
    result: MemoryMeasurement | None = None


class CompiledStepMeter:
    """Wraps compiled (boxed) callables; ``with meter.measuring() as m:`` around a step."""

    def __init__(self) -> None:
        self._open: _OpenMeasurement | None = None

    def wrap(self, compiled: Callable[[list], Any], role: str) -> Callable[[list], Any]:
        """A boxed callable running ``compiled`` under the meter when a measurement is open;
        ``role`` is ``forward`` or ``backward``."""

        def run(args: list) -> Any:
            measurement = self._open
            if measurement is None:
                return compiled(args)
            storages = _tensor_storages(list(args))
            if role == "forward":  # untracked forward inputs existed before: resident
                measurement.ledger.settle()
                measurement.resident.update({id(s): s for s in storages if not _tracked(measurement, s)})
            else:  # count what arrived from outside the graphs (output gradients)
                measurement.ledger.record(storages, partial(lambda r: list(r.values()), measurement.resident))
            del storages  # holding them would keep saved activations alive through backward
            with _StorageTrackingMode(measurement.ledger):
                return compiled(args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    @contextlib.contextmanager
    def measuring(self) -> Iterator[CompiledStepMeasurement]:
        """Measure every compiled call made inside the block (forward and backward)."""
        if self._open is not None:
            raise RuntimeError("a measurement is already open on this backend")
        handle = CompiledStepMeasurement()
        self._open = _OpenMeasurement(ledger=_StorageLedger(), resident={})
        try:
            yield handle
        finally:
            opened, self._open = self._open, None
            handle.result = MemoryMeasurement(peak_bytes=opened.ledger.peak_bytes,
                                              final_live_bytes=opened.ledger.settle())
            handle.resident_bytes = sum(s.nbytes() for s in opened.resident.values())


def _tracked(measurement: _OpenMeasurement, storage: torch.UntypedStorage) -> bool:
    entry = measurement.ledger._entries.get(id(storage))
    return entry is not None and entry[0]() is storage


class CompiledStepMeasurement:
    """Filled when the ``measuring()`` block exits."""

    result: MemoryMeasurement | None = None
    resident_bytes: int = 0
    """Bytes of the storages the first compiled call received (parameters, buffers, inputs)."""

    @property
    def peak_bytes(self) -> int:
        """Peak of the step: resident storages plus the largest live total inside the graphs."""
        if self.result is None:
            raise RuntimeError("the measurement is available after the 'with' block exits")
        return self.resident_bytes + self.result.peak_bytes


@dataclass(frozen=True)
class ProfiledAllocations:
    """CPU allocator traffic of one call, from ``torch.profiler``'s memory events."""

    peak_bytes: int
    """Largest net total allocated during the call (what was allocated before is not counted)."""
    net_bytes: int
    """Allocated and still held when the call returned."""
    result: Any = None


def profile_allocations(fn: Callable[[], Any]) -> ProfiledAllocations:
    """Run ``fn()`` under ``torch.profiler`` (memory events on); they see every CPU allocation,
    Inductor's buffers and DDP's buckets included, and do not make dynamo fall back to eager."""
    from torch.profiler import ProfilerActivity, profile  # heavy: the profiler, only when measuring

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return ProfiledAllocations(peak_bytes=peak, net_bytes=live, result=result)


def profiled_peak(step: Callable[[], Any]) -> int:
    """Peak bytes the CPU allocator held during ``step()`` beyond what was allocated before."""
    return profile_allocations(step).peak_bytes
