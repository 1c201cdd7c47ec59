"""Faster CPU kernels for ops that AOTAutograd writes but eager CPU PyTorch never runs.

Eager ``dropout`` on the CPU draws a float noise tensor and multiplies by it. AOTAutograd
decomposes the same call into ``native_dropout`` (a bool mask) and ``native_dropout_backward``,
whose CPU kernels multiply a float tensor by the bool mask through a slow element-wise
bool-to-float conversion: on one thread, 8.7 ms for a [8, 4, 256, 256] float32 gradient where
converting the mask first and multiplying takes 2.5 ms. That alone made transformers GPT-2
(dropout 0.1) 5% slower under the graph runtime at store-all than under plain autograd.
Converting the mask is itself slow (bool to float is not vectorized); multiplying by the mask's
bytes read as ``uint8`` is: 1.9 ms for that forward or backward, against 4.3-4.4 ms converting
first (2026-12-07, same VM), where eager's multiply by its saved float noise takes 1.0 ms.

The replacements compute the same values bit for bit (the mask is drawn by the same
``bernoulli_`` call into the same bool tensor, so the random stream is unchanged; an element the
mask drops is exactly 0) and return tensors of the same shapes and dtypes. They are custom ops,
so the dispatcher sees one call with the same outputs as the aten op: what memory tracking
counts, and so the simulator's prediction, is unchanged. The rewrite substitutes them only for
nodes whose value lives on the CPU; CUDA keeps its fused kernels.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("remat_opt::native_dropout_cpu", mutates_args=())
def native_dropout_cpu(input: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.native_dropout``, multiplying by the mask's bytes instead of converting it."""
    if train is False:  # aten's own answer; a p of 0 still draws, as aten's does
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = 1.0 - p
    mask = torch.empty_like(input, dtype=torch.bool).bernoulli_(keep)
    # aten multiplies by noise = mask * scale rounded to the input's dtype: a 0-dim tensor of
    # that dtype gives the same rounding (a Python float would not, in bf16)
    scale = torch.full((), 0.0 if keep == 0 else 1.0 / keep, dtype=input.dtype)
    return (input * mask.view(torch.uint8)).mul_(scale), mask


@native_dropout_cpu.register_fake
def _native_dropout_cpu_fake(input: torch.Tensor, p: float, train: bool | None):
    return torch.empty_like(input), torch.empty_like(input, dtype=torch.bool)


@torch.library.custom_op("remat_opt::native_dropout_backward_cpu", mutates_args=())
def native_dropout_backward_cpu(grad_output: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``aten.native_dropout_backward``: ``grad_output * mask * scale``, the mask read as bytes."""
    return (grad_output * mask.view(torch.uint8)).mul_(scale)


@native_dropout_backward_cpu.register_fake
def _native_dropout_backward_cpu_fake(grad_output: torch.Tensor, mask: torch.Tensor, scale: float):
    return torch.empty_like(grad_output)


_CPU_REPLACEMENTS = {
    torch.ops.aten.native_dropout.default: torch.ops.remat_opt.native_dropout_cpu.default,
    torch.ops.aten.native_dropout_backward.default: torch.ops.remat_opt.native_dropout_backward_cpu.default,
}


def cpu_kernel(node: torch.fx.Node):
    """The target to run ``node`` with: a replacement above when its value is on the CPU."""
    replacement = _CPU_REPLACEMENTS.get(node.target)
    if replacement is None:
        return node.target
    value = node.meta.get("val")
    first = value[0] if isinstance(value, (tuple, list)) else value
    if isinstance(first, torch.Tensor) and first.device.type == "cpu":
        return replacement
    return node.target
