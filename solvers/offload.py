"""Keep, recompute or offload: a heuristic that chooses per saved value for a device budget.

The schedule family is the saved-set one (`solvers.greedy.schedule_from_saved`: forward runs
once, backward recomputes what forward did not save) with a subset of the saved values offloaded
(`solvers.offload_placement.place_offloads`). A choice is judged by the simulator with the link:
predicted step time is compute plus the copy time compute does not hide, under the device budget
and an optional host budget.

The search starts from three points and improves each by local moves, every candidate simulated:
- everything saved and offloaded (the leanest device memory this family has without recomputing);
- plain autograd (everything saved on device): values live at the peak are offloaded or dropped
  (recomputed), the move that lowers the peak most per second of step time first, until it fits;
- the saved set of the planner's recompute-only schedule (``seed``).
Once a point fits, first-improvement passes keep an offloaded value on device again (no copy to
wait for) or recompute it, and turn recomputations into offloads or keeps, while the step gets faster and still
fits. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from solvers.greedy import droppable, recompute_cost, schedule_from_saved
from solvers.ir.graph import RematGraph
from solvers.ir.link import Link, get_link
from solvers.ir.schedule import Schedule, StepKind
from solvers.ir.simulator import SimulationResult, simulate
from solvers.offload_placement import place_offloads

CANDIDATES_PER_MOVE = 4
"""How many offloads and how many recomputations are simulated before one is taken."""


@dataclass(frozen=True)
class OffloadChoice:
    """One keep / recompute / offload choice and the schedule it makes."""

    schedule: Schedule
    result: SimulationResult
    """The schedule simulated with ``link``: ``step_time_s`` is what the search minimizes."""
    saved: frozenset[str]
    """Values forward saves (on device or through the host); the others backward recomputes."""
    offloaded: frozenset[str]
    """The saved values that go through the host."""
    link: Link
    evaluations: int
    """Choices simulated to find this one."""
    chosen_by: str = "local search"
    """What made the choice (`solvers.offload_exact.best_offloads` names the exact model and its proof)."""
    shift_bytes: int = 0
    """Bytes above the budget the recompute-only schedule was planned for before its earliest
    saved values were offloaded (`solvers.offload_shift`); 0 for the local search."""

    @property
    def step_time_s(self) -> float:
        return self.result.step_time_s


class _Search:
    """Simulated choices, each once, and the rules a choice must meet."""

    def __init__(self, graph: RematGraph, budget_bytes: int, link: Link, host_budget_bytes: int | None,
                 deadline: float) -> None:
        self.graph, self.budget, self.link = graph, budget_bytes, link
        self.host_budget, self.deadline = host_budget_bytes, deadline
        self.cache: dict[tuple[frozenset[str], frozenset[str]], OffloadChoice] = {}

    def evaluate(self, saved: frozenset[str], offloaded: frozenset[str]) -> OffloadChoice:
        key = (saved, offloaded)
        found = self.cache.get(key)
        if found is None:
            base = schedule_from_saved(self.graph, saved)
            offloaded = offloaded & saved_by(self.graph, base)
            schedule = place_offloads(self.graph, base, offloaded, self.link, self.budget)
            found = OffloadChoice(schedule, simulate(self.graph, schedule, link=self.link), saved, offloaded,
                                  self.link, 0)
            self.cache[key] = found
        return found

    def fits(self, choice: OffloadChoice) -> bool:
        r = choice.result
        return r.peak_bytes <= self.budget and (self.host_budget is None or r.host_peak_bytes <= self.host_budget)

    def out_of_time(self) -> bool:
        return time.perf_counter() >= self.deadline

    def host_allows(self, choice: OffloadChoice, v: str) -> bool:
        """Whether offloading ``v`` too can still fit the host budget (held until reloaded)."""
        if self.host_budget is None:
            return True
        return choice.result.host_peak_bytes + self.graph[v].bytes <= self.host_budget


def choose_offloads(graph: RematGraph, budget_bytes: int, link: Link | str, *,
                    host_budget_bytes: int | None = None, seed: Schedule | None = None,
                    deadline: float | None = None) -> OffloadChoice | None:
    """The fastest keep / recompute / offload choice found that fits ``budget_bytes`` (device) and
    ``host_budget_bytes`` (None: unlimited), or None when none fits. ``seed``: a recompute-only
    schedule to start from (its saved set); ``deadline``: a `time.perf_counter` time to stop at
    (the best choice found by then is returned)."""
    link = get_link(link)
    search = _Search(graph, budget_bytes, link, host_budget_bytes,
                     deadline if deadline is not None else float("inf"))
    pool = frozenset(droppable(graph))
    starts = [(pool, pool), (pool, frozenset())]
    if seed is not None:
        seed_saved = frozenset(simulate(graph, seed).saved) & pool
        starts.append((seed_saved, frozenset()))
    best: OffloadChoice | None = None
    for saved, offloaded in starts:
        if best is not None and search.out_of_time():
            break
        choice = _improve(search, pool, _fit(search, search.evaluate(saved, offloaded)))
        if search.fits(choice) and (best is None or choice.step_time_s < best.step_time_s):
            best = choice
    if best is None:
        return None
    return OffloadChoice(best.schedule, best.result, best.saved, best.offloaded, link, len(search.cache))


def saved_by(graph: RematGraph, schedule: Schedule) -> frozenset[str]:
    """What ``schedule`` really saves: a sibling asked to be saved alone is recomputed with its op
    when the other sibling is, so it is not live at the boundary and has nothing to offload."""
    return frozenset(simulate(graph, schedule).saved) - frozenset(graph.forward_outputs)


def _move_rank(before: SimulationResult, after: SimulationResult, name: str) -> tuple:
    """Larger first: any peak drop, then the drop per second of added step time, then the lower peak."""
    gain = before.peak_bytes - after.peak_bytes
    extra = max(after.step_time_s - before.step_time_s, 1e-15)
    return (gain > 0, gain / extra, -after.peak_bytes, name)


def _fit(search: _Search, choice: OffloadChoice) -> OffloadChoice:
    """Offload or recompute values live at the peak until the choice fits (or no move helps)."""
    graph = search.graph
    while not search.fits(choice) and not search.out_of_time():
        if choice.result.peak_bytes <= search.budget:  # only the host is over: keep the largest on device
            largest = max(choice.offloaded, key=lambda v: (graph[v].bytes, v))
            choice = search.evaluate(choice.saved, choice.offloaded - {largest})
            continue
        live = _live_at(choice.schedule, choice.result.peak_step)
        kept = sorted((v for v in choice.saved - choice.offloaded if v in live and search.host_allows(choice, v)),
                      key=lambda v: (-graph[v].bytes, v))
        dropped = sorted((v for v in choice.saved if v in live),
                         key=lambda v: (-graph[v].bytes / recompute_cost(graph, v), v))
        moves = [(v, choice.saved, choice.offloaded | {v}) for v in kept[:CANDIDATES_PER_MOVE]]
        moves += [(v, choice.saved - {v}, choice.offloaded - {v}) for v in dropped[:CANDIDATES_PER_MOVE]]
        best = None
        for v, saved, offloaded in moves:
            trial = search.evaluate(saved, offloaded)
            key = _move_rank(choice.result, trial.result, v)
            if best is None or key > best[0]:
                best = (key, trial)
        if best is None or not best[0][0]:  # no move lowers the peak
            break
        choice = best[1]
    return choice


def _improve(search: _Search, pool: frozenset[str], choice: OffloadChoice) -> OffloadChoice:
    """Passes over the values, each trying the single-value changes that keep the choice fitting
    (keep or recompute an offloaded value; offload or keep a recomputed one), taking any that makes
    the step faster, until a pass changes nothing."""
    if not search.fits(choice):
        return choice
    graph = search.graph
    order = sorted(pool, key=lambda v: (-recompute_cost(graph, v), v))
    improved = True
    while improved and not search.out_of_time():
        improved = False
        for v in order:
            if search.out_of_time():
                break
            if v in choice.offloaded:  # keep it on device, or recompute it if that stalls less
                moves = [(choice.saved, choice.offloaded - {v}), (choice.saved - {v}, choice.offloaded - {v})]
            elif v not in choice.saved:
                moves = [(choice.saved | {v}, choice.offloaded | {v}), (choice.saved | {v}, choice.offloaded)]
            else:
                continue
            for saved, offloaded in moves:
                trial = search.evaluate(saved, offloaded)
                if search.fits(trial) and trial.step_time_s < choice.step_time_s * (1 - 1e-12):
                    choice, improved = trial, True
                    break
    return choice


def _live_at(schedule: Schedule, step: int) -> set[str]:
    """Values live on device when step ``step`` runs (-1: at the boundary)."""
    stop = len(schedule.forward) if step < 0 else step
    live: set[str] = set()
    for s in schedule.steps[:stop]:
        if s.kind is StepKind.COMPUTE or s.kind is StepKind.RELOAD:
            live.add(s.node)
        elif s.kind is StepKind.FREE:
            live.discard(s.node)
    return live
