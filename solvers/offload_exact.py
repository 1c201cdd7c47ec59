"""Keep / recompute / offload solved exactly on small graphs: a CP-SAT master over the choices,
the simulator as the judge (a logic-based Benders decomposition).

The family is `solvers.offload`'s (and `solvers.brute_force.brute_force_offload`'s): each value
backward reads (`solvers.greedy.droppable`) is kept on device, recomputed by backward, or
offloaded; the schedule is `schedule_from_saved` with the copies placed by
`solvers.offload_placement.place_offloads`, and its step time and peaks are what `simulate` says
with the link. The placement moves frees and reloads by a budget-dependent scan, so no closed
model reproduces the simulator's time; instead the master holds *lower bounds* that hold for every
choice, and every choice it proposes is simulated.

The master (CP-SAT, times in integer units rounded down so every bound stays valid):
- ``keep[v] + recompute[v] + offload[v] == 1``; ``kept[v]`` / ``moved[v]``: v really stays on
  device / really goes through the host. They equal ``keep`` / ``offload`` unless a recomputation
  of v's op may make v again (a sibling, or a closure through v's op: `solvers.offload.saved_by`
  then finds v unsaved): there the master may pick either, paying that op's recomputation;
- ``ran[g]``: forward op g runs in forward (a run nobody reads is dropped by
  `Schedule.from_computes`); ``again[g]``: g runs in backward. A value not really saved is
  recomputed, with its closure of values nobody saves; a needed op runs at least once;
- ``boundary``: the compute clock when forward ends, at least forward's compute and at least the
  time the offload stream (FIFO, one copy after the other) lands the offloads issued from any
  value on (every device free of an offloaded value waits for its copy, in forward);
- ``step >= boundary + backward compute + recomputations``; for each backward op i, ``step >=
  boundary + the reloads of the values read by op i or before + backward compute from op i on``
  (the reload stream starts in backward and runs one copy after the other; the last of those
  lands before its reader). The objective is ``step``;
- memory: peak >= the bytes live when the tangents arrive (what every choice holds there, plus
  what it keeps), and >= what is surely live while each backward op runs (values read before and
  after it, kept values read after it, an offloaded value a recomputation before it reads); the
  host holds every offloaded value at the boundary, so the host budget is exact.

Where it is a bound, not the simulator: stalls inside forward and backward beyond the copy-stream
bounds above, recomputation counted once per op (per-reader recomputation repeats it), memory
only where it is sure. Those bounds hold for every choice that fits (the solver checks the time
bound against each simulation, tests/solvers/test_offload_exact.py checks both for each choice),
which is all the loop needs: a choice is dropped only once simulated, or once the master proves it
cannot fit or cannot beat the incumbent.

Every master solution is simulated; one that fits is an incumbent, and a no-good cut removes the
choice. The loop ends when the master's optimum reaches the incumbent's simulated time (no choice
left can be faster: OPTIMAL), when the master is infeasible (every choice simulated or proven not
to fit: OPTIMAL, or the budget is infeasible), or at the time limit (FEASIBLE, with CP-SAT's proven
bound). So the optimum is brute force's (up to `_Master.slack`, ~1e-10 of the step, the
rounding of times to integers), found by simulating a fraction of the 3^k choices: on the 686
small cases checked against brute force, 1.3% of them. Torch-free.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from solvers.backends import cp_sat_backend
from solvers.base import InfeasibleBudgetError, SolverUnavailableError, SolveStatus
from solvers.baselines import forward_closure, kept_through_backward
from solvers.greedy import droppable, schedule_from_saved
from solvers.ir.graph import NodeKind, Phase, RematGraph
from solvers.ir.link import Link, get_link
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import simulate
from solvers.offload import OffloadChoice, choose_offloads, saved_by
from solvers.offload_placement import place_offloads

cp_model = cp_sat_backend().module
"""OR-Tools' CP-SAT module, or None where it is not installed or cannot load (`solvers.backends`)."""

EXACT_MAX_VALUES = 12
"""`best_offloads` runs the exact model on graphs with at most this many values to choose for."""

