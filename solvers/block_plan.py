"""Rockmate-style planning over repeated blocks: solve each block kind once, combine by DP.

1. Blocks are the numbered children of the model's main container (`solvers.blocks`), grouped
   into *kinds* by a canonical signature (ops, bytes, and where each input comes from, by
   position inside the block): GPT-2's twelve layers are one kind.
2. For each kind, an exact MIP on one representative gives its trade-off curve: for a cap on
   the bytes the block keeps for backward, the cheapest set of values to keep and to recompute
   (backward reads each value kept or recomputed; a recomputed value needs each input kept or
   recomputed; inputs from outside the block count as available, and the block's outputs are
   always kept, as in per-block checkpointing, so no recomputation reaches into another
   block). Keeping an intermediate to make a recomputation cheap (a masked score instead of
   the QK^T matmul) is allowed.
3. A multiple-choice knapsack DP over the chain of blocks picks one option per block for a
   total of kept bytes; the other forward values are saved. In the schedule (`segment_schedule`)
   forward keeps the chosen values, and each block's backward starts by recomputing, once,
   what its option dropped (Rockmate's re-tape). It is simulated; the allowance is searched
   (bisection) to the largest one whose simulated peak fits the budget. The saved set is also
   handed to `solvers.saved_set` (just-in-time recomputation) as a second candidate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from solvers.blocks import find_blocks
from solvers.highs_lp import LinearProgram
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate
from solvers.saved_set import repair_saved_set
from solvers.segments import pinned_values, segment_schedule

CURVE_POINTS = 12
"""Byte caps per block kind at which the exact block MIP is solved."""
DP_LEVELS = 2000


@dataclass(frozen=True)
class BlockOption:
    keep: tuple[int, ...]
    """Positions (inside the block) of the values kept for backward."""
    kept_bytes: int
    cost: float
    """Recomputation cost this option adds in backward."""


def _signature(graph: RematGraph, values: tuple[str, ...]) -> tuple:
    position = {v: i for i, v in enumerate(values)}
    return tuple((graph[v].op, graph[v].bytes, graph[v].compute_once,
                  tuple(position.get(i, graph[i].kind.value if not graph[i].is_op else "outside")
                        for i in graph[v].inputs)) for v in values)


def block_kinds(graph: RematGraph) -> list[list[tuple[str, ...]]]:
    """Blocks grouped by kind (each kind: its blocks' forward values, in graph order)."""
    kinds: dict[tuple, list[tuple[str, ...]]] = {}
    for block in find_blocks(graph):
        kinds.setdefault(_signature(graph, block.values), []).append(block.values)
    return list(kinds.values())


def _options(graph: RematGraph, values: tuple[str, ...], pinned: set[str]) -> list[BlockOption]:
    """The block's trade-off curve: the exact MIP of the module docstring at several byte caps."""
    read_later = {i for n in graph.ops if n.phase is Phase.BACKWARD for i in n.inputs}
    inside = set(values)
    outputs = {i for n in graph.ops if n.phase is Phase.FORWARD and n.name not in inside
               for i in n.inputs if i in inside}
    free = [i for i, v in enumerate(values) if v not in pinned and v not in outputs]
    needed = [i for i in free if values[i] in read_later]
    total = sum(graph[values[i]].bytes for i in needed)
    position = {v: i for i, v in enumerate(values)}
    everything = tuple(free)  # keeping every droppable value recomputes nothing
    options = {everything: BlockOption(everything, sum(graph[values[i]].bytes for i in free), 0.0)}
    for step in range(CURVE_POINTS + 1 if free else 0):
        cap = total * step / CURVE_POINTS
        lp = LinearProgram()
        keep = {i: lp.add_var(0.0, 0.0, 1.0, integer=True) for i in free}
        redo = {i: lp.add_var(sum(graph[m].cost for m in graph.group_of(values[i])), 0.0, 1.0,
                              integer=True) for i in free}
        for i in needed:
            lp.add_row({keep[i]: 1.0, redo[i]: 1.0}, lower=1.0)
        for i in free:
            for u in dict.fromkeys(graph[values[i]].inputs):
                j = position.get(u)
                if j is not None and j in keep:
                    lp.add_row({keep[j]: 1.0, redo[j]: 1.0, redo[i]: -1.0}, lower=0.0)
        lp.add_row({keep[i]: float(graph[values[i]].bytes) for i in free}, upper=cap)
        solution = lp.solve(time_limit_s=5.0)
        if solution.values is None:
            continue
        chosen = tuple(i for i in free if solution.values[keep[i]] > 0.5)
        cost = float(solution.objective or 0.0)
        kept_bytes = sum(graph[values[i]].bytes for i in chosen)
        if chosen not in options:
            options[chosen] = BlockOption(chosen, kept_bytes, cost)
    pareto = sorted(options.values(), key=lambda o: (o.kept_bytes, o.cost))
    front: list[BlockOption] = []
    for o in pareto:
        if not front or o.cost < front[-1].cost - 1e-15:
            front.append(o)
    return front


def _knapsack(options: list[list[BlockOption]], allowance: int) -> list[BlockOption] | None:
    """One option per block, total kept bytes within ``allowance``, least total cost."""
    q = max(1, allowance // DP_LEVELS)
    levels = allowance // q + 1
    best = np.zeros(levels)
    choices = []
    for block in options:
        table = np.full((len(block), levels), np.inf)
        for k, o in enumerate(block):
            w = -(-o.kept_bytes // q)
            if w < levels:
                table[k, w:] = best[: levels - w] + o.cost
        choice = table.argmin(axis=0)
        best = table[choice, np.arange(levels)]
        choices.append(choice)
    if not np.isfinite(best[-1]):
        return None
    picked, level = [], levels - 1
    for block, choice in zip(reversed(options), reversed(choices)):
        o = block[int(choice[level])]
        picked.append(o)
        level -= -(-o.kept_bytes // q)
    return picked[::-1]


def block_schedules(graph: RematGraph, budget_bytes: int, deadline: float
                    ) -> tuple[list[tuple[str, Schedule]], str]:
    """Schedules from the block plan (best allowance found) and a note on the blocks found.

    Each plan is a schedule built and simulated (seconds on a 10,000-step loop): none starts past
    ``deadline``, and the saved-set repair (two schedules at least) only when two plans' time is
    left."""
    if time.perf_counter() >= deadline:
        return [], "no time left for block plans"
    kinds = block_kinds(graph)
    if not kinds:
        return [], "no repeated blocks found"
    pinned = pinned_values(graph)
    instances: list[tuple[tuple[str, ...], list[BlockOption]]] = []
    for blocks in kinds:
        curve = _options(graph, blocks[0], pinned)
        instances.extend((values, curve) for values in blocks)
    instances.sort(key=lambda item: graph.position(item[0][0]))
    in_blocks = {v for values, _ in instances for v in values}
    outside = {n.name for n in graph.ops if n.phase is Phase.FORWARD and n.name not in in_blocks}
    block_of_value = {v: k for k, (values, _) in enumerate(instances) for v in values}
    outside |= {i for n in graph.ops if n.phase is Phase.FORWARD for i in n.inputs
                if i in block_of_value and block_of_value.get(n.name) != block_of_value[i]}
    segment_of = {v: -1 for v in outside}
    for index, (values, _) in enumerate(instances):
        segment_of.update((v, index) for v in values)
    note = (f"{len(instances)} blocks of {len(kinds)} kind(s), "
            f"{sum(len(c) for c in {id(c): c for _, c in instances}.values())} block options")

    took: list[float] = []  # seconds of each plan

    def plan(allowance: int) -> tuple[Schedule, int, frozenset[str]] | None:
        picked = _knapsack([curve for _, curve in instances], allowance)
        if picked is None:
            return None
        began = time.perf_counter()
        saved = set(outside)
        for (values, _), option in zip(instances, picked):
            saved.update(values[i] for i in option.keep)
        schedule = segment_schedule(graph, saved, segment_of)
        result = schedule, simulate(graph, schedule).peak_bytes, frozenset(saved)
        took.append(time.perf_counter() - began)
        return result

    def room_for_repair() -> bool:
        return time.perf_counter() + 2 * max(took, default=0.0) <= deadline

    most = sum(max(o.kept_bytes for o in curve) for _, curve in instances)
    low, high, found = 0, most, None
    first = plan(most)
    if first is not None and first[1] <= budget_bytes:
        found = first
    else:
        while high - low > max(1, most // 256) and time.perf_counter() + max(took, default=0.0) <= deadline:
            mid = (low + high) // 2
            attempt = plan(mid)
            if attempt is not None and attempt[1] <= budget_bytes:
                low, found = mid, attempt
            else:
                high = mid
    if found is None:
        if not room_for_repair():
            return [], note
        start = plan(0)
        if start is None or not room_for_repair():
            return [], note
        repaired = repair_saved_set(graph, start[2], budget_bytes, deadline)
        return ([("block-dp", repaired)] if repaired is not None else []), note
    if not room_for_repair():
        return [("block-dp", found[0])], note
    polished = repair_saved_set(graph, found[2], budget_bytes, deadline,
                                candidates=frozenset(in_blocks - found[2]))
    plans = [("block-dp", found[0])]
    if polished is not None:
        plans.append(("block-dp+saved-set", polished))
    return plans, note
