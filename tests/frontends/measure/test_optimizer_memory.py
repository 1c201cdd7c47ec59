"""Optimizer memory measured on fake tensors (frontends.measure.optimizer_memory) equals what the
real optimizer keeps and allocates on the CPU, and a whole training loop measures as planned."""

from __future__ import annotations

import copy

import pytest
import torch

from frontends.measure.loop import measure_training_loop, state_tensors
from frontends.measure.memory_tracker import track_live_memory
from frontends.measure.optimizer_memory import (
    OptimizerSpecError,
    make_optimizer,
    optimizer_memory,
)
from frontends.measure.step import unique_storage_bytes


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 8))


def _real(model: torch.nn.Module, make) -> tuple[int, int]:
    """(state bytes, second step's transient peak) of the real optimizer on a copy."""
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = torch.randn_like(p) if p.requires_grad else None
    opt = make(model)
    opt.step()
    with track_live_memory() as step:
        opt.step()
    return unique_storage_bytes(state_tensors(opt)), step.result.peak_bytes


INSTANCES = {
    "AdamW single-tensor": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1, foreach=False),
    "AdamW foreach": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True),
    "Adam amsgrad": lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, amsgrad=True),
    "SGD momentum": lambda m: torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9),
    "two groups": lambda m: torch.optim.AdamW([{"params": m[0].parameters(), "lr": 1e-3},
                                               {"params": m[2].parameters(), "weight_decay": 0.0}], lr=1e-4),
}


@pytest.mark.parametrize("name", INSTANCES)
def test_an_instance_measures_as_the_real_optimizer_keeps_and_allocates(name):
    model = _model()
    real_state, real_step = _real(model, INSTANCES[name])
    measured = optimizer_memory(INSTANCES[name](model))
    assert (measured.state_bytes, measured.step_bytes) == (real_state, real_step)
    assert real_state > 0
    assert measured.measured


def test_descriptions_measure_as_torchs_own_optimizers():
    model = _model()
    params = list(model.parameters())
    adamw = optimizer_memory("adamw", params)
    assert (adamw.state_bytes, adamw.step_bytes) == _real(model, lambda m: torch.optim.AdamW(m.parameters()))
    momentum = optimizer_memory("SGD-Momentum", params)
    assert momentum.state_bytes == sum(p.numel() * 4 for p in params)
    assert optimizer_memory("sgd", params).state_bytes == 0
    assert adamw.name == "adamw (single-tensor)"


def test_frozen_parameters_have_no_state():
    model = _model()
    model[0].requires_grad_(False)
    trained = sum(p.numel() * 4 for p in model[2].parameters())
    state = optimizer_memory("sgd-momentum", list(model.parameters())).state_bytes
    assert state == trained


def test_cuda_parameters_take_the_foreach_path_and_keep_step_counters_on_the_host():
    """On a CUDA target torch defaults to foreach: one whole group's sqrt at once; the ``step``
    counters are host tensors, not device memory. Measured on fake CUDA tensors (no GPU needed)."""
    params = list(_model().parameters())
    on_cuda = optimizer_memory("adamw", params, device="cuda")
    on_cpu = optimizer_memory("adamw", params)
    n_bytes = sum(p.numel() * 4 for p in params)
    assert on_cuda.name == "adamw (foreach)"
    assert on_cuda.state_bytes == 2 * n_bytes
    assert on_cpu.state_bytes == 2 * n_bytes + 4 * len(params)  # the CPU holds the counters too
    assert on_cuda.step_bytes == n_bytes  # _foreach_sqrt's copies of the whole group


def test_a_model_on_the_meta_device_is_measured_without_memory():
    with torch.device("meta"):
        big = torch.nn.Linear(8192, 8192)
    memory = optimizer_memory("adamw", list(big.parameters()), device="cuda")
    assert memory.state_bytes == 2 * 4 * (8192 * 8192 + 8192)


def test_eight_bit_adamw_is_estimated_from_its_layout():
    params = [torch.zeros(4096, requires_grad=True), torch.zeros(10, requires_grad=True)]
    memory = optimizer_memory("adamw-8bit", params)
    assert memory.state_bytes == 2 * 4096 + 2 * 4 * 16 + 2 * 4 * 10
    assert not memory.measured
    with pytest.raises(OptimizerSpecError, match="bitsandbytes"):
        make_optimizer("adamw-8bit", params)


@pytest.mark.parametrize("bad", ["lamb", 3, torch.nn.Linear(2, 2)])
def test_an_unknown_optimizer_is_refused_naming_what_to_pass(bad):
    with pytest.raises(OptimizerSpecError, match="torch.optim.Optimizer instance or one of 'adamw'"):
        optimizer_memory(bad, list(_model().parameters()))


def test_an_optimizer_that_cannot_be_rebuilt_says_to_pass_a_description():
    class Needy(torch.optim.SGD):
        def __init__(self, params, required):
            super().__init__(params, lr=0.1)

    model = _model()
    with pytest.raises(OptimizerSpecError, match="pass a description"):
        optimizer_memory(Needy(model.parameters(), 1))


def test_the_loop_measurement_counts_the_state_and_the_accumulated_gradients():
    model = _model()
    x = torch.randn(32, 64)
    params = sum(p.numel() * 4 for p in model.parameters())

    class Loss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x).square().mean()

    wrapped, other = Loss(model), Loss(copy.deepcopy(model))
    once = measure_training_loop(wrapped, (x,), None, torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9))
    twice = measure_training_loop(other, (x,), None, torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9),
                                  grad_accumulation=2)
    assert once.optimizer_state_bytes == params
    assert len(once.iteration_peaks) == 2 and once.iteration_peaks[0] == once.iteration_peaks[1]
    assert twice.peak_bytes == once.peak_bytes + params  # gradients held while the next micro-batch runs
