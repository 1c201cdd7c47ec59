"""Measure a whole training iteration: micro-batches of forward and backward, ``step()``, ``zero_grad()``.

The check on `solvers.planning.training_loop`: the peak of an iteration with its optimizer, the
optimizer's state included. The first iteration runs untracked (it creates the state, lazily, as
every torch optimizer does); each later one is measured on its own:

* CPU: the live storages `frontends.measure.memory_tracker` sees during the iteration, plus the
  storages resident before it (parameters, buffers, inputs and every optimizer state tensor,
  each storage once). AdamW's ``step`` counters are made by ``torch.tensor`` outside the
  dispatcher, so they are counted here as resident, not seen by the tracker.
* CPU, a torch.compile'd module: the tracker's dispatch mode would make dynamo run the model
  eagerly, so the CPU allocator's profiler events are read instead (`profile_allocations`), above
  the same resident storages.
* CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats`` (everything the process holds).

The loop is the one the plan models: ``for each micro-batch: loss = module(...); loss.backward()``,
the outputs dropped before the next micro-batch, then ``optimizer.step()`` and
``optimizer.zero_grad()`` (``set_to_none=True``).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from frontends.compile.compiled_memory import profile_allocations
from frontends.measure.memory_tracker import track_live_memory
from frontends.measure.step import forward_backward, unique_storage_bytes
from frontends.torch_compat import is_compiled, tree_flatten


@dataclass(frozen=True)
class LoopMeasurement:
    """The measured peaks of training iterations after the first."""

    peak_bytes: int
    """The largest iteration peak."""
    iteration_peaks: tuple[int, ...]
    """Each measured iteration's peak (iterations 2, 3, ...)."""
    optimizer_state_bytes: int
    """The optimizer's state tensors after the last iteration (each storage once)."""
    device: str


def measure_training_loop(module: torch.nn.Module, inputs: tuple, kwargs: dict | None,
                          optimizer: torch.optim.Optimizer, *, iterations: int = 3,
                          grad_accumulation: int = 1) -> LoopMeasurement:
    """Train ``iterations`` iterations of ``grad_accumulation`` micro-batches each (the same
    inputs every time); measure every iteration but the first."""
    if iterations < 2 or grad_accumulation < 1:
        raise ValueError("measure_training_loop needs iterations >= 2 (the first creates the state) "
                         "and grad_accumulation >= 1")
    kwargs = dict(kwargs or {})
    inputs = tuple(inputs)
    device = next((t.device for t in module.parameters()), torch.device("cpu"))
    compiled = is_compiled(module)
    _iteration(module, inputs, kwargs, optimizer, grad_accumulation)
    peaks = []
    for _ in range(iterations - 1):
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            _iteration(module, inputs, kwargs, optimizer, grad_accumulation)
            torch.cuda.synchronize(device)
            peaks.append(torch.cuda.max_memory_allocated(device))
            continue
        resident = unique_storage_bytes([*module.parameters(), *module.buffers(),
                                         *tree_flatten((inputs, kwargs))[0], *state_tensors(optimizer)])
        if compiled:
            profiled = profile_allocations(lambda: _iteration(module, inputs, kwargs, optimizer, grad_accumulation))
            peaks.append(resident + profiled.peak_bytes)
            continue
        with track_live_memory() as tracker:
            _iteration(module, inputs, kwargs, optimizer, grad_accumulation)
        peaks.append(resident + tracker.result.peak_bytes)
    return LoopMeasurement(peak_bytes=max(peaks), iteration_peaks=tuple(peaks),
                           optimizer_state_bytes=unique_storage_bytes(state_tensors(optimizer)),
                           device=str(device))


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's state."""
    return [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


def _iteration(module: torch.nn.Module, inputs: tuple, kwargs: dict, optimizer: torch.optim.Optimizer,
               grad_accumulation: int) -> None:
    for _ in range(grad_accumulation):
        forward_backward(module, inputs, kwargs)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
