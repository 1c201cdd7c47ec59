"""Cost models: the device table, and roofline times that match hand computation."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from frontends.capture.step import capture
from frontends.measure.costs import (
    FLOP_COUNT_MODEL,
    FLOPS_MODEL,
    PROFILE_MODEL,
    CostModel,
    cost_model_from_name,
    model_dtype,
    op_bytes_moved,
    op_flops,
    roofline_model,
)
from frontends.measure.devices import DEVICES, PRECISIONS, get_device

N = 1024
MATMUL_FLOPS = 2 * N**3
FLOAT_BYTES = N * N * 4


def _only_op(fn, *args) -> torch.fx.Node:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    return node


@pytest.fixture(scope="module")
def mm_node() -> torch.fx.Node:
    return _only_op(torch.mm, torch.empty(N, N), torch.empty(N, N))


@pytest.fixture(scope="module")
def add_node() -> torch.fx.Node:
    return _only_op(torch.add, torch.empty(N, N), torch.empty(N, N))


def _time(model: CostModel, node: torch.fx.Node) -> float:
    return model.seconds(op_flops(node), op_bytes_moved(node))


def test_known_devices_are_listed() -> None:
    required = {"h100", "h200", "a100-80gb", "a100-40gb", "l4", "rtx4090", "v100", "t4", "cpu-nominal"}
    assert required <= set(DEVICES)
    for name, spec in DEVICES.items():
        assert spec.name == name and spec.source
        assert spec.bandwidth > 0 and spec.memory_bytes > 0
        assert all(spec.peak(p) > 0 for p in PRECISIONS)
        assert spec.fp16 >= spec.fp32 and spec.tf32 >= spec.fp32


def test_tensor_core_figures_are_dense_not_sparse() -> None:
    h100 = get_device("h100")
    assert h100.bf16 == 989.5e12 and h100.tf32 == 494.5e12  # datasheet 1,979 / 989 with sparsity
    assert get_device("a100-80gb").bf16 == 312e12  # datasheet: 312 dense, 624 sparse
    assert get_device("H200").bandwidth == 4.8e12 and get_device("h200").memory_bytes == 141 * 10**9


def test_unknown_device_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="h100") as info:
        roofline_model("b9000", torch.float32)
    assert "unknown device 'b9000'" in str(info.value)
    with pytest.raises(ValueError, match="precision"):
        get_device("h100").peak("fp8")
    with pytest.raises(ValueError, match="dtype"):
        roofline_model("h100", torch.int8)


def test_matmul_time_is_flops_over_peak(mm_node: torch.fx.Node) -> None:
    assert op_flops(mm_node) == MATMUL_FLOPS
    assert op_bytes_moved(mm_node) == 3 * FLOAT_BYTES
    h100 = roofline_model("h100", torch.float32)
    assert h100.name == "roofline:h100"
    assert _time(h100, mm_node) == pytest.approx(MATMUL_FLOPS / 67e12, rel=1e-12)
    tf32 = roofline_model("h100", torch.float32, tf32=True)
    assert _time(tf32, mm_node) == pytest.approx(MATMUL_FLOPS / 494.5e12, rel=1e-12)


def test_matmul_on_bandwidth_starved_device_is_bytes_bound(mm_node: torch.fx.Node) -> None:
    # bf16 on an L4 runs at 121e12 FLOP/s but moves bytes at only 300 GB/s. op_bytes_moved reads
    # the fake float32 values, so the bound is 12 MiB / 300 GB/s = 42 us > 2 GFLOP / 121 TFLOP/s.
    l4 = roofline_model("l4", torch.bfloat16)
    assert _time(l4, mm_node) == pytest.approx(3 * FLOAT_BYTES / 300e9, rel=1e-12)


def test_pointwise_time_is_bytes_over_bandwidth(add_node: torch.fx.Node) -> None:
    assert op_flops(add_node) == 0.0  # not in torch's FLOP registry: priced by bytes only
    h100 = roofline_model("h100", torch.float32)
    assert _time(h100, add_node) == pytest.approx(3 * FLOAT_BYTES / 3.35e12, rel=1e-12)
    assert _time(FLOPS_MODEL, add_node) == pytest.approx(3 * FLOAT_BYTES / 1e11, rel=1e-12)


def test_flop_count_prices_pointwise_at_a_tie_break(mm_node: torch.fx.Node, add_node: torch.fx.Node) -> None:
    # A matmul costs its counted FLOPs (plus a thousandth of its memory time); the add, which
    # FlopCounterMode counts as 0 FLOPs, costs only that thousandth: recomputing it is nearly free.
    mm_time = _time(FLOP_COUNT_MODEL, mm_node)
    assert mm_time == pytest.approx(op_flops(mm_node) / 1e12 + 1e-3 * 3 * FLOAT_BYTES / 1e11, rel=1e-12)
    assert _time(FLOP_COUNT_MODEL, add_node) == pytest.approx(1e-3 * 3 * FLOAT_BYTES / 1e11, rel=1e-12)
    assert _time(FLOP_COUNT_MODEL, add_node) < 1e-3 * _time(FLOPS_MODEL, add_node) * 1.0001
    assert "FlopCounterMode" in FLOP_COUNT_MODEL.describe()


def test_cost_model_lookup_by_name() -> None:
    assert cost_model_from_name("flops") is FLOPS_MODEL
    assert cost_model_from_name("Flop-Count") is FLOP_COUNT_MODEL
    assert cost_model_from_name("profile") is PROFILE_MODEL and PROFILE_MODEL.measured
    model = cost_model_from_name("roofline:A100-40GB", dtype=torch.float16)
    assert model == CostModel(name="roofline:a100-40gb", peak_flops=312e12, bandwidth=1555e9)
    assert cost_model_from_name("roofline:v100", dtype=torch.float64).peak_flops == 7.8e12
    with pytest.raises(ValueError, match="roofline:h100"):
        cost_model_from_name("fastest")
    with pytest.raises(ValueError, match="unknown device"):
        cost_model_from_name("roofline:")


def test_captured_graph_carries_roofline_costs() -> None:
    torch.manual_seed(0)
    model = nn.Linear(256, 128, bias=False)
    x = torch.randn(64, 256)
    roofline = roofline_model("a100-80gb", torch.float32)
    graph = capture(model, (x,), cost_model=roofline).graph
    assert graph.cost_model == "roofline:a100-80gb"
    (forward_mm,) = [n for n in graph.ops if n.op == "aten.mm.default" and n.phase.value == "forward"]
    flops = 2 * 64 * 256 * 128
    bytes_moved = 4 * (64 * 256 + 256 * 128 + 64 * 128)
    assert forward_mm.flops == flops
    assert forward_mm.cost == pytest.approx(max(flops / 19.5e12, bytes_moved / 2039e9), rel=1e-12)


def test_model_dtype() -> None:
    assert model_dtype(nn.Linear(2, 2)) == torch.float32
    assert model_dtype(nn.Linear(2, 2).to(torch.bfloat16)) == torch.bfloat16
    assert model_dtype(nn.ReLU()) == torch.float32
