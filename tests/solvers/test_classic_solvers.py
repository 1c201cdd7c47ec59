"""Chen's segments, per-block checkpointing and the chain DP on chains, examples and random graphs."""

from __future__ import annotations

import math
import random
import re
from functools import lru_cache
from pathlib import Path

import pytest
from exhaustive import exhaustive_optimum
from graphs import B, F, chain, op, random_graph

from solvers import SOLVERS, get_solver
from solvers.base import SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.blocks import find_blocks, solve_blocks
from solvers.chain_dp import solve_chain_dp
from solvers.chen import default_segments, solve_chen, solve_chen_greedy, uniform_checkpoints
from solvers.ir.graph import Node, NodeKind, Phase, RematGraph
from solvers.ir.simulator import simulate
from solvers.linearize import articulation_values, linearize

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NEW_SOLVERS = ["chen", "chen-greedy", "blocks", "revolve", "chain-dp"]
OPTIONS = SolverOptions()
AT_BEST = re.compile(r"peaks at (\d+) bytes at best")
"""How chen-greedy and revolve report the least peak of their candidates when none fits."""


@lru_cache(maxsize=None)
def example_graph(name: str) -> RematGraph:
    from frontends.capture.model_file import load_model_file
    from frontends.capture.step import capture

    model, inputs = load_model_file(str(EXAMPLES / f"{name}.py"))
    return capture(model, inputs).graph


def _peaks(graph: RematGraph) -> tuple[int, int]:
    """(recompute-all peak, store-all peak)."""
    return (simulate(graph, recompute_all_schedule(graph)).peak_bytes,
            simulate(graph, store_all_schedule(graph)).peak_bytes)


def test_solvers_are_registered_by_name() -> None:
    for name in NEW_SOLVERS:
        assert name in SOLVERS
        assert callable(get_solver(name))


# ------------------------------------------------------------------ linearisation
def test_a_chain_is_cut_at_every_layer() -> None:
    graph = chain(7)
    assert articulation_values(graph) == tuple(f"f{i}" for i in range(7))
    stages = linearize(graph).stages
    assert [s.values for s in stages[:7]] == [(f"f{i}",) for i in range(7)]
    assert stages[-1].values == ("loss",)


def test_residual_graphs_are_cut_between_blocks() -> None:
    cuts = set(articulation_values(example_graph("convnet")))
    # The output of every residual block (its final relu) separates the inputs from the loss.
    assert {"relu_2", "relu_4", "relu_6"} <= cuts
    gpt = example_graph("gpt")
    # The residual stream: both adds of each transformer block.
    assert {"add_1", "add_2", "add_3", "add_4", "add_5", "add_6"} <= set(articulation_values(gpt))


