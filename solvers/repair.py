"""Near-floor repair: a cheap schedule for a budget close to the smallest feasible one.

Why: on a CNN the smallest budget is set at the end of backward, where almost every parameter
gradient is live beside the first layers' large activations. Greedy's family
(`solvers.greedy.schedule_from_saved`) holds each recomputed value from its first backward
reader to its last, and that alone overshoots there; recompute-all fits, but recomputes the
forward for every backward op (12x a step's FLOPs on timm's regnetx_002, 93x on densenet121).
What fits cheaply is between the two: save most values, and recompute only the few that the
last backward ops read, each for its reader alone.

The family: each forward value backward reads is *saved* (kept from forward), *retained*
(recomputed once, held until its last backward reader) or recomputed *for each reader* (dies
right after it). `repair_to_budget` searches it from both ends and keeps the cheaper plan:

- **down**, from a saved set (store-all's, or a guess): while the simulated peak is over the
  budget, move one value live at the peak one state down (saved -> retained -> each reader),
  the move that lowers the peak the most per second of recomputation among a few simulated
  candidates (greedy's rule, with the extra state);
- **up**, from the leanest state (nothing saved or retained: recompute-all's schedule, the one
  the smallest-budget search names on large graphs), promote values one state up, the costliest
  recomputations first (as the simulation counts them), keeping each promotion that still fits.

Down then also promotes what still fits, so both end with nothing cheap left to put back.
Every schedule is simulated; the result fits the budget or is None.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass

from solvers.baselines import kept_through_backward
from solvers.greedy import drop_rank, droppable, live_at, recompute_cost, schedule_from_saved
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate

CANDIDATES_PER_STEP = 8
"""How many values live at the peak (most bytes per second of recomputation first) the down
search simulates, in each lower state, before it moves one."""


@dataclass(frozen=True)
class FamilyState:
    """Which values backward reads are saved and which recomputed values are held."""

    saved: frozenset[str]
    retained: frozenset[str]
    """Recomputed once and held until the last backward reader (ignored for saved values);
    every other unsaved value is recomputed for each reader."""
    once: bool = False
    """Greedy's recompute-once variant: the values of a recomputation's whole closure, not
    only those its reader reads, may be retained (DenseNet's concatenations, read by many)."""

    def schedule(self, graph: RematGraph) -> Schedule:
        return schedule_from_saved(graph, self.saved, self.once, self.retained)


@dataclass(frozen=True)
class Repaired:
    """A schedule of the family within the budget, and how the search found it."""

    schedule: Schedule
    sim: SimulationResult
    state: FamilyState
    direction: str
    """'down' (from a saved set) or 'up' (from recompute-all's state)."""
    simulations: int


class _Search:
    """One budget's search: simulates states, counts the simulations, watches the deadline."""

    def __init__(self, graph: RematGraph, budget_bytes: int, deadline: float) -> None:
        self.graph, self.budget, self.deadline = graph, budget_bytes, deadline
        self.read_in_backward = droppable(graph)
        kept = kept_through_backward(graph)
        self.recomputable = frozenset(n.name for n in graph.ops
                                      if n.phase is Phase.FORWARD and n.name not in kept)
        """Forward values a schedule may leave unsaved: saving one that only a recomputation
        reads (DenseNet's concatenation inputs) cuts that recomputation short."""
        self.simulations = 0

    def run(self, state: FamilyState) -> tuple[Schedule, SimulationResult]:
        schedule = state.schedule(self.graph)
        self.simulations += 1
        return schedule, simulate(self.graph, schedule)

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline

    def can_retain(self, state: FamilyState, v: str) -> bool:
        """Whether retaining ``v`` changes the schedule: per reader only backward's direct
        inputs are held, with ``once`` any value of a closure."""
        return state.once or v in self.read_in_backward

    def lower(self, state: FamilyState, v: str) -> list[FamilyState]:
        """``v`` one or two states down: saved -> retained or each reader; retained -> each."""
        each = FamilyState(state.saved - {v}, state.retained - {v}, state.once)
        if v not in state.saved:
            return [each] if v in state.retained and self.can_retain(state, v) else []
        if not self.can_retain(state, v):
            return [each]
        return [FamilyState(state.saved - {v}, state.retained | {v}, state.once), each]

    def higher(self, state: FamilyState, v: str) -> list[FamilyState]:
        """``v`` up, the highest first: each reader -> saved or retained; retained -> saved."""
        if v in state.saved:
            return []
        saved = FamilyState(state.saved | {v}, state.retained, state.once)
        if v in state.retained or not self.can_retain(state, v):
            return [saved]
        return [saved, FamilyState(state.saved, state.retained | {v}, state.once)]

    def down(self, state: FamilyState) -> tuple[FamilyState, Schedule, SimulationResult] | None:
        """Lower values live at the peak, one state at a time, until the peak fits."""
        graph = self.graph
        schedule, sim = self.run(state)
        while sim.peak_bytes > self.budget:
            if self.out_of_time():
                return None
            live = live_at(schedule, sim.peak_step)
            movable = [v for v in self.recomputable if self.lower(state, v)]
            pool = [v for v in movable if v in live] or movable
            if not pool:
                return None  # recompute-all's state, over the budget
            pool.sort(key=lambda v: (-graph[v].bytes / recompute_cost(graph, v), v))
            best = None
            for v in pool[:CANDIDATES_PER_STEP]:
                for lower in self.lower(state, v):
                    candidate, result = self.run(lower)
                    key = drop_rank(sim, result, v)
                    if best is None or key > best[0]:
                        best = (key, lower, candidate, result)
            _, state, schedule, sim = best
        return state, schedule, sim

    def up(self, state: FamilyState, schedule: Schedule,
           sim: SimulationResult) -> tuple[FamilyState, Schedule, SimulationResult]:
        """Promote values one state up while the peak fits and the cost falls, the costliest
        recomputations (times recomputed x cost, from the last simulation) first; a value
        refused is not tried again."""
        graph = self.graph
        refused: set[str] = set()
        while not self.out_of_time():
            counts = dict(sim.recomputed)  # a value computed once gains nothing from promotion
            ranked = [v for v in counts if v not in refused and v in self.recomputable
                      and self.higher(state, v)]
            if not ranked:
                break
            v = max(ranked, key=lambda v: ((counts[v] - 1) * recompute_cost(graph, v), v))
            for higher in self.higher(state, v):
                candidate, result = self.run(higher)
                if result.peak_bytes <= self.budget and result.total_cost < sim.total_cost:
                    state, schedule, sim = higher, candidate, result
                    break
            else:
                refused.add(v)
        return state, schedule, sim


def guess_states(graph: RematGraph, saved: frozenset[str]) -> tuple[FamilyState, ...]:
    """Down-search starts from a guess of the saved set (the bound LP's, rounded), best first
    as measured on timm's densenet121 and regnetx_002 near their floors: everything else
    recomputed for each reader, with the recompute-once closures; retained, with them; for
    each reader, per reader."""
    tables = _Search(graph, 0, 0.0)
    saved = saved & tables.recomputable
    return (FamilyState(saved, frozenset(), True), FamilyState(saved, tables.recomputable, True),
            FamilyState(saved, frozenset()))


def repair_to_budget(graph: RematGraph, budget_bytes: int, deadline: float,
                     starts: Iterable[FamilyState] = (), *, up_first: bool = False) -> Repaired | None:
    """The cheapest plan of the down searches from ``starts``, then from store-all's state
    (per reader and recompute-once), and of the up search from recompute-all's state (see the
    module docstring), each in the time the earlier ones left; None when none fits by
    ``deadline``. ``up_first``: the up search first, for a budget recompute-all fits (the
    smallest-budget search's): it improves on recompute-all from its first promotion, so a
    short deadline still ends with something better, where a down search cut short has nothing."""
    search = _Search(graph, budget_bytes, deadline)
    every, recomputable = search.read_in_backward, search.recomputable
    found: list[Repaired] = []

    def up_from_lean() -> None:
        lean = FamilyState(frozenset(), frozenset())
        schedule, sim = search.run(lean)
        if sim.peak_bytes <= budget_bytes:
            state, schedule, sim = search.up(lean, schedule, sim)
            found.append(Repaired(schedule, sim, state, "up", search.simulations))

    if up_first:
        up_from_lean()
    for start in (*starts, FamilyState(every, every), FamilyState(every, recomputable, True)):
        if search.out_of_time():
            break
        down = search.down(start)
        if down is not None:
            state, schedule, sim = search.up(*down)
            found.append(Repaired(schedule, sim, state, "down", search.simulations))
    if not up_first and not search.out_of_time():
        up_from_lean()
    return min(found, key=lambda r: r.sim.total_cost, default=None)


SWAP_DEMOTIONS = 6
"""Most values a swap (`improve_schedule`) lowers to make room for the one it promotes."""
SWAP_CANDIDATES = 6
SWAP_SPREAD = 4
"""Each demotion simulates ``SWAP_CANDIDATES`` values live at the peak, every ``SWAP_SPREAD``-th of
them by least recomputation per byte, then the start's tie-break order: many tie (every add and
ReLU output recomputes at one second per byte), and which of them is best depends on where in
the step it is next read, which the per-demotion rank does not see."""
SWAP_STARTS = 12
"""Tie-break orders the swaps start from (graph order, reverse, then shuffles with fixed seeds
1, 2, ...). Measured on resnet_like(150) at 2x its floor, one start each: 1.1708-1.1835 of
store-all (graph order 1.1735, reverse 1.1835); the best of 12 is 1.1712."""
SWAP_START_TRIES = 12
"""Each start repeats passes over only this many costliest recomputations: the swaps that pay
most come from the first few (the first stage's convolutions), a full pass takes ~8 s there."""
SWAP_START_SIMULATIONS = 400
"""Simulations one start may use (a start whose demotions keep failing stops here, ~2 s)."""
SWAP_START_SHARE = 0.7
"""Share of the swaps' time the starts may take; full passes from the best start get the rest."""


def seed_state(graph: RematGraph, sim: SimulationResult) -> FamilyState:
    """The family's state nearest a simulated schedule: what its forward leaves live is saved,
    every recomputed value is held until its last reader (recompute-once). For rotor's
    schedules on `benchmarks/cnn_graph.resnet_like` this is the same schedule: the family
    then holds rotor's winner, and its per-value moves can leave rotor's stage structure."""
    return _seed_state(_Search(graph, 0, 0.0), sim)


def _seed_state(search: _Search, sim: SimulationResult) -> FamilyState:
    """`seed_state` with the search's tables (built once per search)."""
    return FamilyState(frozenset(sim.saved) & search.recomputable, search.recomputable, True)


def tie_orders(graph: RematGraph, count: int = SWAP_STARTS) -> list[dict[str, int]]:
    """``count`` deterministic ranks of the graph's values (graph order, reverse, seeded
    shuffles): which of the tied demotion candidates a swap tries, per start."""
    names = [n.name for n in graph.nodes]
    orders = [names, names[::-1]]
    for k in range(1, count - 1):
        shuffled = list(names)
        random.Random(k).shuffle(shuffled)
        orders.append(shuffled)
    return [{v: i for i, v in enumerate(o)} for o in orders[:count]]


def improve_schedule(graph: RematGraph, budget_bytes: int, deadline: float,
                     seed: Schedule, starts: int = SWAP_STARTS) -> Repaired | None:
    """Swaps from a fitting schedule (a chain solver's winner, `seed_state`): promote one
    recomputed value to saved (the costliest recomputation first), then, while the peak is over
    the budget and the swap still pays, demote a saved value live at the peak (down's rule, at
    most `SWAP_DEMOTIONS`); keep the swap when it fits and is cheaper. Why: rotor keeps or drops
    a whole stretch's tape with its checkpoint, so on resnet_like(150) at 2x its floor it
    recomputes every first-stage convolution; saving a few of them in place of later stages'
    cheap ReLU and add outputs is what the bound LP does, and no single promotion fits.

    Which tied value a demotion takes decides how many swaps fit later, so ``starts`` tie-break
    orders (`tie_orders`) each search from the seed (`SWAP_START_TRIES`,
    `SWAP_START_SIMULATIONS`), then full passes continue from the cheapest until ``deadline``.
    None when the seed's state does not fit or nothing cheaper than the seed is found; every
    schedule returned is simulated."""
    search = _Search(graph, budget_bytes, deadline)
    seed_sim = simulate(graph, seed)
    state = _seed_state(search, seed_sim)
    schedule, sim = search.run(state)
    if sim.peak_bytes > budget_bytes:
        return None
    start_cost = min(sim.total_cost, seed_sim.total_cost)
    begin = time.perf_counter()
    starts_end = begin + SWAP_START_SHARE * max(deadline - begin, 0.0)
    best = None
    for order in tie_orders(graph, max(1, starts)):
        if best is not None and time.perf_counter() > starts_end:
            break
        limit = search.simulations + SWAP_START_SIMULATIONS
        found = _passes(search, (state, schedule, sim), order, SWAP_START_TRIES, limit)
        if best is None or found[2].total_cost < best[0][2].total_cost:
            best = (found, order)
        if search.out_of_time():
            break
    (state, schedule, sim), order = best
    state, schedule, sim = _passes(search, (state, schedule, sim), order)
    if sim.total_cost >= start_cost - 1e-12 * max(start_cost, 1.0):
        return None
    return Repaired(schedule, sim, state, "swap", search.simulations)


def _passes(search: _Search, current: tuple[FamilyState, Schedule, SimulationResult],
            order: dict[str, int], tries: int | None = None,
            simulations: float = math.inf) -> tuple[FamilyState, Schedule, SimulationResult]:
    """Passes of swaps over the ``tries`` costliest recomputations (all: None), repeated while
    one keeps a swap, until ``simulations`` or the deadline."""
    graph = search.graph
    state, schedule, sim = current
    improved = True
    while improved and not search.out_of_time() and search.simulations < simulations:
        improved = False
        counts = dict(sim.recomputed)
        ranked = sorted((v for v in counts if v in search.recomputable and v not in state.saved),
                        key=lambda v: (-(counts[v] - 1) * recompute_cost(graph, v), v))
        for v in ranked[:tries]:
            if search.out_of_time() or search.simulations >= simulations:
                break
            found = _swap(search, state, sim, v, order)
            if found is not None:
                state, schedule, sim = found
                improved = True
    return state, schedule, sim


def _swap(search: _Search, state: FamilyState, sim: SimulationResult, v: str,
          order: dict[str, int]) -> tuple[FamilyState, Schedule, SimulationResult] | None:
    """``v`` saved, then saved values live at the peak demoted to retained until it fits; the
    result if it fits and costs less than ``sim``. ``order`` breaks ties among candidates."""
    graph = search.graph
    trial = FamilyState(state.saved | {v}, state.retained, state.once)
    schedule, result = search.run(trial)
    for _ in range(SWAP_DEMOTIONS):
        if result.peak_bytes <= search.budget or result.total_cost >= sim.total_cost:
            break
        if search.out_of_time():
            return None
        live = live_at(schedule, result.peak_step)
        pool = sorted((w for w in trial.saved if w in live and w != v),
                      key=lambda w: (-graph[w].bytes / recompute_cost(graph, w), order[w]))
        best = None
        for w in pool[:SWAP_SPREAD * SWAP_CANDIDATES:SWAP_SPREAD]:
            lower = FamilyState(trial.saved - {w}, trial.retained | {w}, trial.once)
            candidate, after = search.run(lower)
            key = (*drop_rank(result, after, w)[:3], -order[w])
            if best is None or key > best[0]:
                best = (key, lower, candidate, after)
        if best is None:
            return None
        _, trial, schedule, result = best
    if result.peak_bytes <= search.budget and result.total_cost < sim.total_cost - 1e-12 * max(sim.total_cost, 1.0):
        return trial, schedule, result
    return None
