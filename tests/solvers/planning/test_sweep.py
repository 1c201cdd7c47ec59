"""Budget sweep: parsing, Pareto bookkeeping, and remat-opt's curve against every other strategy."""

from __future__ import annotations

import pytest
from e2e_helpers import small_mlp
from graphs import chain, tiny_chain

from solvers.base import SolverOptions
from solvers.baselines import store_all_schedule
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import BudgetError
from solvers.ir.simulator import simulate
from solvers.planning.sweep import (
    ALL_STRATEGIES,
    REMAT_OPT,
    TORCH_STRATEGY,
    ExternalSchedule,
    Status,
    SweepPoint,
    count_solves,
    pareto_front,
    parse_sweep,
    plan_point,
    run_sweep,
)

EXACT = AllocatorModel(block_bytes=1)


@pytest.fixture(scope="module")
def mlp_sweep():
    from frontends.capture.meta_capture import MetaCapturer
    from optimizer.whatif import _torch_points

    captured = MetaCapturer(*small_mlp()).at()
    options = SolverOptions(time_limit_s=20)
    externals = _torch_points(captured, (0.0, 0.25, 0.5, 0.75, 1.0))
    sweep = run_sweep(captured.graph, parse_sweep("75%:100%:5"), externals=externals, options=options)
    return captured.graph, sweep, options


def test_parse_sweep_ranges_and_lists():
    assert parse_sweep("20%:100%:10") == tuple(f"{p}%" for p in range(20, 101, 10))
    assert parse_sweep("50%:60%:2.5") == ("50%", "52.5%", "55%", "57.5%", "60%")
    assert parse_sweep("1GB:2GB:500MB") == (10**9, 15 * 10**8, 2 * 10**9)
    assert parse_sweep("50%, 70%,2GiB") == ("50%", "70%", 2 * 2**30)
    for bad in ("", "20%:100%", "20%:1GB:10", "100%:20%:10", "20%:100%:0", "abc", "1%:100%:0.01", "x%,5"):
        with pytest.raises(BudgetError):
            parse_sweep(bad)


def _point(strategy, peak, extra):
    return SweepPoint(strategy, Status.OK, peak_bytes=peak, extra_time_s=extra)


def test_pareto_front_drops_dominated_points():
    points = [_point("a", 10, 5.0), _point("a", 12, 5.0), _point("a", 11, 2.0), _point("a", 20, 0.0),
              _point("a", 15, 3.0)]
    front = pareto_front(points)
    assert [(p.peak_bytes, p.extra_time_s) for p in front] == [(10, 5.0), (11, 2.0), (20, 0.0)]


def test_fixed_strategies_are_single_points_and_infeasible_budgets_are_points():
    graph = chain(6)
    store_all_peak = simulate(graph, store_all_schedule(graph)).peak_bytes
    sweep = run_sweep(graph, ["1%", "60%", "100%"], strategies=ALL_STRATEGIES[:-1])
    for name in ("store-all", "recompute-all", "chen", "blocks"):
        assert len(sweep.points_of(name)) == 1 and sweep.points_of(name)[0].budget_bytes is None
    ours = sweep.points_of(REMAT_OPT)
    assert [p.status for p in ours][0] == Status.INFEASIBLE and ours[-1].ok
    assert sweep.store_all_peak_bytes == store_all_peak
    assert sweep.best_at("store-all", store_all_peak - 1) is None
    assert sweep.best_at("store-all", store_all_peak).extra_time_s == 0.0
    assert count_solves(ALL_STRATEGIES, 3) == 4 + 5 * 3


def test_chain_only_strategy_is_not_applicable_once_on_a_branching_graph():
    from graphs import random_graph

    graph = random_graph(0, 8)  # branches around every value: no articulation values
    sweep = run_sweep(graph, ["50%", "80%", "100%"], strategies=("revolve", "chen-greedy"))
    (revolve,) = sweep.points_of("revolve")  # asked once, not once per budget
    assert revolve.status == Status.NOT_APPLICABLE and "chain" in revolve.message
    assert len(sweep.points_of("chen-greedy")) == 3  # linearizes branches: applies at every budget


