"""Budget sweep: every strategy's peak memory and extra compute on one captured graph.

Users ask "what fits, at what cost?" before a run. The model is captured once; every budget of
the sweep is planned on the same `RematGraph`, by remat-opt's solver and by the schedules
people know, so their points land on one Pareto plot:

- fixed strategies (store-all, recompute-all, blocks, chen) make one schedule whatever the
  budget: one point each;
- budget-taking strategies (remat-opt's solver, chen-greedy, chain-dp, revolve, greedy) are
  planned at every budget: a curve; a budget they cannot meet is an ``infeasible`` point;
- ``remat-opt+offload`` (only with a ``link``, issue 39) plans each budget like remat-opt, then
  lets saved values go to host memory and back (`solvers.planning.planner.offload_choice`), keeping
  the faster of the two as the planner does: beside remat-opt's row, the same budget with and
  without offload;
- external schedules (PyTorch's min-cut partitioner at its own budgets, made by
  `frontends.compile.torch_partitioner`) arrive ready-made and are simulated here like the rest.

Every point is simulated, allocator rounding and margins included. A point's
raw numbers are what its strategy produced at that budget; `SweepResult.best_at` answers "the
cheapest schedule this strategy produced that fits B" (a schedule that fits a smaller budget
fits B too), which is what tables and curves show. Pure Python over the IR: no torch here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Callable, Iterable, Sequence

from solvers import get_solver
from solvers.base import InfeasibleBudgetError, ScheduleTooLongError, SolverOptions, SolverUnavailableError
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import Budget, BudgetError, format_bytes, parse_bytes, resolve_budget
from solvers.ir.graph import RematGraph
from solvers.ir.link import Link, get_link
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate
from solvers.planning.parallel import map_forked
from solvers.planning.planner import offload_choice, store_all_peak_bytes

REMAT_OPT = "remat-opt"
FIXED_STRATEGIES = ("store-all", "recompute-all", "blocks", "chen")
BUDGETED_STRATEGIES = ("chen-greedy", "chain-dp", "revolve", "greedy")
TORCH_STRATEGY = "torch-min-cut"
ALL_STRATEGIES = (REMAT_OPT, *FIXED_STRATEGIES, *BUDGETED_STRATEGIES, TORCH_STRATEGY)
OFFLOAD_STRATEGY = "remat-opt+offload"
"""remat-opt's solver with keep / recompute / offload: planned only when a link is given, so it is
not among `ALL_STRATEGIES` (the default list)."""
KNOWN_STRATEGIES = (*ALL_STRATEGIES, OFFLOAD_STRATEGY)
STRUCTURAL_STRATEGIES = ("blocks", "chen", "chen-greedy", "chain-dp", "revolve")
"""Schedules that need a structure (a chain, repeated blocks) some graphs lack: not-applicable there."""
MAX_SWEEP_BUDGETS = 200
_UNLIMITED = 1 << 62  # the budget fixed strategies are planned at: their schedule, whatever it peaks at


class Status:
    OK = "ok"
    INFEASIBLE = "infeasible"
    FAILED = "failed"
    NOT_APPLICABLE = "not-applicable"


@dataclass(frozen=True)
class ExternalSchedule:
    """A schedule made elsewhere (e.g. by PyTorch's partitioner), to be simulated as a point."""

    strategy: str
    setting: str
    """What produced it, e.g. ``activation_memory_budget=0.5``."""
    schedule: Schedule | None
    """None when the producer failed (``message`` says why)."""
    message: str = ""


@dataclass(frozen=True)
class SweepPoint:
    """One strategy's answer at one budget (or its only answer, for fixed strategies)."""

    strategy: str
    status: str
    """``ok``, ``infeasible`` (nothing within the budget), ``failed`` (the strategy broke,
    ``message`` says why) or ``not-applicable`` (e.g. revolve on a graph that is not a chain)."""
    budget_bytes: int | None = None
    """The budget it was asked for; None for fixed strategies and external schedules."""
    setting: str = ""
    peak_bytes: int | None = None
    """Simulated peak (allocator rounding and margins included)."""
    extra_time_s: float | None = None
    """Recomputation time under the cost model, plus the copy time compute does not hide
    (``stall_time_s``), as in `solvers.ir.plan.Plan.extra_time_s`."""
    extra_flops: float | None = None
    solve_time_s: float = 0.0
    message: str = ""
    schedule: Schedule | None = field(default=None, repr=False, compare=False)
    offloaded_bytes: int = 0
    """Bytes of saved values copied to host and back (0 for every recompute-only strategy)."""
    transfer_time_s: float = 0.0
    """Seconds the copy streams are busy."""
    stall_time_s: float = 0.0
    """Seconds compute waits on copies (included in ``extra_time_s``)."""
    host_peak_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


@dataclass(frozen=True)
class SweepResult:
    """Every point of a sweep, and what the graph's plain step costs (for percentages)."""

    budgets: tuple[int, ...]
    points: tuple[SweepPoint, ...]
    store_all_peak_bytes: int
    step_time_s: float
    step_flops: float
    cost_model: str
    solver: str
    """The solver behind the ``remat-opt`` strategy."""
    link: str = ""
    """The link ``remat-opt+offload`` priced its copies on (`Link.describe`); "" without it."""

    @property
    def strategies(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.strategy for p in self.points))

    def points_of(self, strategy: str) -> tuple[SweepPoint, ...]:
        return tuple(p for p in self.points if p.strategy == strategy)

    def best_at(self, strategy: str, budget_bytes: int) -> SweepPoint | None:
        """The cheapest schedule ``strategy`` produced whose peak fits ``budget_bytes``."""
        fitting = [p for p in self.points_of(strategy) if p.ok and p.peak_bytes <= budget_bytes]
        return min(fitting, key=lambda p: (p.extra_time_s, p.peak_bytes), default=None)

    def curve(self, strategy: str) -> tuple[SweepPoint, ...]:
        """``strategy``'s Pareto-optimal points, by increasing peak (so decreasing extra time)."""
        return pareto_front(p for p in self.points_of(strategy) if p.ok)

    def frontier(self) -> tuple[SweepPoint, ...]:
        """The Pareto-optimal points over all strategies."""
        return pareto_front(p for p in self.points if p.ok)

    def extra_percent(self, point: SweepPoint) -> float:
        return 100.0 * point.extra_time_s / self.step_time_s if self.step_time_s else 0.0


