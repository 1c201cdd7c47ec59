"""Offload in the eager runtime: a module region whose saved activations wait on the host.

Why saved-tensor hooks and not selective checkpointing's ``MUST_CPU_OFFLOAD``: in eager mode
torch (2.13 and 2.14 alike, ``_CachingTorchDispatchMode`` in ``torch/utils/checkpoint.py``) saves
only ``MUST_SAVE``/``PREFER_SAVE`` outputs and *recomputes* everything else, offload policies
included; only torch.compile's activation-offloading pass honours them. So an offloaded region is
run under ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves inside it is
copied to host when it is saved (pack) and brought back for backward (unpack), the way
``torch.autograd.graph.save_on_cpu`` does, with these differences:

* parameters and buffers of the region are left on the device (saved weights are resident
  anyway: copying them moves bytes and frees nothing);
* the copy to host runs on a side stream (`frontends.graph_runtime.offload_ops`) and the device
  block is kept from reuse until that copy has read it (``record_stream``), so forward does not
  wait on the link;
* several saved tensors on one storage share one host copy, and one device copy when they come
  back (a view saved beside its base);
* a saved tensor whose device storage is still alive when backward reads it (something outside
  the region holds it: a later module saved it too, a checkpoint keeps it as its input, the
  caller holds it) is read there, not copied back: only what really left the device returns;
* **prefetch**: the first unpack of a region call brings back all of that call's values (the
  ones not still on the device), and starts bringing back the previous offloaded region call's
  too, so that copy overlaps this region's backward. `solvers.planning.eager_plan` schedules the
  same reloads (`RegionModel.schedule`), so the simulator predicts this runtime's memory.

On the CPU the same hooks make plain host copies (separate tensors), so gradients are testable;
`OffloadCounts` says what left the device and what came back.

The planner chooses offloaded regions (`apply_checkpointing(..., offload="auto")`: option
``"offload"`` of a region, applied by `frontends.eager_runtime.eager_checkpoint.apply_regions`);
`apply_offloading` offloads modules by hand (unplanned: its memory is not predicted).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from frontends.eager_runtime.instance_forward import CheckpointPlanError, InstanceForward, wrappers_of
from frontends.graph_runtime.offload_ops import (
    host_copy_ready,
    offload_to_host,
    release_after_copy,
    reload_done,
    reload_to_device,
)
from solvers.planning.eager_plan import OFFLOAD, OFFLOAD_PREFETCH, OFFLOADS


@dataclass
class OffloadCounts:
    """What offloaded region calls sent to host and brought back (filled in as autograd saves
    and reads tensors)."""

    tensors: int = 0
    """Saved tensors that went to host."""
    host_bytes: int = 0
    """Bytes of host copies made (one per storage)."""
    kept_on_device: int = 0
    """Saved tensors left on the device (parameters and buffers)."""
    reloaded_bytes: int = 0
    """Bytes copied back to the device (one copy per storage whose device block had been freed)."""
    read_on_device: int = 0
    """Unpacks served by a device storage still alive (held outside the region): not copied back."""


__all__ = ["OFFLOAD", "OFFLOAD_PREFETCH", "OFFLOADS",
           "OffloadCounts", "OffloadSession", "OffloadedForward", "offloaded_saved_tensors",
           "run_offloaded", "offload_modules", "apply_offloading", "offload_session", "offloaded_modules"]


class _Stored:
    """One device storage that offloaded region calls saved: its host copy, and its device copy
    while backward needs it. Shared by every call of the session that saves the storage (the
    rotary tables every decoder layer saves go to host once and come back once)."""

    __slots__ = ("host", "device", "device_storage", "reloaded", "pending", "__weakref__")

    def __init__(self, host: torch.Tensor, device: torch.device, storage: torch.UntypedStorage) -> None:
        self.host, self.device = host, device
        self.device_storage = weakref.ref(storage)
        """The device storage as forward made it: alive at unpack when something else holds it."""
        self.reloaded: torch.Tensor | None = None
        """The copy back (`reload_to_device`), until every pack of this storage was unpacked."""
        self.pending = 0
        """Packs of this storage not yet unpacked."""

    def on_device(self) -> torch.UntypedStorage | None:
        return self.device_storage()

    def bring_back(self, counts: Iterable[OffloadCounts]) -> None:
        """Start copying back, unless the device storage is alive or a copy is already on its way."""
        if self.reloaded is None and self.on_device() is None:
            host_copy_ready(self.host, self.device)
            self.reloaded = reload_to_device(self.host, self.device)
            for c in counts:
                c.reloaded_bytes += self.host.untyped_storage().nbytes()


class _RegionCall:
    """The storages one call of an offloaded region saved, in the order it saved them."""

    def __init__(self, session: "OffloadSession", counts: OffloadCounts, prefetch: bool) -> None:
        self.session = session
        self.prefetch = prefetch
        """Bring its values back early: when the backward of the next call of the session starts."""
        self.counts = counts
        """This call's own counts (the session has the totals)."""
        self.stored: dict[int, _Stored] = {}
        """id -> entry of every storage it saved, in the order it saved them."""
        self.started = False
        """Backward has read one of its values (its reloads and the previous call's were started)."""

    def bring_back(self) -> None:
        for entry in self.stored.values():
            entry.bring_back((self.counts, self.session.counts))


