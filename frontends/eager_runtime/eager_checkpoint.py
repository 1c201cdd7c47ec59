"""The eager runtime's run-time half: selective-checkpoint wrappers on the user's modules, and
plans as files.

Why apart from `optimizer.checkpointing` (which plans): applying, loading, saving and removing a
plan needs only ``torch.utils.checkpoint``, not the capture and solver machinery, so a training
script (or every rank of a distributed job) that loads a plan made elsewhere imports little.

Only an instance attribute ``forward`` is set on each chosen module (no parameters, buffers,
hooks or state-dict entries change); `remove_checkpointing` deletes it again. Without grad
(``torch.no_grad()``, inference) the original forward runs. Apply a plan before wrapping the
model (``fully_shard``, DDP): the plan names modules by their paths in the model as planned.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from frontends.eager_runtime.eager_offload import OFFLOADS, OffloadedForward, offload_modules
from frontends.eager_runtime.instance_forward import CheckpointPlanError, InstanceForward, wrappers_of
from frontends.guards.hf_training import cache_off_for_training
from frontends.split.row_split import chunk_sizes
from frontends.torch_compat import TorchDispatchMode, _BatchNorm, tree_map
from solvers.ir.budget import format_bytes
from solvers.ir.plan import Plan

SCHEMA = "remat-opt/eager-plan/1"


@dataclass(frozen=True)
class RegionPolicy:
    """One checkpointed module: which calls of which overloads its policy keeps."""

    path: str
    option: str
    """Saved set the planner chose: none, matmuls or all (see `eager_plan.OPTIONS`)."""
    save: tuple[tuple[str, tuple[int, ...]], ...]
    """(aten overload, indices of its calls within the region) kept with MUST_SAVE."""
    expected_ops: tuple[tuple[str, int], ...]
    """Calls per overload the region made when planned (checked at run time)."""
    saving_bytes: int = 0
    extra_flops: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "option": self.option,
                "save": {op: list(idx) for op, idx in self.save},
                "expected_ops": dict(self.expected_ops),
                "saving_bytes": self.saving_bytes, "extra_flops": self.extra_flops}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RegionPolicy":
        return cls(path=str(data["path"]), option=str(data["option"]),
                   save=tuple((op, tuple(int(i) for i in idx)) for op, idx in data["save"].items()),
                   expected_ops=tuple((op, int(n)) for op, n in data["expected_ops"].items()),
                   saving_bytes=int(data.get("saving_bytes", 0)),
                   extra_flops=float(data.get("extra_flops", 0.0)))


@dataclass(frozen=True)
class SplitPolicy:
    """One MLP module whose forward runs in row chunks (`ChunkedForward`)."""

    path: str
    chunks: int
    """Row chunks of the flattened token rows (fewer when a call has fewer rows)."""
    checkpoint: bool = True
    """Each chunk under its own checkpoint (the plan chose it); False: the chunks one after the
    other, everything kept, as the unsplit MLP keeps it (the plan was made on the chunked step)."""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "chunks": self.chunks, "checkpoint": self.checkpoint}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SplitPolicy":
        return cls(path=str(data["path"]), chunks=int(data["chunks"]),
                   checkpoint=bool(data.get("checkpoint", True)))


@dataclass(frozen=True)
class CheckpointPlan:
    """What `apply_checkpointing` decided and predicts; ``runtime`` is always ``"eager"``."""

    regions: tuple[RegionPolicy, ...]
    model_signature: str
    """Hash of the module tree (paths, classes, parameter shapes) the plan was made for."""
    model_class: str
    plan: Plan | None = field(default=None, compare=False)
    """The IR plan (same fields as the graph runtime's: predicted peak, extra FLOPs, bound...);
    None for a plan loaded from a file (its figures are in ``summary``)."""
    summary: tuple[tuple[str, Any], ...] = ()
    """Headline figures, also in the file: budget, predicted peak, store-all peak, extra FLOPs,
    per-block checkpointing's extra FLOPs and peak, the graph runtime's at the same budget."""
    runtime: str = "eager"
    splits: tuple[SplitPolicy, ...] = ()
    """MLP modules run in row chunks, each chunk under its own checkpoint (``split_mlp``)."""

    def __getattr__(self, name: str) -> Any:  # plan.predicted_peak_bytes etc.
        if name.startswith("_") or name in ("plan", "summary"):
            raise AttributeError(name)
        summary = dict(object.__getattribute__(self, "summary"))
        if name in summary:
            return summary[name]
        plan = object.__getattribute__(self, "plan")
        if plan is not None and hasattr(plan, name):
            return getattr(plan, name)
        raise AttributeError(f"CheckpointPlan has no attribute {name!r}")

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "generated_by": "remat-opt", "runtime": self.runtime, "model_class": self.model_class,
                "model_signature": self.model_signature,
                "regions": [r.to_json() for r in self.regions],
                **({"mlp_splits": [sp.to_json() for sp in self.splits]} if self.splits else {}),
                "summary": dict(self.summary)}

    def save(self, path: str | os.PathLike) -> None:
        save_checkpointing_plan(self, path)


def model_signature(model: torch.nn.Module) -> str:
    """Hash of every module's path and class and every parameter's and buffer's shape."""
    parts = [f"{p}:{type(m).__name__}" for p, m in model.named_modules()]
    parts += [f"{n}:{tuple(t.shape)}" for n, t in model.named_parameters()]
    parts += [f"{n}:{tuple(t.shape)}" for n, t in model.named_buffers()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- the wrapper
class _Policy:
    """One region call's policy: counts calls per overload as checkpoint's SAC does."""

    def __init__(self, save: dict[str, frozenset[int]]) -> None:
        self.save = save
        self.counts: Counter[str] = Counter()

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if ctx.is_recompute:
            return CheckpointPolicy.PREFER_RECOMPUTE
        name = str(func)
        index = self.counts[name]
        self.counts[name] += 1
        if index in self.save.get(name, ()):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE


def is_in_place(op: str) -> bool:
    """``aten.add_.Tensor``: an overload that writes its first argument."""
    parts = op.split(".")
    return len(parts) == 3 and parts[1].endswith("_") and not parts[1].endswith("__")


EAGER_BATCH_NORMS = {"aten.native_batch_norm.default": 6, "aten._native_batch_norm_legit.default": 6,
                     "aten._batch_norm_with_update.default": 5, "aten.cudnn_batch_norm.default": 6,
                     "aten.miopen_batch_norm.default": 6}
"""What eager runs for the captured ``_native_batch_norm_legit_functional`` in training (running
statistics updated in place), by device and version -> the position of its momentum argument."""


class _FrozenStatistics(TorchDispatchMode):
    """Entered while a region recomputes: batch norm reruns with momentum 0, so its running
    statistics get ``1 * running + 0 * batch``, bit for bit what they were (the batch's
    normalization itself does not read them in training, and its outputs are the same)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        index = EAGER_BATCH_NORMS.get(str(func))
        if index is not None and len(args) > index:
            args = (*args[:index], 0.0, *args[index + 1:])
        return func(*args, **(kwargs or {}))


class _RecomputeWithFrozenStatistics:
    """SAC's recompute context, and `_FrozenStatistics` inside it."""

    def __init__(self, recompute: Any) -> None:
        self._stack = contextlib.ExitStack()
        self._recompute = recompute

    def __enter__(self) -> None:
        self._stack.enter_context(self._recompute)
        self._stack.enter_context(_FrozenStatistics())

    def __exit__(self, *exc: Any) -> None:
        self._stack.__exit__(*exc)


def recomputes_batch_norm(save: tuple[tuple[str, tuple[int, ...]], ...],
                          expected_ops: tuple[tuple[str, int], ...]) -> bool:
    """Whether a region reruns some batch norm call (the policy keeps fewer than it makes)."""
    kept = dict(save)
    return any(len(kept.get(op, ())) < n for op, n in expected_ops if op in EAGER_BATCH_NORMS)


def counting_batch_norms(module: torch.nn.Module) -> list[_BatchNorm]:
    """The BatchNorm modules under ``module`` that count their training steps
    (``num_batches_tracked.add_(1)`` once per training call)."""
    return [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats
            and getattr(m, "num_batches_tracked", None) is not None]


def keeps_only_batch_norm_counters(module: torch.nn.Module, save: tuple[tuple[str, tuple[int, ...]], ...],
                                   expected_ops: tuple[tuple[str, int], ...]) -> bool:
    """Whether a region's policy keeps nothing but its BatchNorms' step counters: the region's
    only in-place calls are one counter update per counting BatchNorm module, each BatchNorm
    module makes the region's only batch norm calls, and ``save`` keeps exactly those updates.
    Such a region runs as plain ``checkpoint`` with the BatchNorms frozen by attribute on the
    rerun (`_BatchNormsFrozenOnRerun`): no dispatch mode, and the same statistics."""
    norms = len(counting_batch_norms(module))
    batch_norm_calls = sum(n for op, n in expected_ops if op in EAGER_BATCH_NORMS)
    in_place_calls = sum(n for op, n in expected_ops if is_in_place(op))
    kept = sum(len(indices) for _, indices in save)
    return (norms > 0 and norms == batch_norm_calls == in_place_calls == kept
            and all(is_in_place(op) for op, _ in save))


class _BatchNormsFrozenOnRerun:
    """A checkpointed function whose later calls (checkpoint's recomputation) run with every
    counting BatchNorm at momentum 0 and its step counter put back afterwards: the running
    statistics get ``1 * running + 0 * batch``, bit for bit what they were (`_FrozenStatistics`'s
    rule, set on the modules instead of through a dispatch mode), and the batch is counted once."""

    def __init__(self, inner: Any, norms: list[_BatchNorm]) -> None:
        self.inner, self.norms, self.calls = inner, norms, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            return self.inner(*args, **kwargs)
        kept = [(m, m.momentum, m.num_batches_tracked.clone()) for m in self.norms]
        try:
            for m in self.norms:
                m.momentum = 0.0
            return self.inner(*args, **kwargs)
        finally:
            with torch.no_grad():
                for m, momentum, count in kept:
                    m.momentum = momentum
                    m.num_batches_tracked.copy_(count)


NOMINAL_POLICY_OP_S = 8e-6
"""Seconds a selective-checkpoint policy adds per forward op call (its Python dispatch mode), as
`policy_op_seconds` measured it on one core of a 2-core x86_64 VM (2026-12-06): what plans priced
on a GPU's datasheet roofline (``roofline:*``) charge, so they stay the same on every machine."""


@functools.cache
def policy_op_seconds() -> float:
    """Seconds a policy adds per op call of a region, measured here once per process: a chain of
    400 small ops under non-reentrant ``checkpoint`` with and without a policy that recomputes
    everything (forward and rerun both go through the mode), best of 5 steps each."""
    def chain(x):
        for _ in range(200):
            x = x * 1.0001 + 0.0001
        return x

    def recompute(ctx, op, *args, **kwargs):
        return CheckpointPolicy.PREFER_RECOMPUTE

    def step(context_fn) -> float:
        with torch.random.fork_rng(devices=[]):
            x = torch.ones(16, requires_grad=True)
            start = time.perf_counter()
            checkpoint(chain, x, use_reentrant=False, **context_fn).sum().backward()
            return time.perf_counter() - start

    policy = {"context_fn": functools.partial(create_selective_checkpoint_contexts, recompute)}
    plain = min(step({}) for _ in range(5))
    with_policy = min(step(policy) for _ in range(5))
    return max(with_policy - plain, 0.0) / (2 * 400)


NOMINAL_CHECKPOINT_CALL_S = 1.3e-4
"""Seconds one ``checkpoint`` call adds beyond what its function's ops cost, as
`checkpoint_call_seconds` measured it on one core of a 2-core x86_64 VM (2026-12-07): what plans
priced on a GPU's datasheet roofline (``roofline:*``) charge, so they stay the same everywhere."""


@functools.cache
def checkpoint_call_seconds() -> float:
    """Seconds one non-reentrant ``checkpoint`` call adds to a step beyond what its function's ops
    cost (its frames, hooks, RNG state and the rerun's dispatch), measured here once per process:
    a chain of 200 two-op functions, each under ``checkpoint`` or not, forward and backward, best
    of 5 steps each."""
    def two_ops(x):
        return (x * 2).sin()

    def step(wrapped: bool) -> float:
        with torch.enable_grad():
            x = torch.ones(16, requires_grad=True)
            start = time.perf_counter()
            y = x
            for _ in range(200):
                y = checkpoint(two_ops, y, use_reentrant=False) if wrapped else two_ops(y)
            y.sum().backward()
            return time.perf_counter() - start

    plain = min(step(False) for _ in range(5))
    wrapped = min(step(True) for _ in range(5))
    return max(wrapped - plain, 0.0) / 200


def _policy_contexts(save: tuple[tuple[str, tuple[int, ...]], ...], seen: list | None = None,
                     freeze_statistics: bool = False):
    """checkpoint's ``context_fn``: a fresh policy per region call. A ``functools.partial`` of
    this with constant arguments is what ``torch.compile`` accepts as a context_fn.

    A region that keeps an in-place state update (BatchNorm's ``num_batches_tracked.add_(1)``,
    kept so that the recomputation does not count the batch twice) turns off SAC's check that
    kept tensors are not mutated: SAC records a kept tensor's version before the in-place op
    bumps it, so the check would always fire. The planner only keeps such an op in a region
    whose every in-place call is a kept state update (`frontends.eager_runtime.eager_ops.candidates`), so
    no other kept tensor can be mutated there."""
    policy = _Policy({op: frozenset(indices) for op, indices in save})
    if seen is not None:
        seen.append(policy)
    forward, recompute = create_selective_checkpoint_contexts(
        policy, allow_cache_entry_mutation=any(is_in_place(op) for op, _ in save))
    if freeze_statistics:
        return forward, _RecomputeWithFrozenStatistics(recompute)
    return forward, recompute


_CHUNKS = threading.local()


@contextlib.contextmanager
def unchecked_chunks():
    """Within: split MLPs (`ChunkedForward`) run their chunks one after the other without a
    checkpoint of their own. A checkpointed region enters it around its forward and its
    recomputation (the region's checkpoint already frees and reruns them; nested checkpoints are
    not planned); the planner enters it to capture and trace the chunked step."""
    depth = getattr(_CHUNKS, "depth", 0)
    _CHUNKS.depth = depth + 1
    try:
        yield
    finally:
        _CHUNKS.depth = depth


def chunks_unchecked() -> bool:
    return getattr(_CHUNKS, "depth", 0) > 0


class _RegionCall:
    """What a region's checkpoint runs when a split MLP is inside it: the module's forward
    under `unchecked_chunks`, in forward and in the recomputation alike."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with unchecked_chunks():
            return self.inner(*args, **kwargs)


class CheckpointedForward(InstanceForward):
    """The instance ``forward`` of a checkpointed module."""

    def __init__(self, module: torch.nn.Module, region: RegionPolicy, previous: Any) -> None:
        super().__init__(module, previous)
        self.region = region
        self._save = {op: frozenset(idx) for op, idx in region.save}
        self._expected = dict(region.expected_ops)
        self._freeze = recomputes_batch_norm(region.save, region.expected_ops)
        self._warned = False
        self._splits: bool | None = None
        """Whether a split MLP runs inside (found at the first call: a module being deep-copied
        has no submodules yet)."""
        self._counters_only: bool | None = None
        """Whether the policy keeps only BatchNorm step counters (`keeps_only_batch_norm_counters`),
        found at the first call."""

    def _inner(self) -> Any:
        if self._splits is None:
            self._splits = bool(split_modules(self.module))
        return _RegionCall(self._original()) if self._splits else self._original()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = self._inner()
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        # checkpoint keeps the call's arguments to rerun it: a list its caller appends to after
        # the call (timm's DenseNet hands each layer the block's growing feature list) would
        # rerun on more tensors than forward saw. The rerun gets the containers as they were.
        args, kwargs = tree_map(lambda leaf: leaf, (args, kwargs))
        if torch.compiler.is_compiling():
            if self._freeze:
                raise RuntimeError(
                    f"remat-opt: module {self.region.path!r} recomputes a BatchNorm, whose running "
                    "statistics the eager runtime freezes while it reruns, which torch.compile "
                    "cannot trace: compile the model without apply_checkpointing, or use "
                    "remat_backend, which plans the compiled graph")
            return checkpoint(inner, *args, use_reentrant=False, preserve_rng_state=True,
                              context_fn=functools.partial(_policy_contexts, self.region.save), **kwargs)
        if not self.region.save and not self._freeze:
            # Saves nothing: plain checkpoint. A policy would send every op of the region through
            # a Python dispatch mode only to answer "recompute" (per-block checkpointing's cost).
            return checkpoint(inner, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        if self._counters_only is None:  # a region with BatchNorms that keeps nothing is planned so
            self._counters_only = not self.region.save or keeps_only_batch_norm_counters(  # (see eager_ops)
                self.module, self.region.save, self.region.expected_ops)
        if self._counters_only:  # keeps only BatchNorm step counters: no policy, norms frozen by attribute
            return checkpoint(_BatchNormsFrozenOnRerun(inner, counting_batch_norms(self.module)), *args,
                              use_reentrant=False, preserve_rng_state=True, **kwargs)
        seen: list[_Policy] = []
        out = checkpoint(inner, *args, use_reentrant=False, preserve_rng_state=True,
                         context_fn=functools.partial(_policy_contexts, self.region.save, seen,
                                                      self._freeze), **kwargs)
        if not self._warned and seen and seen[0].counts:
            counts = seen[0].counts
            differ = [op for op in self._save if counts.get(op, 0) != self._expected.get(op, 0)]
            if differ:
                self._warned = True
                warnings.warn(f"remat-opt: module {self.region.path!r} runs other ops than it was "
                              f"planned with ({differ[0]} and {len(differ) - 1} more): gradients "
                              "stay exact, memory may differ from the prediction; plan again "
                              "with apply_checkpointing", stacklevel=2)
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"module": self.module, "region": self.region, "previous": self.previous}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["module"], state["region"], state["previous"])


class ChunkedForward(InstanceForward):
    """The instance ``forward`` of a split MLP: the module's own forward on ``split.chunks``
    chunks of the input's flattened token rows, each chunk under a non-reentrant checkpoint that
    keeps nothing, the outputs concatenated. The wide intermediate then lives one chunk at a
    time in forward (only the chunk's input is held) and in backward (each chunk's backward
    reruns that chunk's forward first). The planner allows it only for modules whose forward
    treats every row alone (linear -> pointwise -> linear, no dropout): same function, the
    weight gradients summed over chunks. Without grad, or called with anything but one tensor,
    the original forward runs whole; inside a checkpointed region (`unchecked_chunks`), or
    where the plan does not checkpoint them (``split.checkpoint`` False), the chunks run without
    their own checkpoint."""

    def __init__(self, module: torch.nn.Module, split: SplitPolicy, previous: Any) -> None:
        super().__init__(module, previous)
        self.split = split

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = self._original()
        x = args[0] if len(args) == 1 and not kwargs else None
        if not (torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[-1] > 0):
            return inner(*args, **kwargs)
        rows = x.numel() // x.shape[-1]
        chunks = min(self.split.chunks, rows)
        if chunks <= 1:
            return inner(x)
        pieces = x.reshape(rows, x.shape[-1]).split(chunk_sizes(rows, chunks))
        if chunks_unchecked() or not self.split.checkpoint:
            outs = [inner(piece) for piece in pieces]
        else:
            outs = [checkpoint(inner, piece, use_reentrant=False, preserve_rng_state=False)
                    for piece in pieces]
        del pieces
        out = torch.cat(outs)
        del outs  # the chunks die at the concatenation, not when forward returns
        return out.view(*x.shape[:-1], out.shape[-1])

    def __getstate__(self) -> dict[str, Any]:
        return {"module": self.module, "split": self.split, "previous": self.previous}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["module"], state["split"], state["previous"])


class CacheOffForward(InstanceForward):
    """The root's instance ``forward`` when a config asks for a generation cache: training calls
    (grad enabled, ``model.training``) run with ``use_cache=False``, as Hugging Face's own
    gradient checkpointing does, since a cache filled in forward changes what the recomputation
    runs. Evaluation and generation are untouched."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = self._original()
        if not (torch.is_grad_enabled() and self.module.training):
            return inner(*args, **kwargs)
        with cache_off_for_training(self.module, kwargs) as cache_off:
            return inner(*args, **cache_off.kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {"module": self.module, "previous": self.previous}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["module"], state["previous"])


def _wants_cache(model: torch.nn.Module) -> bool:
    return any(getattr(getattr(m, "config", None), "use_cache", None) is True for m in model.modules())


def apply_splits(model: torch.nn.Module, splits: tuple[SplitPolicy, ...]) -> None:
    """Run each named module's forward in row chunks (`ChunkedForward`)."""
    modules = dict(model.named_modules())
    missing = [s.path for s in splits if s.path not in modules]
    if missing:
        raise CheckpointPlanError(f"the plan splits module {missing[0]!r}, which this model does not "
                                  "have; nothing was applied")
    for split in splits:
        module = modules[split.path]
        module.__dict__["forward"] = ChunkedForward(module, split, module.__dict__.get("forward"))


def apply_regions(model: torch.nn.Module, regions: tuple[RegionPolicy, ...],
                  splits: tuple[SplitPolicy, ...] = ()) -> None:
    """Split the MLPs ``splits`` names, then checkpoint the ``regions`` (a region around a split
    MLP runs its chunks under its own checkpoint)."""
    modules = dict(model.named_modules())
    missing = [r.path for r in regions if r.path not in modules]
    if missing:
        raise CheckpointPlanError(f"the plan names module {missing[0]!r}, which this model does not "
                                  "have; nothing was applied")
    apply_splits(model, splits)  # checks its modules before it applies any
    offloaded = [(r.path, r) for r in regions if r.option in OFFLOADS]
    if offloaded:
        offload_modules(model, offloaded)  # one session: each region prefetches the one before it
    for region in regions:
        if region.option in OFFLOADS:
            continue
        module = modules[region.path]
        previous = module.__dict__.get("forward")
        module.__dict__["forward"] = CheckpointedForward(module, region, previous)
    if (regions or splits) and _wants_cache(model):
        model.__dict__["forward"] = CacheOffForward(model, model.__dict__.get("forward"))


def checkpointed_modules(model: torch.nn.Module) -> dict[str, RegionPolicy]:
    """Module path -> its policy, for every module `apply_checkpointing` wrapped (checkpointed,
    or offloaded: option ``"offload"``)."""
    return {p: m.__dict__["forward"].region for p, m in model.named_modules()
            if isinstance(m.__dict__.get("forward"), (CheckpointedForward, OffloadedForward))
            and m.__dict__["forward"].region is not None}


def split_modules(model: torch.nn.Module) -> dict[str, SplitPolicy]:
    """Module path -> its split, for every MLP `apply_checkpointing` runs in row chunks."""
    return {path: wrapper.split for path, wrapper in wrappers_of(model, ChunkedForward)}


def remove_checkpointing(model: torch.nn.Module) -> int:
    """Undo `apply_checkpointing` / `load_checkpointing` exactly; returns the modules unwrapped."""
    count = 0
    for _path, module in model.named_modules():
        wrapper = module.__dict__.get("forward")
        while isinstance(wrapper, InstanceForward):
            if wrapper.previous is None:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = wrapper.previous
            count += 1
            wrapper = module.__dict__.get("forward")
    return count


# --------------------------------------------------------------------------- files
def save_checkpointing_plan(plan: CheckpointPlan, path: str | os.PathLike) -> None:
    """Write ``plan`` as JSON (``"schema": "remat-opt/eager-plan/1"``)."""
    with open(path, "w") as f:
        json.dump(plan.to_json(), f, indent=2, default=float)
        f.write("\n")


def load_checkpointing(model: torch.nn.Module, path: str | os.PathLike) -> CheckpointPlan:
    """Apply a plan saved by `save_checkpointing_plan` to a freshly built ``model`` (no capture,
    no solve). A model whose module tree differs from the one planned raises
    `CheckpointPlanError` with one line, and nothing is applied."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointPlanError(f"cannot read checkpointing plan {os.fspath(path)!r}: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CheckpointPlanError(f"{os.fspath(path)!r} is not a remat-opt eager plan (schema {SCHEMA})")
    if checkpointed_modules(model) or split_modules(model):
        raise CheckpointPlanError("the model is already checkpointed: call remove_checkpointing(model) "
                                  "first; nothing was applied")
    signature = model_signature(model)
    if data["model_signature"] != signature:
        raise CheckpointPlanError(
            f"plan {os.fspath(path)!r} was made for another model ({data['model_class']}, module "
            f"tree {data['model_signature']}; this {type(model).__name__} has {signature}): plan it "
            "with apply_checkpointing; nothing was applied")
    regions = tuple(RegionPolicy.from_json(r) for r in data["regions"])
    splits = tuple(SplitPolicy.from_json(sp) for sp in data.get("mlp_splits", ()))
    apply_regions(model, regions, splits)
    return CheckpointPlan(regions=regions, model_signature=signature,
                          model_class=type(model).__name__, plan=None,
                          summary=tuple(data.get("summary", {}).items()), splits=splits)


def describe(plan: CheckpointPlan) -> str:
    """A few lines for the CLI: regions, predicted peak, extra compute, comparisons."""
    s = dict(plan.summary)

    def extra(flops: float, seconds: float | None) -> str:
        time = f", {1e3 * seconds:.3f} ms under the cost model" if seconds is not None else ""
        return f"{flops / 1e9:.3f} GFLOP{time}"

    offloaded = sum(r.option in OFFLOADS for r in plan.regions)
    lines = [f"eager runtime: {len(plan.regions) - offloaded} modules checkpointed"
             + (f", {offloaded} offloaded" if offloaded else "")
             + f" ({', '.join(f'{r.path}[{r.option}]' for r in plan.regions[:6])}"
             f"{', ...' if len(plan.regions) > 6 else ''})"]
    if "offloaded_bytes" in s:
        lines.append(f"offloaded {format_bytes(s['offloaded_bytes'])} to host and back over {s['link']}: "
                     f"{1e3 * s['transfer_time_s']:.3g} ms of copies, {1e3 * s['stall_time_s']:.3g} ms not hidden")
    if plan.splits:
        names = ", ".join(sp.path for sp in plan.splits[:3]) + (", ..." if len(plan.splits) > 3 else "")
        lines.append(f"{len(plan.splits)} MLPs in {plan.splits[0].chunks} row chunks ({names}), the chunks "
                     f"of {sum(sp.checkpoint for sp in plan.splits)} each under its own checkpoint")
    lines += [f"predicted peak {format_bytes(s['predicted_peak_bytes'])} of budget "
              f"{format_bytes(s['budget_bytes'])} (plain autograd {format_bytes(s['store_all_peak_bytes'])})",
              f"extra compute {extra(s['extra_flops'], s.get('extra_time_s'))} ({s['status']}"
              + (f", gap {s['gap']:.1%} of the step" if s.get("gap") is not None else "") + ")"]
    if "per_block_extra_flops" in s:
        lines.append(f"per-block checkpointing: {extra(s['per_block_extra_flops'], s.get('per_block_extra_time_s'))}"
                     f" extra, peak {format_bytes(s['per_block_peak_bytes'])}")
    if "graph_runtime_extra_flops" in s:
        lines.append("graph runtime (optimize) at this budget: "
                     f"{extra(s['graph_runtime_extra_flops'], s.get('graph_runtime_extra_time_s'))} extra, "
                     f"peak {format_bytes(s['graph_runtime_peak_bytes'])}")
    elif "graph_runtime_error" in s:
        lines.append(f"graph runtime (optimize) at this budget: {s['graph_runtime_error']}")
    return "\n".join(lines)