_TIME_UNITS = 10**12
"""Integer time units the longest conceivable step is given in the master. Times are rounded
down, so a bound loses at most a unit per term: `_Master.slack` (about 1e-10 of the step)."""

KEEP, RECOMPUTE, OFFLOAD = "keep", "recompute", "offload"


@dataclass(frozen=True)
class ExactOffloadResult:
    """The exact model's answer: the fastest choice of the family that fits, or the best one found
    with a proven lower bound when the time limit stopped it."""

    choice: OffloadChoice
    """The choice, its schedule and its simulation (``choice.step_time_s`` is the objective)."""
    status: SolveStatus
    """OPTIMAL (proven) or FEASIBLE (stopped at the time limit)."""
    bound_s: float
    """Proven lower bound on the step time of every choice of the family that fits."""
    solve_time_s: float
    master_solves: int
    """CP-SAT solves of the master, one per proposed choice (plus the last, proving)."""

    @property
    def step_time_s(self) -> float:
        return self.choice.step_time_s

    @property
    def gap(self) -> float:
        """Relative gap (step time - bound) / step time; 0 when optimal."""
        objective = self.step_time_s
        return max(0.0, (objective - self.bound_s) / objective) if objective > 0 else 0.0

    def describe(self) -> str:
        """Which solver made the choice and how sure it is (for a plan's message)."""
        proof = "optimal" if self.status is SolveStatus.OPTIMAL else f"time limit, gap {self.gap:.2%}"
        return f"the exact model ({proof}, {self.master_solves} CP-SAT solves)"


# ============================================================================ data
@dataclass(frozen=True)
class _Facts:
    """What the master's bounds read off the graph, in seconds and bytes."""

    pool: tuple[str, ...]
    forward_groups: tuple[str, ...]
    """Forward op groups in graph order (forward's compute order)."""
    needed: frozenset[str]
    """Forward groups some output needs: each runs at least once."""
    forced: frozenset[str]
    """Forward groups that always run in forward (their values are held or run once)."""
    forward_readers: dict[str, tuple[str, ...]]
    """Forward group -> the needed forward groups reading one of its values."""
    closure: dict[str, frozenset[str]]
    """Pool value -> the forward groups recomputing it needs, when no other pool value helps."""
    unsure: frozenset[str]
    """Pool values some other value's recomputation may make again (see `saved_by`)."""
    cost: dict[str, float]
    """Group -> its op's cost (the simulator's: the first member's)."""
    backward_cost: float
    """Every needed backward op once."""
    first_read: dict[str, int]
    """Pool value -> index of its first backward reader among the needed backward ops."""
    backward_suffix: tuple[float, ...]
    """Backward compute from needed backward op i on."""
    floor_s: float
    """Every needed op once: no choice takes less (the bound before the master has one)."""
    boundary_bytes: int
    """Live bytes when the tangents arrive, with nothing saved."""
    backward_live: tuple[tuple[int, tuple[tuple[str, tuple[str, ...]], ...]], ...]
    """Per needed backward op: bytes surely live while it runs, and the pool values live then if
    kept, or if offloaded while one of the listed values (recomputed before this op) reads them."""


def _needed(graph: RematGraph) -> set[str]:
    """Op groups an output, a gradient or a run-once op depends on."""
    wanted = [*graph.forward_outputs, *graph.user_outputs, *graph.backward_outputs]
    wanted += [n.name for n in graph.ops if n.compute_once]
    needed: set[str] = set()
    while wanted:
        name = wanted.pop()
        node = graph[name]
        if not node.is_op or node.group in needed:
            continue
        needed.add(node.group)
        for m in graph.group_of(name):
            wanted.extend(graph[m].inputs)
    return needed


