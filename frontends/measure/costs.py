"""Per-op compute cost from torch's own FLOP formulas, with memory-bound ops costed by bytes.

Every analytic cost model is a roofline: time = max(FLOPs / peak, bytes moved / bandwidth).
Matmuls are FLOP-bound, pointwise ops and copies are bound by the bytes they read and write, so
recomputing a cheap-but-large op is not free. ``flops`` prices ops at a nominal device;
``roofline:<device>`` at a known GPU's datasheet numbers (`frontends.measure.devices`), so a plan for a
GPU can be made on a laptop; ``profile`` stands for measured times (`frontends.measure.profile`).
``flop-count`` is not a roofline: it prices an op by the FLOPs torch's ``FlopCounterMode``
counts, so pointwise recomputation is (nearly) free, for users whose budget is FLOPs, not time.

``device`` prices time on the device the model lives on (`device_model`): each op of the captured
step is timed alone there and priced at its time; ops not timed get a roofline fitted to the timed
ones (`frontends.measure.calibration`), which starts from the datasheet roofline of the GPU CUDA
names or, on the CPU, rates measured here once per process (`calibrated_cpu_model`), with a fixed
cost per kernel (a launch) and a causal SDPA kernel at half its FLOPs (flash and memory-efficient
kernels skip the masked half). ``auto`` (the
default) is ``device`` for a model on a GPU and ``flops`` elsewhere, so CPU plans stay the same
on every machine.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import flop_registry

from frontends.capture.fx_leaves import flat_leaves
from frontends.capture.symbolic_sizes import SymbolSizes
from frontends.measure.devices import DEVICES, device_of_product, get_device


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
    launch_s: float = 0.0
    """Fixed seconds per kernel (a GPU launch, a CPU op's dispatch): many small recomputed ops
    cost more than their bytes say."""
    causal_attention: bool = False
    """Price a causal SDPA kernel (``is_causal=True``, square) at half its counted FLOPs."""
    calibrate: bool = False
    """Before a joint graph is priced, time its ops on their device and price by those times, this
    roofline fitted to them for the rest (`frontends.measure.calibration`)."""

    def seconds(self, flops: float, bytes_moved: float) -> float:
        if self.bytes_weight is not None:
            return flops / self.peak_flops + self.bytes_weight * bytes_moved / self.bandwidth
        return max(flops / self.peak_flops, bytes_moved / self.bandwidth) + self.launch_s

    def op_seconds(self, node: torch.fx.Node, flops: float, bytes_moved: float) -> float:
        """`seconds` of one op of a captured graph, by kernel where the model knows it."""
        if self.causal_attention and is_square_causal_attention(node):
            flops /= 2
        return self.seconds(flops, bytes_moved)

    def describe(self) -> str:
        if self.bytes_weight is not None:
            return (f"{self.name} (FLOPs / {self.peak_flops:.3g} FLOP/s, counted as FlopCounterMode "
                    f"counts them, + {self.bytes_weight:g} x bytes / {self.bandwidth:.3g} B/s to break ties)")
        if self.measured:
            return f"{self.name} (per-op times measured on the device the module lives on)"
        launch = f" + {self.launch_s * 1e6:.3g} us a kernel" if self.launch_s else ""
        causal = ", causal attention at half its FLOPs" if self.causal_attention else ""
        return (f"{self.name} (max(FLOPs / {self.peak_flops:.3g} FLOP/s, bytes / {self.bandwidth:.3g} B/s)"
                f"{launch}{causal})")


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


GPU_LAUNCH_S = 4e-6
"""Seconds a CUDA kernel costs beyond its work: launch and tail, as a step's many small kernels
see it (a few microseconds on current GPUs and drivers)."""

_SQUARE_CAUSAL_KERNELS = {
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
}


def is_square_causal_attention(node: torch.fx.Node) -> bool:
    """A fused SDPA kernel (forward or backward) called with ``is_causal=True`` on as many
    queries as keys: it computes about half the score matrix FlopCounterMode counts."""
    packet = getattr(node.target, "overloadpacket", None)
    if getattr(packet, "__name__", "") not in _SQUARE_CAUSAL_KERNELS:
        return False
    schema = [a.name for a in node.target._schema.arguments]
    bound = {**dict(zip(schema, node.args)), **node.kwargs}
    query, key = (getattr(bound.get(n), "meta", {}).get("val") for n in ("query", "key"))
    return bool(bound.get("is_causal")) and isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) \
        and query.shape[-2] == key.shape[-2]


def device_model(device: torch.device, dtype: torch.dtype = torch.float32) -> CostModel:
    """``device``: time on ``device``. A GPU CUDA names that `frontends.measure.devices` knows gets
    its datasheet roofline (TF32 as ``torch.backends.cuda.matmul.allow_tf32`` says) plus
    `GPU_LAUNCH_S` a kernel; the CPU gets `calibrated_cpu_model`. Either is only where pricing
    starts: ``calibrate`` is set, so a captured graph's ops are timed on the device and priced by
    those times (`frontends.measure.calibration`)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        product = torch.cuda.get_device_name(index)
        spec = device_of_product(product, torch.cuda.get_device_properties(index).total_memory)
        if spec is None:
            raise ValueError(f"no datasheet numbers for {product!r}: use cost_model='profile' (measured "
                             f"on it) or 'roofline:<device>' with one of {', '.join(sorted(DEVICES))}")
        tf32 = dtype == torch.float32 and bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))
        roofline = roofline_model(spec.name, dtype, tf32=tf32)
        return CostModel(name=f"device:{spec.name}", peak_flops=roofline.peak_flops,
                         bandwidth=roofline.bandwidth, launch_s=GPU_LAUNCH_S, causal_attention=True, calibrate=True)
    if device.type == "cpu":
        return calibrated_cpu_model(dtype, torch.get_num_threads())
    raise ValueError(f"cost_model='device' prices time on a CPU or a CUDA GPU, not on {device.type!r}: "
                     "use 'flops' or 'roofline:<device>'")