class _Packed:
    """A saved tensor as the hook keeps it: its storage's entry, the call that saved it, and its
    layout in the storage."""

    __slots__ = ("entry", "call", "dtype", "offset", "size", "stride")

    def __init__(self, entry: _Stored, call: _RegionCall, tensor: torch.Tensor) -> None:
        self.entry, self.call, self.dtype = entry, call, tensor.dtype
        self.offset, self.size, self.stride = tensor.storage_offset(), tensor.size(), tensor.stride()

    def view_of(self, storage: torch.UntypedStorage) -> torch.Tensor:
        return torch.empty(0, dtype=self.dtype, device=self.entry.device).set_(
            storage, self.offset, self.size, self.stride)


class OffloadSession:
    """The offloaded regions of one model, shared by their wrappers: the order their calls ran
    in forward, so that backward reaching one call prefetches the one before it, and one entry per
    device storage they saved."""

    def __init__(self) -> None:
        self._calls: list[weakref.ref[_RegionCall]] = []
        self._entries: weakref.WeakValueDictionary[tuple[torch.device, int], _Stored] = weakref.WeakValueDictionary()
        """(device, address) -> entry, while a saved tensor refers to it. An address is reused once
        its storage dies; the entry's weak reference to the storage tells them apart (a storage's
        Python object lives exactly as long as the storage)."""
        self.counts = OffloadCounts()
        """Totals over every call of the session's regions (since it was made)."""

    def begin(self, counts: OffloadCounts, prefetch: bool) -> _RegionCall:
        self._calls = [ref for ref in self._calls if ref() is not None]
        call = _RegionCall(self, counts, prefetch)
        self._calls.append(weakref.ref(call))
        return call

    def entry_for(self, tensor: torch.Tensor, call: _RegionCall) -> _Stored:
        """The entry of ``tensor``'s storage, its host copy started on first sight."""
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        entry = self._entries.get(key)
        if entry is None or entry.on_device() is not storage:
            host = offload_to_host(tensor.detach())
            release_after_copy(tensor)
            entry = _Stored(host, tensor.device, storage)
            self._entries[key] = entry
            for c in (call.counts, self.counts):
                c.host_bytes += storage.nbytes()
        call.stored.setdefault(id(entry), entry)
        return entry

    def start_backward(self, call: _RegionCall) -> None:
        """``call``'s first unpack: bring back its values, and those of the call before it when
        that one prefetches."""
        call.started = True
        call.bring_back()
        calls = [ref() for ref in self._calls]
        index = next((i for i, c in enumerate(calls) if c is call), 0)
        previous = next((c for c in reversed(calls[:index]) if c is not None and c.stored), None)
        if previous is not None and previous.prefetch and not previous.started:
            previous.bring_back()

    def __getstate__(self) -> dict[str, Any]:  # a copied model starts with no calls
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()


