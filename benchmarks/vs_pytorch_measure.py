"""One real training step of any strategy, measured the same way for all: `measure_strategy`.

* peak: CPU: the storage tracker (`frontends.measure.memory_tracker`) around the step, or inside the
  compiled graphs for ``torch.compile``d modules (`vs_pytorch_peers.GraphProbe`), plus the
  storages resident before the step (parameters, buffers, inputs; each storage once), the
  accounting of `frontends.measure.step`; CUDA: ``max_memory_allocated`` after
  ``reset_peak_memory_stats`` (every strategy, compiled ones included, a warm-up step first);
* FLOPs: ``FlopCounterMode`` around the step (inside the compiled graphs for compiled modules);
  in a step of its own, `ModelledTime` prices every op that runs with remat-opt's ``flops`` cost
  model (max(FLOPs / 1 TFLOP/s, bytes read + written / 100 GB/s), views free), the objective
  remat-opt minimizes, so a FLOP count that calls pointwise recomputation free can be read
  beside it;
* time: median of ``repeats`` forward+backward steps after the first one; the first step's time
  is kept apart (it includes dynamo's compilation for compiled modules);
* gradients after the first step, and floating buffers (BatchNorm running statistics) and
  integer buffers (``num_batches_tracked``) after it, against plain autograd's.

Gradients are set to None before every step; the outputs are held until backward ends.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from frontends.measure.costs import FLOPS_MODEL
from frontends.measure.memory_tracker import track_live_memory


@dataclass(frozen=True)
class StepMetrics:
    """What one strategy's training step really did."""

    peak_bytes: int
    flops: int
    """FLOPs of forward + backward (``FlopCounterMode``: matmuls, convolutions, attention)."""
    modelled_s: float
    """The step's ops priced by remat-opt's ``flops`` cost model (see `ModelledTime`)."""
    time_s: float
    """Median seconds of a step after the first."""
    first_step_s: float
    """Seconds of the first step (compilation included for ``torch.compile``)."""
    grad_error: float
    """Largest relative gradient difference to plain autograd (max |a-b| / max |b| per parameter)."""
    state_error: float
    """Largest relative difference of the buffers after one step to plain autograd's (1.0 when an
    integer buffer such as ``num_batches_tracked`` differs)."""


@dataclass(frozen=True)
class StepState:
    """Gradients and buffers after one step, by the unwrapped model's names."""

    grads: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


class ModelledTime(TorchDispatchMode):
    """Sums max(FLOPs / peak, bytes read and written / bandwidth) of remat-opt's ``flops`` cost
    model over the aten ops that run; view ops (outputs alias an input, not written) are free."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return out
        tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        moved = sum(t.numel() * t.element_size() for t in tensors)
        formula = flop_registry.get(func.overloadpacket)
        flops = float(formula(*args, **kwargs, out_val=out)) if formula is not None else 0.0
        self.seconds += FLOPS_MODEL.seconds(flops, moved)
        return out


def loss_of(out) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _step(module: nn.Module, inputs: tuple, probe=None) -> None:
    out = module(*inputs)  # held until backward ends, as a training loop holds its outputs
    loss = loss_of(out)
    if probe is None:
        loss.backward()
    else:  # the seed gradient ``.backward()`` would make, made where the probe's tracker sees it
        loss.backward(probe.tracked(functools.partial(torch.ones_like, loss)))
    del out, loss


def _clear(params: dict[str, nn.Parameter]) -> None:
    for p in params.values():
        p.grad = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _resident_bytes(tensors: list[torch.Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def max_relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise ValueError(f"different tensor names: {sorted(a.keys() ^ b.keys())[:3]}")
    worst = 0.0
    for name, ref in b.items():
        if not ref.is_floating_point():
            worst = max(worst, 0.0 if torch.equal(a[name], ref) else 1.0)
            continue
        scale = ref.abs().max().clamp_min(1e-300)
        worst = max(worst, float((a[name] - ref).abs().max() / scale))
    return worst


def measure_strategy(module: nn.Module, params: dict[str, nn.Parameter],
                     buffers: dict[str, torch.Tensor], inputs: tuple, *,
                     reference: StepState | None, probe=None, repeats: int = 3,
                     ) -> tuple[StepMetrics, StepState]:
    """Measure ``module`` (plain, wrapped, compiled or rewritten); ``params`` and ``buffers`` are
    the underlying model's, by their unwrapped names; ``probe`` is the `GraphProbe` of a
    compiled module. Without a ``reference`` the errors are 0 (this is the reference)."""
    device = next(iter(params.values())).device
    _clear(params)
    _sync(device)
    start = time.perf_counter()
    _step(module, inputs)
    _sync(device)
    first_step_s = time.perf_counter() - start
    state = StepState({n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None},
                      {n: b.detach().clone() for n, b in buffers.items()})
    peak = _peak(module, params, buffers, inputs, probe, device)
    flops = int(_counted(module, params, inputs, probe, FlopCounterMode))
    modelled_s = _counted(module, params, inputs, probe, ModelledTime)
    times = []
    for _ in range(repeats):
        _clear(params)
        _sync(device)
        start = time.perf_counter()
        _step(module, inputs)
        _sync(device)
        times.append(time.perf_counter() - start)
    _clear(params)
    grad_error = state_error = 0.0
    if reference is not None:
        grad_error = max_relative_error(state.grads, reference.grads)
        state_error = max_relative_error(state.buffers, reference.buffers)
    return StepMetrics(peak, flops, modelled_s, statistics.median(times), first_step_s, grad_error, state_error), state


def _peak(module, params, buffers, inputs, probe, device: torch.device) -> int:
    _clear(params)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        _step(module, inputs)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    tensors = [*params.values(), *buffers.values(), *(t for t in inputs if isinstance(t, torch.Tensor))]
    resident = _resident_bytes(tensors)
    if probe is not None:
        with probe.tracking_memory() as ledger:
            _step(module, inputs, probe)
        return resident + ledger.peak_bytes
    with track_live_memory() as tracker:
        _step(module, inputs)
    return resident + tracker.result.peak_bytes


def _counted(module, params, inputs, probe, counter_kind):
    """One step under ``FlopCounterMode`` (-> FLOPs) or `ModelledTime` (-> seconds), each in a
    step of its own: FlopCounterMode's module hooks change what a RematModule's step runs."""
    _clear(params)
    if probe is not None:
        with probe.counting(counter_kind) as counts:
            _step(module, inputs)
        return sum(counts)
    with (FlopCounterMode(display=False) if counter_kind is FlopCounterMode else ModelledTime()) as counter:
        _step(module, inputs)
    return counter.get_total_flops() if counter_kind is FlopCounterMode else counter.seconds