def pareto_front(points: Iterable[SweepPoint]) -> tuple[SweepPoint, ...]:
    """Points no other point beats on both peak and extra time, by increasing peak."""
    front: list[SweepPoint] = []
    for p in sorted(points, key=lambda p: (p.peak_bytes, p.extra_time_s)):
        if not front or p.extra_time_s < front[-1].extra_time_s:
            front.append(p)
    return tuple(front)


def parse_sweep(spec: str) -> tuple[str | int, ...]:
    """Budgets from ``START:STOP:STEP`` (``20%:100%:10`` or ``1GB:4GB:512MB``, STOP included)
    or a comma list (``50%,70%,2GB``). Percentages are of store-all's peak."""
    text = spec.strip()
    if ":" not in text:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise BudgetError(f"invalid sweep {spec!r}: give START:STOP:STEP or a comma list of budgets")
        try:
            budgets = [Budget.of(item) for item in items]
        except BudgetError as err:
            raise BudgetError(f"invalid sweep {spec!r}: {err}") from None
        return tuple(str(b) if b.is_percentage else b.size_bytes for b in budgets)
    parts = [p.strip() for p in text.split(":")]
    if len(parts) != 3:
        raise BudgetError(f"invalid sweep {spec!r}: a range is START:STOP:STEP, e.g. 20%:100%:10")
    start, stop, step = parts
    try:
        first, last = Budget.of(start), Budget.of(stop)
    except BudgetError:
        raise BudgetError(f"invalid sweep {spec!r}: use numbers like 20%:100%:10 or 1GB:4GB:512MB") from None
    if first.is_percentage != last.is_percentage:
        raise BudgetError(f"invalid sweep {spec!r}: START and STOP must both be percentages or both sizes")
    percent = first.is_percentage
    try:
        lo, hi = ((first.percent, last.percent) if percent
                  else (Decimal(first.size_bytes), Decimal(last.size_bytes)))
        inc = Decimal(step.rstrip("%")) if percent else Decimal(parse_bytes(step))
    except (InvalidOperation, BudgetError):
        raise BudgetError(f"invalid sweep {spec!r}: use numbers like 20%:100%:10 or 1GB:4GB:512MB") from None
    if not (lo.is_finite() and hi.is_finite() and inc.is_finite()) or lo <= 0 or inc <= 0 or hi < lo:
        raise BudgetError(f"invalid sweep {spec!r}: need 0 < START <= STOP and STEP > 0")
    count = int((hi - lo) / inc) + 1
    if count > MAX_SWEEP_BUDGETS:
        raise BudgetError(f"invalid sweep {spec!r}: {count} budgets; use at most {MAX_SWEEP_BUDGETS} (a larger STEP)")
    values = [lo + i * inc for i in range(count)]
    return tuple(f"{v.normalize():f}%" for v in values) if percent else tuple(int(v) for v in values)


