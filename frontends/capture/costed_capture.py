"""Capture a training step and cost its ops under a named cost model.

The one entry point the API, the meta-device what-if and the per-rank planner share: capture
(`frontends.capture.step`), then, for the ``profile`` cost model, time every op on the model's device
(`frontends.measure.profile`).
"""

from __future__ import annotations

import dataclasses

import torch

from frontends.capture.step import CapturedStep, capture
from frontends.measure.costs import cost_model_from_name, model_device, model_dtype
from frontends.measure.profile import profiled_graph


def capture_with_costs(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None,
                       cost_model: str = "auto", grad_outputs: str = "losses",
                       python_side_effects: str | None = None, replay_random: bool = True,
                       split_rows: int = 1, outputs: str = "all", split_mlp: int = 1) -> CapturedStep:
    """Capture the step and cost its ops under ``cost_model`` (profiling runs them once);
    ``python_side_effects``, ``replay_random``, ``split_rows``, ``outputs`` and ``split_mlp`` as in
    `frontends.capture.step.capture`."""
    model_costs = cost_model_from_name(cost_model, dtype=model_dtype(model), device=model_device(model))
    captured = capture(model, tuple(example_inputs), example_kwargs, cost_model=model_costs,
                       grad_outputs=grad_outputs, python_side_effects=python_side_effects,
                       replay_random=replay_random, split_rows=split_rows, outputs=outputs,
                       split_mlp=split_mlp)
    if model_costs.measured:
        graph = profiled_graph(captured, model, tuple(example_inputs), example_kwargs)
        captured = dataclasses.replace(captured, graph=graph)
    return captured