def test_external_schedules_are_simulated_and_failures_reported():
    graph = tiny_chain()
    good = ExternalSchedule(TORCH_STRATEGY, "amb=1", store_all_schedule(graph))
    bad = ExternalSchedule(TORCH_STRATEGY, "amb=0", None, "torch's partitioner failed: RuntimeError: x")
    sweep = run_sweep(graph, ["100%"], strategies=(TORCH_STRATEGY,), externals=(good, bad))
    ok, failed = sweep.points_of(TORCH_STRATEGY)
    assert ok.peak_bytes == simulate(graph, store_all_schedule(graph)).peak_bytes and ok.extra_time_s == 0
    assert failed.status == Status.FAILED and "RuntimeError" in failed.message


def test_allocator_rounding_is_in_every_peak():
    graph = tiny_chain()
    cuda = AllocatorModel(block_bytes=512)
    sweep = run_sweep(graph, ["100%"], strategies=("store-all", REMAT_OPT), allocator=cuda)
    assert all(p.peak_bytes % 512 == 0 for p in sweep.points if p.ok)
    assert sweep.store_all_peak_bytes == simulate(cuda.apply(graph), store_all_schedule(graph)).peak_bytes


def test_remat_opt_curve_is_monotone(mlp_sweep):
    graph, sweep, _ = mlp_sweep
    ours = sorted((p for p in sweep.points_of(REMAT_OPT) if p.ok), key=lambda p: p.peak_bytes)
    assert len(ours) == 6 and len({p.peak_bytes for p in ours}) >= 4
    for lower, higher in zip(ours, ours[1:]):  # raw solver answers, not the envelope
        assert lower.extra_time_s >= higher.extra_time_s - 1e-15, (lower, higher)
    for p in ours:
        assert p.peak_bytes <= p.budget_bytes


def test_remat_opt_lies_on_or_below_every_other_strategy(mlp_sweep):
    graph, sweep, options = mlp_sweep
    others = [p for p in sweep.points if p.ok and p.strategy != REMAT_OPT]
    assert {p.strategy for p in others} >= {"store-all", "chen", "revolve", "chain-dp", TORCH_STRATEGY}
    assert any(p.strategy == TORCH_STRATEGY and p.extra_time_s > 0 for p in others)
    cheapest_at: dict[int, float] = {}
    for p in others:
        cheapest_at[p.peak_bytes] = min(cheapest_at.get(p.peak_bytes, float("inf")), p.extra_time_s)
    solved = 0
    for peak, extra in sorted(cheapest_at.items()):
        ours = sweep.best_at(REMAT_OPT, peak)
        if ours is None or ours.extra_time_s > extra:  # not settled by the sweep: plan at that peak
            ours = plan_point(graph, REMAT_OPT, "auto", peak, options, EXACT)
            solved += 1
        assert ours.ok and ours.peak_bytes <= peak
        assert ours.extra_time_s <= extra * (1 + 1e-9) + 1e-15, (peak, extra, ours)
    assert solved < len(cheapest_at)  # the sweep itself answers most of the comparisons


def test_parallel_sweep_gives_the_same_points_in_the_same_order():
    graph = chain(12)
    budgets = parse_sweep("40%:100%:20")
    torch_calls = []

    def externals():  # runs in this process, while the workers solve
        torch_calls.append(1)
        return (ExternalSchedule(TORCH_STRATEGY, "store-all", store_all_schedule(graph)),)

    strategies = (REMAT_OPT, "greedy", "chen", "revolve", "store-all", TORCH_STRATEGY)
    one = run_sweep(graph, budgets, strategies=strategies, externals=externals, options=SolverOptions(time_limit_s=10))
    two = run_sweep(graph, budgets, strategies=strategies, externals=externals, options=SolverOptions(time_limit_s=10),
                    jobs=2)

    def facts(sweep):
        return [(p.strategy, p.budget_bytes, p.setting, p.status, p.peak_bytes, p.extra_flops) for p in sweep.points]

    assert facts(two) == facts(one)
    assert len(torch_calls) == 2
    assert {p.strategy for p in one.points} == set(strategies)
