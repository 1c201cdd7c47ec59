"""The largest batch that fits a budget, per strategy, without allocating a single activation.

Remat trades compute for memory; what users buy with the memory is usually a bigger batch, and
a bigger batch can raise throughput even after paying for the recomputation. For each strategy
this finds the largest batch whose plan fits the budget: from the example's batch, an
exponential search (doubling while it fits, halving until it does), then a binary search between
the last batch that fits and the first that does not. Each batch size is captured once (shared by every strategy) on the meta device:
the model's parameters and the inputs become meta tensors, so capture allocates nothing and a
batch of 10^6 costs what a batch of 1 does. The search assumes what holds for training steps:
a batch that does not fit is not followed by a larger one that does.

`MetaCapturer` also serves ``--dtype``: floating parameters and inputs are cast on the meta
device, so a bf16 what-if needs neither the memory nor the hardware.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from optimizer.sweep import SweepPoint

DEFAULT_LIMIT = 1 << 20
"""Largest batch the search tries: a model whose peak does not grow with the batch stops here."""

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}


class WhatIfError(ValueError):
    """A what-if question that cannot be answered as asked; the message says what to give."""


class StrategyUnavailable(Exception):
    """The strategy does not apply to this model at all (revolve on a graph that is not a chain,
    torch's partitioner failing): no batch size would change that."""


@dataclass(frozen=True)
class BatchFit:
    """One strategy's largest batch within the budget, and what a step at that batch costs."""

    strategy: str
    max_batch: int
    """0 when not even a batch of 1 fits."""
    capped: bool
    """The search limit was reached: the true maximum may be larger."""
    point: SweepPoint | None
    """The strategy's plan at ``max_batch`` (peak, extra time); None when ``max_batch`` is 0."""
    step_time_s: float | None
    """A plain step at ``max_batch`` under the cost model (recomputation not included)."""
    probes: tuple[tuple[int, bool], ...]
    """(batch, fits) in the order the search tried them."""
    message: str = ""
    applicable: bool = True
    """False when the strategy does not apply to this model (``message`` says why)."""

    @property
    def samples_per_s(self) -> float | None:
        """Estimated throughput: batch / (plain step time + recomputation time)."""
        if not self.max_batch or self.point is None or self.step_time_s is None:
            return None
        seconds = self.step_time_s + (self.point.extra_time_s or 0.0)
        return self.max_batch / seconds if seconds > 0 else None


@dataclass(frozen=True)
class MaxBatchResult:
    budget_bytes: int
    batch_dim: int
    base_batch: int
    """The batch size of the example inputs."""
    limit: int
    fits: tuple[BatchFit, ...]
    captures: int
    """Distinct batch sizes captured (every strategy shares them)."""


def search_max_batch(fits: Callable[[int], bool], limit: int = DEFAULT_LIMIT,
                     start: int = 1) -> tuple[int, bool, tuple]:
    """Largest b in [1, limit] with ``fits(b)``, assuming fits is monotone (true, then false).

    Starts at ``start`` (the example's batch is a good guess), doubles while it fits or halves
    until it does, then bisects between the last batch that fits and the first that does not.
    Returns (batch, capped, probes): batch 0 when not even 1 fits; capped when ``limit`` fits.
    """
    probes: list[tuple[int, bool]] = []

    def probe(b: int) -> bool:
        ok = fits(b)
        probes.append((b, ok))
        return ok

    if limit < 1:
        return 0, False, ()
    low, high = 0, None  # fits(low) (0 stands for "nothing yet"), not fits(high)
    b = max(1, min(start, limit))
    if probe(b):
        low = b
        while high is None:
            if low == limit:
                return low, True, tuple(probes)
            b = min(low * 2, limit)
            if probe(b):
                low = b
            else:
                high = b
    else:
        high = b
        while low == 0 and high > 1:
            b = high // 2
            if probe(b):
                low = b
            else:
                high = b
        if low == 0:
            return 0, False, tuple(probes)
    while high - low > 1:
        mid = (low + high) // 2
        if probe(mid):
            low = mid
        else:
            high = mid
    return low, False, tuple(probes)


class MetaCapturer:
    """Captures the model's training step at any batch size on the meta device (cached)."""

    def __init__(self, model, inputs: tuple, *, batch_dim: int | None = None, dtype: str | None = None,
                 cost_model: str = "flops") -> None:
        self.dtype = _torch_dtype(dtype)
        self.cost_model = cost_model
        self.model = meta_copy(model)
        if self.dtype is not None:
            self.model = self.model.to(self.dtype)
        self.inputs = tuple(inputs)
        self.batch_dim, self.base_batch = infer_batch(self.inputs, batch_dim)
        self._cache: dict[int, Any] = {}

    def at(self, batch: int | None = None):
        """The `CapturedStep` at ``batch`` (default: the example inputs' batch)."""
        from optimizer.api import capture_with_costs

        batch = self.base_batch if batch is None else batch
        if batch not in self._cache:
            inputs = inputs_at_batch(self.inputs, self.batch_dim, self.base_batch, batch, self.dtype)
            self._cache[batch] = capture_with_costs(self.model, inputs, None, self.cost_model)
        return self._cache[batch]

    @property
    def captures(self) -> int:
        return len(self._cache)


def find_max_batches(
    capturer: MetaCapturer,
    budget_bytes: int,
    strategies: Sequence[str],
    evaluate: Callable[[Any, str, int], SweepPoint | None],
    *,
    limit: int = DEFAULT_LIMIT,
    progress: Callable[[str], None] | None = None,
) -> MaxBatchResult:
    """For each strategy, the largest batch whose plan fits ``budget_bytes``.

    ``evaluate(captured, strategy, budget_bytes)`` returns the strategy's cheapest simulated plan
    within the budget, or None when it has none (see `optimizer.sweep.run_sweep` and
    `SweepResult.best_at`); it raises `StrategyUnavailable` when the strategy cannot run at all.
    """
    if capturer.batch_dim is None:
        raise WhatIfError("no batch dimension: the inputs have no tensor to grow; give --batch-dim")
    tick = progress or (lambda _: None)
    results: list[BatchFit] = []
    for strategy in strategies:
        plans: dict[int, SweepPoint | None] = {}

        def fits(batch: int) -> bool:
            plans[batch] = evaluate(capturer.at(batch), strategy, budget_bytes)
            tick(f"{strategy} at batch {batch}")
            return plans[batch] is not None

        try:
            best, capped, probes = search_max_batch(fits, limit, start=capturer.base_batch)
        except StrategyUnavailable as err:
            results.append(BatchFit(strategy, 0, False, None, None, (), f"not applicable: {err}",
                                    applicable=False))
            continue
        point = plans.get(best) if best else None
        step = capturer.at(best).graph.base_cost if best else None
        message = "" if best else "not even a batch of 1 fits the budget"
        if capped:
            message = f"still fits at the search limit {limit}: the peak may not grow with this batch dimension"
        results.append(BatchFit(strategy, best, capped, point, step, probes, message))
    return MaxBatchResult(budget_bytes, capturer.batch_dim, capturer.base_batch, limit, tuple(results),
                          capturer.captures)


def meta_copy(model):
    """A copy of ``model`` whose parameters and buffers live on the meta device (no data is
    copied; tied parameters stay tied)."""
    import torch

    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, torch.nn.Parameter):
            meta = torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(model, memo)