def _facts(graph: RematGraph) -> _Facts:
    pool = tuple(sorted(droppable(graph), key=graph.position))
    kept = kept_through_backward(graph)
    needed = _needed(graph)
    heads = {g: graph[members[0]] for g, members in graph.groups.items()}
    cost = {g: node.cost for g, node in heads.items()}
    forward_groups = tuple(g for g, node in heads.items() if node.phase is Phase.FORWARD)
    backward_groups = tuple(g for g, node in heads.items() if node.phase is Phase.BACKWARD and g in needed)
    forced = frozenset(g for g in forward_groups if g in needed and any(m in kept for m in graph.groups[g]))
    readers: dict[str, set[str]] = {g: set() for g in forward_groups}
    for h in forward_groups:
        for inp in heads[h].inputs:
            if graph[inp].is_op and graph[inp].group in readers:
                readers[graph[inp].group].add(h)
    closure = {v: frozenset(graph[c].group for c in forward_closure(graph, [v], kept | (set(pool) - {v})))
               for v in pool}
    unsure = frozenset(v for v in pool
                       if any(graph[v].group in closure[w] for w in pool if w != v))

    order = {g: i for i, g in enumerate(backward_groups)}
    reads: dict[str, list[int]] = {}
    for g in backward_groups:
        for inp in dict.fromkeys(heads[g].inputs):
            reads.setdefault(inp, []).append(order[g])
    first = {v: min(reads.get(v, [len(backward_groups)])) for v in pool}
    last = {v: max(reads.get(v, [-1])) for v in pool}
    suffix = [0.0] * (len(backward_groups) + 1)
    for i in reversed(range(len(backward_groups))):
        suffix[i] = suffix[i + 1] + cost[backward_groups[i]]

    empty = simulate(graph, schedule_from_saved(graph, frozenset()))
    boundary_bytes = empty.boundary_bytes + sum(graph[t].bytes for t in graph.tangents)

    # While backward op i runs: the tangents, forward user outputs, its inputs and values, the
    # backward values made before it and read after it (or returned), the values kept in forward
    # and read after it, and each sure pool value between its first and last reader.
    held = {o for o in graph.user_outputs if graph[o].phase is Phase.FORWARD}
    held |= set(graph.tangents)
    resident = {n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)}
    made_at = {m: order[g] for g in backward_groups for m in graph.groups[g]}
    finals = set(graph.backward_outputs)
    backward_live = []
    for i, g in enumerate(backward_groups):
        live = set(held) | set(graph.groups[g]) | set(heads[g].inputs)
        for value, at in made_at.items():
            if at < i and (value in finals or max(reads.get(value, [-1])) > i):
                live.add(value)
        for value in kept - resident:
            if graph[value].is_op and max(reads.get(value, [-1])) > i:
                live.add(value)
        for v in pool:
            if v not in unsure and first[v] < i < last[v]:
                live.add(v)
        live -= resident
        surely = graph.resident_bytes + sum(graph[x].bytes for x in live) + heads[g].temp_bytes
        if_kept = tuple(v for v in pool if v not in unsure and v not in live and i < first[v])
        # an offloaded v comes back before the first recomputation that reads it, and stays
        if_reloaded = tuple((v, tuple(w for w in pool if w not in unsure and v in graph[w].inputs and first[w] <= i))
                            for v in if_kept)
        backward_live.append((surely, tuple((v, readers) for v, readers in if_reloaded)))
    return _Facts(pool, forward_groups, frozenset(g for g in forward_groups if g in needed), forced,
                  {g: tuple(sorted(r)) for g, r in readers.items()}, closure, unsure, cost,
                  sum(cost[g] for g in backward_groups), first, tuple(suffix), sum(cost[g] for g in needed),
                  boundary_bytes, tuple(backward_live))


