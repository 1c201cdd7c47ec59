"""Price a captured step's ops by timing them, one at a time, on the device the model lives on.

Why: a roofline from datasheet or microbenchmark rates misprices a real step. On one CPU thread
the ``device`` model of 2026-12-06 priced transformers GPT-2's recomputation at 78 ms where it
measured 194 ms (benchmarks/step_time.md), so plans traded memory for time at the wrong rate.
The ``profile`` model runs the whole step instead, which needs the step's store-all memory: on
the GPU whose memory is the reason to plan, it does not fit.

Here each distinct op of the joint graph (same overload, input shapes, strides, dtypes and
constant arguments: a transformer's layers share them) runs alone on freshly made inputs: only
one op's inputs and outputs exist at a time. The largest ops by their roofline price go first,
until `CALIBRATION_S` is spent. Each timed op is priced at its measured median; the rest at a
roofline whose rates are fitted to the timed ones, per kernel family (matmuls and convolutions;
each attention kernel; bytes for everything else; a fixed cost per op).
Times are cached per device and op signature for the process, so a recapture at other sizes or
another graph with the same ops measures only what is new.

Timing runs under ``torch.no_grad`` with the random state forked (the user's random stream does
not move) and outside any fake-tensor mode. An op that cannot run alone (it fails, or runs out
of memory) is priced by the fitted roofline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from frontends.capture.fx_leaves import flat_leaves
from frontends.capture.symbolic_sizes import SymbolSizes
from frontends.measure.costs import CostModel, is_square_causal_attention, op_bytes_moved, op_flops
from frontends.torch_compat import unset_fake_temporarily

CALIBRATION_S = 5.0
"""Wall seconds one graph's calibration may spend timing ops (signatures already cached are free)."""

REPEATS = 3
"""Timed runs per op (after one warm-up); its price is their median."""

MATMUL_PACKETS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward",
                            "_convolution", "matmul", "linear"})

_TIMES: dict[tuple, float | None] = {}
"""(device, op signature) -> median seconds, or None when the op cannot run alone."""


@dataclass(frozen=True)
class Calibration:
    """What timing a graph's ops found: the fitted rates, and how much of the step is measured."""

    family_flops: tuple[tuple[str, float], ...]
    """(kernel family, fitted FLOP/s) for the FLOP-bound families the graph has timed ops of."""
    bandwidth: float
    """Fitted bytes/s of the memory-bound ops."""
    launch_s: float
    """Fitted fixed seconds per op."""
    timed_ops: int
    ops: int
    timed_seconds: float
    """Sum of the measured prices of the graph's timed ops."""
    spent_s: float
    """Wall seconds this calibration spent timing (0 when everything was cached)."""


@dataclass(frozen=True, kw_only=True)
class CalibratedCostModel(CostModel):
    """`CostModel` for one joint graph: measured seconds by fx node name, else the fitted roofline."""

    node_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    family_flops: Mapping[str, float] = dataclasses.field(default_factory=dict)
    calibration: Calibration | None = None

    def op_seconds(self, node: torch.fx.Node, flops: float, bytes_moved: float) -> float:
        measured = self.node_seconds.get(node.name)
        if measured is not None:
            return measured
        rate = self.family_flops.get(kernel_family(node), self.peak_flops)
        if self.causal_attention and is_square_causal_attention(node):
            flops /= 2
        return max(flops / rate, bytes_moved / self.bandwidth) + self.launch_s

    def describe(self) -> str:
        c = self.calibration
        if c is None:
            return super().describe()
        families = ", ".join(f"{family} {rate:.3g} FLOP/s" for family, rate in c.family_flops)
        return (f"{self.name} ({c.timed_ops} of {c.ops} ops timed one at a time on the device; the rest "
                f"max(FLOPs / the family's fitted rate, bytes / {c.bandwidth:.3g} B/s) + {c.launch_s * 1e6:.3g} us"
                f"{': ' + families if families else ''})")


