"""Captures of the training step at any batch size (and dtype) on the meta device.

The model's parameters and the inputs become meta tensors, so capture allocates nothing and a
batch of 10^6 costs what a batch of 1 does. `MetaCapturer` also serves ``--dtype``: floating
parameters and inputs are cast on the meta device, so a bf16 what-if needs neither the memory
nor the hardware. `solvers.planning.batch_search` searches over the captures.

A search probes many batch sizes; `MetaCapturer.scale_to` fits the step's sizes and costs over
the batch from two captures and checks the fit with a third (`solvers.planning.batch_scaling`),
after which `graph_at` answers every batch in the checked range by arithmetic instead of a capture.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from frontends.capture.costed_capture import capture_with_costs
from frontends.measure.costs import cost_model_from_name, op_bytes_moved
from frontends.torch_compat import tree_flatten, tree_map
from solvers.ir.graph import RematGraph
from solvers.planning.batch_scaling import BatchScaling, ScalingMismatch, StepSample, fit_batch_scaling
from solvers.planning.batch_search import DTYPES, WhatIfError


class MetaCapturer:
    """Captures the model's training step at any batch size on the meta device (cached)."""

    def __init__(self, model, inputs: tuple, *, batch_dim: int | None = None, dtype: str | None = None,
                 cost_model: str = "auto") -> None:
        self.dtype = torch_dtype(dtype)
        self.cost_model = cost_model
        self.model = meta_copy(model)
        if self.dtype is not None:
            self.model = self.model.to(self.dtype)
        self.inputs = tuple(inputs)
        self.batch_dim, self.base_batch = infer_batch(self.inputs, batch_dim)
        self._cache: dict[int, Any] = {}
        self.scaling: BatchScaling | None = None
        """The checked fit `graph_at` predicts with (None: every batch is captured)."""
        self.scaling_note = ""
        """Why there is no fit, when `scale_to` tried and failed."""

    def at(self, batch: int | None = None):
        """The `CapturedStep` at ``batch`` (default: the example inputs' batch)."""
        batch = self.base_batch if batch is None else batch
        if batch not in self._cache:
            inputs = inputs_at_batch(self.inputs, self.batch_dim, self.base_batch, batch, self.dtype)
            self._cache[batch] = capture_with_costs(self.model, inputs, None, self.cost_model)
        return self._cache[batch]

    def graph_at(self, batch: int | None = None) -> RematGraph:
        """The step's graph at ``batch``: predicted inside the checked range of `scale_to`'s fit
        (the graph a capture would give), captured otherwise."""
        batch = self.base_batch if batch is None else batch
        if self.scaling is not None and self.scaling.covers(batch) and batch not in self._cache:
            return self.scaling.predict(batch)
        return self.at(batch).graph

    def predicted_at(self, batch: int) -> RematGraph | None:
        """The fit's graph at ``batch`` even outside the checked range (an extrapolation, for
        choosing where to check it); None without a fit."""
        return None if self.scaling is None else self.scaling.predict(batch)

    def fit_scaling(self) -> bool:
        """Fit sizes and costs over the batch from the example's batch and ``2 * batch + 1`` (a
        capture each; the fit is then checked on those two only). False, with `scaling_note`,
        when the two graphs differ in structure or the cost model is measured.

        An example batch of 1 is fitted from batches 2 and 5 instead: at batch 1 a transpose
        that moves the batch dimension leaves a contiguous tensor, so a later ``reshape`` is a
        view where every larger batch copies (one value fewer on Llama: no fit at all, and a
        capture per probe). Batch 1 keeps its own capture."""
        base = self.base_batch
        if base == 1:
            base = 2
        if self.scaling is not None:
            return True
        if base is None:
            return False
        if cost_model_from_name(self.cost_model).measured:
            self.scaling_note = "measured costs do not scale with the batch: every batch is captured"
            return False
        try:
            self.scaling = fit_batch_scaling(self.sample(base), self.sample(2 * base + 1),
                                             self.at(base).cost_model.seconds)
        except ScalingMismatch as err:
            self.scaling_note = f"sizes are not affine in the batch ({err}): every batch is captured"
            return False
        return True

    def check_scaling(self, batch: int) -> bool:
        """Check the fit against a capture at ``batch`` and widen its checked range to it; a fit
        that fails there is dropped (`scaling_note` says where) and every batch is captured."""
        if self.scaling is None:
            return False
        if self.scaling.covers(batch):
            return True
        try:
            self.scaling = self.scaling.check(self.sample(batch))
        except ScalingMismatch as err:
            self.scaling = None
            self.scaling_note = f"sizes are not affine in the batch ({err}): every batch is captured"
            return False
        return True

    def sample(self, batch: int) -> StepSample:
        """The capture at ``batch`` with each op group's bytes moved (the roofline's memory term)."""
        step = self.at(batch)
        moved = {node.name: float(op_bytes_moved(node)) for node in step.gm.graph.nodes
                 if node.op == "call_function" and node.name in step.graph.groups}
        return StepSample(batch, step.graph, moved)

    @property
    def captures(self) -> int:
        return len(self._cache)


def meta_copy(model):
    """A copy of ``model`` whose parameters and buffers live on the meta device (no data is
    copied; tied parameters stay tied)."""
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, torch.nn.Parameter):
            meta = torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(model, memo)


def infer_batch(inputs: tuple, batch_dim: int | None) -> tuple[int | None, int | None]:
    """(batch dim, batch size): ``batch_dim`` (default 0) of the first tensor input that has it."""
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


def torch_dtype(name: str | None):
    if name is None:
        return None
    key = name.strip().lower()
    if key not in DTYPES:
        raise WhatIfError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[key])