def run_sweep(
    graph: RematGraph,
    budgets: Sequence[str | int],
    *,
    strategies: Sequence[str] = ALL_STRATEGIES,
    solver: str = "auto",
    options: SolverOptions = SolverOptions(),
    allocator: AllocatorModel | None = None,
    externals: Sequence[ExternalSchedule] | Callable[[], Sequence[ExternalSchedule]] = (),
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
    link: Link | str | None = None,
    host_budget: int | None = None,
) -> SweepResult:
    """Plan ``graph`` with each of ``strategies`` at each of ``budgets`` (bytes, sizes or
    percentages of store-all's peak); ``externals`` are simulated as they are (a callable is
    called for them, in this process, while the workers solve).

    ``progress`` is called with a short description after every solve (for progress bars);
    `count_solves` says how many calls to expect. ``jobs > 1`` solves on forked workers
    (`solvers.planning.parallel`), with the same points in the same order.

    ``link`` (a `Link` or preset name) and ``host_budget`` (pinned host bytes, None: unlimited)
    are for the ``remat-opt+offload`` strategy, which needs the link. Its point at a budget is
    never slower than remat-opt's at that budget when both are swept (the faster is kept).
    """
    unknown = [s for s in strategies if s not in KNOWN_STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}: choose from {', '.join(KNOWN_STRATEGIES)}")
    copy_link = get_link(link) if link is not None else None
    if OFFLOAD_STRATEGY in strategies and copy_link is None:
        raise ValueError(f"{OFFLOAD_STRATEGY} prices copies to host: pass link= (a solvers.ir.link.Link "
                         "or a preset name such as 'pcie5')")
    allocator = allocator or AllocatorModel(block_bytes=1)
    store_all_peak = store_all_peak_bytes(graph, allocator)
    resolved = tuple(sorted({resolve_budget(b, store_all_peak) for b in budgets}))
    tick = progress or (lambda _: None)
    solves = [(strategy, None if strategy in FIXED_STRATEGIES else budget)
              for strategy in strategies if strategy != TORCH_STRATEGY
              for budget in ((None,) if strategy in FIXED_STRATEGIES else resolved)]
    torch_wanted = TORCH_STRATEGY in strategies

    def work(item):
        if item is None:  # torch's schedules, simulated here
            checked = allocator.apply(graph)
            made = externals() if callable(externals) else externals
            return [external_point(checked, ext, allocator) for ext in made]
        strategy, budget = item
        if strategy == OFFLOAD_STRATEGY:
            assert copy_link is not None and budget is not None
            seed = _fastest_fitting(done, budget) if jobs <= 1 else None  # remat-opt's answers, when solved here
            point = offload_point(graph, solver, budget, options, allocator, copy_link, host_budget, seed)
        else:
            point = plan_point(graph, strategy, solver if strategy == REMAT_OPT else strategy, budget, options,
                               allocator)
        if jobs <= 1:
            tick(strategy if budget is None else f"{strategy} at {format_bytes(budget)}")
        return point

    items = [*_slowest_first(solves), None] if torch_wanted else _slowest_first(solves)
    done: dict = {}
    if jobs <= 1:
        for item in solves:  # in order, so a structure a strategy lacks stops it at its first budget
            strategy = item[0]
            if done.get((strategy, "skip")):
                continue
            done[item] = work(item)
            done[(strategy, "skip")] = done[item].status == Status.NOT_APPLICABLE
        if torch_wanted:
            done[None] = work(None)
    else:
        done = dict(zip(items, map_forked(work, items, jobs, here=lambda item: item is None)))
        for strategy, budget in solves:
            tick(strategy if budget is None else f"{strategy} at {format_bytes(budget)}")
    points: list[SweepPoint] = []
    for strategy in dict.fromkeys(s for s, _ in solves):
        for item in (i for i in solves if i[0] == strategy and i in done):
            points.append(done[item])
            if done[item].status == Status.NOT_APPLICABLE:
                break
    if torch_wanted:
        points.extend(done[None])
    points = [_no_slower_than_remat_opt(p, done) for p in points]
    return SweepResult(resolved, tuple(points), store_all_peak, graph.base_cost, graph.base_flops,
                       graph.cost_model, solver, copy_link.describe() if copy_link is not None else "")


