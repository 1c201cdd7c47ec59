"""The Checkmate MILP in PuLP: variables, constraint families, objective, and a MIP start.

What each variable and constraint means is documented in `solvers.checkmate.milp`; the graph indexing
and which variables exist are in `solvers.checkmate.data`, shared with `solvers.checkmate.cpsat`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import pulp

from solvers.checkmate.data import (
    CheckmateData,
    TriviallyInfeasible,
    computed,
    free_once_slots,
    is_const,
    is_kept,
    keep_slots,
    prepare,
    stage_slots,
)
from solvers.checkmate.stages import start_assignment
from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule

_MAX_SCALED_BYTES = 1e4
"""Bytes are scaled so that the sum of every byte count in the model is at most this."""
_CAPACITY_MARGIN = 0.05
"""Model units taken off the budget so solver tolerances can never overshoot it."""

Term = Union[pulp.LpVariable, int]
"""A model quantity: a variable, or a constant 0/1 for which no variable is created."""


@dataclass
class MilpModel:
    prob: pulp.LpProblem
    scale: float
    """Model bytes per byte."""
    capacity: float
    """The budget in model bytes, less the safety margin."""
    cost_scale: float
    """Model cost per unit of cost."""
    R: dict[tuple[int, int], Term] = field(default_factory=dict)
    S: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    FREE: dict[tuple[int, int, int], Term] = field(default_factory=dict)
    U: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    slots: dict[int, list[int]] = field(default_factory=dict)
    """Groups that may run in each stage, in order."""



def _affine(terms, constant: float = 0.0) -> pulp.LpAffineExpression:
    """sum(coef * x) + constant, where each x is a variable or a constant number."""
    expr = pulp.LpAffineExpression(constant=constant)
    for x, coef in terms:
        if is_const(x):
            expr.constant += x * coef
        elif coef:
            expr.addterm(x, coef)
    return expr


def _add(model: MilpModel, constraint: pulp.LpConstraint, name: str) -> None:
    """Add a constraint; check those without variables here instead of in the solver."""
    if len(constraint.keys()) == 0:
        value = constraint.constant  # the constraint reads: value (sense) 0
        ok = {pulp.LpConstraintLE: value <= 1e-9, pulp.LpConstraintGE: value >= -1e-9,
              pulp.LpConstraintEQ: abs(value) <= 1e-9}[constraint.sense]
        if not ok:
            raise TriviallyInfeasible(name)
        return
    model.prob += constraint, name


def _new_model(data: CheckmateData, budget: int) -> MilpModel:
    total = data.resident_bytes + sum(data.value_bytes) + max(data.temp_bytes, default=0)
    scale = min(1.0, _MAX_SCALED_BYTES / max(total, 1))
    # Bytes are integers: a true peak below budget + 1 is within budget; the margin covers
    # the solver's integrality and feasibility tolerances on numbers below 1e4.
    capacity = scale * (budget + 0.5) - _CAPACITY_MARGIN
    max_cost = max((c for c, n in zip(data.cost, data.needed) if n), default=0.0)
    cost_scale = 1.0 if max_cost <= 0 or 1.0 <= max_cost <= 1e4 else 1e3 / max_cost
    return MilpModel(pulp.LpProblem("checkmate", pulp.LpMinimize), scale, capacity, cost_scale)



def _create_variables(data: CheckmateData, model: MilpModel) -> None:
    model.slots.update((t, []) for t in range(data.n_groups))
    # R[t, g]: stage t computes group g (fixed to 1 for its own group).
    for t, g in stage_slots(data):
        model.R[t, g] = 1 if g == t else pulp.LpVariable(f"R_{t}_{g}", cat=pulp.LpBinary)
        model.slots[t].append(g)
    # S[t, v]: value v is live when stage t starts.
    for t, v, held in keep_slots(data):
        model.S[t, v] = pulp.LpVariable(f"S_{t}_{v}", lowBound=1 if held else 0, upBound=1,
                                        cat=pulp.LpInteger)
    # U[t, g]: live bytes while group g runs in stage t.
    for t, slots in model.slots.items():
        for g in slots:
            model.U[t, g] = pulp.LpVariable(f"U_{t}_{g}", lowBound=0, upBound=model.capacity)



def _add_read_constraints(data: CheckmateData, model: MilpModel) -> None:
    # A group runs only if each input was computed earlier in the stage or kept into it.
    for (t, j), r in model.R.items():
        for u in data.inputs[j]:
            available = _affine([(model.S.get((t, u), 0), 1), (computed(data, model, t, u), 1)])
            _add(model, _affine([(r, 1)]) <= available, f"read_{t}_{j}_{u}")


def _add_keep_constraints(data: CheckmateData, model: MilpModel) -> None:
    # A value is kept into stage t only if it was live in stage t-1 (kept or computed there);
    # tangents arrive at the first backward stage and are never recomputed.
    for (t, v), s in model.S.items():
        if data.producer[v] is None and t == data.first_stage[v]:
            continue
        before = _affine([(model.S.get((t - 1, v), 0), 1), (computed(data, model, t - 1, v), 1)])
        _add(model, _affine([(s, 1)]) <= before, f"keep_{t}_{v}")
    # A kept value is not recomputed in the same stage.
    for (t, v), s in model.S.items():
        r = computed(data, model, t, v)
        if not is_const(r):
            _add(model, _affine([(s, 1), (r, 1)]) <= 1, f"nodouble_{t}_{v}")


def _add_output_constraints(data: CheckmateData, model: MilpModel) -> None:
    # Forward outputs are live when the last forward stage ends, user and backward outputs
    # when the last stage ends (is_kept() makes them unfreeable in those stages).
    ends = [(data.n_forward - 1, v) for v in sorted(data.forward_outputs)]
    ends += [(data.n_groups - 1, v) for v in sorted(data.final_outputs)]
    for t, v in ends:
        live = _affine([(model.S.get((t, v), 0), 1), (computed(data, model, t, v), 1)])
        _add(model, live >= 1, f"output_{t}_{v}")


def _add_free_constraints(data: CheckmateData, model: MilpModel) -> None:
    # FREE[t, v, k] = R[t, k] * (1 - keep[t+1, v]) * prod_{readers j > k} (1 - R[t, j]).
    # Hazards: (1 - R[t, k]), keep, R[t, j]; each is 0/1 and any one at 1 forbids the free.
    for t in range(data.n_groups):
        for v in range(len(data.values)):
            if (t, v) not in model.S and is_const(computed(data, model, t, v)) \
                    and computed(data, model, t, v) == 0:
                continue  # v is never live in stage t
            keep = is_kept(data, model, t + 1, v)
            if is_const(keep) and keep == 1:
                continue  # never freed in this stage
            own = data.producer[v]
            for k in ([own] if own is not None else []) + list(data.readers[v]):
                if (t, k) not in model.R:
                    continue
                hazards = [(model.R[t, k], True), (keep, False)]  # (x, counts as 1 - x)
                hazards += [(model.R[t, j], False) for j in data.readers[v]
                            if j > k and (t, j) in model.R]
                if any(is_const(x) and (1 - x if neg else x) == 1 for x, neg in hazards):
                    continue  # a constant hazard: FREE = 0, no variable
                terms = [(x, neg) for x, neg in hazards if not is_const(x)]
                if not terms:
                    model.FREE[t, v, k] = 1
                    continue
                f = pulp.LpVariable(f"FREE_{t}_{v}_{k}", lowBound=0, upBound=1)
                model.FREE[t, v, k] = f
                h = _affine([(x, -1 if neg else 1) for x, neg in terms],
                            constant=sum(1 for _, neg in terms if neg))
                # The paper's pair: 1 - FREE <= h and h_max * (1 - FREE) >= h ...
                model.prob += _affine([(f, -1)], 1) <= h, f"freelo_{t}_{v}_{k}"
                model.prob += _affine([(f, -len(terms))], len(terms)) >= h, f"freehi_{t}_{v}_{k}"
                # ... and the second one per hazard: FREE <= R[t, k], FREE <= 1 - x.
                for i, (x, neg) in enumerate(terms):
                    bound = _affine([(x, 1)]) if neg else _affine([(x, -1)], 1)
                    model.prob += _affine([(f, 1)]) <= bound, f"freeh{i}_{t}_{v}_{k}"


def _add_free_once_constraints(data: CheckmateData, model: MilpModel) -> None:
    # Each live copy of a value is either kept into the next stage or freed at most once:
    # S[t+1, v] + sum_k FREE[t, v, k] <= S[t, v] + R[t, group(v)]. In integer solutions this
    # follows from the rest; it stops the LP relaxation from freeing bytes it never held.
    for t, v, fs in free_once_slots(data, model.FREE):
        lhs = _affine([(model.S.get((t + 1, v), 0), 1)] + [(f, 1) for f in fs])
        live = _affine([(model.S.get((t, v), 0), 1), (computed(data, model, t, v), 1)])
        _add(model, lhs <= live, f"freeonce_{t}_{v}")


def _add_memory_constraints(data: CheckmateData, model: MilpModel) -> None:
    # U[t, first] = resident + kept values + bytes(first);
    # U[t, g] = U[t, prev] - bytes freed after prev + R[t, g] * bytes(g);
    # U <= capacity (variable bound) and U + R * temp_bytes <= capacity.
    sc = model.scale
    for t in range(data.n_groups):
        kept = [(s, sc * data.value_bytes[v]) for (tt, v), s in model.S.items() if tt == t]
        prev = None
        for g in model.slots[t]:
            r = model.R[t, g]
            if prev is None:
                rhs = _affine(kept + [(r, sc * data.group_bytes[g])], sc * data.resident_bytes)
            else:
                freeable = dict.fromkeys(data.inputs[prev] + data.members[prev])
                freed = [(model.FREE[t, v, prev], -sc * data.value_bytes[v])
                         for v in freeable if (t, v, prev) in model.FREE]
                rhs = _affine([(model.U[t, prev], 1), (r, sc * data.group_bytes[g])] + freed)
            _add(model, _affine([(model.U[t, g], 1)]) == rhs, f"mem_{t}_{g}")
            if data.temp_bytes[g]:
                during = _affine([(model.U[t, g], 1), (r, sc * data.temp_bytes[g])])
                _add(model, during <= model.capacity, f"temp_{t}_{g}")
            prev = g
        if prev is None:  # an unneeded group's stage: what is kept must still fit
            _add(model, _affine(kept, sc * data.resident_bytes) <= model.capacity, f"mem_{t}")


def _add_boundary_constraint(data: CheckmateData, model: MilpModel) -> None:
    # When forward ends: resident + every tangent + every value live then <= budget.
    sc = model.scale
    live = [(is_kept(data, model, data.n_forward, v), sc * data.value_bytes[v])
            for v, g in enumerate(data.producer) if g is not None and g < data.n_forward]
    total = _affine(live, sc * (data.resident_bytes + data.tangent_bytes))
    _add(model, total <= model.capacity, "boundary")


def _set_objective(data: CheckmateData, model: MilpModel) -> None:
    # Minimize the total compute cost: every computation of every group.
    model.prob += _affine([(r, model.cost_scale * data.cost[g]) for (t, g), r in model.R.items()])


def build_milp_model(data: CheckmateData, budget: int) -> MilpModel:
    model = _new_model(data, budget)
    _create_variables(data, model)
    _add_read_constraints(data, model)
    _add_keep_constraints(data, model)
    _add_output_constraints(data, model)
    _add_free_constraints(data, model)
    _add_free_once_constraints(data, model)
    _add_memory_constraints(data, model)
    _add_boundary_constraint(data, model)
    _set_objective(data, model)
    return model


def model_size(graph: RematGraph, budget_bytes: int) -> dict[str, int]:
    """Variable and constraint counts of the model for ``graph`` and ``budget_bytes``."""
    model = build_milp_model(prepare(graph), budget_bytes)
    count = lambda table: sum(not is_const(x) for x in table.values())  # noqa: E731
    return {"R": count(model.R), "S": len(model.S), "FREE": count(model.FREE),
            "U": len(model.U), "variables": len(model.prob.variables()),
            "constraints": len(model.prob.constraints)}



def set_mip_start(data: CheckmateData, model: MilpModel, schedule: Schedule) -> bool:
    """Set every variable's initial value from a schedule (a MIP start for CBC).

    Returns False, setting nothing, when the schedule does not map onto the model's stages or
    its literal form (with each stage's own group) does not fit the capacity.
    """
    assignment = start_assignment(data, model, schedule)
    if assignment is None:
        return False
    r, s, free = assignment
    u: dict[tuple[int, int], float] = {}
    sc = model.scale
    for t in range(data.n_groups):
        level = sc * (data.resident_bytes + sum(data.value_bytes[v] for (tt, v) in s if tt == t))
        prev = None
        for g in model.slots[t]:
            if prev is not None:
                for v in dict.fromkeys(data.inputs[prev] + data.members[prev]):
                    level -= sc * data.value_bytes[v] * free.get((t, v, prev), 0)
            level += sc * data.group_bytes[g] * r[t, g]
            if level + sc * data.temp_bytes[g] * r[t, g] > model.capacity:
                return False
            u[t, g] = level
            prev = g
    for table, values in ((model.R, r), (model.S, s), (model.FREE, free), (model.U, u)):
        for key, x in table.items():
            if not is_const(x):
                x.setInitialValue(values.get(key, 0), check=False)
    return True
