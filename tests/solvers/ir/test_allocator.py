"""Allocator realism: exact block rounding, and reserve + margin that budgets can be inverted for."""

from __future__ import annotations

import pytest
from graphs import random_graph, tiny_chain
from hypothesis import given
from hypothesis import strategies as st

from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.ir.allocator import (
    CPU_ALLOCATOR,
    CUDA_ALLOCATOR,
    AllocatorModel,
    allocator_for,
    round_block,
)
from solvers.ir.simulator import simulate


@pytest.mark.parametrize(
    ("nbytes", "rounded"),
    [(0, 0), (1, 512), (4, 512), (511, 512), (512, 512), (513, 1024), (1_048_576, 1_048_576),
     (1_048_577, 1_049_088), (3 * 4 * 1024 * 1024 + 1, 12_583_424)],
)
def test_round_block_is_exact(nbytes: int, rounded: int) -> None:
    assert round_block(nbytes) == rounded


def test_round_block_other_sizes() -> None:
    assert round_block(13, block=1) == 13
    assert round_block(13, block=8) == 16
    with pytest.raises(ValueError):
        round_block(-1)
    with pytest.raises(ValueError):
        round_block(10, block=0)


def test_apply_rounds_every_value_and_nothing_else() -> None:
    graph = tiny_chain()
    rounded = CUDA_ALLOCATOR.apply(graph)
    assert rounded.cost_model == graph.cost_model and rounded.name == graph.name
    for before, after in zip(graph.nodes, rounded.nodes, strict=True):
        assert after.bytes == round_block(before.bytes)
        assert after.temp_bytes == round_block(before.temp_bytes)
        assert ((after.name, after.cost, after.inputs, after.group)
                == (before.name, before.cost, before.inputs, before.group))
    # Every tiny_chain value fits one 512-byte block: resident p, x (2 blocks); a, b, loss (5);
    # the tangent (6); gb while b and t are still live (7 blocks). Unrounded, gp (100 B) peaked.
    result = simulate(rounded, store_all_schedule(rounded))
    assert (result.peak_bytes, result.peak_node) == (7 * 512, "gb")


def test_cpu_allocator_changes_nothing() -> None:
    graph = tiny_chain()
    assert CPU_ALLOCATOR.apply(graph) is graph
    assert CPU_ALLOCATOR.planned_peak(1234) == 1234
    assert allocator_for("cpu") is CPU_ALLOCATOR and allocator_for("cuda") is CUDA_ALLOCATOR


@given(st.integers(min_value=0, max_value=30))
def test_rounding_never_lowers_a_peak(seed: int) -> None:
    graph = random_graph(seed)
    rounded = CUDA_ALLOCATOR.apply(graph)
    for schedule in (store_all_schedule, recompute_all_schedule):
        assert simulate(rounded, schedule(rounded)).peak_bytes >= simulate(graph, schedule(graph)).peak_bytes


def test_planned_peak_adds_margin_then_reserve() -> None:
    model = AllocatorModel(workspace_reserve_bytes=8 << 20, fragmentation_margin=0.05)
    assert model.planned_peak(1_000_000) == 1_050_000 + (8 << 20)
    assert model.planned_peak(0) == 8 << 20
    assert model.solver_budget(1000) == 0  # the reserve alone is larger than the budget


@given(
    budget=st.integers(min_value=0, max_value=10**12),
    reserve=st.integers(min_value=0, max_value=10**9),
    margin=st.floats(min_value=0.0, max_value=0.5),
)
def test_solver_budget_inverts_planned_peak(budget: int, reserve: int, margin: float) -> None:
    model = AllocatorModel(workspace_reserve_bytes=reserve, fragmentation_margin=margin)
    simulated = model.solver_budget(budget)
    if simulated > 0:
        assert model.planned_peak(simulated) <= budget
    if budget > reserve:
        assert model.planned_peak(simulated + 1) > budget


def test_invalid_models_are_rejected() -> None:
    with pytest.raises(ValueError):
        AllocatorModel(block_bytes=0)
    with pytest.raises(ValueError):
        AllocatorModel(workspace_reserve_bytes=-1)
    with pytest.raises(ValueError):
        AllocatorModel(fragmentation_margin=1.5)
