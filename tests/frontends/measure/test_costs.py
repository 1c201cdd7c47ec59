"""Cost models: the device table, and roofline times that match hand computation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from frontends.capture.step import capture
from frontends.measure.costs import (
    FLOP_COUNT_MODEL,
    FLOPS_MODEL,
    GPU_LAUNCH_S,
    PROFILE_MODEL,
    CostModel,
    check_cost_model_name,
    cost_model_from_name,
    model_dtype,
    op_bytes_moved,
    op_flops,
    roofline_model,
)
from frontends.measure.devices import DEVICES, PRECISIONS, device_of_product, get_device
from optimizer import optimize

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


# ------------------------------------------------------------------ time on the model's device
@pytest.mark.parametrize(("product", "memory_gb", "expected"), [
    ("NVIDIA H100 80GB HBM3", 80, "h100"), ("NVIDIA H200", 141, "h200"),
    ("NVIDIA A100-SXM4-40GB", 40, "a100-40gb"), ("NVIDIA A100 80GB PCIe", 80, "a100-80gb"),
    ("NVIDIA L4", 24, "l4"), ("NVIDIA L40S", 48, None), ("NVIDIA GeForce RTX 4090", 24, "rtx4090"),
    ("Tesla V100-SXM2-32GB", 32, "v100"), ("Tesla T4", 16, "t4"), ("NVIDIA B200", 180, None),
])
def test_the_gpu_cuda_names_is_found_in_the_table(product, memory_gb, expected) -> None:
    spec = device_of_product(product, memory_gb * 10**9)
    assert (spec.name if spec else None) == expected


def _pretend_cuda(monkeypatch, product: str, memory_bytes: int) -> None:
    class Properties:
        total_memory = memory_bytes

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: product)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: Properties())


def test_auto_prices_time_on_the_gpu_and_flops_elsewhere(monkeypatch) -> None:
    assert cost_model_from_name("auto", device=torch.device("cpu")) is FLOPS_MODEL
    assert cost_model_from_name("auto") is FLOPS_MODEL
    assert cost_model_from_name("auto", device=torch.device("meta")) is FLOPS_MODEL
    _pretend_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", 85 * 10**9)
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=False))
    h100 = cost_model_from_name("auto", device=torch.device("cuda"))
    assert h100 == CostModel(name="device:h100", peak_flops=67e12, bandwidth=3350e9,
                             launch_s=GPU_LAUNCH_S, causal_attention=True, calibrate=True)
    assert cost_model_from_name("device", dtype=torch.bfloat16, device=torch.device("cuda:0")).peak_flops == 989.5e12
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=True))
    assert cost_model_from_name("auto", device=torch.device("cuda")).peak_flops == 494.5e12
    _pretend_cuda(monkeypatch, "NVIDIA B200", 180 * 10**9)
    with pytest.raises(ValueError, match="'profile'.*roofline:<device>"):
        cost_model_from_name("auto", device=torch.device("cuda"))


def test_device_on_the_cpu_is_measured_once() -> None:
    model = cost_model_from_name("device", device=torch.device("cpu"))
    assert model.name == "device:cpu" and model.causal_attention
    assert model.peak_flops > 1e8 and model.bandwidth > 1e8 and 0 < model.launch_s < 1e-3
    assert cost_model_from_name("device", device=torch.device("cpu")) is model  # cached
    assert model.seconds(0.0, 0.0) == model.launch_s  # every kernel pays its launch
    with pytest.raises(ValueError, match="roofline:<device>"):
        cost_model_from_name("device", device=torch.device("meta"))
    with pytest.raises(ValueError, match="auto, device, flops"):
        check_cost_model_name("fastest")
    assert check_cost_model_name("roofline:H200") == "roofline:H200"


class _CausalAttention(nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.causal = causal

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 64, 3, 2, 16).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal).sum()


@pytest.mark.parametrize("causal", [True, False])
def test_a_causal_attention_kernel_costs_half_its_counted_flops(causal) -> None:
    """On a roofline where FLOPs dominate, the kernel-aware model prices a causal SDPA kernel
    (forward and backward) at half of what the plain one does; a non-causal one the same."""
    compute_bound = {"peak_flops": 1e12, "bandwidth": 1e18}
    aware = CostModel(name="aware", causal_attention=True, **compute_bound)
    plain = CostModel(name="plain", **compute_bound)
    x = torch.randn(2, 64, 32)

    def attention_costs(model: CostModel) -> list[float]:
        torch.manual_seed(0)
        graph = capture(_CausalAttention(causal), (x,), cost_model=model).graph
        return [n.cost for n in graph.ops if "scaled_dot_product" in n.op and n.cost]

    aware_costs, plain_costs = attention_costs(aware), attention_costs(plain)
    assert len(aware_costs) == 2  # forward and backward kernels
    ratio = 0.5 if causal else 1.0
    assert aware_costs == pytest.approx([c * ratio for c in plain_costs], rel=1e-12)


def test_optimize_with_the_device_cost_model_on_the_cpu() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 1))
    x = torch.randn(128, 64)
    rm = optimize(model, (x,), "92%", cost_model="device", time_limit=5)
    assert rm.plan.cost_model == "device:cpu"
    assert rm.plan.recomputed
    default = optimize(model, (x,), "92%", time_limit=5)
    assert default.plan.cost_model == "flops"  # auto on the CPU
