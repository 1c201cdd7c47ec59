"""Large-neighbourhood search over the interval model (`solvers.checkmate.interval_model`).

Why: on a 1,000-group graph one CP-SAT worker rarely improves a good hint within a minute; a
neighbourhood where most decisions are fixed is solved (often to optimality) in a second. A
neighbourhood is a window of consecutive forward groups plus the backward groups that read
them: their copies' presence and stages are free, every other copy is fixed to the incumbent,
and every end (how long a value is held) stays free, so freed recomputations can shorten or
stretch the lives around them. Windows that are solved to optimality grow, others shrink.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from solvers.base import SolverOptions
from solvers.checkmate.data import CheckmateData
from solvers.checkmate.interval_model import IntervalModel
from solvers.checkmate.interval_placement import hint, solution_stages

FIRST_WINDOW = 40
"""Forward groups in the first window (grown x1.5 after an optimal neighbourhood, shrunk x0.7
after one cut short)."""
NEIGHBOURHOOD_S = 2.0
"""Time limit of one neighbourhood's solve."""
STALL_ROUNDS = 40
"""The search stops after this many neighbourhoods in a row without improvement."""


@dataclass(frozen=True)
class LnsResult:
    stages: dict[int, list[int]]
    cost_units: int
    neighbourhoods: int
    improvements: int


def model_cost(data: CheckmateData, m: IntervalModel, stages: dict[int, list[int]]) -> int:
    return sum(m.units.cost(data.cost[g]) * (len(ts) - 1) for g, ts in stages.items())


def improve(cp_model, data: CheckmateData, m: IntervalModel, stages: dict[int, list[int]],
            deadline: float, options: SolverOptions) -> LnsResult:
    """Improve the placement ``stages`` (a solution of ``m``) until ``deadline``."""
    rng = random.Random(options.seed)
    forward = [g for g in m.copies if g < data.n_forward]
    backward_readers = {g: sorted({j for v in data.members[g] for j in data.readers[v]
                                   if j >= data.n_forward}) for g in forward}
    cost = model_cost(data, m, stages)
    size, rounds, better, stalled = float(FIRST_WINDOW), 0, 0, 0
    while cost > 0 and deadline - time.perf_counter() > 0.2 and stalled < STALL_ROUNDS:
        rounds += 1
        width = max(2, min(len(forward), int(size)))
        first = rng.randrange(max(1, len(forward) - width + 1))
        free = set(forward[first:first + width])
        free.update(j for g in list(free) for j in backward_readers[g])
        sub = m.model.clone()
        sub.clear_hints()
        hint(m, stages, sub)
        for g, copies in m.copies.items():
            if g in free:
                continue
            for k, c in enumerate(copies[1:], start=1):
                here = k < len(stages[g])
                sub.add(c.present == int(here))
                sub.add(c.stage == (stages[g][k] if here else g + 1))
        sub.add(m.objective <= cost)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, min(NEIGHBOURHOOD_S, deadline - time.perf_counter()))
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = options.seed + rounds
        status = solver.solve(sub)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            found = solution_stages(m, solver)
            found_cost = model_cost(data, m, found)
            if found_cost < cost:
                stages, cost, better, stalled = found, found_cost, better + 1, -1
        stalled += 1
        size = size * 1.5 if status == cp_model.OPTIMAL else max(4.0, size * 0.7)
    return LnsResult(stages, cost, rounds, better)
