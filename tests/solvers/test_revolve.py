"""Binomial checkpointing: the table from the schedules, optimality, and chain graphs."""

from __future__ import annotations

import heapq

import pytest
from exhaustive import exhaustive_optimum
from graphs import chain, random_graph

from solvers.base import SolverOptions
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.chain_dp import solve_chain_dp
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import Schedule, StepKind
from solvers.ir.simulator import simulate
from solvers.revolve import (
    binomial_schedule,
    chain_steps,
    max_steps,
    min_recomputations,
    replay,
    revolve_backward,
    revolve_cost,
    revolve_schedule,
    solve_revolve,
)

TABLE = [(2, 2, 6), (3, 3, 20), (5, 5, 252), (10, 5, 3_003), (10, 10, 184_756)]


@pytest.mark.parametrize("slots, recomputations, steps", TABLE)
def test_max_steps_reproduces_the_binomial_table(slots: int, recomputations: int, steps: int) -> None:
    assert max_steps(slots, recomputations) == steps


@pytest.mark.parametrize("slots, recomputations, steps", TABLE[:4])
def test_binomial_schedules_reverse_the_whole_chain_within_the_limits(
    slots: int, recomputations: int, steps: int
) -> None:
    schedule = binomial_schedule(slots, recomputations)
    result = replay(schedule)  # raises on any illegal move
    assert schedule.steps == steps
    assert result.max_slots <= slots
    assert result.max_recomputations == recomputations


@pytest.mark.parametrize("slots, recomputations, steps", TABLE[:4])
def test_one_step_more_needs_one_recomputation_more(
    slots: int, recomputations: int, steps: int
) -> None:
    assert min_recomputations(steps, slots) == recomputations
    assert min_recomputations(steps + 1, slots) == recomputations + 1


def _exhaustive_fewest_evaluations(steps: int, slots: int) -> int:
    """Dijkstra over every move sequence of the abstract model (independent of the DP)."""
    start = (frozenset({0}), 0, False, steps)  # stored, current, taped, next step to reverse
    dist = {start: 0}
    queue = [(0, 0, start)]
    counter = 0
    while queue:
        d, _, state = heapq.heappop(queue)
        if d > dist[state]:
            continue
        stored, current, taped, k = state
        if k == 0:
            return d
        moves = []
        if current is not None and current < k:
            moves.append((1, (stored, current + 1, True, k)))
        if current is not None and current not in stored and len(stored) < slots:
            moves.append((0, (stored | {current}, current, taped, k)))
        for s in stored:
            moves.append((0, (stored - {s}, current, taped, k)))
            moves.append((0, (stored, s, False, k)))
        if current == k and taped:
            moves.append((0, (stored, None, False, k - 1)))
        for cost, nxt in moves:
            if d + cost < dist.get(nxt, 1 << 30):
                dist[nxt] = d + cost
                counter += 1
                heapq.heappush(queue, (d + cost, counter, nxt))
    raise AssertionError("no reversal found")


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_revolve_is_optimal_in_its_model(steps: int, slots: int) -> None:
    schedule = revolve_schedule(steps, slots)
    assert schedule.forward_steps == revolve_cost(steps, slots)
    assert sum(replay(schedule).evaluations) == schedule.forward_steps
    assert schedule.forward_steps == _exhaustive_fewest_evaluations(steps, slots)


def test_known_extra_forward_steps() -> None:
    # One slot: reversing step i re-runs steps 1..i-1 and re-tapes i: sum of 1..L-1 extra.
    assert revolve_schedule(10, 1).extra_forward_steps == 45
    # Enough slots: only the re-taping of each step but the last.
    assert revolve_schedule(10, 10).extra_forward_steps == 9


def _forward_values_live(graph: RematGraph, schedule: Schedule) -> int:
    """Most forward op values live at once over the schedule (what the simulator tracks)."""
    live: set[str] = set()
    most = 0
    for step in schedule.steps:
        node = graph[step.node]
        if step.kind is StepKind.COMPUTE:
            if node.phase is Phase.FORWARD and graph.user_outputs.count(step.node) == 0:
                live.add(step.node)
                most = max(most, len(live))
        else:
            live.discard(step.node)
    return most


