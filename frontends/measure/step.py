"""Run one real training step and measure its peak memory and time: the check on every prediction.

A predicted peak nobody has seen match a measured one is not trusted, so the CLI's
``--measure``, the tests and the GPU benchmark all measure the same way:

* CPU: live storage bytes from `frontends.measure.memory_tracker` during forward + backward, plus the
  bytes of the storages resident before the step (parameters, buffers, tensor inputs; each
  storage once, so tied weights count once). This is the simulator's accounting exactly.
* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, taken after a
  warm-up step. Nothing is subtracted: it includes everything the process holds on the device
  (other models' tensors too), library workspaces (cuBLAS keeps one per handle and stream once
  used) and the caching allocator's 512-byte rounding; `solvers.ir.allocator` models these.

Gradients are set to None before every step, so each step allocates them as a first step does
(the simulator counts them as outputs of backward). The loss is the module's output, or its
first element when it returns a tuple or list. Step time is the median over ``repeats`` of
forward + backward (synchronized on CUDA).
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from frontends.measure.memory_tracker import track_live_memory
from frontends.torch_compat import tree_flatten


@dataclass(frozen=True)
class StepMeasurement:
    """What one training step really used."""

    peak_bytes: int
    """Peak device memory of the step (see the module docstring for what is included)."""
    step_time_s: float
    """Median seconds of forward + backward."""
    device: str
    resident_bytes: int
    """Bytes live before the step: CPU: parameters, buffers, inputs; CUDA: all allocated."""
    repeats: int

    @property
    def step_peak_bytes(self) -> int:
        """What the step added on top of what was resident."""
        return self.peak_bytes - self.resident_bytes


def measure_step(
    module: torch.nn.Module,
    inputs: tuple,
    kwargs: dict | None = None,
    *,
    warmup: int = 1,
    repeats: int = 3,
) -> StepMeasurement:
    """Measure forward + backward of ``module(*inputs, **kwargs)`` (a model or a RematModule)."""
    if repeats < 1 or warmup < 0:
        raise ValueError("measure_step needs repeats >= 1 and warmup >= 0")
    kwargs = dict(kwargs or {})
    inputs = tuple(inputs)
    device = _device_of(module, inputs)
    for _ in range(warmup):
        _timed_step(module, inputs, kwargs, device)
    if device.type == "cuda":
        peak, resident = _cuda_peak(module, inputs, kwargs, device)
    else:
        peak, resident = _cpu_peak(module, inputs, kwargs)
    times = [_timed_step(module, inputs, kwargs, device) for _ in range(repeats)]
    _clear_grads(module)
    return StepMeasurement(
        peak_bytes=peak, step_time_s=statistics.median(times), device=str(device),
        resident_bytes=resident, repeats=repeats,
    )


def forward_backward(module: torch.nn.Module, inputs: tuple, kwargs: dict) -> None:
    """One forward and ``loss.backward()``; the outputs are dropped when it returns."""
    out = module(*inputs, **kwargs)
    if hasattr(out, "to_tuple"):  # a Hugging Face ModelOutput: the loss comes first
        out = out.to_tuple()
    loss = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError("the module's (first) output must be a scalar loss tensor to measure a step")
    loss.backward()


def _timed_step(module: torch.nn.Module, inputs: tuple, kwargs: dict, device: torch.device) -> float:
    _clear_grads(module)
    _synchronize(device)
    start = time.perf_counter()
    forward_backward(module, inputs, kwargs)
    _synchronize(device)
    return time.perf_counter() - start


def _cpu_peak(module: torch.nn.Module, inputs: tuple, kwargs: dict) -> tuple[int, int]:
    _clear_grads(module)
    gc.collect()
    resident = unique_storage_bytes([*module.parameters(), *module.buffers(), *tree_flatten((inputs, kwargs))[0]])
    with track_live_memory() as tracker:
        forward_backward(module, inputs, kwargs)
    return resident + tracker.result.peak_bytes, resident


def _cuda_peak(module: torch.nn.Module, inputs: tuple, kwargs: dict, device: torch.device) -> tuple[int, int]:
    _clear_grads(module)
    gc.collect()
    torch.cuda.synchronize(device)
    resident = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    forward_backward(module, inputs, kwargs)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device), resident


def unique_storage_bytes(values: list[Any]) -> int:
    """Bytes of the distinct storages among ``values`` (tensors sharing a storage count once)."""
    seen: dict[int, int] = {}
    for v in values:
        if isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values())


def _clear_grads(module: torch.nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_of(module: torch.nn.Module, inputs: tuple) -> torch.device:
    for t in [*module.parameters(), *tree_flatten(inputs)[0]]:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")
