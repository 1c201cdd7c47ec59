"""What checkpointing a module adds to its own forward and backward, measured on this machine.

Why: the eager planner priced a region's checkpoint as its rerun ops (scaled by the module's
timed forward, `region_timing`) plus one per-call figure measured on a chain of two-op functions
(`eager_checkpoint.checkpoint_call_seconds`). On small modules the rest of a checkpoint is most
of its cost: every tensor autograd saves passes checkpoint's pack and unpack hooks (about 13 us
each on one core of the 2-core VM), a batch norm reruns under the statistics-freezing dispatch
mode, the rerun allocates afresh. On examples/resnet.py the planner predicted +1.6 ms for a plan
that measured +5.6 to +6.4 ms (2026-12-07): the stem's forward takes 0.18 ms, and checkpointing
it added 0.54 ms to its own forward and backward; a selective-checkpoint policy's dispatch mode,
priced at a nominal 8 us per op, nearly doubled a resnet block's checkpoint. Timing each candidate
module with each saved set as the runtime would run it, on the inputs one forward gave it, against
the same module run plainly, prices all of that where the measurement stands out of its noise.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from frontends.eager_runtime.eager_checkpoint import CheckpointedForward, RegionPolicy
from frontends.eager_runtime.eager_ops import (
    EagerTrace,
    forwards_left_as_found,
    model_left_as_found,
    prices_measured_time,
    region_policy,
    step_cuda_devices,
)
from frontends.guards.hf_training import cache_off_for_training
from frontends.torch_compat import tree_leaves, tree_map
from solvers.ir.graph import RematGraph
from solvers.planning.eager_plan import RegionCandidate, RegionModel, timed_options, with_measured_options

TIMING_BUDGET_S = 10.0
"""Seconds the timed rounds may take; groups are warmed up smallest first (fewest eager calls),
and those whose rounds would no longer fit are left out, so the whole timing stays near
``TIMING_BUDGET_S * (1 + 1 / REPEATS)``."""

REPEATS = 7
"""Paired rounds (plain, checkpointed) per group of like modules; the median difference is kept."""

MEDIAN_ERROR = 1.2533 * 1.4826
"""Standard error of a median over a sample's MAD / sqrt(n), for normal noise: sqrt(pi / 2) times
the MAD's scale to a standard deviation."""


@dataclass(frozen=True)
class CheckpointTiming:
    """Measured seconds a checkpoint adds per module and saved set, and what could not be timed."""

    extra_s: dict[tuple[str, str], float]
    """(module path, option) -> seconds its checkpoint with that option's policy adds to the
    module's forward and backward run alone: the median over `rounds` paired runs of its group."""
    error_s: dict[tuple[str, str], float]
    """(path, option) -> standard error of that median (1.2533 x 1.4826 x the samples' median
    absolute deviation / sqrt(samples)): how far this machine's noise may have moved it."""
    rounds: int
    skipped: tuple[tuple[str, str], ...]
    """(path, option) not timed: no gradient flows through the module, it does not run alone (it
    raised), or its group did not fit the budget."""
    seconds: float = 0.0
    """Wall time the timing took (recording the inputs included)."""

    def describe(self) -> str:
        """One line for the plan's message: what was timed, in how long."""
        left = f", {len(self.skipped)} left out" if self.skipped else ""
        return f"{len(self.extra_s)} checkpoint options timed alone in {self.seconds:.1f} s{left}"


def record_module_inputs(model: torch.nn.Module, args: tuple, kwargs: dict | None,
                         paths: Sequence[str]) -> dict[str, tuple[tuple, dict]]:
    """Module path -> (args, kwargs) it was called with in one training forward: tensors copied
    and detached, each still asking for a gradient where the original did, so the module can run
    forward and backward alone. Modules called more than once are left out."""
    chosen = set(paths)
    wanted = {id(m): p for p, m in model.named_modules() if p in chosen}
    seen: dict[str, tuple[tuple, dict]] = {}
    calls: dict[str, int] = {}

    def copy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return t.detach().clone().requires_grad_(t.requires_grad)

    def pre(module, a, k):
        path = wanted.get(id(module))
        if path is not None:
            calls[path] = calls.get(path, 0) + 1
            seen[path] = (tree_map(copy, tuple(a)), tree_map(copy, dict(k)))

    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in model.modules() if id(m) in wanted]
    try:
        with forwards_left_as_found(model, args, kwargs):
            out = model(*args, **(kwargs or {}))
            del out
    finally:
        for h in handles:
            h.remove()
    return {p: v for p, v in seen.items() if calls[p] == 1}


