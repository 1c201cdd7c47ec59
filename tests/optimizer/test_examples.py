"""Every example trains in float32 and float64, gives each parameter a gradient, and is seeded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from frontends.capture.model_file import load_model_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["mlp", "gpt", "convnet"]


def _loss(out: Any) -> torch.Tensor:
    loss = out[0] if isinstance(out, (tuple, list)) else out
    assert isinstance(loss, torch.Tensor)
    return loss


def _to_double(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
    )


def test_examples_is_not_a_package() -> None:
    assert not (EXAMPLES / "__init__.py").exists()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_backward_gives_every_parameter_a_gradient(name: str, dtype: torch.dtype) -> None:
    model, inputs = load_model_file(str(EXAMPLES / f"{name}.py"))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    if dtype == torch.float64:
        model = model.double()
        inputs = _to_double(inputs)
    loss = _loss(model(*inputs))
    assert loss.dim() == 0 and loss.dtype == dtype
    assert torch.isfinite(loss)
    loss.backward()
    for name_, param in model.named_parameters():
        assert param.grad is not None, f"{name}: no gradient for {name_}"
        assert param.grad.dtype == dtype
        assert torch.isfinite(param.grad).all(), f"{name}: non-finite gradient for {name_}"
        assert param.grad.abs().sum() > 0, f"{name}: zero gradient for {name_}"


@pytest.mark.parametrize("name", NAMES)
def test_models_and_inputs_are_deterministic(name: str) -> None:
    torch.manual_seed(1234)
    before = torch.rand(3)
    torch.manual_seed(1234)
    model_a, inputs_a = load_model_file(str(EXAMPLES / f"{name}.py"))
    model_b, inputs_b = load_model_file(str(EXAMPLES / f"{name}.py"))
    for pa, pb in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    for xa, xb in zip(inputs_a, inputs_b, strict=True):
        assert torch.equal(xa, xb)
    # Seeding inside the example leaves the caller's random stream alone.
    assert torch.equal(torch.rand(3), before)


def test_input_dtypes_and_shapes() -> None:
    _, (x, target) = load_model_file(str(EXAMPLES / "mlp.py"))
    assert x.dtype == target.dtype == torch.float32 and x.shape == target.shape
    _, (idx, targets) = load_model_file(str(EXAMPLES / "gpt.py"))
    assert idx.dtype == targets.dtype == torch.int64 and idx.shape == (4, 32)
    assert torch.equal(idx[:, 1:], targets[:, :-1])  # next-token targets
    _, (images, labels) = load_model_file(str(EXAMPLES / "convnet.py"))
    assert images.shape == (8, 3, 16, 16) and labels.dtype == torch.int64


def _load_gpt_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("examples_gpt_under_test", EXAMPLES / "gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpt_ties_lm_head_to_token_embedding() -> None:
    gpt = _load_gpt_module()
    model = gpt.get_model()
    assert model.lm_head.weight is model.tok_emb.weight
    names = [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # one parameter, listed once
    loss, logits = model(*gpt.get_inputs())
    assert logits.shape == (4, 32, 256)
    loss.backward()
    assert model.tok_emb.weight.grad is not None


def test_gpt_dropout_switch() -> None:
    gpt = _load_gpt_module()
    inputs = gpt.get_inputs()
    deterministic = gpt.get_model(dropout=0.0)
    loss_a, _ = deterministic(*inputs)
    loss_b, _ = deterministic(*inputs)
    assert torch.equal(loss_a, loss_b)
    noisy = gpt.get_model()
    assert all(m.p == 0.1 for m in noisy.modules() if isinstance(m, nn.Dropout))
    torch.manual_seed(0)
    loss_c, _ = noisy(*inputs)
    torch.manual_seed(1)
    loss_d, _ = noisy(*inputs)
    assert not torch.equal(loss_c, loss_d)
    # Weights do not depend on dropout, and near-uniform initial logits give loss ~ ln(256).
    for p, q in zip(deterministic.parameters(), noisy.parameters(), strict=True):
        assert torch.equal(p, q)
    assert abs(loss_a.item() - torch.log(torch.tensor(256.0)).item()) < 0.1


def test_gpt_attention_is_causal() -> None:
    gpt = _load_gpt_module()
    model = gpt.get_model(dropout=0.0)
    idx, targets = gpt.get_inputs()
    _, logits = model(idx, targets)
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    _, logits_changed = model(changed, targets)
    assert torch.allclose(logits[:, :-1], logits_changed[:, :-1])
    assert not torch.allclose(logits[:, -1], logits_changed[:, -1])


def test_convnet_updates_batchnorm_running_stats() -> None:
    model, inputs = load_model_file(str(EXAMPLES / "convnet.py"))
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) >= 5 and model.training
    means = [bn.running_mean for bn in bns if isinstance(bn.running_mean, torch.Tensor)]
    assert len(means) == len(bns)
    before = [mean.clone() for mean in means]
    model(*inputs)
    assert all(not torch.equal(b, m) for b, m in zip(before, means, strict=True))
