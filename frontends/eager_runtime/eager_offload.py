"""Offload in the eager runtime: a module region whose saved activations wait on the host.

Why saved-tensor hooks and not selective checkpointing's ``MUST_CPU_OFFLOAD``: in eager mode
torch (2.13 and 2.14 alike, ``_CachingTorchDispatchMode`` in ``torch/utils/checkpoint.py``) saves
only ``MUST_SAVE``/``PREFER_SAVE`` outputs and *recomputes* everything else, offload policies
included; only torch.compile's activation-offloading pass honours them. So an offloaded region is
run under ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves inside it is
copied to host when it is saved (pack) and copied back when backward reads it (unpack), the way
``torch.autograd.graph.save_on_cpu`` does, with three differences:

* parameters and buffers of the region are left on the device (saved weights are resident
  anyway: copying them moves bytes and frees nothing);
* the copy to host runs on a side stream (`frontends.graph_runtime.offload_ops`) and the device
  block is kept from reuse until that copy has read it (``record_stream``), so forward does not
  wait on the link; backward waits for the copy when it unpacks;
* several saved tensors on one storage share one host copy (a view saved beside its base).

There is no prefetch: a value comes back when backward reads it, so the copy back is not hidden.
On the CPU the same hooks make plain host copies (separate tensors), so gradients are testable.

A planner decision to offload a module is applied with `apply_offloading` (module paths); the
eager planner (`solvers.planning.eager_plan`) does not choose offload yet: this is the hook.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from frontends.eager_runtime.eager_checkpoint import CheckpointPlanError, _InstanceForward
from frontends.graph_runtime.offload_ops import (
    host_copy_ready,
    offload_to_host,
    release_after_copy,
    reload_done,
    reload_to_device,
)


@dataclass
class OffloadCounts:
    """What one offloaded region call sent to host (filled in as autograd saves tensors)."""

    tensors: int = 0
    """Saved tensors that went to host."""
    host_bytes: int = 0
    """Bytes of host copies made (one per storage)."""
    kept_on_device: int = 0
    """Saved tensors left on the device (parameters and buffers)."""


class _Packed:
    """A saved tensor as the hook keeps it: its host copy and the device to bring it back to."""

    __slots__ = ("host", "device")

    def __init__(self, host: torch.Tensor, device: torch.device) -> None:
        self.host, self.device = host, device


@contextlib.contextmanager
def offloaded_saved_tensors(resident: Iterable[torch.Tensor] = ()) -> Iterator[OffloadCounts]:
    """Inside: every tensor autograd saves goes to host and comes back when backward reads it,
    except the ``resident`` ones (a region's parameters and buffers, matched by storage)."""
    kept = {t.untyped_storage().data_ptr() for t in resident}
    # one host copy per device storage, while that storage lives (an address is reused after it
    # dies; its Python storage object lives exactly as long as the storage, so a weak reference tells)
    # (the host copy is held weakly too: the saved tensors' packs hold it, and free it in backward)
    host_storages: dict[tuple[torch.device, int], tuple[weakref.ref, weakref.ref]] = {}
    counts = OffloadCounts()

    def pack(tensor: torch.Tensor) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in kept or tensor.device.type == "meta" or storage.nbytes() == 0:
            counts.kept_on_device += 1
            return tensor
        key = (tensor.device, storage.data_ptr())
        entry = host_storages.get(key)
        shared = entry[1]() if entry is not None and entry[0]() is storage else None
        if shared is None:
            host = offload_to_host(tensor.detach())
            release_after_copy(tensor)
            host_storages[key] = (weakref.ref(storage), weakref.ref(host))
            counts.host_bytes += storage.nbytes()
        else:  # the same storage again: a view over the host copy already made
            host = torch.empty(0, dtype=tensor.dtype).set_(shared.untyped_storage(), tensor.storage_offset(),
                                                           tensor.size(), tensor.stride())
        counts.tensors += 1
        return _Packed(host, tensor.device)

    def unpack(packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            return packed
        host_copy_ready(packed.host, packed.device)
        return reload_done(reload_to_device(packed.host, packed.device))

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield counts


def run_offloaded(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with the activations its backward needs kept on host."""
    resident = list(module.parameters()) + list(module.buffers())
    with offloaded_saved_tensors(resident):
        return module(*args, **kwargs)


class OffloadedForward(_InstanceForward):
    """The instance ``forward`` of a module whose saved activations are offloaded (removed by
    `frontends.eager_runtime.eager_checkpoint.remove_checkpointing` like the other wrappers)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = self._original()
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        resident = list(self.module.parameters()) + list(self.module.buffers())
        with offloaded_saved_tensors(resident):
            return inner(*args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {"module": self.module, "previous": self.previous}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["module"], state["previous"])


def apply_offloading(model: torch.nn.Module, paths: Iterable[str]) -> int:
    """Offload the saved activations of each module ``paths`` names (checked before any is
    wrapped); returns how many were wrapped. Undo with ``remove_checkpointing``."""
    modules = dict(model.named_modules())
    paths = list(paths)
    missing = [p for p in paths if p not in modules]
    if missing:
        raise CheckpointPlanError(f"offloading names module {missing[0]!r}, which this model does not "
                                  "have; nothing was applied")
    for path in paths:
        module = modules[path]
        module.__dict__["forward"] = OffloadedForward(module, module.__dict__.get("forward"))
    return len(paths)


def offloaded_modules(model: torch.nn.Module) -> tuple[str, ...]:
    """Paths of the modules `apply_offloading` wrapped."""
    found = []
    for path, module in model.named_modules():
        wrapper = module.__dict__.get("forward")
        while isinstance(wrapper, _InstanceForward):
            if isinstance(wrapper, OffloadedForward):
                found.append(path)
            wrapper = wrapper.previous
    return tuple(found)
