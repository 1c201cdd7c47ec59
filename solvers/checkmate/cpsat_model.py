"""The Checkmate model in OR-Tools CP-SAT: integer units, variables, constraints, hints.

The encoding and the integer scaling are documented in `solvers.checkmate.cpsat`. ``build_cpsat_model`` makes the
cost-minimizing model for a budget, or (``minimize_peak``) the model whose objective is the
peak itself, used by `solvers.checkmate.min_budget` to find the smallest feasible budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import reduce
from typing import Union

from solvers.backends import cp_sat_backend
from solvers.checkmate.data import (
    CheckmateData,
    TriviallyInfeasible,
    computed,
    free_once_slots,
    is_const,
    is_kept,
    keep_slots,
    stage_slots,
)
from solvers.checkmate.stages import start_assignment
from solvers.ir.schedule import Schedule

_MAX_BYTE_UNITS = 10**8
"""Largest model size in byte units before bytes are scaled lossily (rounded up)."""
_COST_RESOLUTION = 1000
"""Units given to the smallest positive cost."""
_MAX_COST_UNITS = 10**9
"""Units given to the largest cost at most."""

cp_model = cp_sat_backend().module
"""OR-Tools' CP-SAT module, or None where it is not installed or cannot load (`solvers.backends`)."""

Term = Union["cp_model.IntVar", int]
"""A variable, or a constant 0/1 for which no variable is created."""


# ============================================================================ data
@dataclass(frozen=True)
class _Units:
    """Integer units of the model: bytes per unit and cost units per unit of cost."""

    byte_unit: int
    cost_scale: float
    exact_bytes: bool = True
    """Every byte count is a multiple of the unit: model bytes are true bytes."""

    def nbytes(self, b: int) -> int:
        return -(-b // self.byte_unit)  # rounded up: never optimistic

    def cost(self, c: float) -> int:
        return math.floor(c * self.cost_scale + 1e-9)  # rounded down: bounds stay valid


def new_solver(options, start: float):
    """A CpSolver configured from `SolverOptions`, with what is left of the time limit since
    ``start`` (a `time.perf_counter()` value). The full LP relaxation is in the search: the
    Checkmate model's bound comes from its LP (on chain(16) one worker proves optimality in
    1-7 s with it, not within 60 s without)."""

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, options.time_limit_s
                                                - (time.perf_counter() - start))
    solver.parameters.num_workers = max(1, options.threads)
    solver.parameters.random_seed = options.seed
    solver.parameters.log_search_progress = options.verbose
    solver.parameters.linearization_level = 2
    return solver


