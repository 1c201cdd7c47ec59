"""Measured per-op runtimes of a captured training step, on the device its tensors live on.

Analytic costs misjudge small ops, fused library kernels and anything the FLOP registry omits;
the ``profile`` cost model instead runs the captured joint graph with ``torch.fx.Interpreter``
on the model's real parameters, buffers and example inputs (output gradients: ones), timing
every ``call_function`` node: CUDA events on GPU, ``time.perf_counter_ns`` on CPU. After warm-up
runs, each node's time is the median over repeats. Views and other aliases are timed too (they
cost ~0 and the IR has no node for them). Profiles are cached by a hash of the graph's code and
input shapes, the device and the dtype: in memory, and as JSON under ``cache_dir`` when given.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from frontends.capture.step import CapturedStep
from frontends.measure.costs import PROFILE_MODEL
from frontends.torch_compat import aot_descriptors as aot_desc
from frontends.torch_compat import tree_flatten
from solvers.ir.costs_update import with_costs
from solvers.ir.graph import RematGraph

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "remat-opt" / "profiles"
"""Where the CLI keeps profiles between runs (tests and library calls pass their own or none)."""

_MEMORY_CACHE: dict[str, NodeProfile] = {}


@dataclass(frozen=True)
class NodeProfile:
    """Median seconds of every call_function node of one joint graph on one device."""

    key: str
    """Cache key: hash of graph code, input shapes, device, dtype and torch version."""
    device: str
    """Device the step ran on, with its model (``cuda:NVIDIA H200``, ``cpu:x86_64:2threads``)."""
    dtype: str
    warmup: int
    repeats: int
    node_seconds: tuple[tuple[str, float], ...]
    """(fx node name, median seconds) in graph order."""
    run_seconds: float
    """Median wall-clock of one interpreted run (includes the interpreter's own overhead)."""

    @property
    def seconds(self) -> dict[str, float]:
        return dict(self.node_seconds)

    @property
    def total_seconds(self) -> float:
        """Sum of per-node medians: the step's compute time without Python overhead."""
        return sum(s for _, s in self.node_seconds)

    def seconds_by_group(self, graph: RematGraph) -> dict[str, float]:
        """Times of the ops that are groups of ``graph`` (alias ops, ~0 s, are left out)."""
        seconds = self.seconds
        return {group: seconds[group] for group in graph.groups if group in seconds}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["node_seconds"] = [list(item) for item in self.node_seconds]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeProfile:
        fields = dict(data)
        fields["node_seconds"] = tuple((str(n), float(s)) for n, s in fields["node_seconds"])
        return cls(**fields)


def profile_step(
    captured: CapturedStep,
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict | None = None,
    *,
    warmup: int = 2,
    repeats: int = 5,
    cache_dir: str | os.PathLike[str] | None = None,
    refresh: bool = False,
) -> NodeProfile:
    """Time every op of ``captured``'s joint graph on the device of ``model``'s tensors.

    ``model``, ``args`` and ``kwargs`` are what was captured (real tensors, so embeddings and
    losses get valid indices). Nothing of the model changes: buffers are cloned, the random
    state is restored. ``refresh`` ignores cached profiles.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError("profile needs repeats >= 1 and warmup >= 0")
    gm = captured.gm
    fakes = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    device = _device_of(fakes)
    dtype = _dominant_dtype(fakes)
    key = graph_key(gm, _device_key(device), dtype)
    if not refresh:
        cached = _lookup(key, cache_dir)
        if cached is not None:
            return cached
    inputs = _placeholder_values(gm, model, tuple(args), dict(kwargs or {}))
    timer = _CudaTimer(device) if device.type == "cuda" else _CpuTimer()
    runner = _TimedInterpreter(gm, timer)
    samples: dict[str, list[float]] = {}
    walls: list[float] = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        for i in range(warmup + repeats):
            start = time.perf_counter()
            runner.run(*inputs, enable_io_processing=False)
            times = timer.collect()
            walls.append(time.perf_counter() - start)
            if i >= warmup:
                for name, seconds in times:
                    samples.setdefault(name, []).append(seconds)
    result = NodeProfile(
        key=key, device=_device_key(device), dtype=str(dtype).removeprefix("torch."),
        warmup=warmup, repeats=repeats,
        node_seconds=tuple((name, statistics.median(s)) for name, s in samples.items()),
        run_seconds=statistics.median(walls[warmup:]),
    )
    _store(result, cache_dir)
    return result


def profiled_graph(
    captured: CapturedStep, model: torch.nn.Module, args: tuple, kwargs: dict | None = None, **options: Any
) -> RematGraph:
    """``captured.graph`` with measured costs, named 'profile' (options: see `profile_step`)."""
    profile = profile_step(captured, model, args, kwargs, **options)
    return with_costs(captured.graph, profile.seconds_by_group(captured.graph), PROFILE_MODEL.name)


def clear_memory_cache() -> None:
    _MEMORY_CACHE.clear()


# ----------------------------------------------------------------------------- inputs
def _placeholder_values(gm: torch.fx.GraphModule, model: torch.nn.Module, args: tuple, kwargs: dict) -> list:
    """Real tensors for the joint graph's placeholders, in order."""
    flat_inputs = tree_flatten((args, kwargs))[0]
    values: list = []
    for node in gm.graph.find_nodes(op="placeholder"):
        desc = node.meta.get("desc")
        fake = node.meta.get("val")
        if isinstance(desc, aot_desc.ParamAOTInput):
            values.append(model.get_parameter(desc.target).detach())
        elif isinstance(desc, aot_desc.BufferAOTInput):
            values.append(model.get_buffer(desc.target).detach().clone())
        elif isinstance(desc, aot_desc.PlainAOTInput) and desc.idx < len(flat_inputs):
            value = flat_inputs[desc.idx]
            values.append(value.detach() if isinstance(value, torch.Tensor) else value)
        elif isinstance(desc, aot_desc.TangentAOTInput) and isinstance(fake, torch.Tensor):
            values.append(torch.ones(fake.shape, dtype=fake.dtype, device=fake.device))
        elif isinstance(fake, torch.Tensor):
            values.append(_materialize(fake))
        else:
            values.append(fake)
    return values


def _materialize(fake: torch.Tensor) -> torch.Tensor:
    """A real tensor like ``fake``: random floats, zeros otherwise (valid as indices)."""
    real = torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device)
    return real.normal_() if real.is_floating_point() else real.zero_()


