"""Exhaustive search for tiny graphs: the test oracle for the MILP.

It shares no code with `solvers.checkmate.milp`. Schedules are searched in the simulator's own terms:
a state is the set of live values; a step computes one op group (all its inputs live, none
of its values live), after which any of the values it read or produced may be freed; at the
boundary the tangents arrive (and stay: the caller holds them) and any forward output may be freed. Peak bytes are
counted as the simulator counts them (resident bytes, the op's siblings and temp bytes while
it runs, every tangent at the boundary), and the best path is rebuilt as an explicit
schedule of compute and free steps and checked with `solvers.ir.simulator.simulate`.

A user output computed in forward is never freed once forward ends: forward returns it and
the caller holds it to the end of the step (the simulator alone would let a schedule free it
at the boundary and recompute it in backward, memory the real module cannot release).

Freeing only right after a read (or the boundary) loses nothing: a value freed later than its
last read only holds memory longer. So the search sees every *literal* schedule: each listed
computation runs, even one nobody reads afterwards.

Two schedule spaces:

- ``space="checkmate"`` (default), the MILP's space, searched exactly: stage t (one per op
  group, topological order) computes group t (needed groups only) and may first recompute
  any earlier needed group that is not random/mutating, each at most once, in topological
  order. The optimum is the MILP model's optimum (`solvers.checkmate.milp.MilpSolution.model_cost`).
  The stage structure is a restriction by design: a group's first computation sits at its
  own stage, so e.g. a forward op read only by backward can only be deferred to backward by
  computing it in forward for nothing and again later (`Schedule.from_computes` then drops
  the first one, which is why `solve_milp`'s schedules can cost less than the model says).
- ``space="free"``: any order: each step computes any needed group whose inputs are live
  (forward ops in either phase, backward ops in backward, random/mutating ops once, in
  forward, in order), searched with Dijkstra. Its optimum is at most the Checkmate one and
  at most the cost of any schedule `solve_milp` returns.

State counts grow as 2^(values): meant for graphs of up to about 14 op values.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

from solvers.base import InfeasibleBudgetError, SolveResult, SolverOptions, SolveStatus
from solvers.greedy import droppable, schedule_from_saved
from solvers.ir.graph import NodeKind, Phase, RematGraph
from solvers.ir.link import Link, get_link
from solvers.ir.schedule import Schedule, compute, free
from solvers.ir.simulator import simulate
from solvers.offload import OffloadChoice, saved_by
from solvers.offload_placement import place_offloads

MAX_VALUES = 24
"""Refuse graphs with more op values plus tangents than this."""

_BOUNDARY = -1
"""Action id of the forward/backward boundary in a path."""


@dataclass(frozen=True)
class _Instance:
    graph: RematGraph
    names: tuple[str, ...]
    """Op values, then tangents; bit i of a live set is names[i]."""
    nbytes: tuple[int, ...]
    groups: tuple[tuple[str, ...], ...]
    group_mask: tuple[int, ...]
    input_mask: tuple[int, ...]
    group_bytes: tuple[int, ...]
    temp: tuple[int, ...]
    cost: tuple[float, ...]
    once: tuple[bool, ...]
    backward: tuple[bool, ...]
    needed: tuple[bool, ...]
    n_forward: int
    fo_mask: int
    final_mask: int
    held_mask: int
    """User outputs computed in forward: never freed once forward ends (the caller holds them)."""
    tangent_mask: int
    resident: int

    def live_bytes(self, live: int) -> int:
        total, i = 0, 0
        while live:
            if live & 1:
                total += self.nbytes[i]
            live >>= 1
            i += 1
        return total


def _instance(graph: RematGraph) -> _Instance:
    names = [n.name for n in graph.ops] + list(graph.tangents)
    if len(names) > MAX_VALUES:
        raise ValueError(f"brute force is for tiny graphs: {len(names)} values > {MAX_VALUES}")
    bit = {name: 1 << i for i, name in enumerate(names)}
    groups = list(graph.groups.values())
    firsts = [graph[m[0]] for m in groups]
    mask = lambda names_: sum(bit[n] for n in dict.fromkeys(names_) if n in bit)  # noqa: E731
    fo = [o for o in graph.forward_outputs if o in bit]
    final = [o for o in (*graph.user_outputs, *graph.backward_outputs, *graph.tangents) if o in bit]
    producer = {name: g for g, ms in enumerate(groups) for name in ms}
    needed = [False] * len(groups)
    stack = [producer[o] for o in fo + final if o in producer]
    stack += [g for g, n in enumerate(firsts) if n.compute_once]
    while stack:
        g = stack.pop()
        if not needed[g]:
            needed[g] = True
            stack.extend(producer[i] for i in firsts[g].inputs if i in producer)
    return _Instance(
        graph=graph,
        names=tuple(names),
        nbytes=tuple(graph[n].bytes for n in names),
        groups=tuple(groups),
        group_mask=tuple(mask(ms) for ms in groups),
        input_mask=tuple(mask(n.inputs) for n in firsts),
        group_bytes=tuple(sum(graph[m].bytes for m in ms) for ms in groups),
        temp=tuple(n.temp_bytes for n in firsts),
        cost=tuple(n.cost for n in firsts),
        once=tuple(n.compute_once for n in firsts),
        backward=tuple(n.phase is Phase.BACKWARD for n in firsts),
        needed=tuple(needed),
        n_forward=sum(n.phase is Phase.FORWARD for n in firsts),
        fo_mask=mask(fo),
        final_mask=mask(final),
        held_mask=mask(o for o in graph.user_outputs
                       if o in producer and firsts[producer[o]].phase is not Phase.BACKWARD),
        tangent_mask=mask(graph.tangents),
        resident=sum(n.bytes for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)),
    )


def _submasks(mask: int):
    sub = mask
    while True:
        yield sub
        if sub == 0:
            return
        sub = (sub - 1) & mask


class _Moves:
    """What can happen from a live set: run a group, or cross the boundary."""

    def __init__(self, inst: _Instance):
        self.inst = inst
        self._sizes: dict[int, int] = {}

    def live_bytes(self, live: int) -> int:
        size = self._sizes.get(live)
        if size is None:
            size = self._sizes[live] = self.inst.live_bytes(live)
        return size

    def compute(self, live: int, g: int, backward: bool):
        """(cost, peak while group g runs, live after, freeable) or None if it cannot run."""
        inst = self.inst
        if inst.input_mask[g] & ~live or inst.group_mask[g] & live:
            return None
        peak = inst.resident + self.live_bytes(live) + inst.group_bytes[g] + inst.temp[g]
        after = live | inst.group_mask[g]
        freeable = (inst.input_mask[g] | inst.group_mask[g]) & after
        if backward:
            freeable &= ~inst.held_mask & ~inst.tangent_mask
        return inst.cost[g], peak, after, freeable

    def boundary(self, live: int):
        """(0, peak when the tangents arrive, live after, freeable) or None."""
        inst = self.inst
        if inst.fo_mask & ~live:
            return None
        after = live | inst.tangent_mask
        peak = inst.resident + self.live_bytes(after)
        return 0.0, peak, after, inst.fo_mask & after & ~inst.held_mask


@dataclass(frozen=True)
class _Path:
    value: float
    """Total cost (mode 'cost') or peak bytes (mode 'peak')."""
    actions: tuple[tuple[int, int], ...]
    """(group or _BOUNDARY, freed mask) in order."""


def _dijkstra(start, moves, is_final, mode: str, budget: int | None, start_peak: int,
              remaining=lambda state: 0.0) -> _Path | None:
    """Cheapest (mode 'cost') or lowest-peak (mode 'peak') path to a final state.

    ``moves(state)`` yields (action, outcome, next_position) where outcome is a
    `_Moves.compute`/`boundary` result (None: impossible) and a None action is a free skip.
    Costs are >= 0 and peaks only grow along a path, so the first final state expanded is
    best. In cost mode this is A*: ``remaining(state)`` is a lower bound on the cost still to
    pay that drops by at most each step's cost (consistent), so the order stays exact.
    """
    cost_mode = mode == "cost"
    if budget is not None and start_peak > budget:
        return None
    first = 0.0 if cost_mode else float(start_peak)
    best = {start: first}
    parent: dict = {}
    closed: set = set()
    tie = itertools.count()
    heap = [(first + (remaining(start) if cost_mode else 0.0), next(tie), start)]
    while heap:
        _, _, state = heapq.heappop(heap)
        if state in closed:
            continue
        closed.add(state)
        value = best[state]
        if is_final(state):
            actions = []
            while state in parent:
                state, action, freed = parent[state]
                if action is not None:
                    actions.append((action, freed))
            return _Path(value, tuple(reversed(actions)))
        for action, outcome, position in moves(state):
            if action is None:  # skip: same live set, nothing runs
                successors = [(value, (position, state[1]), 0)]
            else:
                if outcome is None:
                    continue
                cost, peak, after, freeable = outcome
                if budget is not None and peak > budget:
                    continue
                new = value + cost if cost_mode else max(value, peak)
                successors = [(new, (position, after & ~freed), freed)
                              for freed in _submasks(freeable)]
            for new, nstate, freed in successors:
                if nstate not in closed and new < best.get(nstate, float("inf")):
                    best[nstate] = new
                    parent[nstate] = (state, action, freed)
                    key = new + remaining(nstate) if cost_mode else new
                    heapq.heappush(heap, (key, next(tie), nstate))
    return None


def _search_checkmate(inst: _Instance, mode: str, budget: int | None) -> _Path | None:
    """The Checkmate stages as a fixed list of positions: state = (position, live set)."""
    positions: list[tuple[int, bool]] = []  # (group or _BOUNDARY, optional)
    first_backward = 0
    T = len(inst.groups)
    for t in range(T + 1):
        if t == inst.n_forward:
            positions.append((_BOUNDARY, False))
            first_backward = len(positions)
        if t == T:
            break
        for g in range(t + 1):
            if inst.needed[g] and (g == t or not inst.once[g]):
                # the stage's own group always runs; earlier ones are optional recomputations
                positions.append((g, g != t))
    m = _Moves(inst)

    def moves(state):
        position, live = state
        if position == len(positions):
            return
        g, optional = positions[position]
        if optional:
            yield None, None, position + 1
        if g == _BOUNDARY:
            yield g, m.boundary(live), position + 1
        else:
            yield g, m.compute(live, g, position >= first_backward), position + 1

    def is_final(state):
        return state[0] == len(positions) and not inst.final_mask & ~state[1]

    # A* bound: the stages' own groups not yet run must all still run.
    mandatory = [0.0] * (len(positions) + 1)
    for i in reversed(range(len(positions))):
        g, optional = positions[i]
        own = g != _BOUNDARY and not optional
        mandatory[i] = mandatory[i + 1] + (inst.cost[g] if own else 0.0)
    return _dijkstra((0, 0), moves, is_final, mode, budget, inst.resident,
                     remaining=lambda state: mandatory[state[0]])


def _search_free(inst: _Instance, mode: str, budget: int | None) -> _Path | None:
    """Any order: state = ((phase, run-once ops done), live set)."""
    once_order = [g for g in range(len(inst.groups)) if inst.once[g] and inst.needed[g]]
    m = _Moves(inst)

    def moves(state):
        (phase, done), live = state
        if phase == 0 and done == len(once_order):
            yield _BOUNDARY, m.boundary(live), (1, done)
        for g in range(len(inst.groups)):
            if not inst.needed[g] or (phase == 0 and inst.backward[g]):
                continue
            if inst.once[g]:  # once, in forward, in the original order
                if phase == 0 and done < len(once_order) and once_order[done] == g:
                    yield g, m.compute(live, g, False), (0, done + 1)
            else:
                yield g, m.compute(live, g, phase == 1), (phase, done)

    def is_final(state):
        return state[0][0] == 1 and not inst.final_mask & ~state[1]

    return _dijkstra(((0, 0), 0), moves, is_final, mode, budget, inst.resident)


_SEARCH = {"checkmate": _search_checkmate, "free": _search_free}


def _schedule(inst: _Instance, path: _Path) -> Schedule:
    """The path as explicit compute and free steps."""
    forward: list = []
    backward: list = []
    part = forward
    for action, freed in path.actions:
        if action == _BOUNDARY:
            part = backward
        else:
            part.extend(compute(m) for m in inst.groups[action])
        part.extend(free(inst.names[i]) for i in range(len(inst.names)) if freed >> i & 1)
    return Schedule(forward=tuple(forward), backward=tuple(backward))


def _check_space(space: str) -> None:
    if space not in _SEARCH:
        raise ValueError(f"unknown space {space!r} (checkmate or free)")


def min_feasible_budget(graph: RematGraph, *, space: str = "checkmate") -> int:
    """The lowest peak any schedule of ``space`` reaches (exact, by exhaustive search)."""
    _check_space(space)
    inst = _instance(graph)
    path = _SEARCH[space](inst, "peak", None)
    if path is None:
        raise ValueError("no schedule can run this graph")
    return int(path.value)


def solve_brute_force(graph: RematGraph, budget_bytes: int, options: SolverOptions,
                      *, space: str = "checkmate") -> SolveResult:
    """The minimum-cost schedule of ``space`` within ``budget_bytes``, by exhaustive search.

    Returns an OPTIMAL result whose schedule lists every computation and free explicitly
    (checked by the simulator: cost and peak must match the search's). Raises
    `InfeasibleBudgetError` with the exact smallest feasible budget of the space. ``options``
    is accepted for the common signature; the search has no time limit.
    """
    _check_space(space)
    start = time.perf_counter()
    inst = _instance(graph)
    path = _SEARCH[space](inst, "cost", budget_bytes)
    if path is None:
        smallest = _SEARCH[space](inst, "peak", None)
        raise InfeasibleBudgetError(budget_bytes, None if smallest is None else int(smallest.value),
                                    f" (exhaustive search, {space} space)")
    schedule = _schedule(inst, path)
    sim = simulate(graph, schedule)
    if sim.peak_bytes > budget_bytes or abs(sim.total_cost - path.value) > 1e-9 * max(1.0, path.value):
        raise AssertionError(f"brute force disagrees with the simulator: peak {sim.peak_bytes} "
                             f"(budget {budget_bytes}), cost {sim.total_cost} vs {path.value}")
    return SolveResult(solver=f"brute-force-{space}", status=SolveStatus.OPTIMAL, schedule=schedule,
                       objective=sim.total_cost, bound=sim.total_cost,
                       solve_time_s=time.perf_counter() - start)


MAX_OFFLOAD_CHOICES = 9
"""Refuse `brute_force_offload` on graphs with more values to choose for (3^9 = 19,683 choices)."""


def brute_force_offload(graph: RematGraph, budget_bytes: int, link: Link | str, *,
                        host_budget_bytes: int | None = None) -> OffloadChoice | None:
    """The fastest keep / recompute / offload choice for every value backward reads (the
    saved-set family of `solvers.offload`, copies placed by `solvers.offload_placement`), by
    trying all 3^k of them; None when none fits. The oracle `solvers.offload.choose_offloads` is
    tested against: same family and placement, no search."""
    link = get_link(link)
    pool = sorted(droppable(graph), key=graph.position)
    if len(pool) > MAX_OFFLOAD_CHOICES:
        raise ValueError(f"brute force is for tiny graphs: {len(pool)} values to choose for > {MAX_OFFLOAD_CHOICES}")
    best: OffloadChoice | None = None
    tried = 0
    for choice in itertools.product(("keep", "recompute", "offload"), repeat=len(pool)):
        saved = frozenset(v for v, c in zip(pool, choice) if c != "recompute")
        offloaded = frozenset(v for v, c in zip(pool, choice) if c == "offload")
        base = schedule_from_saved(graph, saved)
        offloaded &= saved_by(graph, base)
        schedule = place_offloads(graph, base, offloaded, link, budget_bytes)
        result = simulate(graph, schedule, link=link)
        tried += 1
        if result.peak_bytes > budget_bytes or (host_budget_bytes is not None
                                                 and result.host_peak_bytes > host_budget_bytes):
            continue
        if best is None or result.step_time_s < best.step_time_s:
            best = OffloadChoice(schedule, result, saved, offloaded, link, 0)
    return None if best is None else OffloadChoice(best.schedule, best.result, best.saved, best.offloaded,
                                                   link, tried)