# --------------------------------------------------------------------------- chen
def _fit_exponent(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def test_chen_memory_grows_like_sqrt_of_depth() -> None:
    depths = [16, 32, 64, 128, 256, 512, 1024]
    activations = []
    for depth in depths:
        graph = chain(depth)
        result = solve_chen(graph, 10**12, OPTIONS)
        sim = simulate(graph, result.schedule)
        outputs = sum(graph[o].bytes for o in (*graph.user_outputs, *graph.backward_outputs))
        activations.append(sim.peak_bytes - graph.resident_bytes - outputs)
    exponent = _fit_exponent(depths, activations)
    assert 0.4 <= exponent <= 0.6, exponent
    # Plain autograd grows linearly on the same chains.
    store = [simulate(chain(d), store_all_schedule(chain(d))).peak_bytes for d in depths]
    assert _fit_exponent(depths, store) > 0.9


@pytest.mark.parametrize("depth", [16, 30, 100])
def test_chen_recomputes_one_forward_pass_up_to_the_last_segment(depth: int) -> None:
    costs = [float(1 + (3 * i) % 5) for i in range(depth)]
    graph = chain(depth, costs=costs)
    lin = linearize(graph)
    checkpoints = uniform_checkpoints(graph, lin, default_segments(lin))
    result = solve_chen(graph, 10**12, OPTIONS)
    sim = simulate(graph, result.schedule)
    last = int(checkpoints[-1][1:])
    expected = sum(c for i, c in enumerate(costs) if i < last and f"f{i}" not in checkpoints)
    assert len(checkpoints) + 1 == round(math.sqrt(depth))
    assert sim.extra_cost == pytest.approx(expected)
    assert dict(sim.recomputed).keys() == {f"f{i}" for i in range(last) if f"f{i}" not in checkpoints}
    assert set(dict(sim.recomputed).values()) == {2}


def test_chen_is_infeasible_below_its_peak() -> None:
    graph = chain(20)
    peak = simulate(graph, solve_chen(graph, 10**12, OPTIONS).schedule).peak_bytes
    assert solve_chen(graph, peak, OPTIONS).status is SolveStatus.HEURISTIC
    low = solve_chen(graph, peak - 1, OPTIONS)
    assert low.status is SolveStatus.INFEASIBLE and low.schedule is None
    assert str(peak) in low.message


def test_chen_greedy_uses_spare_budget_and_never_loses_to_chen() -> None:
    graph = chain(25)
    low, high = _peaks(graph)
    chen_peak = simulate(graph, solve_chen(graph, 10**12, OPTIONS).schedule).peak_bytes
    chen_cost = solve_chen(graph, chen_peak, OPTIONS).objective
    assert solve_chen_greedy(graph, high, OPTIONS).objective == graph.base_cost
    costs = []
    for budget in range(chen_peak, high + 1, 40):
        result = solve_chen_greedy(graph, budget, OPTIONS)
        assert result.status is SolveStatus.HEURISTIC, budget
        assert simulate(graph, result.schedule).peak_bytes <= budget
        assert result.objective <= chen_cost
        costs.append(result.objective)
    assert costs == sorted(costs, reverse=True) and costs[-1] < costs[0]
    assert solve_chen_greedy(graph, low - 1, OPTIONS).status is SolveStatus.INFEASIBLE


# ------------------------------------------------------------------------- blocks
@pytest.mark.parametrize("name", ["gpt", "convnet"])
def test_blocks_finds_the_repeated_blocks_and_saves_memory(name: str) -> None:
    graph = example_graph(name)
    assert [b.path for b in find_blocks(graph)] == ["blocks.0", "blocks.1", "blocks.2"]
    _, store = _peaks(graph)
    every = solve_blocks(graph, 10**12, OPTIONS)
    half = solve_blocks(graph, 10**12, OPTIONS, every=2)
    every_sim = simulate(graph, every.schedule)
    half_sim = simulate(graph, half.schedule)
    assert every_sim.peak_bytes < half_sim.peak_bytes < store
    assert 0 < half_sim.extra_cost < every_sim.extra_cost
    # Each checkpointed block's interior is recomputed exactly once.
    assert set(dict(every_sim.recomputed).values()) == {2}
    recomputed_modules = {graph[v].module.split(".")[1] for v, _ in every_sim.recomputed}
    assert recomputed_modules == {"0", "1", "2"}


def _resnet_like() -> RematGraph:
    """A chain whose layers sit in ResNet-style blocks: layer1.0, layer1.1, layer2.0, layer2.1."""
    nodes = [Node("x", NodeKind.INPUT, F, 10)]
    modules = ["stem"] + [f"layer{s}.{b}" for s in (1, 2) for b in (0, 1) for _ in range(3)]
    prev = "x"
    for i, module in enumerate(modules):
        nodes.append(op(f"f{i}", F, 10, [prev], module=module))
        prev = f"f{i}"
    nodes.append(op("loss", F, 1, [prev]))
    nodes.append(Node("t", NodeKind.TANGENT, B, 1))
    grad = "t"
    for i in reversed(range(len(modules))):
        reads = [grad, "x" if i == 0 else f"f{i - 1}", f"f{i}"]
        nodes.append(op(f"g{i}", B, 10, reads, cost=2.0))
        grad = f"g{i}"
    return RematGraph(tuple(nodes), forward_outputs=("loss",), user_outputs=("loss",),
                      backward_outputs=(grad,))


def test_blocks_finds_resnet_style_stages_of_blocks() -> None:
    graph = _resnet_like()
    blocks = find_blocks(graph)
    assert [b.path for b in blocks] == ["layer1.0", "layer1.1", "layer2.0", "layer2.1"]
    result = solve_blocks(graph, 10**9, OPTIONS)
    sim = simulate(graph, result.schedule)
    # Each block keeps its output; its two inner values are recomputed once.
    assert len(sim.recomputed) == 8
    assert sim.peak_bytes < _peaks(graph)[1]


def test_blocks_respects_an_explicit_container() -> None:
    graph = example_graph("gpt")
    assert [b.path for b in find_blocks(graph, "blocks.1.mlp")] == [
        "blocks.1.mlp.0", "blocks.1.mlp.1", "blocks.1.mlp.2"]
    result = solve_blocks(graph, 10**12, OPTIONS, container="blocks.1.mlp")
    assert result.schedule is not None
    with pytest.raises(ValueError, match="every"):
        solve_blocks(graph, 10**12, OPTIONS, every=0)


# ----------------------------------------------------------------------- chain DP
def test_chain_dp_reports_its_memory_step() -> None:
    graph = chain(6, sizes=[10, 20, 30, 20, 10, 40])
    low, _ = _peaks(graph)
    result = solve_chain_dp(graph, low + 20, OPTIONS)
    assert result.status is SolveStatus.HEURISTIC
    assert "memory step 1 bytes" in result.message
    low, high = _peaks(example_graph("gpt"))
    big = solve_chain_dp(example_graph("gpt"), (low + high) // 2, OPTIONS)
    assert big.schedule is not None and "memory step 1024 bytes" in big.message


def test_chain_dp_never_loses_to_chen_or_revolve_on_chains() -> None:
    rng = random.Random(3)
    for _ in range(3):
        depth = rng.randint(5, 8)
        graph = chain(depth, sizes=[rng.choice([10, 20, 40]) for _ in range(depth)],
                      costs=[float(rng.choice([1, 2, 5])) for _ in range(depth)])
        low, high = _peaks(graph)
        for budget in range(low, high + 1, max(1, (high - low) // 4)):
            exact = solve_chain_dp(graph, budget, OPTIONS)
            # On a chain the DP reaches recompute-all's peak (and is exact on short chains).
            assert exact.objective is not None, budget
            for other in ("chen-greedy", "revolve"):
                result = get_solver(other)(graph, budget, OPTIONS)
                if result.objective is None:
                    # Revolve's one-slot schedule reaches recompute-all's peak on these chains;
                    # chen-greedy's segments may not: then its least peak is above the budget.
                    assert other == "chen-greedy", budget
                    assert result.status is SolveStatus.INFEASIBLE
                    assert int(AT_BEST.search(result.message)[1]) > budget
                    continue
                assert exact.objective <= result.objective + 1e-9


def _random_chain(seed: int) -> RematGraph:
    rng = random.Random(1000 + seed)
    depth = rng.randint(2, 5)
    return chain(depth, sizes=[rng.choice([5, 10, 20, 30, 40]) for _ in range(depth)],
                 costs=[float(rng.choice([1, 2, 3, 5])) for _ in range(depth)])


@pytest.mark.parametrize("seed", range(25))
def test_chain_dp_is_optimal_on_short_heterogeneous_chains(seed: int) -> None:
    graph = _random_chain(seed)
    low, high = _peaks(graph)
    for budget in range(low - 10, high + 1, max(1, (high - low) // 5)):
        result = solve_chain_dp(graph, budget, OPTIONS)
        assert result.objective == exhaustive_optimum(graph, budget), budget
        if result.schedule is not None and result.message != "store-all fits the budget":
            assert "memory step 1 bytes" in result.message  # the gcd: nothing rounded


def test_chain_dp_misses_schedules_that_drop_a_checkpoint_still_needed_later() -> None:
    """The known limit of the DP's nested family, found by exhaustive search.

    The optimum keeps f1, f3, f4 in forward; for g3 it computes f2 from f1 and drops f1
    (5 bytes that do not fit next to g3), then recomputes f0 and f1 from the input and keeps
    both for g2 and g1. The DP can drop f1 and recompute it, but not keep f0 from that
    recomputation for a later subproblem: 59 instead of 56 (about 1 in 1,000 random chains of
    up to 6 layers at 7 budgets each show such a gap, never above 8%).
    """
    graph = chain(6, sizes=[5, 5, 30, 40, 40, 5], costs=[3.0, 5.0, 2.0, 2.0, 1.0, 2.0])
    best = exhaustive_optimum(graph, 157)  # 156 + the loss's 1-byte gradient, held to the end
    result = solve_chain_dp(graph, 157, OPTIONS)
    assert best == 56.0
    assert result.objective == pytest.approx(59.0, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_chain_dp_cost_equals_the_milp_optimum_on_heterogeneous_chains(seed: int) -> None:
    from solvers.checkmate.milp import solve_milp

    rng = random.Random(77 + seed)
    depth = rng.randint(4, 6)
    graph = chain(depth, sizes=[rng.choice([10, 20, 30, 40]) for _ in range(depth)],
                  costs=[float(rng.choice([1, 2, 3, 5])) for _ in range(depth)])
    low, high = _peaks(graph)
    for budget in sorted({low, (low + high) // 2, high - 1}):
        exact = solve_chain_dp(graph, budget, OPTIONS)
        milp = solve_milp(graph, budget, SolverOptions(time_limit_s=60))
        assert "memory step 1 bytes" in exact.message  # the gcd: no discretisation error
        assert exact.objective is not None and milp.objective is not None
        assert exact.objective <= milp.objective + 1e-9
        if milp.bound is not None:
            assert exact.objective >= milp.bound - 1e-9
        if milp.status is SolveStatus.OPTIMAL:
            assert exact.objective == pytest.approx(milp.objective), budget


# --------------------------------------------------- every solver, every graph shape
def _own_peak(graph: RematGraph, name: str) -> int:
    """chen and blocks build one schedule whatever the budget: its simulated peak."""
    return simulate(graph, get_solver(name)(graph, 10**12, OPTIONS).schedule).peak_bytes


def _check(graph: RematGraph, name: str, budget: int) -> None:
    """``name`` must return a schedule wherever its own family reaches ``budget``, and that
    schedule must run within the budget at the cost it reports.

    chen and blocks have one schedule: a schedule comes back exactly when the budget covers its
    peak. The others hold store-all (chen-greedy's single segment, chain-dp's and revolve's
    keep-everything schedules), so they fit at its peak; below it chain-dp's family (and its
    model's memory rounding) may miss a budget, and chen-greedy and revolve report the least
    peak of their candidates, which must be above the budget and fit when asked for.
    """
    store_all_peak = _peaks(graph)[1]
    try:
        result = get_solver(name)(graph, budget, OPTIONS)
    except ValueError as err:
        assert name == "revolve" and "revolve needs a chain graph" in str(err)
        return
    if name in ("chen", "blocks"):
        assert (result.schedule is not None) == (budget >= _own_peak(graph, name)), budget
    if result.schedule is None:
        assert result.status is SolveStatus.INFEASIBLE and result.message
        assert budget < store_all_peak, f"{name} found no schedule at store-all's peak"
        if name in ("chen-greedy", "revolve"):
            least = int(AT_BEST.search(result.message)[1])
            assert least > budget
            if name == "chen-greedy":  # its uniform splits include chen's sqrt(n) segments
                assert least <= _own_peak(graph, "chen")
            fitted = get_solver(name)(graph, least, OPTIONS)
            assert fitted.schedule is not None
            assert simulate(graph, fitted.schedule).peak_bytes == least
        return
    assert result.status is SolveStatus.HEURISTIC
    sim = simulate(graph, result.schedule)  # raises if the schedule cannot run
    assert sim.peak_bytes <= budget
    assert result.objective == pytest.approx(sim.total_cost)


@pytest.mark.parametrize("name", NEW_SOLVERS)
@pytest.mark.parametrize("example", ["mlp", "convnet", "gpt"])
def test_every_solver_on_the_examples(example: str, name: str) -> None:
    graph = example_graph(example)
    low, high = _peaks(graph)
    for budget in (high, (low + high) // 2, 10**12):
        _check(graph, name, budget)
    if name != "revolve" or example == "mlp":
        fitted = get_solver(name)(graph, 10**12, OPTIONS)
        assert fitted.schedule is not None


@pytest.mark.parametrize("seed", range(40))
def test_every_solver_on_random_graphs(seed: int) -> None:
    graph = random_graph(seed, 6 + seed % 7)
    low, high = _peaks(graph)
    for name in NEW_SOLVERS:
        for budget in (low, (low + high) // 2, high):
            _check(graph, name, budget)


def test_forward_ops_run_once_in_forward_in_every_schedule() -> None:
    graph = example_graph("gpt")
    low, high = _peaks(graph)
    for name in ("chen", "blocks", "chain-dp"):
        result = get_solver(name)(graph, high, OPTIONS)
        forward = result.schedule.computes("forward")
        assert len(forward) == len(set(forward))
        assert all(graph[v].phase is Phase.FORWARD for v in forward)
