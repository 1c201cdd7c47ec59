"""What the compile tests do to a compiled module: one training step, its gradients, a peak check."""

from __future__ import annotations

from torch import nn


def grads(module: nn.Module) -> dict:
    """The gradients by parameter name, without torch.compile's ``_orig_mod.`` prefix."""
    return {n.removeprefix("_orig_mod."): p.grad.detach().clone() for n, p in module.named_parameters()}


def step(module: nn.Module, inputs: tuple) -> None:
    """One forward and backward from the first output (gradients cleared first)."""
    for p in module.parameters():
        p.grad = None
    out = module(*inputs)
    (out[0] if isinstance(out, (tuple, list)) else out).backward()


def within(measured: int, predicted: int) -> bool:
    """Within 2% (or 4 KiB) of the prediction: the compiled step's allocations beside the plan's."""
    return abs(measured - predicted) <= max(0.02 * predicted, 4096)
