"""Capture a model's step for the eager planner with its MLP modules run in row chunks.

The torch half of ``apply_checkpointing(..., split_mlp=m)`` (`optimizer.checkpointing`): find the
MLP modules that can run in chunks (`eager_split`), capture and trace the step with the chunked
forwards in place (each chunk without its own checkpoint, as the graph needs them), label each
chunk's values, and capture again without the chunks the capture refused. The model is left as
found; the planner decides which chunks get a checkpoint.
"""

from __future__ import annotations

import dataclasses

import torch

from frontends.eager_runtime.eager_checkpoint import (
    SplitPolicy,
    apply_splits,
    remove_checkpointing,
    unchecked_chunks,
)
from frontends.eager_runtime.eager_ops import capture_for_eager, prices_measured_time, trace_eager
from frontends.eager_runtime.eager_split import EagerSplitError, chunk_labels, mlp_modules
from frontends.eager_runtime.region_timing import time_module_forwards
from frontends.guards.hf_training import cache_off_for_training


def capture_split(model, inputs, kwargs, chunks: int, cost_model, grad_outputs, python_side_effects):
    """The step captured and traced for planning, with the MLP modules ``chunks > 1`` can split
    run in row chunks: (captured, trace, chunk labels, splits, notes on what was not split).
    The model is left as found."""
    splits: tuple[SplitPolicy, ...] = ()
    notes: list[str] = []
    if chunks > 1:
        with cache_off_for_training(model, dict(kwargs or {})) as cache_off:
            splits, skipped = mlp_modules(model, trace_eager(model, inputs, cache_off.kwargs), chunks)
        notes += [f"not split: {why}" for why in skipped]
    try:
        captured, trace, labels = capture_chunked(model, inputs, kwargs, splits, cost_model, grad_outputs,
                                                   python_side_effects)
        if labels.refused:  # left whole: capture again without them
            notes += [f"not split: {why}" for why in labels.refused.values()]
            splits = tuple(sp for sp in splits if sp.path not in labels.refused)
            if not splits:
                raise EagerSplitError(f"split_mlp={chunks}: no MLP module of the model can run in row chunks "
                                      f"in the eager runtime ({'; '.join(labels.refused.values())}); leave "
                                      "split_mlp at 1, or use optimize(), which splits the chain itself")
            captured, trace, labels = capture_chunked(model, inputs, kwargs, splits, cost_model, grad_outputs,
                                                       python_side_effects)
    finally:
        remove_checkpointing(model)  # the chunked forwards were in place for the capture only
    if splits:
        notes.insert(0, f"{len(splits)} MLP module{'s' if len(splits) > 1 else ''} "
                        f"({', '.join(sp.path for sp in splits[:3])}{', ...' if len(splits) > 3 else ''}) "
                        f"in {chunks} row chunks")
    return captured, trace, labels, splits, notes


def capture_chunked(model, inputs, kwargs, splits, cost_model, grad_outputs, python_side_effects):
    """Capture and trace the step with ``splits`` applied (chunks without their own checkpoint,
    as the graph needs them), and label each chunk's values; the model keeps the wrappers. In
    measured time, each module's eager forward is timed too (``trace.forward_s``)."""
    remove_checkpointing(model)
    apply_splits(model, splits)
    with unchecked_chunks():
        captured = capture_for_eager(model, inputs, kwargs, cost_model, grad_outputs, python_side_effects)
        with cache_off_for_training(model, dict(kwargs or {})) as cache_off:
            trace = trace_eager(model, inputs, cache_off.kwargs)
            if prices_measured_time(captured.graph):  # what an eager rerun costs beyond its ops
                trace = dataclasses.replace(trace, forward_s=time_module_forwards(model, inputs, cache_off.kwargs))
    labels = chunk_labels(captured.graph, captured.gm, splits, trace.calls)
    return captured, trace, labels


def on_cpu(model: torch.nn.Module, inputs: tuple) -> bool:
    """Whether the model (its first parameter, else its first tensor input) lives on the CPU:
    the eager graph then holds no CUDA workspace."""
    for t in [*model.parameters(), *inputs]:
        if isinstance(t, torch.Tensor):
            return t.device.type == "cpu"
    return True