# ============================================================================ the master
class _Master:
    """The CP-SAT master: choice literals, the bounds of the module docstring, no-good cuts."""

    def __init__(self, graph: RematGraph, facts: _Facts, budget_bytes: int, link: Link,
                 host_budget_bytes: int | None) -> None:
        model = cp_model.CpModel()
        self.model, self.facts = model, facts
        pool = facts.pool
        horizon = 2 * sum(facts.cost.values()) + sum(
            link.offload_seconds(graph[v].bytes) + link.reload_seconds(graph[v].bytes) for v in pool)
        self.scale = _TIME_UNITS / max(horizon, 1e-30)
        units = self.units
        top = units(horizon) + 1
        self.slack = (2 * len(pool) + len(facts.forward_groups) + 4) / self.scale
        """Seconds the rounding may take off a bound: a choice whose bound is the incumbent's
        time less this is no faster than the incumbent, up to this."""

        # ---- choice variables: one of keep, recompute, offload per value
        self.choice = {v: {c: model.new_bool_var(f"{c}[{v}]") for c in (KEEP, RECOMPUTE, OFFLOAD)} for v in pool}
        for v in pool:
            model.add_exactly_one(self.choice[v].values())
        kept = {v: model.new_bool_var(f"kept[{v}]") for v in pool}
        moved = {v: model.new_bool_var(f"moved[{v}]") for v in pool}
        ran = {g: model.new_bool_var(f"ran[{g}]") for g in facts.forward_groups}
        again = {g: model.new_bool_var(f"again[{g}]") for g in facts.forward_groups}

        # ---- what is really saved: as asked, unless a recomputation of the op may make it again
        group_of = {v: graph[v].group for v in pool}
        for v in pool:
            model.add_implication(kept[v], self.choice[v][KEEP])
            model.add_implication(moved[v], self.choice[v][OFFLOAD])
            if v in facts.unsure:  # unsaved only if its op runs in backward
                model.add_bool_or([kept[v], self.choice[v][KEEP].negated(), again[group_of[v]]])
                model.add_bool_or([moved[v], self.choice[v][OFFLOAD].negated(), again[group_of[v]]])
            else:
                model.add_implication(self.choice[v][KEEP], kept[v])
                model.add_implication(self.choice[v][OFFLOAD], moved[v])

        # ---- compute: a value not saved is recomputed with its closure; needed ops run at least once
        for v in pool:
            for g in facts.closure[v]:
                model.add_bool_or([kept[v], moved[v], again[g]])
            model.add_implication(kept[v], ran[group_of[v]])
            model.add_implication(moved[v], ran[group_of[v]])
        for g in facts.forward_groups:
            if g in facts.forced:
                model.add(ran[g] == 1)
            for h in facts.forward_readers[g]:
                model.add_implication(ran[h], ran[g])
            if g in facts.needed:
                model.add_bool_or([ran[g], again[g]])

        # ---- the compute clock when forward ends
        boundary = model.new_int_var(0, top, "boundary")
        forward_cost = [(ran[g], units(facts.cost[g])) for g in facts.forward_groups]
        model.add(boundary >= sum(c * x for x, c in forward_cost))
        position = {g: i for i, g in enumerate(facts.forward_groups)}
        made = {v: position[group_of[v]] for v in pool}
        for v in pool:  # the offloads issued from v's on, one after the other, land before forward ends
            before = [(x, c) for x, c in forward_cost[: made[v] + 1]]
            copies = [(moved[u], units(link.offload_seconds(graph[u].bytes))) for u in pool if made[u] >= made[v]]
            model.add(boundary >= sum(c * x for x, c in before + copies)).only_enforce_if(moved[v])

        # ---- the step: backward after the boundary, reloads after the boundary
        self.step = step = model.new_int_var(0, top, "step")
        recomputed = sum(units(facts.cost[g]) * again[g] for g in facts.forward_groups)
        model.add(step >= boundary + units(facts.backward_cost) + recomputed)
        for i in sorted(set(facts.first_read.values())):  # reloads read by op i land before it
            reloads = sum(units(link.reload_seconds(graph[u].bytes)) * moved[u] for u in pool
                          if facts.first_read[u] <= i)
            model.add(step >= boundary + reloads + units(facts.backward_suffix[i]))

        # ---- memory: the boundary, each backward op, the host
        model.add(facts.boundary_bytes + sum(graph[v].bytes * kept[v] for v in pool) <= budget_bytes)
        for i, (surely, maybe) in enumerate(facts.backward_live):
            live = []
            for v, readers in maybe:
                if not readers:
                    live.append(self.choice[v][KEEP])
                    continue
                x = model.new_bool_var(f"live[{v},{i}]")
                model.add_implication(self.choice[v][KEEP], x)
                for w in readers:
                    model.add_bool_or([self.choice[v][OFFLOAD].negated(), self.choice[w][RECOMPUTE].negated(), x])
                live.append(x)
            model.add(surely + sum(graph[v].bytes * x for (v, _), x in zip(maybe, live)) <= budget_bytes)
        if host_budget_bytes is not None:
            model.add(sum(graph[v].bytes * moved[v] for v in pool) <= host_budget_bytes)
        model.minimize(step)

    def units(self, seconds: float) -> int:
        """Seconds in master units, rounded down (so every bound stays a bound)."""
        return max(0, math.floor(seconds * self.scale * (1 - 1e-12)))

    def seconds(self, units: float) -> float:
        return units / self.scale

    def exclude(self, picked: dict[str, str]) -> None:
        """A no-good cut: this choice has been simulated."""
        self.model.add_bool_or([self.choice[v][c].negated() for v, c in picked.items()])

    def solve(self, time_limit_s: float, threads: int, seed: int):
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
        solver.parameters.num_workers = max(1, threads)
        solver.parameters.random_seed = seed
        status = solver.solve(self.model)
        picked = None
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            picked = {v: next(c for c, x in options.items() if solver.boolean_value(x))
                      for v, options in self.choice.items()}
        return status, picked, solver.best_objective_bound


