"""What an eager rerun of a module costs: its forward timed in eager PyTorch, and checkpoint's call.

Checked: every module called once per forward gets a time (a module called twice none, a parent
at least its child's), the model is left as found (BatchNorm statistics, the RNG stream, a
counter its forward moves in Python); in
measured time the candidates carry the timed scale (one per module class, ops and their time) and
checkpoint's cost, in FLOPs neither; and
the planner prices an option's rerun by them.
"""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch
from torch import nn

from frontends.eager_runtime.eager_checkpoint import checkpoint_call_seconds
from frontends.eager_runtime.eager_ops import RERUN_SCALE_RANGE, candidates, eager_graph, held_values
from frontends.eager_runtime.region_timing import time_module_forwards
from frontends.eager_runtime.split_capture import capture_split
from solvers.ir.graph import Phase
from solvers.planning.eager_plan import RegionModel, with_holds, within

pytestmark = pytest.mark.usefixtures("one_thread")


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.norm = nn.BatchNorm1d(d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.relu(self.up(self.norm(x)))))


class Net(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.blocks = nn.ModuleList(Block(d) for _ in range(3))
            self.shared = nn.Linear(d, d)  # called twice per forward

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.shared(x)
        for block in self.blocks:
            x = block(x)
        return nn.functional.mse_loss(self.shared(x), target)


class CountingNet(Net):
    """Counts its calls in Python (what ``python_side_effects="ignore"`` lets through capture)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x, target)


class TanhBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class TanhNet(Net):
    """`Net` with blocks whose checkpoints save memory (no BatchNorm, no dropout): checkpointing a
    dropout alone holds its input, more than the mask it drops."""

    def __init__(self, d: int = 32) -> None:
        super().__init__(d)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.blocks = nn.ModuleList(TanhBlock(d) for _ in range(3))


def inputs(batch: int = 128, d: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, d, generator=g), torch.randn(batch, d, generator=g)


def test_each_module_called_once_is_timed_and_the_model_is_left_as_found():
    model, args = CountingNet(), inputs()
    statistics_before = {n: b.clone() for n, b in model.named_buffers()}
    torch.manual_seed(5)
    expected_next = torch.rand(3)
    torch.manual_seed(5)
    times = time_module_forwards(model, args)
    assert torch.equal(torch.rand(3), expected_next)  # the RNG stream did not move
    assert model.calls == 0  # six forwards ran; the Python state they moved is put back
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, statistics_before[name]), name
    assert "shared" not in times  # called twice per forward: no one rerun to price
    for i in range(3):
        assert times[f"blocks.{i}"] > 0
        for child in ("up", "down", "norm", "drop"):
            assert times[f"blocks.{i}"] >= times[f"blocks.{i}.{child}"] > 0


def test_candidates_carry_the_timed_scale_in_measured_time_and_nothing_in_flops():
    model, args = Net(), inputs()
    captured, trace, *_ = capture_split(model, args, None, 1, "device", "losses", None)
    assert trace.forward_s and "blocks.0" in trace.forward_s
    graph = eager_graph(captured.graph, captured.gm, True)
    found = {c.path: c for c in candidates(graph, trace, model)}
    low, high = RERUN_SCALE_RANGE

    def ratio(path: str) -> float:
        ops_s = sum(graph[m[0]].cost for m in graph.groups.values()
                    if graph[m[0]].phase is Phase.FORWARD and within(graph[m[0]].module, path))
        return trace.forward_s[path] / ops_s

    # the three blocks run the same ops at the same priced time: one scale, the median of
    # their three ratios; so do the three up projections, but not an up and a down projection
    for module in ("", ".up", ".down"):
        shared = statistics.median(ratio(f"blocks.{i}{module}") for i in range(3))
        for i in range(3):
            assert found[f"blocks.{i}{module}"].rerun_scale == pytest.approx(min(max(shared, low), high))
    assert all(c.checkpoint_s == checkpoint_call_seconds() for c in found.values())
    assert all(low <= c.rerun_scale <= high for c in found.values())

    flops_captured, flops_trace, *_ = capture_split(model, args, None, 1, "flops", "losses", None)
    assert flops_trace.forward_s == {}  # not timed: nothing would read it
    flops_graph = eager_graph(flops_captured.graph, flops_captured.gm, True)
    timed_trace = dataclasses.replace(flops_trace, forward_s=trace.forward_s)
    for c in candidates(flops_graph, timed_trace, model):
        assert (c.rerun_scale, c.checkpoint_s) == (1.0, 0.0), c.path


def test_an_options_rerun_is_scaled_and_charged_one_checkpoint_call():
    model, args = TanhNet(), inputs()
    captured, trace, *_ = capture_split(model, args, None, 1, "flops", "losses", None)
    graph = eager_graph(captured.graph, captured.gm, True)
    found = candidates(graph, trace, model)
    graph = with_holds(graph, held_values(graph, trace, found))
    plain = RegionModel(graph, found)
    priced = RegionModel(graph, [dataclasses.replace(c, rerun_scale=2.0, checkpoint_s=0.5) for c in found])
    checked = 0
    for path, options in priced.options.items():
        for before, option in zip(plain.options[path], options):
            assert (before.option, before.saved, before.dropped) == (option.option, option.saved, option.dropped)
            assert option.extra_cost == pytest.approx(2.0 * before.extra_cost + 0.5)
            checked += 1
    assert checked >= 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_forwards_on_cuda_are_timed_by_events():
    model, args = Net(d=256).cuda(), tuple(t.cuda() for t in inputs(batch=4096, d=256))
    before = torch.cuda.memory_allocated()
    times = time_module_forwards(model, args)
    assert torch.cuda.memory_allocated() == before  # nothing saved for a backward is left behind
    for i in range(3):
        assert times[f"blocks.{i}"] >= times[f"blocks.{i}.up"] > 0


def test_a_slow_forward_is_timed_fewer_times(monkeypatch):
    from frontends.eager_runtime import region_timing

    counted = CountingNet()
    monkeypatch.setattr(region_timing, "TIMING_BUDGET_S", 1e-9)  # every forward is "too slow"
    calls = []
    counted.register_forward_pre_hook(lambda module, args: calls.append(1))
    times = time_module_forwards(counted, inputs())
    assert len(calls) == 2  # the warm-up, then one timed forward
    assert times["blocks.0"] > 0
