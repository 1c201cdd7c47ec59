"""The Checkmate MILP (Jain et al., MLSys 2020) over the op groups of a `RematGraph`, in PuLP.

Stages are the op groups in topological order (forward groups first). Stage ``t`` computes
group ``t`` and may recompute earlier groups, each at most once and in topological order;
what it keeps for later stages is decided by ``S``. The variables, as in the paper:

- ``R[t, g]`` (binary, ``g < t``; ``R[t, t] = 1``): group ``g`` is computed in stage ``t``.
  Siblings of a multi-output op share one ``R``: the op allocates all of them at once.
- ``S[t, v]`` (binary): value ``v`` is live when stage ``t`` starts (computed in an earlier
  stage and kept). Each sibling has its own ``S``: siblings are freed apart.
- ``FREE[t, v, k]``: ``v`` is freed right after group ``k`` runs in stage ``t``; ``k`` is
  ``v``'s own group or a group that reads ``v``. ``FREE = 1`` iff ``R[t, k] = 1``, ``v`` is not
  kept into stage ``t + 1`` and no later reader of ``v`` runs in stage ``t``. Linearized with
  the paper's hazard count ``h = (1 - R[t, k]) + keep + sum_j R[t, j]``: ``1 - FREE <= h`` and
  ``h_max * (1 - FREE) >= h``, plus one ``FREE <= 1 - hazard`` per hazard (the paper's second
  constraint disaggregated: same integer points, a much tighter LP relaxation). With those,
  ``FREE`` is integral whenever ``R`` and ``S`` are, so it is a continuous variable.
- ``U[t, g]`` (continuous): live bytes while group ``g`` runs in stage ``t`` (its inputs
  still live, its outputs allocated), by the paper's recurrence ``U[t, g] = U[t, prev] -
  freed after prev + R[t, g] * bytes(g)``; ``U <= budget`` and ``U + R * temp_bytes <= budget``.

Adaptations to this project's IR and simulator (`optimizer.simulator` is the judge):

- **Run-once ops** (``compute_once``): only ``R[g, g] = 1`` exists, so they run exactly once,
  in forward (checked), in the original order.
- **Forward / backward boundary.** Forward groups come first, so ``R[t, g]`` with ``g <= t``
  never puts a backward op in a forward stage. ``forward_outputs`` must be live when the last
  forward stage ends (they are not freed in it); whether they stay live into backward is the
  separate decision ``S[F, v]``. Tangents are values with ``S`` only, from the first backward
  stage on: they arrive at the boundary, are freed after their last read, are never
  recomputed. The boundary has its own constraint, the moment the simulator checks:
  resident + every tangent + every value live when forward ends <= budget.
- **End of step.** ``user_outputs`` and ``backward_outputs`` are live when the last stage
  ends (a virtual stage ``T`` with ``S[T, v] = 1``). A user output computed in forward is
  returned to the caller, who holds that copy to the end of the step, so ``S[t, v] = 1`` in
  every backward stage: it is never freed at the boundary and recomputed in backward. (The
  simulator would accept that, but the memory could not actually be released; stricter
  than the simulator, so never optimistic.)
- Resident bytes (parameters, buffers, inputs) are a constant in every ``U``.
- Valid tightenings (same integer solutions, tighter LP relaxation): ``S[t, v] + R[t,
  group(v)] <= 1`` (the simulator never computes a live value, and readers in stage ``t``
  come after the recompute, so a kept copy is useless); ``S[t+1, v] + sum_k FREE[t, v, k] <=
  S[t, v] + R[t, group(v)]`` (a live copy is kept or freed once, never both: without it the
  LP frees bytes it never held).
- Groups no output (and no run-once op) depends on are never computed.

The model's memory accounting is exact for the *literal* schedule of its stages (every
computation made, each value freed right after its last read), which is what
`solvers.brute_force` searches independently. The returned schedule is built by
`Schedule.from_computes`, which also drops computations nobody reads (a stage's own group
that is neither kept nor read before being recomputed): its cost and peak can only be lower
than the model's, so ``SolveResult.objective`` (the simulated cost) is at most the model's
optimum, `MilpSolution.model_cost`.

Variables exist only where they can be nonzero: ``R[t, g]`` for needed groups, up to the last
stage that can read a value of ``g``; ``S[t, v]`` from ``v``'s birth to its last possible read;
``FREE`` where ``v`` can be live and ``k`` can run and no constant hazard blocks it. With
``T`` groups, ``V`` values and ``E`` (value, reader) pairs, at most about ``T^2/2`` R,
``V*T`` S, ``(V + E)*T`` FREE and ``T^2/2`` U variables; ``E*T`` read, ``3*V*T`` keep,
no-double and free-once, about ``4*(V + E)*T`` free and ``T^2/2`` memory constraints
(`model_size` counts them for a graph).

Bytes are scaled so that the model's numbers stay below about 1e4, and the capacity gets a
margin of 5e-6 of the total bytes (none for graphs under 1e4 bytes), so solver tolerances
can never let an extracted schedule exceed the budget.

Anytime: the back-end gets the cheapest classic schedule that fits (store-all or
recompute-all, in the stages' literal form) as a MIP start, so a time limit leaves an
incumbent whenever a classic schedule fits (CBC through PuLP's ``warmStart``; HiGHS through
``Highs.setSolution``, which PuLP's interface does not call itself).

Bound: when HiGHS runs, its own best bound (``mip_dual_bound``). PuLP does not expose the best
bound CBC proves, so with CBC a time-limited solve reports the optimum of the model's LP
relaxation (solved afterwards, time limit 10% of the main one), never less than the store-all
cost (each needed op runs at least once); an optimal solve reports ``bound == objective``.
"""