@contextlib.contextmanager
def offloaded_saved_tensors(resident: Iterable[torch.Tensor] = (), session: OffloadSession | None = None,
                            prefetch: bool = True) -> Iterator[OffloadCounts]:
    """Inside: every tensor autograd saves goes to host and comes back for backward, except the
    ``resident`` ones (a region's parameters and buffers, matched by storage). One region call of
    ``session`` (a new session of its own when None); ``prefetch``: its values come back when the
    backward of the session's next call starts (else when its own starts). Yields this call's counts."""
    kept = {t.untyped_storage().data_ptr() for t in resident}
    session = session if session is not None else OffloadSession()
    counts = OffloadCounts()
    call = session.begin(counts, prefetch)

    def pack(tensor: torch.Tensor) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in kept or tensor.device.type == "meta" or storage.nbytes() == 0:
            counts.kept_on_device += 1
            session.counts.kept_on_device += 1
            return tensor
        entry = session.entry_for(tensor, call)
        entry.pending += 1
        for c in (counts, session.counts):
            c.tensors += 1
        return _Packed(entry, call, tensor)

    def unpack(packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            return packed
        entry = packed.entry
        if not packed.call.started:
            session.start_backward(packed.call)
        alive = entry.on_device()
        if alive is not None and entry.reloaded is None:
            session.counts.read_on_device += 1
            packed.call.counts.read_on_device += 1
            tensor = packed.view_of(alive)
        else:
            entry.bring_back((packed.call.counts, session.counts))  # a read after its copy was let go
            reloaded = reload_done(entry.reloaded)
            tensor = packed.view_of(reloaded.untyped_storage())
        entry.pending -= 1
        if entry.pending <= 0:
            entry.reloaded = None  # the tensors returned hold it while backward reads them
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield counts


def run_offloaded(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with the activations its backward needs kept on host."""
    resident = list(module.parameters()) + list(module.buffers())
    with offloaded_saved_tensors(resident):
        return module(*args, **kwargs)


class OffloadedForward(InstanceForward):
    """The instance ``forward`` of a module whose saved activations are offloaded (removed by
    `frontends.eager_runtime.eager_checkpoint.remove_checkpointing` like the other wrappers).
    ``region``: the plan's entry for it (None when offloaded by hand with `apply_offloading`:
    then its values are prefetched, as with option `OFFLOAD_PREFETCH`)."""

    def __init__(self, module: torch.nn.Module, previous: Any, session: OffloadSession,
                 region: Any = None) -> None:
        super().__init__(module, previous)
        self.session, self.region = session, region

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self._original()(*args, **kwargs)
        return _run_offloaded_region(self, args, kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {"module": self.module, "previous": self.previous, "session": self.session,
                "region": self.region}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["module"], state["previous"], state["session"], state["region"])


@torch.compiler.disable
def _run_offloaded_region(wrapper: OffloadedForward, args: tuple, kwargs: dict) -> Any:
    """An offloaded module's call, kept out of ``torch.compile``: dynamo would trace into the
    saved-tensor hooks (storage copies, ``set_``) and recompile per tensor shape. Under compile the
    region runs eagerly between the compiled graphs around it (a graph break per offloaded module)."""
    resident = list(wrapper.module.parameters()) + list(wrapper.module.buffers())
    prefetch = wrapper.region is None or wrapper.region.option == OFFLOAD_PREFETCH
    with offloaded_saved_tensors(resident, wrapper.session, prefetch):
        return wrapper._original()(*args, **kwargs)


def offload_modules(model: torch.nn.Module, regions: Iterable[tuple[str, Any]],
                    session: OffloadSession | None = None) -> OffloadSession:
    """Wrap each module path of ``regions`` (path, plan entry or None) in `OffloadedForward`,
    all sharing one `OffloadSession` (returned). Paths are checked before any is wrapped."""
    modules = dict(model.named_modules())
    regions = list(regions)
    missing = [p for p, _ in regions if p not in modules]
    if missing:
        raise CheckpointPlanError(f"offloading names module {missing[0]!r}, which this model does not "
                                  "have; nothing was applied")
    session = session if session is not None else OffloadSession()
    for path, region in regions:
        module = modules[path]
        module.__dict__["forward"] = OffloadedForward(module, module.__dict__.get("forward"), session, region)
    return session


def apply_offloading(model: torch.nn.Module, paths: Iterable[str]) -> int:
    """Offload the saved activations of each module ``paths`` names (checked before any is
    wrapped); returns how many were wrapped. Undo with ``remove_checkpointing``."""
    paths = list(paths)
    offload_modules(model, [(p, None) for p in paths])
    return len(paths)


def offload_session(model: torch.nn.Module) -> OffloadSession | None:
    """The session the model's offloaded modules share (its counts), or None."""
    return next((wrapper.session for _, wrapper in wrappers_of(model, OffloadedForward)), None)


def offloaded_modules(model: torch.nn.Module) -> tuple[str, ...]:
    """Paths of the modules `apply_offloading` wrapped."""
    return tuple(path for path, _ in wrappers_of(model, OffloadedForward))