@functools.cache
def calibrated_cpu_model(dtype: torch.dtype, threads: int) -> CostModel:
    """``device`` on the CPU: FLOP/s of a 512 x 512 matmul, bytes/s of a 64 MiB copy and the
    time of a one-element add (an op's dispatch), each the best of a few runs, measured once per
    process, dtype and thread count (about 0.2 s)."""
    with torch.random.fork_rng(devices=[]):  # the user's random stream does not move
        a = torch.randn(512, 512).to(dtype)
    big = torch.empty(16 * 2**20, dtype=torch.float32)
    one = torch.ones(1)
    flops_s = 2 * 512**3 / _best_seconds(lambda: torch.mm(a, a), 5)
    bytes_s = 2 * big.numel() * big.element_size() / _best_seconds(big.clone, 5)
    launch = _best_seconds(lambda: torch.add(one, one), 200)
    return CostModel(name="device:cpu", peak_flops=flops_s, bandwidth=bytes_s, launch_s=launch,
                     causal_attention=True, calibrate=True)


def _best_seconds(run, repeats: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


COST_MODEL_NAMES = ("auto", "device", "flops", "flop-count", "profile")
"""Names `cost_model_from_name` takes, besides ``roofline:<device>``."""


def check_cost_model_name(name: str) -> str:
    """``name`` when `cost_model_from_name` can resolve it on some device; ValueError listing the
    names otherwise (what a setting is checked against before any model is at hand)."""
    key = name.strip().lower()
    if key in COST_MODEL_NAMES:
        return name
    if key.startswith("roofline:"):
        get_device(key.removeprefix("roofline:"))
        return name
    raise _unknown(name)


def _unknown(name: str) -> ValueError:
    known = [*COST_MODEL_NAMES, *(f"roofline:{d}" for d in sorted(DEVICES))]
    return ValueError(f"unknown cost model {name!r}: choose one of {', '.join(known)}")


def cost_model_from_name(name: str, *, dtype: torch.dtype = torch.float32, tf32: bool = False,
                         device: torch.device | None = None) -> CostModel:
    """'auto', 'device', 'flops', 'flop-count', 'roofline:<device>' (a key of
    `frontends.measure.devices.DEVICES`) or 'profile'. ``device``: where the model lives, which
    'auto' and 'device' price (`device_model`); without it 'auto' is 'flops'."""
    key = name.strip().lower()
    if key == "auto":
        return device_model(device, dtype) if device is not None and device.type == "cuda" else FLOPS_MODEL
    if key == "device":
        if device is None or device.type == "meta":
            raise ValueError("cost_model='device' prices time on the device the model lives on: this one "
                             "has none (meta); use 'roofline:<device>' for a GPU you do not have")
        return device_model(device, dtype)
    if key == FLOPS_MODEL.name:
        return FLOPS_MODEL
    if key == FLOP_COUNT_MODEL.name:
        return FLOP_COUNT_MODEL
    if key == PROFILE_MODEL.name:
        return PROFILE_MODEL
    if key.startswith("roofline:"):
        return roofline_model(key.removeprefix("roofline:"), dtype, tf32=tf32)
    raise _unknown(name)


def model_device(model: torch.nn.Module) -> torch.device | None:
    """The device most of the model's parameters live on (None for a model without any)."""
    counts = Counter(p.device for p in model.parameters())
    return counts.most_common(1)[0][0] if counts else None


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