def infer_batch(inputs: tuple, batch_dim: int | None) -> tuple[int | None, int | None]:
    """(batch dim, batch size): ``batch_dim`` (default 0) of the first tensor input that has it."""
    import torch
    from torch.utils._pytree import tree_flatten

    dim = 0 if batch_dim is None else batch_dim
    if dim < 0:
        raise WhatIfError(f"--batch-dim must be >= 0, got {dim}")
    tensors = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)]
    for t in tensors:
        if t.dim() > dim:
            return dim, int(t.shape[dim])
    if batch_dim is not None and tensors:
        raise WhatIfError(f"no input tensor has a dimension {dim}: choose another --batch-dim")
    return None, None


def inputs_at_batch(inputs: tuple, batch_dim: int | None, base: int | None, batch: int, dtype=None) -> tuple:
    """Meta copies of ``inputs``; tensors whose ``batch_dim`` is the base batch get ``batch``,
    floating ones are cast to ``dtype``. Non-tensor inputs pass through."""
    import torch
    from torch.utils._pytree import tree_map

    def convert(t):
        if not isinstance(t, torch.Tensor):
            return t
        shape = list(t.shape)
        if batch_dim is not None and t.dim() > batch_dim and shape[batch_dim] == base:
            shape[batch_dim] = batch
        target = dtype if dtype is not None and t.is_floating_point() else t.dtype
        out = torch.empty(shape, dtype=target, device="meta")
        return out.requires_grad_(t.requires_grad) if out.is_floating_point() else out

    return tuple(tree_map(convert, tuple(inputs)))


def _torch_dtype(name: str | None):
    if name is None:
        return None
    import torch

    key = name.strip().lower()
    if key not in DTYPES:
        raise WhatIfError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[key])
