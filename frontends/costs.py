"""Per-op compute cost from torch's own FLOP formulas, with memory-bound ops costed by bytes.

The ``flops`` cost model prices an op at a nominal device: time = max(FLOPs / peak,
bytes moved / bandwidth). Matmuls are FLOP-bound, pointwise ops and copies are bound by the
bytes they read and write, so recomputing a cheap-but-large op is not free.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """A roofline over one device: what a FLOP and a byte cost."""

    name: str
    peak_flops: float
    """Dense FLOP/s the model assumes."""
    bandwidth: float
    """Memory bytes/s the model assumes."""

    def seconds(self, flops: float, bytes_moved: float) -> float:
        return max(flops / self.peak_flops, bytes_moved / self.bandwidth)

    def describe(self) -> str:
        return f"{self.name} (max(FLOPs / {self.peak_flops:.3g} FLOP/s, bytes / {self.bandwidth:.3g} B/s))"


FLOPS_MODEL = CostModel(name="flops", peak_flops=1e12, bandwidth=1e11)
"""Nominal device: 1 TFLOP/s dense, 100 GB/s memory (a ratio of 10 FLOPs per byte)."""


def op_flops(node: torch.fx.Node) -> float:
    """FLOPs of one aten op from torch.utils.flop_counter's registry (0 for ops it omits)."""
    target = getattr(node.target, "overloadpacket", None)
    formula = flop_registry.get(target)
    if formula is None:
        return 0.0
    args, kwargs = _vals(node.args), _vals(node.kwargs)
    try:
        return float(formula(*args, **kwargs, out_val=node.meta.get("val")))
    except Exception:  # a formula that cannot read these shapes: cost by bytes only
        return 0.0


def op_bytes_moved(node: torch.fx.Node) -> int:
    """Bytes the op reads (its tensor inputs) plus the bytes it writes (its outputs)."""
    inputs = [v for v in tree_flatten((_vals(node.args), _vals(node.kwargs)))[0] if isinstance(v, torch.Tensor)]
    outputs = [v for v in tree_flatten(node.meta.get("val"))[0] if isinstance(v, torch.Tensor)]
    return sum(_tensor_bytes(t) for t in inputs + outputs)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _vals(tree):
    """Replace fx nodes in args by their FakeTensor values."""
    def value(a):
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a
    return torch.fx.node.map_aggregate(tree, value)
