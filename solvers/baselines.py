"""The trivial schedules every other solver is checked against.

- store-all: plain autograd. Forward computes everything once and keeps what backward reads.
- recompute-all: forward keeps nothing but resident values, outputs and ops that must not be
  recomputed; each backward op recomputes the forward values it needs from those, right
  before it runs. Very lean, at the highest cost (not always the leanest schedule: recomputing
  a branch in a different order can peak lower).
"""

from __future__ import annotations

import time
from collections.abc import Container

from solvers.base import ScheduleTooLongError, SolveResult, SolverOptions, heuristic_result
from solvers.ir.derived import per_graph
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate


def store_all_schedule(graph: RematGraph) -> Schedule:
    """Plain autograd's schedule, built once per graph (`per_graph`): auto, hierarchical, the
    chain solvers and the planner all start from it, and a 10,000-step loop's takes seconds."""
    return per_graph(graph, _store_all)


def _store_all(graph: RematGraph) -> Schedule:
    forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
    backward = [n.name for n in graph.ops if n.phase is Phase.BACKWARD]
    return Schedule.from_computes(graph, forward, backward)


class _ClosureTables:
    """Per-graph lookups for `forward_closure` (built once per graph, see `per_graph`): saved-set
    solvers call it for every candidate they try."""

    def __init__(self, graph: RematGraph) -> None:
        self.forward_inputs = {n.name: n.inputs for n in graph.ops if n.phase is Phase.FORWARD}
        """Forward op -> its inputs: the ops a closure may recompute."""
        self.members = {n.name: graph.group_of(n.name) for n in graph.ops if n.phase is Phase.FORWARD}
        self.position = {n.name: i for i, n in enumerate(graph.nodes)}


def forward_closure(graph: RematGraph, targets: list[str], available: Container[str]) -> list[str]:
    """Forward values needed to compute ``targets`` from ``available`` (a set, or anything that
    answers ``in``), in topological order."""
    tables = per_graph(graph, _ClosureTables)
    inputs_of, members_of = tables.forward_inputs, tables.members
    needed: set[str] = set()
    stack = [t for t in targets if t not in available]
    while stack:
        name = stack.pop()
        if name in needed or name in available:
            continue
        inputs = inputs_of.get(name)
        if inputs is None:
            raise ValueError(f"cannot recompute {name!r}: it is not a forward op")
        needed.update(members_of[name])
        stack.extend(i for i in inputs if i not in available)
    return sorted(needed, key=tables.position.__getitem__)


def kept_through_backward(graph: RematGraph) -> set[str]:
    """Values no schedule needs to recompute in backward: resident, outputs, run-once ops."""
    kept = {n.name for n in graph.nodes if not n.is_op}
    kept |= set(graph.forward_outputs) | set(graph.user_outputs)
    for node in graph.ops:
        if node.compute_once:
            kept.update(graph.group_of(node.name))
    return kept


RECOMPUTE_ALL_MAX_STEPS = 20_000_000
"""Past this many recomputations (`recompute_all_steps_estimate`) recompute-all is not built: on
a chain it grows with the square of the chain (every backward op recomputes from the inputs; 4
million recomputations and 8 s at 1,000 steps of a time-stepping loop, 400 million at 10,000)."""


def recompute_all_steps_estimate(graph: RematGraph) -> int:
    """An upper bound on recompute-all's recomputations, without building it: each backward op
    group recomputes at most the forward ops up to its latest forward input."""
    tables = per_graph(graph, _ClosureTables)
    forward_rank = {name: i + 1 for i, name in enumerate(tables.forward_inputs)}
    total = 0
    for members in graph.groups.values():
        first = graph[members[0]]
        if first.phase is Phase.BACKWARD:
            total += max((forward_rank.get(i, 0) for i in first.inputs), default=0)
    return total


def recompute_all_refusal(graph: RematGraph) -> str | None:
    """Why recompute-all is not built on ``graph``: past `RECOMPUTE_ALL_MAX_STEPS`
    recomputations (`recompute_all_steps_estimate`); None when it is within the cap."""
    estimate = recompute_all_steps_estimate(graph)
    if estimate <= RECOMPUTE_ALL_MAX_STEPS:
        return None
    return (f"recompute-all would recompute up to {estimate:,} ops on this graph, past its cap of "
            f"{RECOMPUTE_ALL_MAX_STEPS:,} (each backward op recomputes the forward values it reads "
            "from the inputs: quadratic in a long chain's length); use a solver that scales with "
            "the chain, such as 'rotor' or 'auto'")


def recompute_all_within_cap(graph: RematGraph) -> Schedule | None:
    """recompute-all, or None past `RECOMPUTE_ALL_MAX_STEPS` recomputations (not built)."""
    if recompute_all_refusal(graph) is not None:
        return None
    return recompute_all_schedule(graph)


def recompute_all_schedule(graph: RematGraph) -> Schedule:
    forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
    kept = kept_through_backward(graph)
    backward: list[str] = []
    available = kept | {n.name for n in graph.ops if n.phase is Phase.BACKWARD}
    for name, members in graph.groups.items():
        first = graph[members[0]]
        if first.phase is not Phase.BACKWARD:
            continue
        backward.extend(forward_closure(graph, list(first.inputs), available))
        backward.extend(members)
    return Schedule.from_computes(graph, forward, backward)


def solve_store_all(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    start = time.perf_counter()
    schedule = store_all_schedule(graph)
    return heuristic_result("store-all", budget_bytes, schedule, simulate(graph, schedule), start)


def solve_recompute_all(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """recompute-all; ScheduleTooLongError past its cap (`recompute_all_refusal`): on a
    10,000-step loop it would run 400 million recomputations, practically forever."""
    start = time.perf_counter()
    refusal = recompute_all_refusal(graph)
    if refusal is not None:
        raise ScheduleTooLongError(refusal)
    schedule = recompute_all_schedule(graph)
    return heuristic_result("recompute-all", budget_bytes, schedule, simulate(graph, schedule), start)
