"""Check a plan by running it: gradients against plain autograd in float64, peak against prediction.

This is the routine check BACKGROUND.md asks for: a relative gradient error around 1e-10 is
healthy; anything near 1e-3 means recomputation changed the math.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from frontends.memory_tracker import track_live_memory
from optimizer.app.api import optimize

GRADIENT_TOLERANCE = 1e-10
PEAK_TOLERANCE = 0.02


@dataclass(frozen=True)
class VerifyResult:
    max_relative_grad_error: float
    """Largest over parameters of max|g_remat - g_plain| / max|g_plain|."""
    max_relative_output_error: float
    predicted_peak_bytes: int
    measured_peak_bytes: int
    """Live tensor storages during one step, plus resident parameters, buffers and inputs."""
    plain_peak_bytes: int
    """The same measurement for plain autograd."""

    @property
    def grads_ok(self) -> bool:
        return self.max_relative_grad_error <= GRADIENT_TOLERANCE

    @property
    def peak_ok(self) -> bool:
        return abs(self.measured_peak_bytes - self.predicted_peak_bytes) <= max(
            PEAK_TOLERANCE * self.predicted_peak_bytes, 4096)

    @property
    def passed(self) -> bool:
        return self.grads_ok and self.peak_ok


def to_float64(model: torch.nn.Module, inputs: tuple) -> tuple[torch.nn.Module, tuple]:
    """A float64 copy of the model and its floating inputs (integer inputs stay as they are)."""
    model = copy.deepcopy(model).to(torch.float64)
    inputs = tuple(t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in inputs)
    return model, inputs


def first_tensor(output) -> torch.Tensor:
    """The loss: the output itself or its first element."""
    return output[0] if isinstance(output, (tuple, list)) else output


def measured_step(module: torch.nn.Module, params_owner: torch.nn.Module, inputs: tuple, seed: int):
    """One training step with fresh gradients: (outputs, gradients by name, peak bytes)."""
    for p in params_owner.parameters():
        p.grad = None
    torch.manual_seed(seed)
    with track_live_memory() as tracker:
        out = module(*inputs)
        first_tensor(out).backward()
    resident = {id(t): t for t in [*params_owner.parameters(), *params_owner.buffers(), *inputs]
                if isinstance(t, torch.Tensor)}
    peak = tracker.result.peak_bytes + sum(t.untyped_storage().nbytes() for t in resident.values())
    outs = [o.detach() for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
    grads = {n: p.grad.detach().clone() for n, p in params_owner.named_parameters() if p.grad is not None}
    return outs, grads, peak


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(torch.finfo(b.dtype).tiny)) if b.numel() else 0.0


def verify(model: torch.nn.Module, inputs: tuple, budget, *, solver: str = "milp",
           time_limit: float = 60.0, seed: int = 0, milp_engine: str = "auto") -> VerifyResult:
    """Plan a float64 copy of ``model`` for ``budget`` and compare one step with plain autograd.

    Random ops draw the same numbers in both runs (same seed, random ops never recomputed).
    """
    plain_model, inputs = to_float64(model, inputs)
    remat_model = copy.deepcopy(plain_model)
    plain_out, plain_grads, plain_peak = measured_step(plain_model, plain_model, inputs, seed)
    rm = optimize(remat_model, inputs, budget, solver=solver, time_limit=time_limit, milp_engine=milp_engine)
    out, grads, peak = measured_step(rm, remat_model, inputs, seed)
    missing = sorted(set(plain_grads) ^ set(grads))
    if missing:
        raise AssertionError(f"gradients present in only one run: {missing[:5]}")
    grad_error = max((_relative(grads[n], plain_grads[n]) for n in plain_grads), default=0.0)
    out_error = max((_relative(a, b) for a, b in zip(out, plain_out) if a.is_floating_point()), default=0.0)
    return VerifyResult(grad_error, out_error, rm.plan.predicted_peak_bytes, peak, plain_peak)
