"""Largest batch that fits: the search, meta-device capture at any batch, and dtype what-ifs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from frontends.capture.meta_capture import MetaCapturer, infer_batch, inputs_at_batch, meta_copy
from frontends.capture.step import capture
from solvers.base import SolverOptions
from solvers.baselines import store_all_schedule
from solvers.ir.allocator import AllocatorModel
from solvers.ir.simulator import simulate
from solvers.planning.batch_search import BatchFit, cheap_fit, find_max_batches, search_max_batch
from solvers.planning.sweep import SweepPoint, run_sweep


class TinyNet(nn.Module):
    """Two Linear layers and a cross-entropy loss: a few dozen nodes, captured in well under a second."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 10)

    def forward(self, x, labels):
        return nn.functional.cross_entropy(self.fc2(torch.tanh(self.fc1(x))), labels)


def tiny():
    torch.manual_seed(0)
    return TinyNet(), (torch.randn(8, 16), torch.randint(0, 10, (8,)))


def store_all_peak(step) -> int:
    return simulate(step.graph, store_all_schedule(step.graph)).peak_bytes


def evaluate(step, strategy: str, budget: int) -> SweepPoint | None:
    return run_sweep(step.graph, [budget], strategies=(strategy,),
                     options=SolverOptions(time_limit_s=10)).best_at(strategy, budget)


@pytest.mark.parametrize("start", [1, 8, 50, 5000])
@pytest.mark.parametrize("largest", [1, 2, 37, 64, 1000])
def test_search_finds_the_last_batch_that_fits(largest, start):
    tried = []
    batch, capped, probes = search_max_batch(lambda b: tried.append(b) or b <= largest, 4096, start)
    assert (batch, capped) == (largest, False)
    assert len(tried) == len(set(tried)) <= 2 * 13 + 1  # exponential, then binary: O(log limit)
    assert (largest, True) in probes and (largest + 1, False) in probes


def test_search_reports_nothing_fits_and_the_limit():
    assert search_max_batch(lambda b: False, start=64)[:2] == (0, False)
    assert search_max_batch(lambda b: True, limit=100)[:2] == (100, True)
    assert search_max_batch(lambda b: True, limit=100, start=100)[2] == ((100, True),)


def test_store_all_max_batch_fits_and_one_more_does_not():
    model, inputs = tiny()
    capturer = MetaCapturer(model, inputs)
    budget = store_all_peak(capturer.at(21)) + 100
    result = find_max_batches(capturer, budget, ("store-all", "recompute-all"), evaluate, limit=1024)
    fit = result.fits[0]
    assert (result.batch_dim, result.base_batch) == (0, 8) and not fit.capped
    # checked against the simulator on independent captures of the original (non-meta) model
    for batch, fits in ((fit.max_batch, True), (fit.max_batch + 1, False)):
        step = capture(model, inputs_at_real_batch(inputs, batch))
        assert (store_all_peak(step) <= budget) is fits, batch
    assert fit.max_batch == 21
    assert fit.point.peak_bytes <= budget and fit.point.extra_time_s == 0
    assert fit.samples_per_s == pytest.approx(21 / fit.step_time_s)
    lean = result.fits[1]  # recomputation buys a larger batch, at a price in samples/s per batch
    assert lean.max_batch >= fit.max_batch and lean.point.extra_time_s > 0
    assert result.captures == len({b for f in result.fits for b, _ in f.probes})


def inputs_at_real_batch(inputs, batch):
    torch.manual_seed(1)
    return (torch.randn(batch, 16), torch.randint(0, 10, (batch,)))


def test_meta_capture_allocates_nothing_and_matches_real_capture():
    model, inputs = tiny()
    meta_model = meta_copy(model)
    assert all(p.device.type == "meta" for p in meta_model.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())  # the user's model is untouched
    meta_step = MetaCapturer(model, inputs).at(12)
    real_step = capture(model, inputs_at_real_batch(inputs, 12))
    assert [(n.name, n.bytes) for n in meta_step.graph.nodes] == [(n.name, n.bytes) for n in real_step.graph.nodes]


def test_tied_parameters_stay_tied_on_meta():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    copy = meta_copy(model)
    assert copy[1].weight is copy[0].weight and copy[0].weight.device.type == "meta"


def test_batch_dimension_inference_and_resizing():
    x, y, mask = torch.zeros(8, 3), torch.zeros(8, dtype=torch.long), torch.zeros(3, 3)
    assert infer_batch((x, y, mask, 2.0), None) == (0, 8)
    assert infer_batch((torch.zeros(3, 5, 2),), 1) == (1, 5)
    assert infer_batch((1.0,), None) == (None, None)
    with pytest.raises(ValueError, match="batch-dim"):
        infer_batch((x,), 4)
    bx, by, bmask, flag = inputs_at_batch((x, y, mask, 2.0), 0, 8, 40, torch.bfloat16)
    assert bx.shape == (40, 3) and bx.dtype == torch.bfloat16 and bx.device.type == "meta"
    assert by.shape == (40,) and by.dtype == torch.long
    assert bmask.shape == (3, 3) and flag == 2.0  # not batched: left as they are


def test_bf16_halves_parameters_and_float_activations():
    model, inputs = tiny()
    fp32 = MetaCapturer(model, inputs).at()
    bf16 = MetaCapturer(model, inputs, dtype="bf16").at()
    assert bf16.graph.parameter_bytes * 2 == fp32.graph.parameter_bytes
    assert store_all_peak(bf16) < 0.6 * store_all_peak(fp32)
    with pytest.raises(ValueError, match="unknown dtype"):
        MetaCapturer(model, inputs, dtype="int3")


def test_no_batch_dimension_is_a_clear_error():
    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, scale: float):
            return (self.w * scale).sum()

    capturer = MetaCapturer(Constant(), (2.0,))
    with pytest.raises(ValueError, match="no batch dimension"):
        find_max_batches(capturer, 10**6, ("store-all",), evaluate)


def test_samples_per_s_counts_the_recomputation():
    point = SweepPoint("chen", "ok", peak_bytes=10, extra_time_s=0.5)
    assert BatchFit("chen", 10, False, point, 1.5, ()).samples_per_s == pytest.approx(5.0)
    assert BatchFit("chen", 0, False, None, None, ()).samples_per_s is None


def test_bounds_answer_the_same_max_batch_with_fewer_solves():
    model, inputs = tiny()
    capturer = MetaCapturer(model, inputs)
    budget = 4 * store_all_peak(capturer.at(8))
    options = SolverOptions(time_limit_s=10)
    solves = {"slow": 0, "fast": 0}

    def counted(kind):
        def run(step, strategy, budget_bytes):
            solves[kind] += 1
            return evaluate(step, strategy, budget_bytes)
        return run

    def decide(step, strategy, budget_bytes):
        return cheap_fit(step.graph, budget_bytes, AllocatorModel(block_bytes=1), strategy == "remat-opt", options)

    strategies = ("remat-opt", "chen-greedy", "greedy")
    slow = find_max_batches(capturer, budget, strategies, counted("slow"))
    fast = find_max_batches(capturer, budget, strategies, counted("fast"), decide=decide)
    assert [f.max_batch for f in fast.fits] == [f.max_batch for f in slow.fits]
    assert all(f.point is not None and f.point.peak_bytes <= budget for f in fast.fits)
    assert solves["fast"] < solves["slow"]
