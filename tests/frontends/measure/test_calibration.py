"""The ``device`` cost model's calibration: ops timed alone, the rest priced by a fitted roofline."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from frontends.capture.step import capture
from frontends.measure import calibration
from frontends.measure.calibration import calibrate, kernel_family
from frontends.measure.costs import CostModel, op_bytes_moved, op_flops

BASE = CostModel(name="device:test", peak_flops=1e12, bandwidth=1e11, launch_s=1e-6, calibrate=True)
TRUE_FLOPS, TRUE_BANDWIDTH, TRUE_LAUNCH = 2e9, 5e9, 3e-6
"""The synthetic device the fit must recover: far from ``BASE``'s rates."""


def _mlp() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 1))
    return model, (torch.randn(32, 64),)


def _joint(model, inputs) -> torch.fx.GraphModule:
    return capture(model, inputs).gm


def _synthetic_seconds(node: torch.fx.Node, sizes) -> float:
    """What the synthetic device takes: a roofline at TRUE_* rates."""
    flops = op_flops(node, sizes) if kernel_family(node) != "memory" else 0.0
    return max(flops / TRUE_FLOPS, op_bytes_moved(node, sizes) / TRUE_BANDWIDTH) + TRUE_LAUNCH


@pytest.fixture(autouse=True)
def _fresh_cache():
    calibration.clear_cache()
    yield
    calibration.clear_cache()


def test_ops_are_priced_at_their_measured_time_and_the_user_state_is_untouched() -> None:
    model, inputs = _mlp()
    gm = _joint(model, inputs)
    before = [p.detach().clone() for p in model.parameters()]
    rng = torch.random.get_rng_state()
    priced = calibrate(gm, BASE, time_budget_s=60.0)
    assert torch.equal(rng, torch.random.get_rng_state())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert priced.calibration.timed_ops == priced.calibration.ops > 10
    assert not priced.calibrate  # a priced model is not calibrated again
    for node in [n for n in gm.graph.nodes if n.op == "call_function"]:
        if node.name in priced.node_seconds:
            assert priced.op_seconds(node, 0.0, 0.0) == priced.node_seconds[node.name] > 0
    # the two 128 x 128 layers' forward matmuls share a signature, so one measured price
    addmms = [n for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.addmm.default)
              if n.meta["val"].shape == (32, 128) and n.args[2].meta["val"].shape == (128, 128)]
    assert len(addmms) == 2
    assert priced.node_seconds[addmms[0].name] == priced.node_seconds[addmms[1].name]


def test_the_fitted_roofline_prices_the_ops_not_timed(monkeypatch) -> None:
    """Time only the most expensive half (by a budget): the roofline fitted to them recovers the
    device's rates and prices the other half as the device would run them."""
    monkeypatch.setattr(calibration, "_time_alone", _synthetic_seconds)
    gm = _joint(*_mlp())
    everything = calibrate(gm, BASE, time_budget_s=60.0)
    assert everything.family_flops["matmul"] == pytest.approx(TRUE_FLOPS, rel=0.05)
    assert everything.bandwidth == pytest.approx(TRUE_BANDWIDTH, rel=0.05)
    assert everything.launch_s == pytest.approx(TRUE_LAUNCH, rel=0.05)

    calibration.clear_cache()
    half = everything.calibration.timed_seconds / 2
    spent = iter(range(10**6))
    monkeypatch.setattr(calibration.time, "perf_counter", lambda: next(spent) * half / 10)
    partial = calibrate(gm, BASE, time_budget_s=half)  # each timing "takes" half / 10 s
    assert 0 < partial.calibration.timed_ops < partial.calibration.ops
    untimed = [n for n in [n for n in gm.graph.nodes if n.op == "call_function"]
               if n.name in everything.node_seconds and n.name not in partial.node_seconds]
    assert untimed
    for node in untimed:
        predicted = partial.op_seconds(node, op_flops(node), op_bytes_moved(node))
        assert predicted == pytest.approx(everything.node_seconds[node.name], rel=0.1), node.format_node()


def test_timings_are_cached_and_an_op_that_cannot_run_alone_is_priced_by_the_roofline(monkeypatch) -> None:
    calls: list[str] = []

    def timed(node, sizes):
        calls.append(node.name)
        return None if node.target is torch.ops.aten.gelu.default else _synthetic_seconds(node, sizes)

    monkeypatch.setattr(calibration, "_time_alone", timed)
    gm = _joint(*_mlp())
    first = calibrate(gm, BASE, time_budget_s=60.0)
    assert calls and len(calls) < first.calibration.ops  # repeated signatures timed once
    gelu = next(iter(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.gelu.default)))
    assert gelu.name not in first.node_seconds
    flops, moved = op_flops(gelu), op_bytes_moved(gelu)
    assert first.op_seconds(gelu, flops, moved) == pytest.approx(moved / first.bandwidth + first.launch_s)
    calls.clear()
    again = calibrate(gm, BASE, time_budget_s=60.0)
    assert calls == [] and again.calibration.spent_s == 0.0
    assert again.node_seconds == first.node_seconds
    nothing = calibrate(_joint(nn.Linear(8, 8), (torch.randn(4, 8),)), BASE, time_budget_s=0.0)
    assert nothing.calibration.timed_ops == 0 and nothing.bandwidth == BASE.bandwidth


def test_capture_with_the_device_model_prices_the_graph_by_calibration(monkeypatch) -> None:
    monkeypatch.setattr(calibration, "_time_alone", _synthetic_seconds)
    model, inputs = _mlp()
    graph = capture(model, inputs, cost_model=BASE).graph
    plain = capture(model, inputs, cost_model=CostModel(name="device:test", peak_flops=1e12, bandwidth=1e11,
                                                        launch_s=1e-6)).graph
    assert graph.cost_model == plain.cost_model == "device:test"
    calibrated = sum(n.cost for n in graph.ops)
    roofline = sum(n.cost for n in plain.ops)
    assert calibrated > 5 * roofline  # the synthetic device is far slower than BASE's datasheet
