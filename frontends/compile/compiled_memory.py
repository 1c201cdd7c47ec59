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
to the caller, as in `frontends.measure.step`. Host copies of an offload plan
(`frontends.graph_runtime.offload_ops.offload_to_host`, made by the graphs that
`keep_host_copies_apart` marks) are counted in a ledger of their own, not as device bytes: the
plan's peak is the device's, and on the CPU the "host" is the same memory, so only the op that
makes a copy tells it apart. This measures what an fx graph allocates through the
dispatcher: the eager compiler. Inductor's CPU code allocates its buffers below the dispatcher
(and reuses them), so with Inductor use `torch.profiler`'s memory events (`profiled_peak`),
which see every CPU allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from frontends.graph_runtime.offload_ops import offload_to_host
from frontends.measure.memory_tracker import (
    MemoryMeasurement,
    _StorageLedger,
    _storages,
    _StorageTrackingMode,
    _tensor_storages,
)
from frontends.torch_compat import _disable_current_modes


@dataclass
class _OpenMeasurement:
    ledger: _StorageLedger
    resident: dict[int, torch.UntypedStorage]
    result: MemoryMeasurement | None = None
    host: _StorageLedger = dataclasses.field(default_factory=_StorageLedger)
    """Host copies made by offloads (never device bytes, whatever device the graphs run on)."""


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
                measurement.resident.update({id(s): s for s in storages if not _tracked(measurement.ledger, s)})
            else:  # count what arrived from outside the graphs (output gradients), not the host copies
                arrived = [s for s in storages if not _tracked(measurement.host, s)]
                measurement.ledger.record(arrived, partial(lambda r: list(r.values()), measurement.resident))
                del arrived
            del storages  # holding them would keep saved activations alive through backward
            with _StorageTrackingMode(measurement.ledger):
                return compiled(args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def keep_host_copies_apart(self, gm: torch.fx.GraphModule) -> None:
        """Count the host copies ``gm`` makes (its `offload_to_host` nodes) as host memory: the
        nodes call `_offload_to_host`, which is `offload_to_host` when no measurement is open."""
        nodes = gm.graph.find_nodes(op="call_function", target=offload_to_host)
        for node in nodes:
            node.target = self._offload_to_host
        if nodes:
            gm.recompile()

    def _offload_to_host(self, value: torch.Tensor) -> torch.Tensor:
        measurement = self._open
        if measurement is None:
            return offload_to_host(value)
        with _disable_current_modes():  # the device ledger's mode must not see the host allocation
            host = offload_to_host(value)
        measurement.host.record(_storages(host), list)
        return host

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
            handle.host_peak_bytes = opened.host.peak_bytes


def _tracked(ledger: _StorageLedger, storage: torch.UntypedStorage) -> bool:
    entry = ledger._entries.get(id(storage))
    return entry is not None and entry[0]() is storage


class CompiledStepMeasurement:
    """Filled when the ``measuring()`` block exits."""

    result: MemoryMeasurement | None = None
    resident_bytes: int = 0
    """Bytes of the storages the first compiled call received (parameters, buffers, inputs)."""
    host_peak_bytes: int = 0
    """Most bytes of offloaded values' host copies alive at once (0: the plan offloads nothing)."""

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