from __future__ import annotations

import importlib.util
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator, Union

import pulp

from optimizer.graph import NodeKind, Phase, RematGraph
from optimizer.schedule import Schedule
from optimizer.simulator import simulate
from solvers.base import (
    InfeasibleBudgetError,
    SolveResult,
    SolverOptions,
    SolverUnavailableError,
    SolveStatus,
)
from solvers.baselines import recompute_all_schedule, store_all_schedule

SOLVER_NAME = "checkmate-milp"

_MAX_SCALED_BYTES = 1e4
"""Bytes are scaled so that the sum of every byte count in the model is at most this."""
_CAPACITY_MARGIN = 0.05
"""Model units taken off the budget so solver tolerances can never overshoot it."""

Term = Union[pulp.LpVariable, int]
"""A model quantity: a variable, or a constant 0/1 for which no variable is created."""


# ============================================================================ data
@dataclass(frozen=True)
class _Data:
    """The graph in the shape the model needs: groups and values by index."""

    graph: RematGraph
    groups: tuple[tuple[str, ...], ...]
    """Sibling values of each op group; groups in topological order."""
    n_forward: int
    """F: groups 0..F-1 are forward ops, F..T-1 backward ops."""
    cost: tuple[float, ...]
    once: tuple[bool, ...]
    group_bytes: tuple[int, ...]
    temp_bytes: tuple[int, ...]
    needed: tuple[bool, ...]
    """Groups some output or run-once op depends on; the others are never computed."""
    values: tuple[str, ...]
    """Op values in graph order, then tangents."""
    value_bytes: tuple[int, ...]
    producer: tuple[int | None, ...]
    """Group of each value (None for tangents)."""
    members: tuple[tuple[int, ...], ...]
    """Values of each group."""
    inputs: tuple[tuple[int, ...], ...]
    """Values each group reads (resident values are omitted: always live)."""
    readers: tuple[tuple[int, ...], ...]
    """Needed groups that read each value, in order."""
    forward_outputs: frozenset[int]
    final_outputs: frozenset[int]
    """User outputs and backward outputs: live when the step ends."""
    held: frozenset[int]
    """User outputs computed in forward: the caller holds forward's copy until the step ends."""
    tangent_bytes: int
    resident_bytes: int
    first_stage: tuple[int, ...]
    """First stage a value can be kept into (its group + 1; F for tangents)."""
    last_stage: tuple[int, ...]
    """Last stage that can need the value (-1: never needed)."""

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def group_last_stage(self, g: int) -> int:
        return max(self.last_stage[v] for v in self.members[g])


