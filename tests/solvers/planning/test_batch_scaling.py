"""Graphs at any batch from captures at three: exact where sizes are affine in the batch, refused
where they are not; the largest-batch answers equal the slow path's (a capture per probe)."""

from __future__ import annotations

import os

import pytest
import torch
from test_max_batch import tiny
from torch import nn

from frontends.capture.meta_capture import MetaCapturer
from optimizer.whatif import WhatIfRequest, what_if
from solvers.base import SolverOptions
from solvers.planning.batch_search import search_max_batch, search_near
from solvers.planning.parallel import map_forked


class Similarity(nn.Module):
    """A contrastive loss: its batch x batch logits grow with the square of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 8)

    def forward(self, x):
        z = self.proj(x)
        return torch.logsumexp(z @ z.t(), dim=1).mean()


def test_fitted_graph_equals_the_capture_inside_the_checked_range():
    model, inputs = tiny()
    capturer = MetaCapturer(model, inputs)
    assert capturer.fit_scaling() and capturer.check_scaling(500)
    assert capturer.scaling.checked == (8, 500)
    captures = capturer.captures
    for batch in (9, 123, 499):
        predicted = capturer.graph_at(batch)
        assert capturer.captures == captures  # answered without a capture
        real = MetaCapturer(model, inputs).at(batch).graph
        assert predicted.nodes == real.nodes  # bytes, temporaries, FLOPs and costs, node for node
        assert predicted.base_cost == real.base_cost


def test_sizes_quadratic_in_the_batch_are_refused_and_captured():
    torch.manual_seed(0)
    capturer = MetaCapturer(Similarity(), (torch.randn(4, 16),))
    assert capturer.fit_scaling()  # two batches always fit a line ...
    assert not capturer.check_scaling(40)  # ... the third shows it is not one
    assert capturer.scaling is None and "not affine" in capturer.scaling_note
    captures = capturer.captures
    graph = capturer.graph_at(17)
    assert capturer.captures == captures + 1  # captured, not predicted
    assert graph.nodes == MetaCapturer(Similarity(), (torch.randn(4, 16),)).at(17).graph.nodes


@pytest.mark.parametrize("guess", [1, 30, 36, 37, 38, 60, 900])
@pytest.mark.parametrize("largest", [0, 1, 37, 64])
def test_search_near_finds_the_last_batch_that_fits(largest, guess):
    tried = []
    batch, capped, probes = search_near(lambda b: tried.append(b) or b <= largest, 4096, start=guess)
    assert (batch, capped) == (largest, False)
    assert len(tried) == len(set(tried))
    distance = abs(guess - largest) + 1
    assert len(tried) <= 2 * distance.bit_length() + 3
    if guess == largest and largest:
        assert tried == [largest, largest + 1]  # a right guess costs two probes


def test_searches_never_probe_a_batch_known_not_to_fit():
    for search in (search_max_batch, search_near):
        tried = []
        batch, capped, _ = search(lambda b: tried.append(b) or b <= 50, 4096, start=70, high=60)
        assert (batch, capped) == (50, False) and max(tried) < 60
        assert search(lambda b: True, 4096, start=5, high=60)[:2] == (59, False)


def test_forked_map_keeps_order_and_raises_errors():
    offset = 100  # inherited by the forked workers
    assert map_forked(lambda x: x + offset, [3, 1, 2], jobs=2) == [103, 101, 102]
    with pytest.raises(ZeroDivisionError):
        map_forked(lambda x: 1 // x, [1, 0], jobs=2)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores for the forked workers")
def test_fitted_search_gives_the_slow_paths_answers():
    model, inputs = tiny()
    strategies = ("remat-opt", "store-all", "chen", "greedy", "torch-min-cut")

    def answer(bounds: bool, jobs: int = 1):
        request = WhatIfRequest(model_name="tiny", budget="300KB", max_batch=True, plots=False, bounds=bounds,
                                strategies=strategies, options=SolverOptions(time_limit_s=10), jobs=jobs,
                                torch_fractions=(0.0, 0.5, 1.0), batch_limit=4096)
        return what_if(model, inputs, request).max_batch

    slow, fast, parallel = answer(False), answer(True), answer(True, jobs=2)
    assert [f.max_batch for f in fast.fits] == [f.max_batch for f in slow.fits]
    assert [f.max_batch for f in parallel.fits] == [f.max_batch for f in slow.fits]
    assert all(f.max_batch > 8 for f in slow.fits)  # the search had to grow the batch
    assert fast.captures < slow.captures / 2
    for f in fast.fits:
        assert f.point is not None and f.point.peak_bytes <= 300_000
