"""Check a plan by running it: gradients against plain autograd in float64, peak against prediction.

This is the routine check BACKGROUND.md asks for: a relative gradient error around 1e-10 is
healthy; anything near 1e-3 means recomputation changed the math.

Both runs also take a second, consecutive step (after an SGD update), seeded once before the
first (Python's ``random``, numpy and torch): what capture froze into the graph (a Python
random draw, a counter, a reseeded generator; see `frontends.guards.forward_guards`) shows up as a
second step, or a model state (buffers, plain attributes), that differs from plain autograd's.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch

from frontends.guards.forward_state import differing_attributes, plain_attributes
from frontends.guards.rng_states import numpy_random
from frontends.measure.memory_tracker import track_live_memory
from optimizer.api import optimize

GRADIENT_TOLERANCE = 1e-10
PEAK_TOLERANCE = 0.02
STEPS_TOLERANCE = 1e-8
"""Two consecutive steps: outputs and gradients of both, relative (float64)."""
SGD_LR = 1e-2
"""The update between the two steps, so that the second one reads changed parameters."""


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
    max_relative_two_step_error: float = 0.0
    """Largest relative difference of outputs and gradients over two consecutive steps."""
    state_differences: tuple[str, ...] = ()
    """Buffers and plain Python attributes of the model that differ after the two steps."""

    @property
    def grads_ok(self) -> bool:
        return self.max_relative_grad_error <= GRADIENT_TOLERANCE

    @property
    def peak_ok(self) -> bool:
        return abs(self.measured_peak_bytes - self.predicted_peak_bytes) <= max(
            PEAK_TOLERANCE * self.predicted_peak_bytes, 4096)

    @property
    def steps_ok(self) -> bool:
        return self.max_relative_two_step_error <= STEPS_TOLERANCE and not self.state_differences

    @property
    def passed(self) -> bool:
        return self.grads_ok and self.peak_ok and self.steps_ok


def to_float64(model: torch.nn.Module, inputs: tuple) -> tuple[torch.nn.Module, tuple]:
    """A float64 copy of the model and its floating inputs (integer inputs stay as they are)."""
    model = copy.deepcopy(model).to(torch.float64)
    inputs = tuple(t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in inputs)
    return model, inputs


def first_tensor(output) -> torch.Tensor:
    """The loss: the output itself or its first element."""
    return output[0] if isinstance(output, (tuple, list)) else output


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy's global RNG (when numpy is loaded) and torch."""
    random.seed(seed)
    np_random = numpy_random()  # None when numpy is not loaded: nothing can draw from it
    if np_random is not None:
        np_random.seed(seed)
    torch.manual_seed(seed)


def measured_step(module: torch.nn.Module, params_owner: torch.nn.Module, inputs: tuple,
                  seed: int | None):
    """One training step with fresh gradients: (outputs, gradients by name, peak bytes);
    ``seed`` None: the RNGs continue from where they are."""
    for p in params_owner.parameters():
        p.grad = None
    if seed is not None:
        seed_everything(seed)
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


def _steps(module: torch.nn.Module, params_owner: torch.nn.Module, inputs: tuple, seed: int):
    """Two consecutive training steps, seeded once, an SGD update between them: the first
    step's (outputs, gradients, peak), the second's, then the model's buffers and plain
    attributes afterwards."""
    first = measured_step(module, params_owner, inputs, seed)
    with torch.no_grad():
        for p in params_owner.parameters():
            if p.grad is not None:
                p.sub_(SGD_LR * p.grad)
    second = measured_step(module, params_owner, inputs, None)
    buffers = {n: b.detach().clone() for n, b in params_owner.named_buffers()}
    return first, second, (buffers, plain_attributes(params_owner))


def _step_error(step, plain_step) -> float:
    (out, grads, _), (plain_out, plain_grads, _) = step, plain_step
    errors = [_relative(grads[n], plain_grads[n]) for n in plain_grads if n in grads]
    errors += [_relative(a, b) for a, b in zip(out, plain_out) if a.is_floating_point()]
    return max(errors, default=0.0)


def _state_differences(state, plain_state) -> tuple[str, ...]:
    (buffers, attributes), (plain_buffers, plain_attributes_) = state, plain_state
    found = []
    for name, plain in plain_buffers.items():
        mine = buffers.get(name)
        if mine is None or mine.shape != plain.shape:
            found.append(f"buffer {name} differs in shape")
        elif plain.is_floating_point() and _relative(mine, plain) > STEPS_TOLERANCE:
            found.append(f"buffer {name} differs (relative error {_relative(mine, plain):.1e})")
        elif not plain.is_floating_point() and not torch.equal(mine, plain):
            found.append(f"buffer {name} differs")
    found += [f"{name}: {plain} with plain autograd, {mine} with the plan"
              for name, plain, mine in differing_attributes(plain_attributes_, attributes)]
    return tuple(found)


def verify(model: torch.nn.Module, inputs: tuple, budget, *, solver: str = "milp",
           time_limit: float = 60.0, seed: int = 0, milp_engine: str = "auto",
           python_side_effects: str = "error") -> VerifyResult:
    """Plan a float64 copy of ``model`` for ``budget`` and compare two consecutive steps with
    plain autograd's (the first one's gradients and peak memory in detail).

    Random ops draw the same numbers in both runs (same seed; a recomputation replays its state).
    ``python_side_effects`` is passed to `optimize`: with ``"ignore"`` what capture froze is
    planned, and shows up here as a second step or a model state that differs.
    """
    plain_model, inputs = to_float64(model, inputs)
    remat_model = copy.deepcopy(plain_model)
    plain_first, plain_second, plain_state = _steps(plain_model, plain_model, inputs, seed)
    rm = optimize(remat_model, inputs, budget, solver=solver, time_limit=time_limit, milp_engine=milp_engine,
                  python_side_effects=python_side_effects)
    first, second, state = _steps(rm, remat_model, inputs, seed)
    (out, grads, peak), (plain_out, plain_grads, plain_peak) = first, plain_first
    missing = sorted(set(plain_grads) ^ set(grads))
    if missing:
        raise AssertionError(f"gradients present in only one run: {missing[:5]}")
    grad_error = max((_relative(grads[n], plain_grads[n]) for n in plain_grads), default=0.0)
    out_error = max((_relative(a, b) for a, b in zip(out, plain_out) if a.is_floating_point()), default=0.0)
    two_step_error = max(_step_error(first, plain_first), _step_error(second, plain_second))
    return VerifyResult(grad_error, out_error, rm.plan.predicted_peak_bytes, peak, plain_peak,
                        two_step_error, _state_differences(state, plain_state))