def _prepare(graph: RematGraph) -> _Data:
    """Index the graph's groups and values; reject graphs no schedule can run."""
    group_names = list(graph.groups)
    groups = tuple(graph.groups[g] for g in group_names)
    firsts = [graph[m[0]] for m in groups]
    n_forward = sum(n.phase is Phase.FORWARD for n in firsts)
    if any(n.phase is Phase.FORWARD for n in firsts[n_forward:]):
        raise ValueError("forward op groups must all come before backward op groups")
    for node in firsts:
        if node.compute_once and node.phase is Phase.BACKWARD:
            raise ValueError(f"random or mutating op {node.name!r} is a backward op: "
                             "the simulator runs such ops only in forward")
    for name in graph.forward_outputs:
        node = graph[name]
        if node.kind is NodeKind.TANGENT or (node.is_op and node.phase is Phase.BACKWARD):
            raise ValueError(f"forward output {name!r} cannot be live when forward ends")

    values = [n.name for n in graph.ops] + list(graph.tangents)
    vindex = {name: i for i, name in enumerate(values)}
    gindex = {name: g for g, name in enumerate(group_names)}
    producer = tuple(gindex[graph[v].group] if graph[v].is_op else None for v in values)
    members = tuple(tuple(vindex[m] for m in ms) for ms in groups)
    inputs = tuple(
        tuple(vindex[i] for i in dict.fromkeys(node.inputs) if i in vindex) for node in firsts
    )
    fo = frozenset(vindex[o] for o in graph.forward_outputs if o in vindex)
    final = frozenset(vindex[o] for o in (*graph.user_outputs, *graph.backward_outputs)
                      if o in vindex)

    # Needed groups: ancestors of the outputs and of run-once ops (as `prune_dead`).
    needed = [False] * len(groups)
    stack = [producer[v] for v in sorted(fo | final) if producer[v] is not None]
    stack += [g for g, node in enumerate(firsts) if node.compute_once]
    while stack:
        g = stack.pop()
        if not needed[g]:
            needed[g] = True
            stack.extend(producer[v] for v in inputs[g] if producer[v] is not None)

    readers_list: list[list[int]] = [[] for _ in values]
    for g, ins in enumerate(inputs):
        if needed[g]:
            for v in ins:
                readers_list[v].append(g)
    readers = tuple(tuple(r) for r in readers_list)

    n_groups = len(groups)
    once = tuple(n.compute_once for n in firsts)
    first_stage, last_stage = [], []
    for v, g in enumerate(producer):
        first_stage.append(n_forward if g is None else g + 1)
        last = -1
        if g is None or needed[g]:
            for j in readers[v]:  # a run-once reader runs only in its own stage
                last = max(last, j if once[j] else n_groups - 1)
            if v in fo:
                last = max(last, n_forward - 1)
            if v in final:
                last = max(last, n_groups - 1)
        last_stage.append(last)

    return _Data(
        graph=graph,
        groups=groups,
        n_forward=n_forward,
        cost=tuple(n.cost for n in firsts),
        once=once,
        group_bytes=tuple(sum(graph[m].bytes for m in ms) for ms in groups),
        temp_bytes=tuple(n.temp_bytes for n in firsts),
        needed=tuple(needed),
        values=tuple(values),
        value_bytes=tuple(graph[v].bytes for v in values),
        producer=producer,
        members=members,
        inputs=inputs,
        readers=readers,
        forward_outputs=fo,
        final_outputs=final,
        held=frozenset(v for v in (vindex[o] for o in graph.user_outputs if o in vindex)
                       if producer[v] is not None and producer[v] < n_forward),
        tangent_bytes=sum(graph[t].bytes for t in graph.tangents),
        resident_bytes=graph.resident_bytes,
        first_stage=tuple(first_stage),
        last_stage=tuple(last_stage),
    )


def _lower_bound_bytes(data: _Data) -> int:
    """A peak no schedule avoids: the boundary, and each needed op with its inputs."""
    fo_bytes = sum(data.value_bytes[v] for v in data.forward_outputs)
    bound = data.resident_bytes + data.tangent_bytes + fo_bytes
    for g in range(data.n_groups):
        if data.needed[g]:
            during = sum(data.value_bytes[v] for v in data.inputs[g])
            bound = max(bound, data.resident_bytes + during + data.group_bytes[g]
                        + data.temp_bytes[g])
    return bound


# ======================================================================= the model
@dataclass
class _Model:
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


class _TriviallyInfeasible(Exception):
    """A constraint without variables is violated: the model has no solution."""


def _is_const(x: object) -> bool:
    return isinstance(x, (int, float))


def _affine(terms, constant: float = 0.0) -> pulp.LpAffineExpression:
    """sum(coef * x) + constant, where each x is a variable or a constant number."""
    expr = pulp.LpAffineExpression(constant=constant)
    for x, coef in terms:
        if _is_const(x):
            expr.constant += x * coef
        elif coef:
            expr.addterm(x, coef)
    return expr


