"""One plan, many input sizes: how a call's inputs compare with the planned ones.

A training loop does not call the model at one size: the last batch of a ``DataLoader`` is
smaller, and batches of text change their sequence length. The rewritten module keeps the
planned schedule for every size up to the planned one. At a new size the step is captured again
(seconds, once per size) and the planned schedule is put on that capture *by name*: the graph
must be the same graph (same ops, same reads, same run-once ops; only sizes differ), which
`structure_difference` checks, and the simulator then evaluates the schedule at the new sizes,
so the promise "peak at a smaller size <= the planned peak" is checked, not assumed. (Every
value's bytes are a product of dimensions with non-negative coefficients, so for the same graph
they can only shrink with the inputs, and so can the peak; the check is what makes it a fact.)

An input larger than planned in any dimension is not covered: the module raises, or re-plans
when asked to (``on_larger="replan"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from frontends.torch_compat import tree_flatten
from solvers.ir.graph import RematGraph

SAME, SMALLER, LARGER, DIFFERENT = "same", "smaller", "larger", "different"
ON_LARGER = ("error", "replan")


def input_signature(tree: Any) -> tuple:
    """Shapes, dtypes and devices of the tensors in ``tree``, and every other value as is."""
    leaves, _ = tree_flatten(tree)
    return tuple(
        ("tensor", tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else ("value", x)
        for x in leaves
    )


@dataclass(frozen=True)
class ShapeFit:
    """How a call's inputs relate to the planned ones; ``detail`` names the first difference."""

    kind: str
    detail: str = ""


def compare_inputs(planned: tuple, called: tuple) -> ShapeFit:
    """`SAME`, `SMALLER` (every dimension at most the planned one), `LARGER` (some dimension
    beyond it) or `DIFFERENT` (another structure, rank, dtype, device or non-tensor value)."""
    if planned == called:
        return ShapeFit(SAME)
    if len(planned) != len(called):
        return ShapeFit(DIFFERENT, f"{len(called)} input values, planned with {len(planned)}")
    larger = ""
    for i, (p, c) in enumerate(zip(planned, called)):
        if p[0] != c[0] or p[0] == "value":
            if p != c:
                return ShapeFit(DIFFERENT, f"input value {i} is {c[1]!r}, planned with {p[1]!r}")
            continue
        _, p_shape, p_dtype, p_device = p
        _, c_shape, c_dtype, c_device = c
        if (p_dtype, p_device) != (c_dtype, c_device):
            return ShapeFit(DIFFERENT, f"input tensor {i} is {c_dtype} on {c_device}, planned as "
                                       f"{p_dtype} on {p_device}")
        if len(p_shape) != len(c_shape):
            return ShapeFit(DIFFERENT, f"input tensor {i} has shape {c_shape}, planned with {p_shape}")
        if not larger and any(c_dim > p_dim for c_dim, p_dim in zip(c_shape, p_shape)):
            larger = f"input tensor {i} has shape {c_shape}, larger than the planned {p_shape}"
    return ShapeFit(LARGER, larger) if larger else ShapeFit(SMALLER)


def structure_difference(planned: RematGraph, other: RematGraph) -> str:
    """'' when ``other`` is ``planned`` at other sizes (a schedule of one runs on the other);
    otherwise the first difference, for the message."""
    if len(planned.nodes) != len(other.nodes):
        return f"{len(other.nodes)} values instead of {len(planned.nodes)}"
    for a, b in zip(planned.nodes, other.nodes):
        if (a.name, a.kind, a.phase, a.inputs, a.group, a.op, a.compute_once, a.replays_rng) != (
                b.name, b.kind, b.phase, b.inputs, b.group, b.op, b.compute_once, b.replays_rng):
            return f"value {a.name!r} ({a.op or a.kind.value}) differs"
    for field in ("forward_outputs", "user_outputs", "backward_outputs"):
        if getattr(planned, field) != getattr(other, field):
            return f"the step's {field.replace('_', ' ')} differ"
    return ""


def shape_key(signature: tuple) -> str:
    """A hashable key for a signature (non-tensor values may be unhashable)."""
    return repr(signature)


def describe_shapes(signature: tuple) -> str:
    """The tensor shapes of a signature, for messages: ``(8, 64), (8, 64)``."""
    return ", ".join(str(s[1]) for s in signature if s[0] == "tensor")