# ============================================================================ the loop
def _evaluate(graph: RematGraph, picked: dict[str, str], link: Link, budget_bytes: int) -> OffloadChoice:
    """The choice as `brute_force_offload` builds and simulates it."""
    saved = frozenset(v for v, c in picked.items() if c != RECOMPUTE)
    base = schedule_from_saved(graph, saved)
    offloaded = frozenset(v for v, c in picked.items() if c == OFFLOAD) & saved_by(graph, base)
    schedule = place_offloads(graph, base, offloaded, link, budget_bytes)
    return OffloadChoice(schedule, simulate(graph, schedule, link=link), saved, offloaded, link, 0)


def _picked_of(choice: OffloadChoice, pool: tuple[str, ...]) -> dict[str, str]:
    return {v: OFFLOAD if v in choice.offloaded else KEEP if v in choice.saved else RECOMPUTE for v in pool}


def solve_offload_exact(graph: RematGraph, budget_bytes: int, link: Link | str, *,
                        host_budget_bytes: int | None = None, time_limit_s: float = 60.0,
                        incumbent: OffloadChoice | None = None, threads: int = 1,
                        seed: int = 0) -> ExactOffloadResult:
    """The fastest keep / recompute / offload choice that fits ``budget_bytes`` on device and
    ``host_budget_bytes`` on host (None: unlimited), proven by the model of the module docstring.

    ``incumbent``: a choice found elsewhere (`solvers.offload.choose_offloads`) to start from.
    Raises `InfeasibleBudgetError` when no choice fits (with the lowest peak of the choices
    simulated on the way), `SolverUnavailableError` without OR-Tools."""
    if cp_model is None:
        problem = cp_sat_backend().problem
        raise SolverUnavailableError(f"the exact offload model: {problem}" if problem
                                     else "the exact offload model needs OR-Tools: pip install ortools")
    start = time.perf_counter()
    link = get_link(link)
    facts = _facts(graph)
    master = _Master(graph, facts, budget_bytes, link, host_budget_bytes)
    evaluations = 0
    best: OffloadChoice | None = None
    lowest_peak: int | None = None

    def fits(choice: OffloadChoice) -> bool:
        r = choice.result
        return r.peak_bytes <= budget_bytes and (host_budget_bytes is None or r.host_peak_bytes <= host_budget_bytes)

    def consider(choice: OffloadChoice) -> None:
        nonlocal best, lowest_peak
        r = choice.result
        if (host_budget_bytes is None or r.host_peak_bytes <= host_budget_bytes) and (
                lowest_peak is None or r.peak_bytes < lowest_peak):
            lowest_peak = r.peak_bytes
        if fits(choice) and (best is None or r.step_time_s < best.step_time_s):
            best = choice

    if incumbent is not None:
        consider(incumbent)
        master.exclude(_picked_of(incumbent, facts.pool))
    solves, bound, status = 0, facts.floor_s, SolveStatus.OPTIMAL
    while True:
        left = time_limit_s - (time.perf_counter() - start)
        if left <= 0:
            status = SolveStatus.FEASIBLE
            break
        master_status, picked, master_bound = master.solve(left, threads, seed)
        solves += 1
        if master_status == cp_model.INFEASIBLE:  # every choice simulated or proven not to fit
            bound = best.step_time_s if best is not None else math.inf
            break
        if picked is None or master_status != cp_model.OPTIMAL:  # stopped by the time limit
            bound = max(master.seconds(master_bound), facts.floor_s)
            status = SolveStatus.FEASIBLE
            break
        bound = master.seconds(master_bound)
        if best is not None and bound >= best.step_time_s - master.slack:  # nothing left is faster
            break
        choice = _evaluate(graph, picked, link, budget_bytes)
        evaluations += 1
        if fits(choice) and choice.step_time_s < bound * (1 - 1e-9):  # the bounds hold for choices that fit
            raise AssertionError(f"the exact offload model's bound {bound} exceeds the simulated step time "
                                 f"{choice.step_time_s} of {picked}: this is a bug in the model")
        consider(choice)
        master.exclude(picked)
    elapsed = time.perf_counter() - start
    if best is None:
        if status is SolveStatus.OPTIMAL:
            raise InfeasibleBudgetError(budget_bytes, lowest_peak, _detail(host_budget_bytes, evaluations))
        raise InfeasibleBudgetError(budget_bytes, lowest_peak, f" (exact offload model: no choice found in "
                                    f"{time_limit_s:g} s, {evaluations} simulated)")
    best = replace(best, evaluations=evaluations + (incumbent.evaluations if incumbent is not None else 0))
    return ExactOffloadResult(best, status, min(bound, best.step_time_s), elapsed, solves)