def _add(model: _Model, constraint: pulp.LpConstraint, name: str) -> None:
    """Add a constraint; check those without variables here instead of in the solver."""
    if len(constraint.keys()) == 0:
        value = constraint.constant  # the constraint reads: value (sense) 0
        ok = {pulp.LpConstraintLE: value <= 1e-9, pulp.LpConstraintGE: value >= -1e-9,
              pulp.LpConstraintEQ: abs(value) <= 1e-9}[constraint.sense]
        if not ok:
            raise _TriviallyInfeasible(name)
        return
    model.prob += constraint, name


def _new_model(data: _Data, budget: int) -> _Model:
    total = data.resident_bytes + sum(data.value_bytes) + max(data.temp_bytes, default=0)
    scale = min(1.0, _MAX_SCALED_BYTES / max(total, 1))
    # Bytes are integers: a true peak below budget + 1 is within budget; the margin covers
    # the solver's integrality and feasibility tolerances on numbers below 1e4.
    capacity = scale * (budget + 0.5) - _CAPACITY_MARGIN
    max_cost = max((c for c, n in zip(data.cost, data.needed) if n), default=0.0)
    cost_scale = 1.0 if max_cost <= 0 or 1.0 <= max_cost <= 1e4 else 1e3 / max_cost
    return _Model(pulp.LpProblem("checkmate", pulp.LpMinimize), scale, capacity, cost_scale)


def _keep(data: _Data, model: _Model, t_next: int, v: int) -> Term:
    """Is value v live when stage t_next - 1 ends: S[t_next, v], with the two boundaries."""
    if t_next == data.n_forward and v in data.forward_outputs:
        return 1  # forward outputs are live when forward ends
    if t_next == data.n_groups:
        return 1 if v in data.final_outputs else 0
    return model.S.get((t_next, v), 0)


def _stage_slots(data: _Data) -> Iterator[tuple[int, int]]:
    """(t, g): stage t computes its own group g == t, or may recompute an earlier group (not
    a run-once one) while a value of it can still be read. Shared by every Checkmate back-end."""
    for t in range(data.n_groups):
        for g in range(t + 1):
            if data.needed[g] and (g == t or (not data.once[g] and t <= data.group_last_stage(g))):
                yield t, g


def _keep_slots(data: _Data) -> Iterator[tuple[int, int, bool]]:
    """(t, v, held): value v may be live when stage t starts; ``held`` when it must be (a user
    output computed in forward is held by the caller through backward, never recomputed)."""
    for v in range(len(data.values)):
        for t in range(data.first_stage[v], min(data.last_stage[v], data.n_groups - 1) + 1):
            yield t, v, v in data.held and t >= data.n_forward


def _create_variables(data: _Data, model: _Model) -> None:
    model.slots.update((t, []) for t in range(data.n_groups))
    # R[t, g]: stage t computes group g (fixed to 1 for its own group).
    for t, g in _stage_slots(data):
        model.R[t, g] = 1 if g == t else pulp.LpVariable(f"R_{t}_{g}", cat=pulp.LpBinary)
        model.slots[t].append(g)
    # S[t, v]: value v is live when stage t starts.
    for t, v, held in _keep_slots(data):
        model.S[t, v] = pulp.LpVariable(f"S_{t}_{v}", lowBound=1 if held else 0, upBound=1,
                                        cat=pulp.LpInteger)
    # U[t, g]: live bytes while group g runs in stage t.
    for t, slots in model.slots.items():
        for g in slots:
            model.U[t, g] = pulp.LpVariable(f"U_{t}_{g}", lowBound=0, upBound=model.capacity)


def _computed(data: _Data, model: _Model, t: int, v: int) -> Term:
    """R of v's group in stage t (0 for tangents and where no variable exists)."""
    g = data.producer[v]
    return 0 if g is None else model.R.get((t, g), 0)


def _add_read_constraints(data: _Data, model: _Model) -> None:
    # A group runs only if each input was computed earlier in the stage or kept into it.
    for (t, j), r in model.R.items():
        for u in data.inputs[j]:
            available = _affine([(model.S.get((t, u), 0), 1), (_computed(data, model, t, u), 1)])
            _add(model, _affine([(r, 1)]) <= available, f"read_{t}_{j}_{u}")


def _add_keep_constraints(data: _Data, model: _Model) -> None:
    # A value is kept into stage t only if it was live in stage t-1 (kept or computed there);
    # tangents arrive at the first backward stage and are never recomputed.
    for (t, v), s in model.S.items():
        if data.producer[v] is None and t == data.first_stage[v]:
            continue
        before = _affine([(model.S.get((t - 1, v), 0), 1), (_computed(data, model, t - 1, v), 1)])
        _add(model, _affine([(s, 1)]) <= before, f"keep_{t}_{v}")
    # A kept value is not recomputed in the same stage.
    for (t, v), s in model.S.items():
        r = _computed(data, model, t, v)
        if not _is_const(r):
            _add(model, _affine([(s, 1), (r, 1)]) <= 1, f"nodouble_{t}_{v}")