def kernel_family(node: torch.fx.Node) -> str:
    """``matmul`` for matmuls and convolutions, the packet's name for an attention kernel,
    ``memory`` for the rest (priced by the bytes they move)."""
    packet = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
    if packet in MATMUL_PACKETS:
        return "matmul"
    if "attention" in packet:
        return packet
    return "memory"


def calibrate(gm: torch.fx.GraphModule, base: CostModel, sizes: SymbolSizes | None = None,
              time_budget_s: float = CALIBRATION_S) -> CalibratedCostModel:
    """``base`` with ``gm``'s ops priced by timing them alone on their device (see module doc)."""
    sizes = sizes or SymbolSizes()
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
           and not _is_alias(n)]
    work = {n.name: (op_flops(n, sizes), op_bytes_moved(n, sizes)) for n in ops}
    order = sorted(ops, key=lambda n: -base.op_seconds(n, *work[n.name]))
    spent = 0.0
    measured: dict[str, float] = {}
    with _quiet():
        for node in order:
            key = _signature(node, sizes)
            if key is None:
                continue
            if key not in _TIMES:
                if spent >= time_budget_s:
                    continue
                started = time.perf_counter()
                _TIMES[key] = _time_alone(node, sizes)
                spent += time.perf_counter() - started
            seconds = _TIMES[key]
            if seconds is not None:
                measured[node.name] = seconds
    launch, bandwidth, family_flops = _fit(ops, measured, work, base)
    calibration = Calibration(
        family_flops=tuple(sorted(family_flops.items())), bandwidth=bandwidth, launch_s=launch,
        timed_ops=len(measured), ops=len(ops), timed_seconds=sum(measured.values()), spent_s=spent)
    return CalibratedCostModel(
        name=base.name, peak_flops=base.peak_flops, bandwidth=bandwidth, launch_s=launch,
        causal_attention=base.causal_attention, calibrate=False, node_seconds=measured, family_flops=family_flops,
        calibration=calibration)


def clear_cache() -> None:
    """Forget every measured op time (tests; a device whose clocks changed)."""
    _TIMES.clear()


def _fit(ops: list[torch.fx.Node], measured: Mapping[str, float], work: Mapping[str, tuple[float, float]],
         base: CostModel) -> tuple[float, float, dict[str, float]]:
    """(seconds per op, bytes/s, FLOP/s per kernel family) fitted to the measured ops: a least-squares
    line through the memory-bound ops' (bytes, seconds) gives the fixed cost (its intercept) and the
    bandwidth (its slope); each FLOP-bound family's rate is its total FLOPs over its total time above
    the fixed cost (so the large ops, which dominate a step, dominate the fit). ``base``'s numbers
    where the graph has too few timed ops to fit."""
    memory = [(work[n.name][1], measured[n.name]) for n in ops
              if n.name in measured and kernel_family(n) == "memory"]
    launch, bandwidth = _line(memory, base)
    work_by: dict[str, float] = {}
    time_by: dict[str, float] = {}
    for n in ops:
        family = kernel_family(n)
        if n.name not in measured or family == "memory":
            continue
        flops = work[n.name][0]
        if base.causal_attention and is_square_causal_attention(n):
            flops /= 2
        if flops > 0:
            work_by[family] = work_by.get(family, 0.0) + flops
            time_by[family] = time_by.get(family, 0.0) + max(measured[n.name] - launch, 1e-9)
    return launch, bandwidth, {family: work_by[family] / time_by[family] for family in work_by}


def _line(points: list[tuple[float, float]], base: CostModel) -> tuple[float, float]:
    """(intercept, 1 / slope) of the least-squares line through (bytes, seconds), the intercept
    kept within [0, the fastest op]; ``base``'s launch and bandwidth without 3 distinct sizes or
    with a slope that is not positive."""
    if len({b for b, _ in points}) < 3:
        return base.launch_s, base.bandwidth
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    spread = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / spread
    if slope <= 0:
        return base.launch_s, base.bandwidth
    intercept = min(max(mean_t - slope * mean_b, 0.0), min(t for _, t in points))
    return intercept, 1.0 / slope