def _fastest_fitting(done: dict, budget: int) -> SweepPoint | None:
    """remat-opt's fastest schedule whose peak fits ``budget``, whichever budget it was solved for
    (what `SweepResult.best_at` shows for remat-opt at ``budget``)."""
    fitting = [p for key, p in done.items() if isinstance(key, tuple) and key[0] == REMAT_OPT
               and isinstance(p, SweepPoint) and p.ok and p.peak_bytes <= budget]
    return min(fitting, key=lambda p: (p.extra_time_s, p.peak_bytes), default=None)


def _no_slower_than_remat_opt(point: SweepPoint, done: dict) -> SweepPoint:
    """An offload point as the planner keeps it: remat-opt's fastest schedule that fits the same
    budget where that one is faster (a recompute-only schedule is an offload plan that offloads
    nothing; a solver re-run on a worker may also land elsewhere than the seed it was given)."""
    if point.strategy != OFFLOAD_STRATEGY:
        return point
    plain = _fastest_fitting(done, point.budget_bytes)
    if plain is None or (point.ok and point.extra_time_s <= plain.extra_time_s):
        return point
    return replace(plain, strategy=OFFLOAD_STRATEGY, budget_bytes=point.budget_bytes,
                   message=f"no offload beats remat-opt's plan; {plain.message}")


def _slowest_first(solves: list) -> list:
    """The exact solver's solves first, then the searching heuristics', then the rest (the pool
    hands items out in order: the long ones should not start last)."""
    rank = {REMAT_OPT: 0, OFFLOAD_STRATEGY: 0, "greedy": 1, "chain-dp": 2, "chen-greedy": 3}
    return sorted(solves, key=lambda item: rank.get(item[0], 4))


def count_solves(strategies: Sequence[str], n_budgets: int) -> int:
    """How many times `run_sweep` calls ``progress`` (at most: chain solvers may stop early)."""
    return sum(1 if s in FIXED_STRATEGIES else n_budgets for s in strategies if s != TORCH_STRATEGY)


def plan_point(graph: RematGraph, strategy: str, solver: str, budget: int | None,
               options: SolverOptions, allocator: AllocatorModel) -> SweepPoint:
    """``solver``'s simulated schedule at ``budget`` bytes (None: unlimited, for fixed strategies).

    The solver runs on the allocator-rounded graph with the budget that leaves room for the
    allocator's reserve and margin, as `solvers.planning.planner.plan_graph` does; unlike it, an
    infeasible budget is a point of the sweep, not an error worth a search for the smallest
    feasible budget.
    """
    start = time.perf_counter()
    rounded = allocator.apply(graph)
    solver_budget = allocator.solver_budget(budget) if budget is not None else _UNLIMITED

    def point(status: str, message: str) -> SweepPoint:
        return SweepPoint(strategy, status, budget, solve_time_s=time.perf_counter() - start,
                          message=message.splitlines()[0] if message else "")

    try:
        result = get_solver(solver)(rounded, solver_budget, options)
    except InfeasibleBudgetError as err:
        smallest = err.smallest_feasible_bytes
        return point(Status.INFEASIBLE, "no schedule fits" if smallest is None else
                     f"no schedule fits; the smallest feasible budget found is {smallest} B")
    except SolverUnavailableError as err:
        return point(Status.FAILED, str(err))
    except ScheduleTooLongError as err:  # recompute-all on a long chain: not built
        return point(Status.NOT_APPLICABLE, str(err))
    except ValueError as err:  # a chain or block schedule on a graph without that structure
        if strategy not in STRUCTURAL_STRATEGIES:
            raise
        return point(Status.NOT_APPLICABLE, str(err) or type(err).__name__)
    if result.schedule is None:
        return point(Status.INFEASIBLE, result.message or "no schedule fits")
    sim = simulate(rounded, result.schedule)
    if sim.peak_bytes > solver_budget:
        raise AssertionError(f"solver {solver} returned a schedule peaking at {sim.peak_bytes} bytes "
                             f"for a budget of {solver_budget}: this is a bug in the solver")
    return SweepPoint(
        strategy, Status.OK, budget, peak_bytes=allocator.planned_peak(sim.peak_bytes),
        extra_time_s=sim.extra_cost, extra_flops=sim.extra_flops,
        solve_time_s=time.perf_counter() - start, message=result.message, schedule=result.schedule,
    )