def _detail(host_budget_bytes: int | None, evaluations: int) -> str:
    host = "" if host_budget_bytes is None else f" and {host_budget_bytes} bytes on host"
    return f" with keep / recompute / offload{host} (proven by the exact offload model, {evaluations} simulated)"


# ============================================================================ the planner's entry
def best_offloads(graph: RematGraph, budget_bytes: int, link: Link | str, *,
                  host_budget_bytes: int | None = None, seed: Schedule | None = None,
                  deadline: float | None = None) -> OffloadChoice | None:
    """`choose_offloads`'s local search, then, on graphs with at most `EXACT_MAX_VALUES` values to
    choose for, the exact model from its answer in the time left before ``deadline``; None when
    no choice fits. ``OffloadChoice.chosen_by`` says which made the choice."""
    found = choose_offloads(graph, budget_bytes, link, host_budget_bytes=host_budget_bytes, seed=seed,
                            deadline=deadline)
    values = len(droppable(graph))
    if values > EXACT_MAX_VALUES:
        reason = f"{values} values to choose for, above the exact model's {EXACT_MAX_VALUES}"
        return None if found is None else replace(found, chosen_by=f"local search ({reason})")
    if cp_model is None:
        return None if found is None else replace(found, chosen_by="local search (no OR-Tools for the exact model)")
    left = math.inf if deadline is None else deadline - time.perf_counter()
    if left <= 0:
        return None if found is None else replace(found, chosen_by="local search (no time left for the exact model)")
    try:
        exact = solve_offload_exact(graph, budget_bytes, link, host_budget_bytes=host_budget_bytes,
                                    time_limit_s=min(left, 3600.0), incumbent=found)
    except InfeasibleBudgetError:
        return None
    return replace(exact.choice, chosen_by=exact.describe())
