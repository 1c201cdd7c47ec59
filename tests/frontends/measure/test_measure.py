"""A measured training step matches the simulator's predicted peak on every example."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from frontends.capture.model_file import load_model_file
from frontends.capture.step import capture
from frontends.graph_runtime.remat_module import RematModule
from frontends.measure.step import StepMeasurement, measure_step
from solvers.planning.planner import plan_graph

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
UNLIMITED = 10**12


@pytest.mark.parametrize("solver", ["store-all", "recompute-all"])
@pytest.mark.parametrize("name", ["mlp", "gpt", "convnet"])
def test_measured_peak_matches_prediction(name: str, solver: str) -> None:
    model, inputs = load_model_file(str(EXAMPLES / f"{name}.py"))
    captured = capture(model, inputs)
    plan = plan_graph(captured.graph, UNLIMITED, solver)
    module = RematModule(model, captured, plan, inputs)
    measured = measure_step(module, inputs, warmup=0, repeats=1)
    assert measured.device == "cpu"
    assert measured.peak_bytes == pytest.approx(plan.predicted_peak_bytes, rel=0.02)
    resident = captured.graph.resident_bytes
    assert measured.resident_bytes == resident
    assert measured.step_peak_bytes == measured.peak_bytes - resident


def test_plain_model_step_and_gradients_cleared() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    x = torch.randn(32, 64)

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.net(x)
            return y.square().mean(), y

    result = measure_step(Loss(), (x,), warmup=1, repeats=3)
    assert isinstance(result, StepMeasurement) and result.repeats == 3
    assert result.step_time_s > 0
    params = sum(p.numel() * 4 for p in model.parameters())
    assert result.resident_bytes == params + x.numel() * 4
    # Gradients are allocated inside the step: the peak holds at least the resident bytes plus them.
    assert result.peak_bytes >= result.resident_bytes + params
    assert all(p.grad is None for p in model.parameters())


def test_non_scalar_loss_is_refused() -> None:
    with pytest.raises(ValueError, match="scalar loss"):
        measure_step(nn.Linear(4, 4), (torch.randn(2, 4),), warmup=0, repeats=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_is_max_memory_allocated() -> None:
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)).cuda()
    x = torch.randn(256, 1024, device="cuda")

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).mean()

    result = measure_step(Loss(), (x,), warmup=1, repeats=2)
    assert result.device.startswith("cuda")
    params = sum(p.numel() * 4 for p in model.parameters())
    assert result.resident_bytes >= params + x.numel() * 4
    assert result.peak_bytes >= result.resident_bytes + params  # gradients, at least
