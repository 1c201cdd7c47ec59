"""Measured per-op costs on CPU: every op timed, cached by graph and device, swapped into the IR.

No tight timing asserts: the machine is noisy. The 15% comparison with a measured step lives in
benchmarks/profile_vs_step.py.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from graphs import tiny_chain

from frontends.capture.step import CapturedStep, capture
from frontends.measure.profile import clear_memory_cache, profile_step, profiled_graph
from frontends.measure.step import measure_step
from solvers.ir.costs_update import with_costs

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Two-thread ops stall for milliseconds when another process holds a core; one is steady."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    clear_memory_cache()
    yield
    torch.set_num_threads(threads)


def _gpt_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpt_for_profile", EXAMPLES / "gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpt() -> tuple[torch.nn.Module, tuple[Any, ...], CapturedStep]:
    module = _gpt_module()
    model, inputs = module.get_model(), module.get_inputs()
    return model, inputs, capture(model, inputs)


def test_every_op_is_timed_and_matmuls_cost_something(gpt) -> None:
    model, inputs, captured = gpt
    profile = profile_step(captured, model, inputs, warmup=1, repeats=3)
    calls = [n for n in captured.gm.graph.nodes if n.op == "call_function"]
    assert [name for name, _ in profile.node_seconds] == [n.name for n in calls]
    matmuls = [n.name for n in calls if n.target in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                                                         torch.ops.aten.addmm.default)]
    assert len(matmuls) >= 30
    assert all(profile.seconds[name] > 0 for name in matmuls)
    assert set(profile.seconds_by_group(captured.graph)) == set(captured.graph.groups)
    assert profile.device.startswith("cpu:") and profile.dtype == "float32"
    assert profile.repeats == 3 and profile.total_seconds > 0 and profile.run_seconds > 0


def test_sum_is_within_a_factor_of_a_measured_step(gpt) -> None:
    model, inputs, captured = gpt
    total = profile_step(captured, model, inputs, warmup=1, repeats=3).total_seconds
    step = measure_step(model, inputs, warmup=1, repeats=3).step_time_s
    assert step / 5 < total < step * 5


def test_profiling_leaves_model_and_random_state_alone(gpt) -> None:
    model, inputs, captured = gpt
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    profile_step(captured, model, inputs, warmup=0, repeats=1)
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())


def test_cache_in_memory_and_on_disk(gpt, tmp_path: Path) -> None:
    model, inputs, captured = gpt
    first = profile_step(captured, model, inputs, warmup=0, repeats=1, cache_dir=tmp_path)
    assert profile_step(captured, model, inputs, warmup=0, repeats=1) is first
    assert (tmp_path / f"{first.key}.json").is_file()
    clear_memory_cache()
    from_disk = profile_step(captured, model, inputs, warmup=0, repeats=1, cache_dir=tmp_path)
    assert from_disk == first and from_disk is not first
    fresh = profile_step(captured, model, inputs, warmup=0, repeats=1, refresh=True)
    assert fresh.key == first.key and fresh is not first


def test_key_depends_on_shapes(gpt) -> None:
    model, inputs, captured = gpt
    idx, targets = inputs
    shorter = (idx[:2].contiguous(), targets[:2].contiguous())
    other = profile_step(capture(model, shorter), model, shorter, warmup=0, repeats=1)
    assert other.key != profile_step(captured, model, inputs, warmup=0, repeats=1).key


def test_profiled_graph_carries_measured_costs(gpt) -> None:
    model, inputs, captured = gpt
    profile = profile_step(captured, model, inputs, warmup=0, repeats=1)
    graph = profiled_graph(captured, model, inputs, warmup=0, repeats=1)
    assert graph.cost_model == "profile"
    by_group = profile.seconds_by_group(captured.graph)
    assert graph.base_cost == pytest.approx(sum(by_group.values()))
    for group, members in graph.groups.items():
        assert graph[members[0]].cost == by_group[group]
        assert all(graph[m].cost == 0.0 for m in members[1:])
        assert graph[members[0]].flops == captured.graph[members[0]].flops


def test_with_costs_replaces_and_checks() -> None:
    graph = tiny_chain()
    seconds = {g: float(i) for i, g in enumerate(graph.groups)} | {"view_1": 9.0}
    updated = with_costs(graph, seconds, "profile")
    assert updated.cost_model == "profile"
    assert [n.cost for n in updated.ops] == [float(i) for i in range(len(graph.ops))]
    assert [n.bytes for n in updated.nodes] == [n.bytes for n in graph.nodes]
    with pytest.raises(ValueError, match="no time"):
        with_costs(graph, {"a": 1.0}, "profile")
    assert with_costs(graph, {"a": 1.0}, "profile", default=0.5).base_cost == 1.0 + 0.5 * (len(graph.ops) - 1)
    with pytest.raises(ValueError, match="finite"):
        with_costs(graph, dict.fromkeys(graph.groups, float("nan")), "profile")
