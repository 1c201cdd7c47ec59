"""Schedules <-> Checkmate stages: the compute order a stage assignment means, and the stage
assignment (R, S and FREE values) of a given schedule, used as a warm start by every back-end.
"""

from __future__ import annotations

from solvers.checkmate.data import CheckmateData, is_const, is_kept
from solvers.ir.schedule import Schedule


def stage_sequences(data: CheckmateData, chosen) -> tuple[list[str], list[str]]:
    """Literal compute orders (every member of every computed group) of chosen R entries."""
    forward: list[str] = []
    backward: list[str] = []
    for t in range(data.n_groups):
        part = forward if t < data.n_forward else backward
        for g in range(t + 1):
            if chosen(t, g):
                part.extend(data.groups[g])
    return forward, backward


def _stages_of(data: CheckmateData, model, schedule: Schedule) -> dict[tuple[int, int], int] | None:
    """R values that put a schedule's computations into stages (None if they do not fit)."""
    gindex = {name: g for g, ms in enumerate(data.groups) for name in ms}
    chosen = {key: 1 for key, x in model.R.items() if is_const(x)}
    for phase, t in (("forward", 0), ("backward", data.n_forward)):
        last = -1
        names = schedule.computes(phase)
        i = 0
        while i < len(names):
            g = gindex[names[i]]
            i += len(data.groups[g])
            while g <= last or g > t:  # stage t runs groups <= t in increasing order
                t, last = t + 1, -1
                if t >= (data.n_forward if phase == "forward" else data.n_groups):
                    return None
            if (t, g) not in model.R:
                return None
            chosen[t, g] = 1
            last = g
    return chosen


def start_assignment(data: CheckmateData, model, schedule: Schedule) -> tuple[dict, dict, dict] | None:
    """R, S and FREE values that put a schedule into the model's stages (None if it does not map).

    ``model`` is any model with this module's ``R``, ``S``, ``FREE`` and ``slots`` tables (the
    PuLP one here, the CP-SAT one in `solvers.checkmate.cpsat`); memory is not checked here.
    """
    chosen = _stages_of(data, model, schedule)
    if chosen is None:
        return None
    r = {key: chosen.get(key, 0) for key in model.R}
    # S: minimal liveness, by a backward pass over the stages.
    s: dict[tuple[int, int], int] = {}
    need = set(data.final_outputs)
    for t in reversed(range(data.n_groups)):
        if t + 1 == data.n_forward:  # tangents arrive at the boundary; forward outputs live
            need = {v for v in need if data.producer[v] is not None} | data.forward_outputs
        for g in reversed(model.slots[t]):
            if r[t, g]:
                need -= set(data.members[g])
                need |= set(data.inputs[g])
        for v in need:
            if (t, v) not in model.S:
                return None
            s[t, v] = 1
    if data.n_forward == 0:
        need = {v for v in need if data.producer[v] is not None}
    if need:
        return None
    # FREE: its definition, evaluated.
    free: dict[tuple[int, int, int], int] = {}
    for (t, v, k), f in model.FREE.items():
        keep = is_kept(data, model, t + 1, v)
        keep = keep if is_const(keep) else s.get((t + 1, v), 0)
        later = any(r.get((t, j), 0) for j in data.readers[v] if j > k)
        free[t, v, k] = f if is_const(f) else int(r[t, k] == 1 and not keep and not later)
    return r, s, free
