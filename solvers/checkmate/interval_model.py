"""The retention-interval model (Moccasin, Bartan et al. 2023) in CP-SAT: O(n) variables.

Why: Checkmate's stage model has a boolean per (stage, group) pair, O(n^2): past
`solvers.base.EXACT_MAX_GROUPS` its build alone outlasts the time limit. Here each op group has a
few *copies* (computations); a copy has a start and, per member value, an end, and holds the
value over ``[start, end]``; memory is one cumulative constraint over those intervals.

Time is the Checkmate stage order, flattened: stage ``t`` runs recomputations of earlier groups
``g < t`` in increasing order, then group ``t`` itself, so copy of ``g`` in stage ``t`` runs at
``tau(t, g) = t * W + g`` (``W = n + 1``). Group ``g``'s first copy runs at ``tau(g, g)``; the
boundary (tangents arrive, forward ends) is ``F * W - 1``; the step ends at ``n * W``. A value
is live in the simulator from its computation to the step after its last read, which is what
an interval ``[start, end + 1)`` with ``end >= every read`` charges (an op's inputs are live
while it allocates, its temporaries only at its start): a solution's simulated peak is at most
the model's. Restrictions (the family searched): run-once ops and groups with an output the
caller holds run once, at their own stage; other groups at most ``copies_of[g]`` times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce

from solvers.checkmate.data import CheckmateData

_MAX_BYTE_UNITS = 10**9
"""Largest budget in byte units before bytes are scaled lossily (demands rounded up)."""
_COST_RESOLUTION = 1000
_MAX_COST_UNITS = 10**7


@dataclass(frozen=True)
class Units:
    """Integer units: bytes per unit (demands rounded up, capacity down) and cost units per
    cost (rounded down), so the model is never optimistic and its bound stays valid."""

    byte_unit: int
    cost_scale: float

    def nbytes(self, b: int) -> int:
        return -(-b // self.byte_unit)

    def cost(self, c: float) -> int:
        return math.floor(c * self.cost_scale)


def units_for(data: CheckmateData, budget: int) -> Units:
    counts = [budget, data.resident_bytes, *data.value_bytes, *data.temp_bytes]
    unit = reduce(math.gcd, (b for b in counts if b > 0), 0) or 1
    if budget // unit > _MAX_BYTE_UNITS:
        unit = -(-budget // _MAX_BYTE_UNITS)
    costs = [c for c, n in zip(data.cost, data.needed) if n and c > 0]
    scale = min(_COST_RESOLUTION / min(costs), _MAX_COST_UNITS / max(costs)) if costs else 1.0
    return Units(unit, scale)


@dataclass
class Copy:
    """One computation of a group: its stage (a constant or variable), presence and member ends."""

    group: int
    stage: object
    present: object
    ends: dict[int, object] = field(default_factory=dict)
    """Member value -> its end variable (the last time the copy is live)."""


@dataclass
class IntervalModel:
    model: object
    units: Units
    width: int
    """W: times per stage."""
    copies: dict[int, list[Copy]]
    """Needed group -> its copies, the first at its own stage."""
    boundary: int
    end: int
    objective: object = 0
    """Cost units of the recomputations (the model's objective)."""
    choices: list = field(default_factory=list)
    """(reader copy or fixed time, value, [(y, source copy)]): which copy each read uses."""

    def start(self, c: Copy):
        return c.stage * self.width + c.group


def recomputable(data: CheckmateData, g: int) -> bool:
    """Groups that may run again: not run-once, not holding a user output (a copy of it would
    be a throwaway), not a gradient the step returns (held to the end)."""
    held = any(v in data.final_outputs for v in data.members[g])
    return not data.once[g] and not held


def build_interval_model(cp_model, data: CheckmateData, budget: int,
                         copies_of: dict[int, int]) -> IntervalModel:
    """The model for ``budget``: ``copies_of[g]`` computations at most for each needed group."""
    units = units_for(data, budget)
    nb = units.nbytes
    model = cp_model.CpModel()
    n, F = data.n_groups, data.n_forward
    W = n + 1
    boundary, end = F * W - 1, n * W
    m = IntervalModel(model, units, W, {}, boundary, end)
    capacity = budget // units.byte_unit - nb(data.resident_bytes)
    if capacity < 0:
        model.add_bool_or([])  # infeasible
        capacity = 0
    intervals, demands = [], []

    # ---- copies: the first at its own stage; later ones in a later stage, in order.
    for g in range(n):
        if not data.needed[g]:
            continue
        last = data.group_last_stage(g)
        copies = [Copy(g, g, 1)]
        for k in range(1, copies_of.get(g, 1)):
            if last <= g:
                break
            stage = model.new_int_var(g + 1, last, f"st_{g}_{k}")
            present = model.new_bool_var(f"p_{g}_{k}")
            if k > 1:  # use copies in order, later in time (symmetry)
                model.add_implication(present, copies[-1].present)
                model.add(stage > copies[-1].stage).only_enforce_if(present)
            model.add(stage == g + 1).only_enforce_if(~present)
            copies.append(Copy(g, stage, present))
        m.copies[g] = copies
        for c in copies:
            start = m.start(c)
            for v in data.members[g]:
                e = model.new_int_var(0, end, f"e_{v}_{len(c.ends)}")
                model.add(e >= start)
                if not isinstance(c.present, int):
                    model.add(e == start).only_enforce_if(~c.present)
                c.ends[v] = e
                if nb(data.value_bytes[v]) == 0:
                    continue
                size = model.new_int_var(1, end + 1, "")
                if isinstance(c.present, int):
                    intervals.append(model.new_interval_var(start, size, e + 1, ""))
                else:
                    intervals.append(model.new_optional_interval_var(start, size, e + 1, c.present, ""))
                demands.append(nb(data.value_bytes[v]))
            if data.temp_bytes[g]:
                if isinstance(c.present, int):
                    intervals.append(model.new_fixed_size_interval_var(start, 1, ""))
                else:
                    intervals.append(model.new_optional_fixed_size_interval_var(start, 1, c.present, ""))
                demands.append(nb(data.temp_bytes[g]))
        for a, b in zip(copies, copies[1:]):  # a copy runs only once the previous one is dead
            for v in data.members[g]:
                model.add(a.ends[v] < m.start(b)).only_enforce_if(b.present)

    # ---- reads: each input of a copy is live at its start, from an earlier copy.
    def read(v: int, time, enforce, reader) -> None:
        h = data.producer[v]
        if h is None:  # a tangent: live through backward
            return
        sources = m.copies[h]
        if len(sources) == 1:
            model.add(sources[0].ends[v] >= time).only_enforce_if(enforce)
            m.choices.append((reader, v, [(1, sources[0])]))
            return
        chosen, pairs = [], []
        for c in sources:
            y = model.new_bool_var("")
            if not isinstance(c.present, int):
                model.add_implication(y, c.present)
            model.add(m.start(c) < time).only_enforce_if(y)
            model.add(c.ends[v] >= time).only_enforce_if(y)
            chosen.append(y)
            pairs.append((y, c))
        model.add_bool_or(chosen).only_enforce_if(enforce)
        m.choices.append((reader, v, pairs))

    for g, copies in m.copies.items():
        for c in copies:
            for v in data.inputs[g]:
                read(v, m.start(c), [] if isinstance(c.present, int) else [c.present], c)
    for v in sorted(data.forward_outputs):
        if data.producer[v] is not None and v not in data.final_outputs:
            read(v, boundary, [], boundary)
    for v in sorted(data.final_outputs):
        if data.producer[v] is not None:
            model.add(m.copies[data.producer[v]][0].ends[v] == end)
            m.choices.append((end, v, [(1, m.copies[data.producer[v]][0])]))

    # ---- memory: every live copy, its temporaries and the tangents within the budget.
    if data.tangent_bytes:
        intervals.append(model.new_fixed_size_interval_var(boundary, end + 1 - boundary, ""))
        demands.append(nb(data.tangent_bytes))
    model.add_cumulative(intervals, demands, capacity)

    # ---- objective: the recomputations (the first copies are the base cost).
    m.objective = sum(units.cost(data.cost[g]) * c.present
                      for g, copies in m.copies.items() for c in copies[1:])
    model.minimize(m.objective)
    return m