def _add_output_constraints(data: _Data, model: _Model) -> None:
    # Forward outputs are live when the last forward stage ends, user and backward outputs
    # when the last stage ends (_keep() makes them unfreeable in those stages).
    ends = [(data.n_forward - 1, v) for v in sorted(data.forward_outputs)]
    ends += [(data.n_groups - 1, v) for v in sorted(data.final_outputs)]
    for t, v in ends:
        live = _affine([(model.S.get((t, v), 0), 1), (_computed(data, model, t, v), 1)])
        _add(model, live >= 1, f"output_{t}_{v}")


def _add_free_constraints(data: _Data, model: _Model) -> None:
    # FREE[t, v, k] = R[t, k] * (1 - keep[t+1, v]) * prod_{readers j > k} (1 - R[t, j]).
    # Hazards: (1 - R[t, k]), keep, R[t, j]; each is 0/1 and any one at 1 forbids the free.
    for t in range(data.n_groups):
        for v in range(len(data.values)):
            if (t, v) not in model.S and _is_const(_computed(data, model, t, v)) \
                    and _computed(data, model, t, v) == 0:
                continue  # v is never live in stage t
            keep = _keep(data, model, t + 1, v)
            if _is_const(keep) and keep == 1:
                continue  # never freed in this stage
            own = data.producer[v]
            for k in ([own] if own is not None else []) + list(data.readers[v]):
                if (t, k) not in model.R:
                    continue
                hazards = [(model.R[t, k], True), (keep, False)]  # (x, counts as 1 - x)
                hazards += [(model.R[t, j], False) for j in data.readers[v]
                            if j > k and (t, j) in model.R]
                if any(_is_const(x) and (1 - x if neg else x) == 1 for x, neg in hazards):
                    continue  # a constant hazard: FREE = 0, no variable
                terms = [(x, neg) for x, neg in hazards if not _is_const(x)]
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


def _add_free_once_constraints(data: _Data, model: _Model) -> None:
    # Each live copy of a value is either kept into the next stage or freed at most once:
    # S[t+1, v] + sum_k FREE[t, v, k] <= S[t, v] + R[t, group(v)]. In integer solutions this
    # follows from the rest; it stops the LP relaxation from freeing bytes it never held.
    frees: dict[tuple[int, int], list] = {}
    for (t, v, k), f in model.FREE.items():
        frees.setdefault((t, v), []).append(f)
    for (t, v), fs in sorted(frees.items()):
        if data.producer[v] is None and t < data.first_stage[v]:
            continue
        lhs = _affine([(model.S.get((t + 1, v), 0), 1)] + [(f, 1) for f in fs])
        live = _affine([(model.S.get((t, v), 0), 1), (_computed(data, model, t, v), 1)])
        _add(model, lhs <= live, f"freeonce_{t}_{v}")


def _add_memory_constraints(data: _Data, model: _Model) -> None:
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


def _add_boundary_constraint(data: _Data, model: _Model) -> None:
    # When forward ends: resident + every tangent + every value live then <= budget.
    sc = model.scale
    live = [(_keep(data, model, data.n_forward, v), sc * data.value_bytes[v])
            for v, g in enumerate(data.producer) if g is not None and g < data.n_forward]
    total = _affine(live, sc * (data.resident_bytes + data.tangent_bytes))
    _add(model, total <= model.capacity, "boundary")


def _set_objective(data: _Data, model: _Model) -> None:
    # Minimize the total compute cost: every computation of every group.
    model.prob += _affine([(r, model.cost_scale * data.cost[g]) for (t, g), r in model.R.items()])


def _build_model(data: _Data, budget: int) -> _Model:
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
    model = _build_model(_prepare(graph), budget_bytes)
    count = lambda table: sum(not _is_const(x) for x in table.values())  # noqa: E731
    return {"R": count(model.R), "S": len(model.S), "FREE": count(model.FREE),
            "U": len(model.U), "variables": len(model.prob.variables()),
            "constraints": len(model.prob.constraints)}


