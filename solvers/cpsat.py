"""The Checkmate model of `solvers.milp`, solved with OR-Tools CP-SAT.

Same stages, same variables, same constraint families as the MILP (see `solvers.milp` for
their meaning), so both back-ends have the same optimum; only the encoding differs:

- ``R``, ``S`` and ``FREE`` are booleans. ``FREE[t, v, k]`` is the AND of its negated hazards
  (``R[t, k]``, not kept, no later reader in the stage), stated as a reified ``add_bool_and``
  plus one clause: the same integer points as the MILP's linearization.
- ``U[t, g]`` are integer variables in ``[0, capacity]`` with the MILP's recurrence.

**Integer scaling.** CP-SAT needs integer coefficients.

- Bytes: the unit is the gcd of every byte count in the model (exact); if the model would
  still exceed ``_MAX_BYTE_UNITS`` units, the unit grows to ``ceil(total / _MAX_BYTE_UNITS)``.
  Every byte count is rounded UP to units and the budget DOWN (``floor(budget / unit)``), so
  the model is never optimistic: a model solution's true peak is at most the budget. With
  the gcd unit (every test graph, and real graphs below ~1e8 bytes per gcd) the scaling is exact.
- Costs: ``c -> floor(c * s)`` with ``s = _COST_RESOLUTION / min_positive_cost``, capped so
  that the largest cost is at most ``_MAX_COST_UNITS``. Integer-ish costs (1, 2, 5, ...)
  stay exact. Rounding DOWN makes ``best_objective_bound / s`` a valid lower bound on the true
  cost. ``MilpSolution.model_cost`` and every reported objective are recomputed in true cost
  units (``SolveResult.objective`` is the simulated cost).

Warm start: the schedule's stage assignment (`solvers.milp._start_assignment`), completed
with ``U`` by its recurrence, is given to CP-SAT as a full hint; if CP-SAT stops without a
solution, the hint itself (checked to fit the capacity) is returned as FEASIBLE, so a
warm-started solve is never worse than its hint.

Determinism: ``random_seed`` is ``options.seed`` (0 by default) and ``num_workers = options.threads``; with one worker
the same inputs give the same schedule (CP-SAT with several workers is deterministic only when
it finishes before the time limit).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import reduce
from typing import Union

from optimizer.graph import RematGraph
from optimizer.schedule import Schedule
from solvers.base import (
    SolveResult,
    SolverOptions,
    SolverUnavailableError,
    SolveStatus,
)
from solvers.milp import (
    MilpSolution,
    _computed,
    _Data,
    _is_const,
    _keep,
    _prepare,
    _stage_sequences,
    _keep_slots,
    _stage_slots,
    _start_assignment,
    solve_checkmate,
)

SOLVER_NAME = "checkmate-cpsat"
BACKEND = "cp-sat"
_MAX_BYTE_UNITS = 10**8
"""Largest model size in byte units before bytes are scaled lossily (rounded up)."""
_COST_RESOLUTION = 1000
"""Units given to the smallest positive cost."""
_MAX_COST_UNITS = 10**9
"""Units given to the largest cost at most."""

try:
    from ortools.sat.python import cp_model
except ImportError:  # pragma: no cover - depends on the environment
    cp_model = None  # type: ignore[assignment]

Term = Union["cp_model.IntVar", int]
"""A variable, or a constant 0/1 for which no variable is created."""


def _require_ortools() -> None:
    if cp_model is None:
        raise SolverUnavailableError("the CP-SAT back-end needs OR-Tools: pip install ortools")


# ============================================================================ data
@dataclass(frozen=True)
class _Units:
    """Integer units of the model: bytes per unit and cost units per unit of cost."""

    byte_unit: int
    cost_scale: float

    def nbytes(self, b: int) -> int:
        return -(-b // self.byte_unit)  # rounded up: never optimistic

    def cost(self, c: float) -> int:
        return math.floor(c * self.cost_scale + 1e-9)  # rounded down: bounds stay valid


def _units(data: _Data) -> _Units:
    counts = [data.resident_bytes, *data.value_bytes, *data.temp_bytes]
    unit = reduce(math.gcd, (b for b in counts if b > 0), 0) or 1
    total = data.resident_bytes + sum(data.value_bytes) + max(data.temp_bytes, default=0)
    if total // unit > _MAX_BYTE_UNITS:
        unit = -(-total // _MAX_BYTE_UNITS)
    costs = [c for c, n in zip(data.cost, data.needed) if n and c > 0]
    scale = 1.0
    if costs:
        scale = min(_COST_RESOLUTION / min(costs), _MAX_COST_UNITS / max(costs))
    return _Units(unit, scale)


# ======================================================================= the model
@dataclass
class _CpModel:
    model: cp_model.CpModel
    units: _Units
    capacity: int
    """The budget in byte units, rounded down."""
    R: dict[tuple[int, int], Term] = field(default_factory=dict)
    S: dict[tuple[int, int], Term] = field(default_factory=dict)
    FREE: dict[tuple[int, int, int], Term] = field(default_factory=dict)
    U: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    slots: dict[int, list[int]] = field(default_factory=dict)


class _TriviallyInfeasible(Exception):
    """A constraint without variables is violated: the model has no solution."""


def _expr(terms, constant: int = 0):
    """sum(coef * x) + constant, folding constant terms; returns (expression, has_variables)."""
    variables = []
    for x, coef in terms:
        if _is_const(x):
            constant += x * coef
        elif coef:
            variables.append(coef * x)
    return sum(variables, constant), bool(variables)


def _add_le(m: _CpModel, lhs_terms, rhs_terms, lhs_const: int = 0, rhs_const: int = 0) -> None:
    """Add lhs <= rhs; check it here when it has no variables."""
    terms = list(lhs_terms) + [(x, -c) for x, c in rhs_terms]
    expr, has_vars = _expr(terms, lhs_const - rhs_const)
    if not has_vars:
        if expr > 0:
            raise _TriviallyInfeasible()
        return
    m.model.add(expr <= 0)


def _create_variables(data: _Data, m: _CpModel) -> None:
    m.slots.update((t, []) for t in range(data.n_groups))
    # R[t, g]: stage t computes group g (fixed to 1 for its own group); same slots as the MILP.
    for t, g in _stage_slots(data):
        m.R[t, g] = 1 if g == t else m.model.new_bool_var(f"R_{t}_{g}")
        m.slots[t].append(g)
    # S[t, v]: v is live when stage t starts; forward's user outputs are held through backward.
    for t, v, held in _keep_slots(data):
        s = m.model.new_bool_var(f"S_{t}_{v}")
        if held:
            m.model.add(s == 1)
        m.S[t, v] = s
    # U[t, g]: live byte units while group g runs in stage t.
    for t, slots in m.slots.items():
        for g in slots:
            m.U[t, g] = m.model.new_int_var(0, m.capacity, f"U_{t}_{g}")


def _build(data: _Data, budget: int) -> _CpModel:
    units = _units(data)
    capacity = budget // units.byte_unit
    if capacity < 0:
        raise _TriviallyInfeasible()
    m = _CpModel(cp_model.CpModel(), units, capacity)
    _create_variables(data, m)
    nb = units.nbytes

    # ---- read: a group runs only if each input was computed earlier in the stage or kept.
    for (t, j), r in m.R.items():
        for u in data.inputs[j]:
            _add_le(m, [(r, 1)], [(m.S.get((t, u), 0), 1), (_computed(data, m, t, u), 1)])

    # ---- keep: kept into stage t only if live in stage t-1; no recompute of a kept value.
    for (t, v), s in m.S.items():
        if data.producer[v] is None and t == data.first_stage[v]:
            continue  # tangents arrive at the first backward stage
        _add_le(m, [(s, 1)], [(m.S.get((t - 1, v), 0), 1), (_computed(data, m, t - 1, v), 1)])
    for (t, v), s in m.S.items():
        r = _computed(data, m, t, v)
        if not _is_const(r):
            _add_le(m, [(s, 1), (r, 1)], [], rhs_const=1)

    # ---- outputs: forward outputs live when forward ends, final outputs when the step ends.
    ends = [(data.n_forward - 1, v) for v in sorted(data.forward_outputs)]
    ends += [(data.n_groups - 1, v) for v in sorted(data.final_outputs)]
    for t, v in ends:
        _add_le(m, [], [(m.S.get((t, v), 0), 1), (_computed(data, m, t, v), 1)], lhs_const=1)

    # ---- free: FREE[t, v, k] = R[t, k] and not keep[t+1, v] and no later reader of v runs.
    for t in range(data.n_groups):
        for v in range(len(data.values)):
            r = _computed(data, m, t, v)
            if (t, v) not in m.S and _is_const(r) and r == 0:
                continue  # v is never live in stage t
            keep = _keep(data, m, t + 1, v)
            if _is_const(keep) and keep == 1:
                continue
            own = data.producer[v]
            for k in ([own] if own is not None else []) + list(data.readers[v]):
                if (t, k) not in m.R:
                    continue
                # Conditions that must all hold for the free: (x, required value of x).
                conds = [(m.R[t, k], 1), (keep, 0)]
                conds += [(m.R[t, j], 0) for j in data.readers[v] if j > k and (t, j) in m.R]
                if any(_is_const(x) and x != want for x, want in conds):
                    continue  # a constant hazard: never freed here
                lits = [x if want else ~x for x, want in conds if not _is_const(x)]
                if not lits:
                    m.FREE[t, v, k] = 1
                    continue
                f = m.model.new_bool_var(f"FREE_{t}_{v}_{k}")
                m.FREE[t, v, k] = f
                m.model.add_bool_and(lits).only_enforce_if(f)
                m.model.add_bool_or([~lit for lit in lits] + [f])

    # ---- free once: a live copy is kept or freed once (redundant, as in the MILP).
    frees: dict[tuple[int, int], list] = {}
    for (t, v, k), f in m.FREE.items():
        frees.setdefault((t, v), []).append(f)
    for (t, v), fs in sorted(frees.items()):
        if data.producer[v] is None and t < data.first_stage[v]:
            continue
        _add_le(m, [(m.S.get((t + 1, v), 0), 1)] + [(f, 1) for f in fs],
                [(m.S.get((t, v), 0), 1), (_computed(data, m, t, v), 1)])

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
            if data.temp_bytes[g]:
                m.model.add(m.U[t, g] + nb(data.temp_bytes[g]) * r <= m.capacity)
            prev = g
        if prev is None:  # an unneeded group's stage: what is kept must still fit
            _add_le(m, kept, [], lhs_const=nb(data.resident_bytes), rhs_const=m.capacity)

    # ---- boundary: resident + tangents + everything live when forward ends <= budget.
    live = [(_keep(data, m, data.n_forward, v), nb(data.value_bytes[v]))
            for v, g in enumerate(data.producer) if g is not None and g < data.n_forward]
    tangents = sum(nb(data.value_bytes[v]) for v, g in enumerate(data.producer) if g is None)
    _add_le(m, live, [], lhs_const=nb(data.resident_bytes) + tangents, rhs_const=m.capacity)

    # ---- objective: every computation of every group, in integer cost units.
    objective, _ = _expr([(r, units.cost(data.cost[g])) for (t, g), r in m.R.items()])
    m.model.minimize(objective)
    return m


def _group_units(data: _Data, g: int, nb) -> int:
    """A group's bytes in units: the sum of its members' rounded-up bytes (as they are freed)."""
    return sum(nb(data.value_bytes[v]) for v in data.members[g])


# ============================================================ warm start
def _hint(data: _Data, m: _CpModel, schedule: Schedule) -> dict[tuple[int, int], int] | None:
    """Hint every variable from a schedule; returns its R values (None: it does not fit)."""
    assignment = _start_assignment(data, m, schedule)
    if assignment is None:
        return None
    r, s, free = assignment
    nb = m.units.nbytes
    u: dict[tuple[int, int], int] = {}
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
            u[t, g] = level
            prev = g
    for table, values in ((m.R, r), (m.S, s), (m.FREE, free), (m.U, u)):
        for key, x in table.items():
            if not _is_const(x):
                m.model.add_hint(x, values.get(key, 0))
    return r


# =========================================================================== solve
class _Progress(cp_model.CpSolverSolutionCallback if cp_model is not None else object):
    """Prints each incumbent and the bound, in cost units, as CP-SAT finds them."""

    def __init__(self, cost_scale: float) -> None:
        super().__init__()
        self._scale = cost_scale
        self._start = time.perf_counter()

    def on_solution_callback(self) -> None:
        print(f"[cp-sat {time.perf_counter() - self._start:7.2f}s] incumbent "
              f"{self.objective_value / self._scale:.6g}, bound "
              f"{self.best_objective_bound / self._scale:.6g}", flush=True)


def solve_cpsat_model(graph: RematGraph, budget_bytes: int, options: SolverOptions,
                      warm_start: Schedule | None = None) -> MilpSolution:
    """Build and solve the Checkmate model with CP-SAT; no shortcuts, no simulation.

    ``warm_start`` (a schedule that fits the budget) becomes a full hint; if CP-SAT stops
    without a solution the hint is returned as FEASIBLE, so the result is never worse.
    """
    _require_ortools()
    start = time.perf_counter()
    data = _prepare(graph)

    def done(status, forward=(), backward=(), cost=None, bound=None, warm=False) -> MilpSolution:
        return MilpSolution(status, tuple(forward), tuple(backward), cost, bound, BACKEND,
                            time.perf_counter() - start, warm)

    def cost_of(chosen: set[tuple[int, int]]) -> float:
        return sum(data.cost[g] for _, g in chosen)

    try:
        m = _build(data, budget_bytes)
    except _TriviallyInfeasible:
        return done(SolveStatus.INFEASIBLE)
    hinted = _hint(data, m, warm_start) if warm_start is not None else None
    warm = hinted is not None

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, options.time_limit_s
                                                - (time.perf_counter() - start))
    solver.parameters.num_workers = max(1, options.threads)
    solver.parameters.random_seed = options.seed
    solver.parameters.log_search_progress = options.verbose
    # The full LP relaxation in the search: the Checkmate model's bound comes from its LP (on
    # chain(16) one worker proves optimality in 1-7 s with it, not within 60 s without).
    solver.parameters.linearization_level = 2
    callback = _Progress(m.units.cost_scale) if options.verbose else None
    status = solver.solve(m.model, callback)

    def bound_in_cost(cost: float) -> float:
        # Coefficients are rounded down, so the bound holds in cost units; the 1e-9 guard
        # against float noise may round one up by a hair: that excess is taken off per term.
        excess = max((m.units.cost(data.cost[g]) - data.cost[g] * m.units.cost_scale
                      for (_, g) in m.R), default=0.0)
        slack = max(0.0, excess) * len(m.R)
        return min(cost, (solver.best_objective_bound - slack) / m.units.cost_scale)

    # ---- branch on every status CP-SAT reports
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        chosen = {key for key, x in m.R.items() if _is_const(x) or solver.boolean_value(x)}
        forward, backward = _stage_sequences(data, lambda t, g: (t, g) in chosen)
        cost = cost_of(chosen)
        if status == cp_model.OPTIMAL:
            return done(SolveStatus.OPTIMAL, forward, backward, cost, cost, warm)
        return done(SolveStatus.FEASIBLE, forward, backward, cost, bound_in_cost(cost), warm)
    if status == cp_model.INFEASIBLE:
        return done(SolveStatus.INFEASIBLE, warm=warm)
    if status == cp_model.MODEL_INVALID:
        raise AssertionError(f"invalid CP-SAT model: {m.model.validate()}")
    # UNKNOWN: stopped (time limit) without a solution; the hint is one if it fit.
    if hinted is not None:
        chosen = {key for key, x in hinted.items() if x}
        forward, backward = _stage_sequences(data, lambda t, g: (t, g) in chosen)
        cost = cost_of(chosen)  # CP-SAT's bound is proven even without a solution
        return done(SolveStatus.FEASIBLE, forward, backward, cost, bound_in_cost(cost), warm)
    return done(None, warm=warm)


def solve_cpsat(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """Cheapest schedule whose simulated peak fits ``budget_bytes`` (Checkmate model, CP-SAT).

    The same contract as `solvers.milp.solve_milp`: store-all fits -> OPTIMAL at once;
    solved -> OPTIMAL; time limit with an incumbent -> FEASIBLE (never worse than the classic
    seed) with CP-SAT's bound; no incumbent -> HEURISTIC classic schedule; nothing fits ->
    `InfeasibleBudgetError` with the smallest classic peak. ``objective`` is simulated.
    """
    _require_ortools()
    return solve_checkmate(graph, budget_bytes, options, solver_name=SOLVER_NAME,
                           solve_model=solve_cpsat_model)
