"""Measure the bytes an extern kernel allocates while it runs: its outputs and its workspace.

Inductor's buffer plan names every buffer the compiled wrapper allocates, but an extern kernel
(a convolution, an SDPA forward or backward, any aten fallback) also allocates memory inside the
call and frees it before returning: im2col columns, per-thread gradient accumulators, scratch.
That memory is part of the step's peak (the allocator holds it, next to everything live), and it
is not in the plan: on the ViT example SDPA's CPU backward alone adds 299,784 bytes to the
compiled peak. `kernel_peak_bytes` runs the kernel's aten op once, on fresh tensors with the
sizes, strides and dtypes the graph gives its inputs, and reads how much the allocator held at
its height (CPU: ``torch.profiler``'s memory events; CUDA: the caching allocator's peak). The
answer depends on the op, the shapes and the thread count, not on the values, so it is cached
per signature: a fit that probes several plans measures each kernel once.

What it cannot run (an op that needs values the random inputs do not give, a custom kernel
with side effects) comes back as None; callers report it rather than guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from frontends.compile.compiled_memory import profile_allocations
from frontends.measure.memory_tracker import _tensor_storages
from frontends.torch_compat import OpOverload, _disable_current_modes, tree_leaves, unset_fake_temporarily

__all__ = ["KernelPeak", "kernel_peak_bytes"]


def _tensor_key(value: torch.Tensor) -> tuple:
    return ("T", tuple(value.shape), tuple(value.stride()), value.dtype, value.device.type)


def _signature(node: torch.fx.Node) -> tuple | None:
    """What the op's allocations depend on: the op, every tensor's layout, the other arguments."""

    def key(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            val = value.meta.get("val")
            return _tensor_key(val) if isinstance(val, torch.Tensor) else ("S", repr(val))
        if isinstance(value, (list, tuple)):
            return tuple(key(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, key(v)) for k, v in value.items()))
        return repr(value)

    if not isinstance(node.target, OpOverload):
        return None
    return (str(node.target), key(node.args), key(node.kwargs), torch.get_num_threads())


def _fresh(value: torch.Tensor) -> torch.Tensor:
    """A real tensor laid out like ``value``: normal floats, zero integers (valid indices)."""
    real = torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype,
                               device=value.device)
    if real.is_floating_point() or real.is_complex():
        return real.normal_()
    return real.zero_()


def _real_arguments(node: torch.fx.Node) -> tuple[tuple, dict]:
    def real(arg: torch.fx.Node) -> Any:
        val = arg.meta.get("val")
        return _fresh(val) if isinstance(val, torch.Tensor) else val

    args = torch.fx.node.map_arg(node.args, real)
    kwargs = torch.fx.node.map_arg(node.kwargs, real)
    return args, kwargs


def _outputs_bytes(result: Any) -> int:
    """Bytes of the distinct storages behind the op's outputs (an output and its view count once)."""
    return sum({s.data_ptr(): s.nbytes() for s in _tensor_storages(result)}.values())


def _held_at_height(run: Callable[[], Any], device: torch.device) -> tuple[int, int]:
    """(peak bytes allocated during ``run()``, bytes of what it returned)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, _outputs_bytes(result)
    profiled = profile_allocations(run)
    return profiled.peak_bytes, _outputs_bytes(profiled.result)


@dataclass(frozen=True)
class KernelPeak:
    """What one run of an op held."""

    peak_bytes: int
    """Bytes the allocator held at the op's height (its outputs included)."""
    output_bytes: int
    """Bytes of the outputs it returned (kept after it returned)."""

    @property
    def workspace_bytes(self) -> int:
        """Bytes held at the height beyond the outputs (freed before the op returns)."""
        return max(0, self.peak_bytes - self.output_bytes)


_MEASURED: dict[tuple, KernelPeak | None] = {}
"""Per signature (op, layouts, other arguments, threads): a fit probing many plans runs each once."""


def _measure(node: torch.fx.Node) -> KernelPeak | None:
    val = node.meta.get("val")
    tensors = [v for v in tree_leaves(val) if isinstance(v, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    try:
        with unset_fake_temporarily(), _disable_current_modes(), torch.no_grad():
            args, kwargs = _real_arguments(node)
            peak, kept = _held_at_height(lambda: node.target(*args, **kwargs), device)
    except Exception:  # noqa: BLE001  # an op random inputs cannot run: unknown, reported as such
        return None
    return KernelPeak(peak_bytes=peak, output_bytes=kept)


def kernel_peak_bytes(node: torch.fx.Node) -> KernelPeak | None:
    """Run ``node``'s aten op once on fresh inputs laid out as its graph says and return what
    the allocator held at its height (None: not an aten op, or it could not run)."""
    signature = _signature(node)
    if signature is None:
        return None
    if signature not in _MEASURED:
        _MEASURED[signature] = _measure(node)
    return _MEASURED[signature]