def _on_chain(steps: int, abstract) -> tuple[RematGraph, Schedule]:
    graph = chain(steps)
    forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
    backward = revolve_backward(graph, chain_steps(graph), abstract, reuse_output=False)
    return graph, Schedule.from_computes(graph, forward, backward)


CHAIN_CASES = [(c, r) for c in range(1, 6) for r in range(1, 6) if max_steps(c, r) <= 30]


@pytest.mark.parametrize("slots, recomputations", CHAIN_CASES)
def test_binomial_schedules_pass_the_simulator_on_chain_graphs(slots: int, recomputations: int) -> None:
    abstract = binomial_schedule(slots, recomputations)
    graph, schedule = _on_chain(abstract.steps, abstract)
    sim = simulate(graph, schedule)
    # x[0] is the resident input: c - 1 stored values, plus the step being computed from the
    # current state (or the state and the output a reversal reads).
    assert _forward_values_live(graph, schedule) <= slots + 1
    assert max((times - 1 for _, times in sim.recomputed), default=0) <= recomputations
    assert sim.extra_cost <= abstract.extra_forward_steps


@pytest.mark.parametrize("steps", [1, 2, 5, 8, 13, 30])
@pytest.mark.parametrize("slots", [1, 2, 4])
def test_optimal_schedules_pass_the_simulator_on_chain_graphs(steps: int, slots: int) -> None:
    abstract = revolve_schedule(steps, slots)
    graph, schedule = _on_chain(steps, abstract)
    sim = simulate(graph, schedule)
    assert _forward_values_live(graph, schedule) <= slots + 1
    assert max((t - 1 for _, t in sim.recomputed), default=0) <= replay(abstract).max_recomputations
    assert sim.extra_cost <= abstract.extra_forward_steps


@pytest.mark.parametrize("steps", [2, 4, 6])
def test_solve_revolve_is_optimal_on_uniform_chains_at_every_budget(steps: int) -> None:
    graph = chain(steps)
    low = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    for budget in range(low - 2, high + 1):
        revolve = solve_revolve(graph, budget, SolverOptions())
        assert revolve.objective == exhaustive_optimum(graph, budget), budget
        if revolve.schedule is not None:
            assert simulate(graph, revolve.schedule).peak_bytes <= budget


@pytest.mark.parametrize("steps", [9])
def test_solve_revolve_matches_the_chain_dp_on_longer_uniform_chains(steps: int) -> None:
    graph = chain(steps)
    low = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    for budget in range(low, high + 1, 10):
        revolve = solve_revolve(graph, budget, SolverOptions())
        assert revolve.objective == solve_chain_dp(graph, budget, SolverOptions()).objective


@pytest.mark.parametrize("steps", [4, 5, 6])
def test_revolve_cost_equals_the_milp_optimum_on_uniform_chains(steps: int) -> None:
    from solvers.checkmate.milp import solve_milp

    graph = chain(steps)
    low = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    for budget in range(low, high, 10):
        milp = solve_milp(graph, budget, SolverOptions(time_limit_s=60))
        revolve = solve_revolve(graph, budget, SolverOptions())
        assert milp.objective is not None and revolve.objective is not None
        assert revolve.objective <= milp.objective + 1e-9
        if milp.bound is not None:
            assert revolve.objective >= milp.bound - 1e-9
        if milp.status.value == "optimal":
            assert revolve.objective == pytest.approx(milp.objective), budget


def test_revolve_refuses_graphs_that_are_not_chains() -> None:
    branching = next(g for g in (random_graph(s, 8) for s in range(50))
                     if _not_a_chain(g))
    with pytest.raises(ValueError, match="revolve needs a chain graph"):
        solve_revolve(branching, 10**9, SolverOptions())


def _not_a_chain(graph: RematGraph) -> bool:
    try:
        chain_steps(graph)
    except ValueError:
        return True
    return False


def test_revolve_reports_infeasible_budgets_with_its_peak() -> None:
    graph = chain(6)
    result = solve_revolve(graph, 20, SolverOptions())
    assert result.schedule is None and result.status.value == "infeasible"
    assert "peaks at" in result.message
