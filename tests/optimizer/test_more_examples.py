"""The ViT-, ResNet- and UNet-like examples: model-file convention, and remat-opt's promises on them.

Each is planned by the default solver at two budgets (a mild and a tight percentage of plain
autograd's peak) and run in float64: gradients equal plain autograd's (relative error <= 1e-10),
BatchNorm's running statistics are updated exactly as plain autograd updates them, and the
measured peak is the predicted one within 2%.
"""

from __future__ import annotations

import pytest
import torch
from e2e_helpers import (
    clone,
    example_path,
    load_example,
    max_relative_error,
    measured_peak,
    train_step,
)
from torch import nn

from frontends.capture.model_file import load_model_file
from optimizer import optimize

NEW_EXAMPLES = ("vit", "resnet", "unet")
BUDGETS = ("85%", "70%")
TIME_LIMIT = 5


@pytest.mark.parametrize("name", NEW_EXAMPLES)
def test_model_file_convention_and_determinism(name):
    model_a, inputs_a = load_model_file(example_path(name))
    model_b, inputs_b = load_model_file(example_path(name))
    assert model_a.training
    for pa, pb in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    for xa, xb in zip(inputs_a, inputs_b, strict=True):
        assert torch.equal(xa, xb)
    out = model_a(*inputs_a)
    loss = out[0] if isinstance(out, tuple) else out
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model_a.parameters())


def test_each_example_has_the_structure_it_stands_for():
    vit, _ = load_model_file(example_path("vit"))
    assert isinstance(vit.patch_embed, nn.Conv2d) and vit.patch_embed.stride == vit.patch_embed.kernel_size
    assert len(vit.blocks) >= 2
    resnet, _ = load_model_file(example_path("resnet"))
    norms = [m for m in resnet.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(m.training and m.track_running_stats for m in norms)
    unet, (images, _) = load_model_file(example_path("unet"))
    concatenations: list = []
    with _Recorder(concatenations):
        unet(images, torch.zeros(images.shape[0], *images.shape[2:], dtype=torch.long))
    assert len(concatenations) == len(unet.up) >= 2, "each decoder level concatenates an encoder skip"


class _Recorder(torch.overrides.TorchFunctionMode):
    """Records every torch.cat call."""

    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.cat:
            self.calls.append(args)
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module", params=NEW_EXAMPLES)
def planned(request):
    model, inputs = load_example(request.param)
    reference = clone(model)
    _, ref_grads = train_step(reference, inputs)
    ref_buffers = {n: b.clone() for n, b in reference.named_buffers()}
    runs = {}
    for budget in BUDGETS:
        rm = optimize(clone(model), inputs, budget, time_limit=TIME_LIMIT)
        _, grads = train_step(rm, inputs)
        buffers = {n: b.clone() for n, b in rm.model.named_buffers()}
        runs[budget] = (rm, grads, buffers, measured_peak(rm, inputs))
    return request.param, ref_grads, ref_buffers, runs


@pytest.mark.parametrize("budget", BUDGETS)
def test_gradients_and_buffers_equal_plain_autograd(planned, budget):
    name, ref_grads, ref_buffers, runs = planned
    rm, grads, buffers, _ = runs[budget]
    assert rm.plan.recomputed, f"{name} at {budget}: nothing recomputed, the test shows nothing"
    assert max_relative_error(grads, ref_grads) <= 1e-10, name
    for key, ref in ref_buffers.items():  # running stats and counters updated exactly once
        assert torch.allclose(buffers[key], ref, rtol=1e-12, atol=0), (name, key)


@pytest.mark.parametrize("budget", BUDGETS)
def test_measured_peak_matches_prediction_and_budget(planned, budget):
    name, _, _, runs = planned
    rm, _, _, measured = runs[budget]
    predicted = rm.plan.predicted_peak_bytes
    assert predicted <= rm.plan.budget_bytes
    assert abs(measured - predicted) <= 0.02 * predicted, (name, measured, predicted)


def test_tighter_budget_gives_a_lower_measured_peak(planned):
    name, _, _, runs = planned
    peaks = [runs[budget][3] for budget in BUDGETS]
    assert peaks[1] < peaks[0], (name, peaks)