# ============================================================ schedules <-> stages
def _stage_sequences(data: _Data, chosen) -> tuple[list[str], list[str]]:
    """Literal compute orders (every member of every computed group) of chosen R entries."""
    forward: list[str] = []
    backward: list[str] = []
    for t in range(data.n_groups):
        part = forward if t < data.n_forward else backward
        for g in range(t + 1):
            if chosen(t, g):
                part.extend(data.groups[g])
    return forward, backward


def _stages_of(data: _Data, model: _Model, schedule: Schedule) -> dict[tuple[int, int], int] | None:
    """R values that put a schedule's computations into stages (None if they do not fit)."""
    gindex = {name: g for g, ms in enumerate(data.groups) for name in ms}
    chosen = {key: 1 for key, x in model.R.items() if _is_const(x)}
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


def _start_assignment(data: _Data, model, schedule: Schedule) -> tuple[dict, dict, dict] | None:
    """R, S and FREE values that put a schedule into the model's stages (None if it does not map).

    ``model`` is any model with this module's ``R``, ``S``, ``FREE`` and ``slots`` tables (the
    PuLP one here, the CP-SAT one in `solvers.cpsat`); memory is not checked here.
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
        keep = _keep(data, model, t + 1, v)
        keep = keep if _is_const(keep) else s.get((t + 1, v), 0)
        later = any(r.get((t, j), 0) for j in data.readers[v] if j > k)
        free[t, v, k] = f if _is_const(f) else int(r[t, k] == 1 and not keep and not later)
    return r, s, free


def _warm_start(data: _Data, model: _Model, schedule: Schedule) -> bool:
    """Set every variable's initial value from a schedule (a MIP start for CBC).

    Returns False, setting nothing, when the schedule does not map onto the model's stages or
    its literal form (with each stage's own group) does not fit the capacity.
    """
    assignment = _start_assignment(data, model, schedule)
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
            if not _is_const(x):
                x.setInitialValue(values.get(key, 0), check=False)
    return True


# =========================================================================== solve
@contextlib.contextmanager
def _stdout_silenced():
    """Point file descriptor 1 at /dev/null (C++ libraries write there, not to sys.stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


class _HiGHS(pulp.HiGHS):
    """PuLP's HiGHS interface, plus a MIP start from the variables' initial values."""

    mip_start = False

    def createAndConfigureSolver(self, lp):
        # highspy prints a banner to the process's stdout when a model is created, whatever
        # the options say: keep it off the user's terminal unless they asked for solver logs.
        if self.msg:
            return super().createAndConfigureSolver(lp)
        with _stdout_silenced():
            return super().createAndConfigureSolver(lp)

    def callSolver(self, lp):
        if self.mip_start:
            import highspy

            highs = lp.solverModel
            start = highspy.HighsSolution()
            values = [0.0] * highs.getNumCol()
            for var in lp.variables():
                values[var.index] = var.varValue or 0.0
            start.col_value = values
            start.value_valid = True
            highs.setSolution(start)
        super().callSolver(lp)


def _backend(options: SolverOptions) -> str:
    # PuLP decides whether HiGHS works when it is imported: ask it, not the file system.
    highs = importlib.util.find_spec("highspy") is not None and pulp.HiGHS(msg=False).available()
    if options.backend == "auto":
        return "highs" if highs else "cbc"
    if options.backend not in ("cbc", "highs"):
        raise ValueError(f"unknown MILP back-end {options.backend!r} (cbc, highs or auto)")
    if options.backend == "highs" and not highs:
        raise SolverUnavailableError("the HiGHS back-end needs highspy: pip install highspy")
    return options.backend


def _solver(backend: str, options: SolverOptions, *, warm: bool = False, mip: bool = True,
            time_limit: float | None = None):
    limit = options.time_limit_s if time_limit is None else time_limit
    if backend == "highs":
        solver = _HiGHS(mip=mip, msg=options.verbose, timeLimit=limit, threads=options.threads,
                        gapRel=0.0, random_seed=0)
        solver.mip_start = warm and mip
        return solver
    return pulp.PULP_CBC_CMD(mip=mip, msg=options.verbose, timeLimit=limit,
                             threads=options.threads, warmStart=warm, gapRel=0.0)


def _best_bound(backend: str, model: _Model, options: SolverOptions) -> float | None:
    """The best bound HiGHS proves, or the LP relaxation's optimum for CBC (None if unknown).

    Call after the solution is read: the CBC relaxation solve overwrites variable values.
    """
    if backend == "highs":
        try:
            return model.prob.solverModel.getInfo().mip_dual_bound / model.cost_scale
        except Exception:  # a highspy without that field
            return None
    relaxed = _solver(backend, options, mip=False, time_limit=max(1.0, 0.1 * options.time_limit_s))
    try:
        model.prob.solve(relaxed)
    except pulp.PulpSolverError:
        return None
    if model.prob.status == pulp.LpStatusOptimal:
        return pulp.value(model.prob.objective) / model.cost_scale
    return None


@dataclass(frozen=True)
class MilpSolution:
    """The solved model, before `Schedule.from_computes`: what each stage computes."""

    status: SolveStatus | None
    """OPTIMAL, FEASIBLE (time limit, incumbent), INFEASIBLE, or None (time limit, nothing)."""
    forward: tuple[str, ...]
    """Literal compute order of the forward stages (every member of every group computed)."""
    backward: tuple[str, ...]
    model_cost: float | None
    """The model's objective: the cost of every computation the stages make."""
    bound: float | None
    """Proven lower bound on the model's optimum (== model_cost when OPTIMAL)."""
    backend: str
    solve_time_s: float
    warm_started: bool = False


def solve_milp_model(graph: RematGraph, budget_bytes: int, options: SolverOptions,
                     warm_start: Schedule | None = None) -> MilpSolution:
    """Build and solve the Checkmate model; no shortcuts, no fallbacks, no simulation.

    ``warm_start`` seeds the search (a MIP start) with a schedule that fits the budget.
    """
    start = time.perf_counter()
    data = _prepare(graph)
    backend = _backend(options)

    def done(status, forward=(), backward=(), cost=None, bound=None, warm=False) -> MilpSolution:
        return MilpSolution(status, tuple(forward), tuple(backward), cost, bound, backend,
                            time.perf_counter() - start, warm)

    try:
        model = _build_model(data, budget_bytes)
    except _TriviallyInfeasible:
        return done(SolveStatus.INFEASIBLE)
    warm = warm_start is not None and _warm_start(data, model, warm_start)
    try:
        model.prob.solve(_solver(backend, options, warm=warm))
    except pulp.PulpSolverError:  # the back-end died (seen rarely with CBC at a time limit)
        if not warm:
            return done(None)
        left = options.time_limit_s - (time.perf_counter() - start)
        warm = False
        try:  # once more, without the MIP start, in the time left
            model.prob.solve(_solver(backend, options, time_limit=max(1.0, left)))
        except pulp.PulpSolverError:
            return done(None)
    status, sol_status = model.prob.status, model.prob.sol_status

    # ---- branch on every status the back-ends report through PuLP
    if status == pulp.LpStatusInfeasible or sol_status == pulp.LpSolutionInfeasible:
        return done(SolveStatus.INFEASIBLE, warm=warm)
    if status == pulp.LpStatusUnbounded or sol_status == pulp.LpSolutionUnbounded:
        raise AssertionError("the Checkmate model cannot be unbounded (costs are >= 0)")
    if status != pulp.LpStatusOptimal or sol_status not in (pulp.LpSolutionOptimal,
                                                            pulp.LpSolutionIntegerFeasible):
        return done(None, warm=warm)  # stopped (time limit) without a solution
    chosen = {key for key, x in model.R.items() if _is_const(x) or round(x.value() or 0) == 1}
    forward, backward = _stage_sequences(data, lambda t, g: (t, g) in chosen)
    cost = sum(data.cost[g] for _, g in chosen)
    if sol_status == pulp.LpSolutionOptimal:
        return done(SolveStatus.OPTIMAL, forward, backward, cost, cost, warm)
    bound = _best_bound(backend, model, options)
    bound = None if bound is None else min(bound, cost)
    return done(SolveStatus.FEASIBLE, forward, backward, cost, bound, warm)


@dataclass(frozen=True)
class _Classic:
    name: str
    schedule: Schedule
    peak: int
    cost: float


def _classics(graph: RematGraph) -> list[_Classic]:
    out = []
    for name, build in (("store-all", store_all_schedule), ("recompute-all", recompute_all_schedule)):
        schedule = build(graph)
        sim = simulate(graph, schedule)
        out.append(_Classic(name, schedule, sim.peak_bytes, sim.total_cost))
    return out


def solve_milp(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """Cheapest schedule whose simulated peak fits ``budget_bytes`` (the Checkmate MILP).

    - store-all fits: returned at once as OPTIMAL (each needed op must run at least once).
    - solved: OPTIMAL with ``bound == objective``; optimal over the Checkmate space (stage t
      computes group t, recomputations in topological order). ``objective`` is the simulated
      cost of the returned schedule, which can be below the model's optimum when
      `Schedule.from_computes` drops a computation nobody reads.
    - time limit with an incumbent: FEASIBLE, the cheaper of the incumbent and the classic
      schedules that fit; ``bound`` as described in the module docstring.
    - time limit without one: HEURISTIC, the cheapest classic schedule that fits (the solve
      is seeded with it, so this happens only when the back-end rejects the start or fails).
    - the model has no schedule within the budget but a classic one fits: HEURISTIC, that
      schedule (recompute-all runs forward ops nobody reads in forward only in backward, which
      the Checkmate stages cannot express; see `solvers.brute_force`).
    - nothing fits: `InfeasibleBudgetError` whose ``smallest_feasible_bytes`` is the lowest
      simulated peak of store-all and recompute-all: a budget known to be feasible, and above
      the budget (a classic schedule that fit would have been returned).

    Every returned schedule is simulated; a peak over budget raises AssertionError (that
    would be a formulation bug, never masked).
    """
    return solve_checkmate(graph, budget_bytes, options, solver_name=SOLVER_NAME,
                           solve_model=solve_milp_model)


def solve_checkmate(graph: RematGraph, budget_bytes: int, options: SolverOptions, *,
                    solver_name: str, solve_model) -> SolveResult:
    """The contract of `solve_milp`, around any back-end that solves the Checkmate model
    (``solve_model(graph, budget, options, warm_start=...) -> MilpSolution``)."""
    start = time.perf_counter()
    data = _prepare(graph)
    classics = _classics(graph)
    smallest = min(c.peak for c in classics)
    fitting = sorted((c for c in classics if c.peak <= budget_bytes), key=lambda c: c.cost)

    def result(status, schedule, cost, bound, message) -> SolveResult:
        return SolveResult(solver=solver_name, status=status, schedule=schedule, objective=cost,
                           bound=bound, solve_time_s=time.perf_counter() - start, message=message)

    store_all = classics[0]
    if store_all.peak <= budget_bytes:
        return result(SolveStatus.OPTIMAL, store_all.schedule, store_all.cost, store_all.cost,
                      "store-all fits the budget: no recomputation needed")
    if budget_bytes < _lower_bound_bytes(data):
        raise InfeasibleBudgetError(budget_bytes, smallest,
                                    " (below the boundary's or one op's unavoidable bytes)")

    solution = solve_model(graph, budget_bytes, options,
                           warm_start=fitting[0].schedule if fitting else None)
    backend = solution.backend
    if solution.status is SolveStatus.INFEASIBLE:
        if fitting:  # outside the Checkmate space, or within the capacity margin
            best = fitting[0]
            return result(SolveStatus.HEURISTIC, best.schedule, best.cost, None,
                          f"the Checkmate model ({backend}) has no schedule within the budget; "
                          f"{best.name} fits and is returned")
        raise InfeasibleBudgetError(budget_bytes, smallest, f" (proven by {backend})")
    if solution.status is None:
        limit = f"{backend} stopped after {options.time_limit_s} s without a schedule"
        if fitting:
            best = fitting[0]
            return result(SolveStatus.HEURISTIC, best.schedule, best.cost, None,
                          f"{limit}; returning {best.name}")
        raise InfeasibleBudgetError(budget_bytes, smallest,
                                    f" ({limit}; a smaller feasible budget may exist)")

    schedule = Schedule.from_computes(graph, solution.forward, solution.backward)
    sim = simulate(graph, schedule)
    if sim.peak_bytes > budget_bytes:
        raise AssertionError(
            f"{solver_name} schedule peaks at {sim.peak_bytes} bytes > budget {budget_bytes} "
            f"(step {sim.peak_step}, {sim.peak_phase.value}, node {sim.peak_node!r}; "
            f"model cost {solution.model_cost}, {backend}): formulation bug")
    if solution.status is SolveStatus.OPTIMAL:
        return result(SolveStatus.OPTIMAL, schedule, sim.total_cost, sim.total_cost,
                      f"optimal ({backend}, model cost {solution.model_cost:g})")

    cost, message = sim.total_cost, f"{backend} stopped at the time limit with a schedule"
    if fitting and fitting[0].cost < cost:
        schedule, cost = fitting[0].schedule, fitting[0].cost
        message += f"; {fitting[0].name} is cheaper and returned"
    floor = store_all.cost  # every needed op runs at least once
    bound = floor if solution.bound is None else max(floor, solution.bound)
    return result(SolveStatus.FEASIBLE, schedule, cost, min(bound, cost), message)