def _units(data: CheckmateData) -> _Units:
    counts = [data.resident_bytes, *data.value_bytes, *data.temp_bytes]
    unit = reduce(math.gcd, (b for b in counts if b > 0), 0) or 1
    total = data.resident_bytes + sum(data.value_bytes) + max(data.temp_bytes, default=0)
    exact = True
    if total // unit > _MAX_BYTE_UNITS:
        unit, exact = -(-total // _MAX_BYTE_UNITS), False
    costs = [c for c, n in zip(data.cost, data.needed) if n and c > 0]
    scale = 1.0
    if costs:
        scale = min(_COST_RESOLUTION / min(costs), _MAX_COST_UNITS / max(costs))
    return _Units(unit, scale, exact)


# ======================================================================= the model
@dataclass
class CpsatModel:
    model: cp_model.CpModel
    units: _Units
    capacity: int
    """The budget in byte units, rounded down."""
    peak: object = None
    """With ``minimize_peak``: the peak in byte units, a variable the objective minimizes;
    every memory constraint is ``<= peak`` (and ``peak <= capacity``)."""
    peak_floor: int = 0
    """The least value ``peak`` may take (a proven lower bound, in byte units)."""
    R: dict[tuple[int, int], Term] = field(default_factory=dict)
    S: dict[tuple[int, int], Term] = field(default_factory=dict)
    FREE: dict[tuple[int, int, int], Term] = field(default_factory=dict)
    U: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    slots: dict[int, list[int]] = field(default_factory=dict)


def _expr(terms, constant: int = 0):
    """sum(coef * x) + constant, folding constant terms; returns (expression, has_variables)."""
    variables = []
    for x, coef in terms:
        if is_const(x):
            constant += x * coef
        elif coef:
            variables.append(coef * x)
    return sum(variables, constant), bool(variables)


def _add_le(m: CpsatModel, lhs_terms, rhs_terms, lhs_const: int = 0, rhs_const: int = 0) -> None:
    """Add lhs <= rhs; check it here when it has no variables."""
    terms = list(lhs_terms) + [(x, -c) for x, c in rhs_terms]
    expr, has_vars = _expr(terms, lhs_const - rhs_const)
    if not has_vars:
        if expr > 0:
            raise TriviallyInfeasible()
        return
    m.model.add(expr <= 0)


def _create_variables(data: CheckmateData, m: CpsatModel) -> None:
    m.slots.update((t, []) for t in range(data.n_groups))
    # R[t, g]: stage t computes group g (fixed to 1 for its own group); same slots as the MILP.
    for t, g in stage_slots(data):
        m.R[t, g] = 1 if g == t else m.model.new_bool_var(f"R_{t}_{g}")
        m.slots[t].append(g)
    # S[t, v]: v is live when stage t starts; forward's user outputs are held through backward.
    for t, v, held in keep_slots(data):
        s = m.model.new_bool_var(f"S_{t}_{v}")
        if held:
            m.model.add(s == 1)
        m.S[t, v] = s
    # U[t, g]: live byte units while group g runs in stage t.
    for t, slots in m.slots.items():
        for g in slots:
            m.U[t, g] = m.model.new_int_var(0, m.capacity, f"U_{t}_{g}")


def build_cpsat_model(data: CheckmateData, budget: int, *, minimize_peak: bool = False,
           least_peak: int = 0) -> CpsatModel:
    """The model for ``budget``; minimizing cost, or with ``minimize_peak`` the peak (in
    ``[least_peak, budget]`` bytes, rounded to units) with costs ignored."""
    units = _units(data)
    capacity = budget // units.byte_unit
    if capacity < 0:
        raise TriviallyInfeasible()
    m = CpsatModel(cp_model.CpModel(), units, capacity)
    if minimize_peak:
        m.peak_floor = min(capacity, max(0, least_peak // units.byte_unit))
        m.peak = m.model.new_int_var(m.peak_floor, capacity, "peak")
    limit = m.peak if minimize_peak else m.capacity
    _create_variables(data, m)
    nb = units.nbytes

    # ---- read: a group runs only if each input was computed earlier in the stage or kept.
    for (t, j), r in m.R.items():
        for u in data.inputs[j]:
            _add_le(m, [(r, 1)], [(m.S.get((t, u), 0), 1), (computed(data, m, t, u), 1)])

    # ---- keep: kept into stage t only if live in stage t-1; no recompute of a kept value.
    for (t, v), s in m.S.items():
        if data.producer[v] is None and t == data.first_stage[v]:
            continue  # tangents arrive at the first backward stage
        _add_le(m, [(s, 1)], [(m.S.get((t - 1, v), 0), 1), (computed(data, m, t - 1, v), 1)])
    for (t, v), s in m.S.items():
        r = computed(data, m, t, v)
        if not is_const(r):
            _add_le(m, [(s, 1), (r, 1)], [], rhs_const=1)

    # ---- outputs: forward outputs live when forward ends, final outputs when the step ends.
    ends = [(data.n_forward - 1, v) for v in sorted(data.forward_outputs)]
    ends += [(data.n_groups - 1, v) for v in sorted(data.final_outputs)]
    for t, v in ends:
        _add_le(m, [], [(m.S.get((t, v), 0), 1), (computed(data, m, t, v), 1)], lhs_const=1)

    # ---- free: FREE[t, v, k] = R[t, k] and not keep[t+1, v] and no later reader of v runs.
    for t in range(data.n_groups):
        for v in range(len(data.values)):
            r = computed(data, m, t, v)
            if (t, v) not in m.S and is_const(r) and r == 0:
                continue  # v is never live in stage t
            keep = is_kept(data, m, t + 1, v)
            if is_const(keep) and keep == 1:
                continue
            own = data.producer[v]
            for k in ([own] if own is not None else []) + list(data.readers[v]):
                if (t, k) not in m.R:
                    continue
                # Conditions that must all hold for the free: (x, required value of x).
                conds = [(m.R[t, k], 1), (keep, 0)]
                conds += [(m.R[t, j], 0) for j in data.readers[v] if j > k and (t, j) in m.R]
                if any(is_const(x) and x != want for x, want in conds):
                    continue  # a constant hazard: never freed here
                lits = [x if want else ~x for x, want in conds if not is_const(x)]
                if not lits:
                    m.FREE[t, v, k] = 1
                    continue
                f = m.model.new_bool_var(f"FREE_{t}_{v}_{k}")
                m.FREE[t, v, k] = f
                m.model.add_bool_and(lits).only_enforce_if(f)
                m.model.add_bool_or([~lit for lit in lits] + [f])

    # ---- free once: a live copy is kept or freed once (redundant, as in the MILP).
    for t, v, fs in free_once_slots(data, m.FREE):
        _add_le(m, [(m.S.get((t + 1, v), 0), 1)] + [(f, 1) for f in fs],
                [(m.S.get((t, v), 0), 1), (computed(data, m, t, v), 1)])

    # ---- memory: U[t, g] = U[t, prev] - freed after prev + R[t, g] * bytes(g) <= capacity.
    for t in range(data.n_groups):
        kept = [(s, nb(data.value_bytes[v])) for (tt, v), s in m.S.items() if tt == t]
        prev = None
        for g in m.slots[t]:
            r = m.R[t, g]
            allocated = (r, _group_units(data, g, nb))
            if prev is None:
                rhs, _ = _expr(kept + [allocated], nb(data.resident_bytes))
            else:
                freeable = dict.fromkeys(data.inputs[prev] + data.members[prev])
                freed = [(m.FREE[t, v, prev], -nb(data.value_bytes[v]))
                         for v in freeable if (t, v, prev) in m.FREE]
                rhs, _ = _expr([(m.U[t, prev], 1), allocated] + freed)
            m.model.add(m.U[t, g] == rhs)
            if minimize_peak:
                m.model.add(m.U[t, g] <= m.peak)
            if data.temp_bytes[g]:
                m.model.add(m.U[t, g] + nb(data.temp_bytes[g]) * r <= limit)
            prev = g
        if prev is None:  # an unneeded group's stage: what is kept must still fit
            _add_le(m, kept, _limit_terms(m), lhs_const=nb(data.resident_bytes),
                    rhs_const=_limit_const(m))

    # ---- boundary: resident + tangents + everything live when forward ends <= budget.
    live = [(is_kept(data, m, data.n_forward, v), nb(data.value_bytes[v]))
            for v, g in enumerate(data.producer) if g is not None and g < data.n_forward]
    tangents = sum(nb(data.value_bytes[v]) for v, g in enumerate(data.producer) if g is None)
    _add_le(m, live, _limit_terms(m), lhs_const=nb(data.resident_bytes) + tangents,
            rhs_const=_limit_const(m))

    # ---- objective: every computation of every group, in integer cost units.
    if minimize_peak:
        m.model.minimize(m.peak)
        return m
    objective, _ = _expr([(r, units.cost(data.cost[g])) for (t, g), r in m.R.items()])
    m.model.minimize(objective)
    return m


def _limit_terms(m: CpsatModel) -> list:
    return [] if m.peak is None else [(m.peak, 1)]


def _limit_const(m: CpsatModel) -> int:
    return m.capacity if m.peak is None else 0


def _group_units(data: CheckmateData, g: int, nb) -> int:
    """A group's bytes in units: the sum of its members' rounded-up bytes (as they are freed)."""
    return sum(nb(data.value_bytes[v]) for v in data.members[g])


# ============================================================ warm start
def hint_schedule(data: CheckmateData, m: CpsatModel, schedule: Schedule) -> dict[tuple[int, int], int] | None:
    """Hint every variable from a schedule; returns its R values (None: it does not fit)."""
    assignment = start_assignment(data, m, schedule)
    if assignment is None:
        return None
    r, s, free = assignment
    nb = m.units.nbytes
    u: dict[tuple[int, int], int] = {}
    peak = 0
    for t in range(data.n_groups):
        level = nb(data.resident_bytes) + sum(nb(data.value_bytes[v]) for (tt, v) in s if tt == t)
        prev = None
        for g in m.slots[t]:
            if prev is not None:
                for v in dict.fromkeys(data.inputs[prev] + data.members[prev]):
                    level -= nb(data.value_bytes[v]) * free.get((t, v, prev), 0)
            level += _group_units(data, g, nb) * r[t, g]
            if level + nb(data.temp_bytes[g]) * r[t, g] > m.capacity:
                return None
            peak = max(peak, level + nb(data.temp_bytes[g]) * r[t, g])
            u[t, g] = level
            prev = g
    for table, values in ((m.R, r), (m.S, s), (m.FREE, free), (m.U, u)):
        for key, x in table.items():
            if not is_const(x):
                m.model.add_hint(x, values.get(key, 0))
    if m.peak is not None:  # the stages' peak; CP-SAT repairs the hint if the boundary is higher
        m.model.add_hint(m.peak, min(m.capacity, max(peak, m.peak_floor)))
    return r