def _device_of(values: list) -> torch.device:
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            return v.device
    return torch.device("cpu")


def _dominant_dtype(values: list) -> torch.dtype:
    counts: dict[torch.dtype, int] = {}
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            counts[v.dtype] = counts.get(v.dtype, 0) + v.numel()
    return max(counts, key=counts.__getitem__) if counts else torch.float32


def _device_key(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu:{platform.machine()}:{torch.get_num_threads()}threads"
    return device.type


def graph_key(gm: torch.fx.GraphModule, device_key: str, dtype: torch.dtype) -> str:
    """Hash of what determines the times: code, placeholder shapes/strides/dtypes, device, dtype."""
    digest = hashlib.sha256()
    digest.update(gm.code.encode())
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            digest.update(f"{node.name}:{tuple(val.shape)}:{val.stride()}:{val.dtype}".encode())
    digest.update(f"{device_key}|{dtype}|torch {torch.__version__}".encode())
    return digest.hexdigest()[:32]


# ----------------------------------------------------------------------------- cache
def _lookup(key: str, cache_dir: str | os.PathLike[str] | None) -> NodeProfile | None:
    if key in _MEMORY_CACHE:
        return _MEMORY_CACHE[key]
    if cache_dir is None:
        return None
    path = Path(cache_dir) / f"{key}.json"
    try:
        profile = NodeProfile.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):  # absent or unreadable: measure again
        return None
    _MEMORY_CACHE[key] = profile
    return profile


def _store(profile: NodeProfile, cache_dir: str | os.PathLike[str] | None) -> None:
    _MEMORY_CACHE[profile.key] = profile
    if cache_dir is None:
        return
    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{profile.key}.json.tmp"
    tmp.write_text(json.dumps(profile.to_json()))
    tmp.replace(directory / f"{profile.key}.json")  # atomic: readers never see half a file


# ----------------------------------------------------------------------------- timing
class _CpuTimer:
    """Wall-clock around each call: CPU kernels run synchronously."""

    def __init__(self) -> None:
        self._times: list[tuple[str, float]] = []

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        start = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        self._times.append((name, (time.perf_counter_ns() - start) * 1e-9))
        return out

    def collect(self) -> list[tuple[str, float]]:
        times, self._times = self._times, []
        return times


class _CudaTimer:
    """CUDA events around each call, read after one synchronize per run (no per-op stalls)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._events: dict[str, tuple[torch.cuda.Event, torch.cuda.Event]] = {}
        self._order: list[str] = []

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if name not in self._events:
            self._events[name] = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        start, end = self._events[name]
        start.record()
        out = fn(*args, **kwargs)
        end.record()
        self._order.append(name)
        return out

    def collect(self) -> list[tuple[str, float]]:
        torch.cuda.synchronize(self._device)
        times = [(n, self._events[n][0].elapsed_time(self._events[n][1]) * 1e-3) for n in self._order]
        self._order = []
        return times


class _TimedInterpreter(torch.fx.Interpreter):
    """Runs the graph node by node, freeing values after their last use, timing each op."""

    def __init__(self, gm: torch.fx.GraphModule, timer: _CpuTimer | _CudaTimer) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self._timer = timer
        self._node: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        self._node = n
        return super().run_node(n)

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        assert self._node is not None
        try:
            return self._timer.call(self._node.name, target, args, kwargs)
        except Exception as err:
            raise RuntimeError(f"profiling failed at {self._node.format_node()}: {err}") from err