def external_point(checked: RematGraph, ext: ExternalSchedule, allocator: AllocatorModel) -> SweepPoint:
    """Simulate a ready-made schedule on the (allocator-rounded) graph."""
    if ext.schedule is None:
        return SweepPoint(ext.strategy, Status.FAILED, setting=ext.setting, message=ext.message)
    sim = simulate(checked, ext.schedule)
    return SweepPoint(ext.strategy, Status.OK, setting=ext.setting,
                      peak_bytes=allocator.planned_peak(sim.peak_bytes), extra_time_s=sim.extra_cost,
                      extra_flops=sim.extra_flops, message=ext.message, schedule=ext.schedule)


def offload_point(graph: RematGraph, solver: str, budget: int, options: SolverOptions, allocator: AllocatorModel,
                  link: Link, host_budget: int | None = None, seed: SweepPoint | None = None) -> SweepPoint:
    """``solver``'s plan at ``budget`` bytes with keep / recompute / offload: the offload searches
    (`solvers.planning.planner.offload_choice`: the budget shift and the local search) start from
    the recompute-only schedule (``seed``, remat-opt's point at this budget, or solved here), and
    the faster of the two is the point, as `solvers.planning.planner.plan_graph` keeps it. A budget
    no recompute-only schedule meets may still fit with offloads."""
    start = time.perf_counter()
    rounded = allocator.apply(graph)
    solver_budget = allocator.solver_budget(budget)
    recompute = seed if seed is not None else plan_point(graph, OFFLOAD_STRATEGY, solver, budget, options, allocator)
    if recompute.status in (Status.FAILED, Status.NOT_APPLICABLE):
        return replace(recompute, strategy=OFFLOAD_STRATEGY)
    choice = offload_choice(rounded, solver_budget, link, host_budget, solver, options, recompute.schedule)
    solve_time_s = recompute.solve_time_s + time.perf_counter() - start
    plain_time = None if recompute.schedule is None else simulate(rounded, recompute.schedule).total_cost
    if choice is not None and (plain_time is None or (choice.offloaded and
                                                      choice.step_time_s < plain_time * (1 - 1e-9))):
        return _offloaded_point(rounded, budget, choice.result, choice.schedule, allocator, solve_time_s,
                                f"keep / recompute / offload chosen by {choice.chosen_by}")
    if recompute.schedule is None:
        return replace(recompute, strategy=OFFLOAD_STRATEGY, solve_time_s=solve_time_s,
                       message=f"nothing fits, with offloads or without ({recompute.message})")
    message = "no offload beats the recompute-only plan"
    return replace(recompute, strategy=OFFLOAD_STRATEGY, solve_time_s=solve_time_s,
                   message=f"{message}; {recompute.message}" if recompute.message else message)


def _offloaded_point(rounded: RematGraph, budget: int, sim: SimulationResult, schedule: Schedule,
                     allocator: AllocatorModel, solve_time_s: float, message: str) -> SweepPoint:
    return SweepPoint(
        OFFLOAD_STRATEGY, Status.OK, budget, peak_bytes=allocator.planned_peak(sim.peak_bytes),
        extra_time_s=sim.extra_cost + sim.stall_time_s, extra_flops=sim.extra_flops, solve_time_s=solve_time_s,
        message=message, schedule=schedule, offloaded_bytes=sum(rounded[name].bytes for name in sim.offloaded),
        transfer_time_s=sim.transfer_time_s, stall_time_s=sim.stall_time_s, host_peak_bytes=sim.host_peak_bytes,
    )