def _is_alias(node: torch.fx.Node) -> bool:
    """An op whose outputs alias its inputs (a view): no kernel, nothing to time or price."""
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.returns and all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns))


def _signature(node: torch.fx.Node, sizes: SymbolSizes) -> tuple | None:
    """What the op's time depends on: target, each tensor's device, dtype, shape and strides,
    the constant arguments; None when something has no concrete value (not timed)."""
    def describe(arg):
        if isinstance(arg, torch.fx.Node):
            value = arg.meta.get("val")
            if isinstance(value, torch.Tensor):
                return ("tensor", str(value.device), value.dtype, sizes.shape(value),
                        tuple(sizes.size(s) for s in value.stride()))
            if isinstance(value, torch.SymInt):
                return ("int", sizes.size(value))
            if isinstance(value, (int, float, bool)):
                return ("const", value)
            raise _Untimeable
        if isinstance(arg, (list, tuple)):
            return tuple(describe(a) for a in arg)
        if isinstance(arg, dict):
            return tuple((k, describe(v)) for k, v in sorted(arg.items()))
        if isinstance(arg, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                            torch.memory_format)):
            return arg
        raise _Untimeable
    try:
        return (str(node.target), torch.get_num_threads(), describe(node.args), describe(node.kwargs))
    except (_Untimeable, ValueError):
        return None


class _Untimeable(Exception):
    """An argument the calibration cannot make a real value for."""


def _time_alone(node: torch.fx.Node, sizes: SymbolSizes) -> float | None:
    """Median seconds of ``node``'s op on fresh inputs, or None when it cannot run alone."""
    fn = node.target
    try:
        args, kwargs = _real_arguments(node.args, sizes), _real_arguments(node.kwargs, sizes)
        device = next((t.device for t in flat_leaves((args, kwargs)) if isinstance(t, torch.Tensor)),
                      torch.device("cpu"))
        timer = _cuda_seconds if device.type == "cuda" else _cpu_seconds
        fn(*args, **kwargs)  # warm-up: lazy initialisation, caches
        samples = [timer(fn, args, kwargs, device) for _ in range(REPEATS)]
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError):  # torch.OutOfMemoryError too
        return None
    return statistics.median(samples)


def _real_arguments(tree, sizes: SymbolSizes):
    """fx arguments with each node replaced by a fresh real tensor like its value: normal floats,
    zeros otherwise (valid indices and masks)."""
    def real(arg):
        if not isinstance(arg, torch.fx.Node):
            return arg
        value = arg.meta.get("val")
        if isinstance(value, torch.SymInt):
            return sizes.size(value)
        if not isinstance(value, torch.Tensor):
            return value
        tensor = torch.empty_strided(sizes.shape(value), tuple(sizes.size(s) for s in value.stride()),
                                     dtype=value.dtype, device=value.device)
        return tensor.normal_() if tensor.is_floating_point() else tensor.zero_()
    return torch.fx.node.map_aggregate(tree, real)


def _cpu_seconds(fn: Callable, args, kwargs, device: torch.device) -> float:
    start = time.perf_counter_ns()
    fn(*args, **kwargs)
    return (time.perf_counter_ns() - start) * 1e-9


def _cuda_seconds(fn: Callable, args, kwargs, device: torch.device) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*args, **kwargs)
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) * 1e-3


def _quiet() -> contextlib.ExitStack:
    """No autograd, no fake mode, and the random state as it was (CPU and every CUDA device)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    stack.enter_context(unset_fake_temporarily())
    cuda = range(torch.cuda.device_count()) if torch.cuda.is_available() else []
    stack.enter_context(torch.random.fork_rng(devices=cuda))
    return stack