def _forward_backward(call, module: torch.nn.Module, a: tuple, k: dict) -> bool:
    """Run ``call(*a, **k)`` and its backward into the module's parameters and the inputs that
    ask for a gradient (``autograd.grad``: no ``.grad`` is touched); False if nothing flows."""
    out = call(*a, **k)
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    targets = [p for p in module.parameters() if p.requires_grad]
    targets += [t for t in tree_leaves((a, k)) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not targets:
        return False
    torch.autograd.grad(outs, targets, grad_outputs=[torch.ones_like(t) for t in outs], allow_unused=True)
    return True


def time_checkpointed_regions(model: torch.nn.Module, args: tuple, kwargs: dict | None,
                              groups: Sequence[Sequence[RegionPolicy]], repeats: int = REPEATS,
                              budget_s: float = TIMING_BUDGET_S) -> CheckpointTiming:
    """Seconds checkpointing each region with its policy adds to its own forward and backward: the
    region runs on the inputs one forward gave it (`record_module_inputs`), plainly and under the
    eager runtime's wrapper (`CheckpointedForward`), in paired rounds whose order alternates.
    ``groups``: like modules with the same saved set (a model's repeated layers), timed in turn,
    one median per group; the smallest regions first within ``budget_s``. The model is left as
    found (buffers, RNG, Python state), and no ``.grad`` moves."""
    started = time.perf_counter()
    modules = dict(model.named_modules())
    wanted = [(r.path, r.option) for group in groups for r in group]
    inputs = record_module_inputs(model, args, kwargs, list(dict.fromkeys(p for p, _ in wanted)))
    groups = [[r for r in group if r.path in inputs] for group in groups]
    groups = [g for g in groups if g]
    devices = step_cuda_devices(model, args)

    def seconds(call, region: RegionPolicy) -> float | None:
        module = modules[region.path]
        a, k = inputs[region.path]
        for d in devices:
            torch.cuda.synchronize(d)
        start = time.perf_counter()
        flowed = _forward_backward(call, module, a, k)
        for d in devices:
            torch.cuda.synchronize(d)
        return time.perf_counter() - start if flowed else None

    def pair(region: RegionPolicy, plain_first: bool) -> float | None:
        module = modules[region.path]
        wrapped = CheckpointedForward(module, region, module.__dict__.get("forward"))
        runs = [(module, "plain"), (wrapped, "checkpointed")]
        if not plain_first:
            runs.reverse()
        try:
            times = {label: seconds(call, region) for call, label in runs}
        except Exception:  # a module that does not run alone (it reads what its parent set): not timed
            return None
        if times["plain"] is None or times["checkpointed"] is None:
            return None
        return times["checkpointed"] - times["plain"]

    skipped: list[tuple[str, str]] = []
    samples: dict[int, list[float]] = {}
    # Smallest regions first (fewest eager calls): a warm-up pair each (lazy initialisation, and
    # what a pair costs), until the rounds of those warmed up would fill the budget.
    groups.sort(key=lambda group: sum(n for _, n in group[0].expected_ops))
    with model_left_as_found(model, args, kwargs), torch.enable_grad():
        kept: list[int] = []
        spent = 0.0
        for index, group in enumerate(groups):
            if spent * repeats > budget_s:
                skipped += [(r.path, r.option) for r in group]
                continue
            start = time.perf_counter()
            if pair(group[0], True) is None:
                skipped += [(r.path, r.option) for r in group]
                continue
            cost = time.perf_counter() - start
            if (spent + cost) * repeats > budget_s:
                skipped += [(r.path, r.option) for r in group]
                continue
            spent += cost
            kept.append(index)
        for round_ in range(repeats):
            for index in kept:
                group = groups[index]
                diff = pair(group[round_ % len(group)], plain_first=round_ % 2 == 0)
                if diff is not None:
                    samples.setdefault(index, []).append(diff)
    extra, error = {}, {}
    for i in kept:
        if samples.get(i):
            median = statistics.median(samples[i])
            spread = statistics.median(abs(x - median) for x in samples[i])
            for r in groups[i]:
                extra[r.path, r.option] = median
                error[r.path, r.option] = MEDIAN_ERROR * spread / math.sqrt(len(samples[i]))
    skipped += [key for key in wanted if key[0] not in inputs]
    return CheckpointTiming(extra_s=extra, error_s=error, rounds=repeats if kept else 0,
                            skipped=tuple(dict.fromkeys(skipped)), seconds=time.perf_counter() - started)


LARGEST_REGION = 0.5
"""Regions whose forward makes more than this share of the step's forward bytes are not timed
(run alone, forward and backward, they would hold about as much as the step the plan is for);
their options keep the modelled price."""


def measured_candidates(graph: RematGraph, trace: EagerTrace, model: torch.nn.Module, args: tuple,
                        kwargs: dict | None, found: Sequence[RegionCandidate],
                        chunked: Sequence[str] = ()) -> tuple[list[RegionCandidate], CheckpointTiming | None]:
    """``found`` with each region's checkpoint options priced as measured (`time_checkpointed_regions`,
    `solvers.planning.eager_plan.with_measured_options`), and the timing (None: nothing timed):
    every saved-set option of every region, like modules (same class, same eager ops, same saved
    set) as one group. Only where the graph prices measured time."""
    if not prices_measured_time(graph):
        return list(found), None
    regions = RegionModel(graph, found, chunked)
    forward_bytes = sum(graph[v].bytes for v in regions.forward)
    mappable = {c.path: c.mappable for c in found}
    modules = dict(model.named_modules())
    groups: dict[tuple, list[RegionPolicy]] = {}
    for path in regions.options:
        if path not in modules or sum(graph[v].bytes for v in regions.regions[path]) > LARGEST_REGION * forward_bytes:
            continue
        for option in timed_options(regions, path):
            policy = region_policy(option, graph, trace, mappable[path])
            kind = (type(modules[path]).__qualname__, tuple(trace.region_ops(path)), option.option, policy.save)
            groups.setdefault(kind, []).append(policy)
    if not groups:
        return list(found), None
    with cache_off_for_training(model, dict(kwargs or {})) as cache_off:
        timing = time_checkpointed_regions(model, args, cache_off.kwargs, list(groups.values()))
    return with_measured_options(found, timing.extra_s, timing.error_s), timing
