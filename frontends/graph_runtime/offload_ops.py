"""Offload and reload: the runtime halves of a schedule's ``offload(v)`` and ``reload(v)`` steps.

The rewrite (`frontends.graph_runtime.rewrite`) turns each step into two fx nodes, so that
the wait happens where the schedule says and not where the copy starts:

* ``offload(v)`` -> `offload_to_host` (start the copy to a host buffer), then, at the schedule's
  ``free(v)``, `offload_done` (the device copy is read for the last time here, after the copy is
  known to finish; fx drops it right after). The host copy `offload_done` returns is what crosses
  the forward/backward boundary: it is what the autograd Function saves.
* ``reload(v)`` -> `reload_to_device` (allocate v on the device again and start the copy back),
  then, right before the first compute that reads v, `reload_done` (that compute waits for it).

On CUDA: the device-to-host copy runs on a side stream (one per device and direction) into
pinned host memory after that stream waits for the compute stream (the producer must have run),
and records an event. The device tensor is an input of `offload_done`, so it stays referenced
until the compute stream has waited on that event: only then can fx drop it, and the caching
allocator hands its block out again only to work ordered after the copy (the block belongs to
the compute stream). The reload allocates on the compute stream, copies on the host-to-device
stream after it waits for the compute stream, and records an event the first reader's stream
waits on. The pinned host block of a reload stays reserved until its copy completes (torch's
host allocator records the copy's stream).

On the CPU the same nodes run with plain copies and no streams (the "host" is the same memory),
so every gradient path can be tested without a GPU. The copy to host is made outside any
dispatch mode, so `frontends.measure.memory_tracker` counts on the CPU what a GPU would hold on
the device: the value freed after its offload, its bytes again from its reload.

The whole storage is copied, with the value's offset, sizes and strides: the IR counts a value
as its storage, and views re-derived from a reloaded value find the layout they had. These are
plain Python functions in fx nodes (like `frontends.graph_runtime.rng_replay.replay`): they carry
events, which an opaque torch custom op could not return.
"""

from __future__ import annotations

import weakref

import torch

from frontends.torch_compat import _disable_current_modes

_SIDE_STREAMS: dict[tuple[str, int], torch.cuda.Stream] = {}
_EVENTS: dict[int, tuple[weakref.ref, torch.cuda.Event]] = {}
"""id(tensor) -> (a weak reference to it, the event its copy recorded). Checked against the
reference on lookup, so a recycled id never matches; dropped when the tensor dies."""


def offload_to_host(value: torch.Tensor) -> torch.Tensor:
    """Start copying ``value``'s storage to host memory; returns the host tensor (same layout)."""
    if value.device.type != "cuda":
        with _disable_current_modes():  # host memory: not what a tracker of device memory counts
            return _copy_storage(value, torch.device("cpu"))
    stream = _side_stream("device_to_host", value.device)
    stream.wait_stream(torch.cuda.current_stream(value.device))
    with torch.cuda.stream(stream):
        host = _copy_storage(value, torch.device("cpu"), pin_memory=True, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    _remember(host, event)
    return host


def offload_done(host: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The schedule's ``free(v)`` after ``offload(v)``: the compute stream waits for the copy, and
    ``value`` (the device tensor) is read for the last time. Returns ``host``, the copy kept."""
    if value.device.type == "cuda":
        _wait_for(host, "device_to_host", value.device)
    return host


def reload_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Allocate the value on ``device`` again and start copying ``host`` into it."""
    if device.type != "cuda":
        return _copy_storage(host, device)
    compute = torch.cuda.current_stream(device)
    value = _empty_storage_like(host, device)  # allocated on the compute stream, which owns the block
    stream = _side_stream("host_to_device", device)
    stream.wait_stream(compute)  # the block may have just been freed by work still queued there
    with torch.cuda.stream(stream):
        _raw(value).copy_(_raw(host), non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    _remember(value, event)
    return value


def reload_done(value: torch.Tensor) -> torch.Tensor:
    """Right before the first compute that reads a reloaded value: wait for its copy."""
    if value.device.type == "cuda":
        _wait_for(value, "host_to_device", value.device)
    return value


def release_after_copy(value: torch.Tensor) -> None:
    """For a caller that drops ``value`` right after `offload_to_host` (a saved-tensor hook):
    its device block is not handed out again before the copy to host has read it."""
    if value.device.type == "cuda":
        value.record_stream(_side_stream("device_to_host", value.device))


def host_copy_ready(host: torch.Tensor, device: torch.device) -> None:
    """The compute stream of ``device`` waits until ``host`` (made by `offload_to_host` from a
    value there) holds the value: before `reload_to_device` where no `offload_done` waited."""
    if device.type == "cuda":
        _wait_for(host, "device_to_host", device)


# ---------------------------------------------------------------------------- helpers
def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s whole storage as a flat uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())


def _empty_storage_like(tensor: torch.Tensor, device: torch.device, pin_memory: bool = False) -> torch.Tensor:
    """A tensor on ``device`` with ``tensor``'s dtype, offset, sizes and strides over a new
    storage of the same byte size (contents undefined)."""
    nbytes = tensor.untyped_storage().nbytes()
    storage = torch.empty(nbytes, dtype=torch.uint8, device=device, pin_memory=pin_memory).untyped_storage()
    return torch.empty(0, dtype=tensor.dtype, device=device).set_(
        storage, tensor.storage_offset(), tensor.size(), tensor.stride())


def _copy_storage(tensor: torch.Tensor, device: torch.device, pin_memory: bool = False,
                  non_blocking: bool = False) -> torch.Tensor:
    copy = _empty_storage_like(tensor, device, pin_memory)
    _raw(copy).copy_(_raw(tensor), non_blocking=non_blocking)
    return copy


def _side_stream(direction: str, device: torch.device) -> torch.cuda.Stream:
    """The one copy stream of ``direction`` on ``device`` (made on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (direction, index)
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[key]


def _remember(tensor: torch.Tensor, event: torch.cuda.Event) -> None:
    key = id(tensor)
    _EVENTS[key] = (weakref.ref(tensor, lambda _ref, key=key: _EVENTS.pop(key, None)), event)


def _wait_for(tensor: torch.Tensor, direction: str, device: torch.device) -> None:
    """The compute stream waits for ``tensor``'s copy: its event, or, where the tensor object is
    not the one the copy made (it crossed the autograd boundary), the whole copy stream."""
    compute = torch.cuda.current_stream(device)
    entry = _EVENTS.get(id(tensor))
    if entry is not None and entry[0]() is tensor:
        compute.wait_event(entry[1])
    else:
        compute.wait_stream(_side_stream(direction, device))
