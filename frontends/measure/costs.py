"""Per-op compute cost from torch's own FLOP formulas, with memory-bound ops costed by bytes.

Every analytic cost model is a roofline: time = max(FLOPs / peak, bytes moved / bandwidth).
Matmuls are FLOP-bound, pointwise ops and copies are bound by the bytes they read and write, so
recomputing a cheap-but-large op is not free. ``flops`` prices ops at a nominal device;
``roofline:<device>`` at a known GPU's datasheet numbers (`frontends.measure.devices`), so a plan for a
GPU can be made on a laptop; ``profile`` stands for measured times (`frontends.measure.profile`).
``flop-count`` is not a roofline: it prices an op by the FLOPs torch's ``FlopCounterMode``
counts, so pointwise recomputation is (nearly) free, for users whose budget is FLOPs, not time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import flop_registry

from frontends.capture.fx_leaves import flat_leaves
from frontends.capture.symbolic_sizes import SymbolSizes
from frontends.measure.devices import DEVICES, get_device


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """A roofline over one device: what a FLOP and a byte cost."""

    name: str
    peak_flops: float
    """Dense FLOP/s the model assumes."""
    bandwidth: float
    """Memory bytes/s the model assumes."""
    measured: bool = False
    """Costs are measured after capture (``profile``): `seconds` is only the nominal estimate the
    graph carries until `frontends.measure.profile.profiled_graph` replaces it."""
    bytes_weight: float | None = None
    """None: a roofline. A number: FLOP-count pricing, ``FLOPs / peak + bytes_weight * bytes /
    bandwidth``, where the small byte term only breaks ties between ops with no counted FLOPs."""

    def seconds(self, flops: float, bytes_moved: float) -> float:
        if self.bytes_weight is not None:
            return flops / self.peak_flops + self.bytes_weight * bytes_moved / self.bandwidth
        return max(flops / self.peak_flops, bytes_moved / self.bandwidth)

    def describe(self) -> str:
        if self.bytes_weight is not None:
            return (f"{self.name} (FLOPs / {self.peak_flops:.3g} FLOP/s, counted as FlopCounterMode "
                    f"counts them, + {self.bytes_weight:g} x bytes / {self.bandwidth:.3g} B/s to break ties)")
        if self.measured:
            return f"{self.name} (per-op times measured on the device the module lives on)"
        return f"{self.name} (max(FLOPs / {self.peak_flops:.3g} FLOP/s, bytes / {self.bandwidth:.3g} B/s))"


FLOPS_MODEL = CostModel(name="flops", peak_flops=1e12, bandwidth=1e11)
"""Nominal device: 1 TFLOP/s dense, 100 GB/s memory (a ratio of 10 FLOPs per byte)."""

FLOP_COUNT_MODEL = CostModel(name="flop-count", peak_flops=FLOPS_MODEL.peak_flops,
                             bandwidth=FLOPS_MODEL.bandwidth, bytes_weight=1e-3)
"""Minimizes counted FLOPs (matmuls, convolutions, attention): a pointwise op costs a
thousandth of its memory time, so among FLOP-free recomputations the lighter ones win."""

PROFILE_MODEL = CostModel(name="profile", peak_flops=FLOPS_MODEL.peak_flops,
                          bandwidth=FLOPS_MODEL.bandwidth, measured=True)
"""Measured costs: capture prices ops nominally, then the profile's times replace them."""

_PRECISION_OF = {
    torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
}


def roofline_model(device: str, dtype: torch.dtype = torch.float32, *, tf32: bool = False) -> CostModel:
    """``roofline:<device>``: max(FLOPs / the device's dense peak for ``dtype``, bytes / bandwidth).

    ``tf32`` prices float32 matmuls at the TF32 tensor-core rate (PyTorch's default is off:
    ``torch.backends.cuda.matmul.allow_tf32 = False``). One peak is used for every op, so a
    mixed-precision step is priced at the precision of ``dtype``.
    """
    spec = get_device(device)
    precision = _PRECISION_OF.get(dtype)
    if precision is None:
        raise ValueError(f"no peak FLOP/s for dtype {dtype}: use one of {', '.join(map(str, _PRECISION_OF))}")
    if precision == "fp32" and tf32:
        precision = "tf32"
    return CostModel(name=f"roofline:{spec.name}", peak_flops=spec.peak(precision), bandwidth=spec.bandwidth)


def cost_model_from_name(name: str, *, dtype: torch.dtype = torch.float32, tf32: bool = False) -> CostModel:
    """'flops', 'flop-count', 'roofline:<device>' (a key of `frontends.measure.devices.DEVICES`) or 'profile'."""
    key = name.strip().lower()
    if key == FLOPS_MODEL.name:
        return FLOPS_MODEL
    if key == FLOP_COUNT_MODEL.name:
        return FLOP_COUNT_MODEL
    if key == PROFILE_MODEL.name:
        return PROFILE_MODEL
    if key.startswith("roofline:"):
        return roofline_model(key.removeprefix("roofline:"), dtype, tf32=tf32)
    known = ["flops", "flop-count", "profile", *(f"roofline:{d}" for d in sorted(DEVICES))]
    raise ValueError(f"unknown cost model {name!r}: choose one of {', '.join(known)}")


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating dtype most of the model's parameters have (float32 when it has none)."""
    counts = Counter(p.dtype for p in model.parameters() if p.is_floating_point())
    return counts.most_common(1)[0][0] if counts else torch.float32


def op_flops(node: torch.fx.Node, sizes: SymbolSizes | None = None) -> float:
    """FLOPs of one aten op from torch.utils.flop_counter's registry (0 for ops it omits);
    symbolic sizes are evaluated at ``sizes`` (see `frontends.capture.symbolic_sizes`)."""
    target = getattr(node.target, "overloadpacket", None)
    formula = flop_registry.get(target)
    if formula is None:
        return 0.0
    sizes = sizes or SymbolSizes()
    args, kwargs = _vals(node.args, sizes), _vals(node.kwargs, sizes)
    out_val = torch.fx.node.map_aggregate(node.meta.get("val"), sizes.concrete)
    try:
        return float(formula(*args, **kwargs, out_val=out_val))
    except Exception:  # a formula that cannot read these shapes: cost by bytes only
        return 0.0


def op_bytes_moved(node: torch.fx.Node, sizes: SymbolSizes | None = None) -> int:
    """Bytes the op reads (its tensor inputs) plus the bytes it writes (its outputs)."""
    sizes = sizes or SymbolSizes()
    inputs = [v for v in flat_leaves((_vals(node.args, sizes), _vals(node.kwargs, sizes)))
              if isinstance(v, torch.Tensor)]
    outputs = [sizes.concrete(v) for v in flat_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
    return sum(_tensor_bytes(t) for t in inputs + outputs)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _vals(tree, sizes: SymbolSizes):
    """Replace fx nodes in args by their FakeTensor values (concrete where sizes are symbolic)."""
    def value(a):
        return sizes.concrete(a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    return torch.fx.node.map_aggregate(tree, value)
