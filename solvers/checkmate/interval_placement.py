"""Schedules <-> placements of the interval model: each group's stages, first copy first.

Why apart: the solve (`solvers.checkmate.intervals`) and its large-neighbourhood search
(`solvers.checkmate.interval_lns`) both hint placements and read them back.
"""

from __future__ import annotations

from solvers.checkmate.data import CheckmateData
from solvers.checkmate.interval_model import Copy, IntervalModel, recomputable
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule


def placements(data: CheckmateData, schedule: Schedule) -> dict[int, list[int]] | None:
    """Stage of each computation of each needed group in ``schedule`` (the first at its own
    stage), placed as early as the stage order allows; None when it does not fit that order."""
    gindex = {name: g for g, ms in enumerate(data.groups) for name in ms}
    W, F = data.n_groups + 1, data.n_forward
    stages: dict[int, list[int]] = {}
    cursor = -1
    for phase, lo, hi in (("forward", 0, F), ("backward", F, data.n_groups)):
        cursor = max(cursor, lo * W - 1)
        names = schedule.computes(phase)
        i = 0
        while i < len(names):
            g = gindex[names[i]]
            i += len(data.groups[g])
            if not data.needed[g]:
                continue
            if g not in stages:  # the first run: its own stage
                t = g
            elif recomputable(data, g):
                t = max(g + 1, cursor // W + (1 if cursor % W >= g else 0))
            else:
                return None
            if t * W + g <= cursor or not lo <= t < hi:
                return None
            stages.setdefault(g, []).append(t)
            cursor = t * W + g
    return stages if all(g in stages for g in range(data.n_groups) if data.needed[g]) else None


def hint(m: IntervalModel, stages: dict[int, list[int]], model=None) -> None:
    """Hint every stage, presence, end and read choice of ``m`` (into ``model``, a clone of
    ``m.model``, when given) from a placement."""
    model = m.model if model is None else model
    start_of: dict[int, int] = {}
    ends: dict[int, int] = {}  # id(end var) -> hinted end

    def start(c: Copy, k: int) -> int:
        return stages[c.group][k] * m.width + c.group

    placed = {}
    for g, copies in m.copies.items():
        for k, c in enumerate(copies):
            here = k < len(stages[g])
            placed[id(c)] = here
            s = start(c, k) if here else (g + 1) * m.width + g
            start_of[id(c)] = s
            if not isinstance(c.present, int):
                model.add_hint(c.present, here)
                model.add_hint(c.stage, stages[g][k] if here else g + 1)
            for v, e in c.ends.items():
                ends[id(e)] = s
    for reader, v, pairs in m.choices:
        if not isinstance(reader, int) and not placed[id(reader)]:
            for y, _ in pairs:
                if not isinstance(y, int):
                    model.add_hint(y, False)
            continue
        time = reader if isinstance(reader, int) else start_of[id(reader)]
        live = [(y, c) for y, c in pairs if placed[id(c)] and start_of[id(c)] < time]
        chosen = max(live, key=lambda p: start_of[id(p[1])], default=(None, None))[0]
        for y, c in pairs:
            if not isinstance(y, int):
                model.add_hint(y, y is chosen)
            if y is chosen:
                ends[id(c.ends[v])] = max(ends[id(c.ends[v])], time)
    for g, copies in m.copies.items():
        for c in copies:
            for e in c.ends.values():
                model.add_hint(e, ends[id(e)])


def solution_stages(m: IntervalModel, solver) -> dict[int, list[int]]:
    """The placement of a solved model: each group's stages, first copy first."""
    stages = {}
    for g, copies in m.copies.items():
        stages[g] = [c.stage if isinstance(c.stage, int) else solver.value(c.stage)
                     for c in copies if isinstance(c.present, int) or solver.boolean_value(c.present)]
    return stages


def placed_schedule(graph: RematGraph, data: CheckmateData, m: IntervalModel,
                    stages: dict[int, list[int]]) -> Schedule:
    """The computations of a placement in time order, split at the boundary."""
    runs = sorted((t * m.width + g, g) for g, ts in stages.items() for t in ts)
    forward = [name for t, g in runs if t < m.boundary for name in data.groups[g]]
    backward = [name for t, g in runs if t > m.boundary for name in data.groups[g]]
    return Schedule.from_computes(graph, forward, backward)
