"""``outputs="loss"`` (`frontends.capture.output_selection`): the step returns the losses only (None in
place of the logits), has the gradients of the whole, unsplit step (float64, 1e-10), and its
predicted peak drops; the plan message that asks for it names the option; a model without a
scalar loss is refused in one line. (A transformers ``ModelOutput`` coming back with only ``loss``
set is tested with the MLP split on a Llama, tests/frontends/split/test_mlp_split.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from frontends.capture.output_selection import NoLossOutputError
from frontends.capture.step import capture
from optimizer import optimize
from solvers.baselines import store_all_schedule
from solvers.checkmate.min_budget import peak_lower_bound
from solvers.ir.simulator import simulate
from tests.e2e_helpers import clone, load_example, max_relative_error

TOLERANCE = 1e-10


def _grads(module: nn.Module, inputs: tuple):
    """(outputs, {name: grad}) of one step backward from the first output (the loss)."""
    params = module.model if hasattr(module, "plan") else module
    for p in params.parameters():
        p.grad = None
    out = module(*inputs)
    out[0].backward()
    return out, {n: p.grad.detach().clone() for n, p in params.named_parameters()}


@pytest.fixture(scope="module")
def gpt():
    """The GPT example (returns ``(loss, logits)``), float64, no dropout."""
    return load_example("gpt", dropout=0.0)


@pytest.fixture(scope="module")
def split_captures(gpt):
    model, inputs = gpt
    return {outputs: capture(clone(model), inputs, split_rows=4, outputs=outputs) for outputs in ("all", "loss")}


def _store_all(captured) -> int:
    return simulate(captured.graph, store_all_schedule(captured.graph)).peak_bytes


def test_loss_only_has_the_gradients_of_the_whole_unsplit_step(gpt, split_captures) -> None:
    model, inputs = gpt
    (expected_loss, _), expected = _grads(clone(model), inputs)
    budget = int(0.8 * _store_all(split_captures["loss"]))  # bytes: no second, unsplit capture for a %
    rm = optimize(clone(model), inputs, budget, split=4, outputs="loss", solver="greedy", time_limit=5)
    assert rm.plan.recomputed and rm.plan.predicted_peak_bytes <= budget  # a plan that recomputes
    (loss, logits), grads = _grads(rm, inputs)
    loss, expected_loss = loss.detach(), expected_loss.detach()
    assert logits is None  # the same structure, None in place of the dropped tensor
    assert float((loss - expected_loss).abs() / expected_loss.abs()) <= TOLERANCE
    assert max_relative_error(grads, expected) <= TOLERANCE
    assert "outputs='loss'" not in rm.plan.message  # nothing left to recommend


def test_dropping_the_logits_lowers_the_predicted_peak(split_captures) -> None:
    whole, loss_only = split_captures["all"], split_captures["loss"]
    assert whole.row_splits[0].whole_outputs and not loss_only.row_splits[0].whole_outputs
    logits_bytes = whole.row_splits[0].logits_bytes
    assert _store_all(loss_only) <= _store_all(whole) - logits_bytes
    assert peak_lower_bound(loss_only.graph) < peak_lower_bound(whole.graph)


def test_the_split_message_names_the_option(split_captures) -> None:
    (note,) = split_captures["all"].notes
    assert "outputs='loss'" in note and "--outputs loss" in note
    assert "stay whole" not in " ".join(split_captures["loss"].notes)


def test_a_model_without_a_scalar_loss_is_refused() -> None:
    with pytest.raises(NoLossOutputError, match=r"returns no scalar floating-point loss \(its outputs: \(3, 4\)\)"):
        capture(nn.Linear(5, 4).double(), (torch.randn(3, 5, dtype=torch.float64),), outputs="loss")
    with pytest.raises(ValueError, match="outputs must be one of"):
        optimize(nn.Linear(5, 4), (torch.randn(3, 5),), "90%", outputs="logits")
