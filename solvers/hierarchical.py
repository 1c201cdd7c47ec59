"""``hierarchical``: near-optimal schedules with a proven gap on graphs far past the exact MILP.

1. Reduce the graph losslessly (`solvers.ir.reduce`): same optimum, schedules map back.
2. On a long chain of stages (a time-stepping loop, an unrolled RNN, a deep stack: at least
   ``LONG_CHAIN_STAGES`` stages between articulation values), first the chain schedules that
   scale with it: rotor's heterogeneous-chain DP (over super-stages when the chain is too long
   for its work limit), chen-greedy and revolve (binomial checkpointing, multi-level), the
   chain solvers with a share of the time limit each; the bound then gets what is left.
3. Prove a lower bound (`solvers.remat_bound`): an LP over the whole graph with O(values)
   columns; it also says which values the relaxation keeps, and can prove a budget infeasible.
4. Build schedules, each simulated, in this order:
   - the cheap classic schedules (per-block checkpointing, chen-greedy), so that the answer is
     never worse than them whatever the time limit;
   - per repeated block (`solvers.block_plan`): each distinct block kind's keep/recompute
     options are solved once, exactly, then a DP over the chain of blocks picks one per block;
   - the bound LP rounded to a saved set, repaired to fit the budget, then re-saved greedily;
   - swaps from a chain solver's winner (`solvers.repair.improve_schedule`: save one value it
     recomputes, demote others live at the peak), when that winner is over 1% from the bound;
   - the near-floor repair (`solvers.repair`, unless the best is within 1% of the bound): each
     value saved, held after its recomputation or recomputed for each reader, searched down
     from the LP's guess and store-all and up from recompute-all; near the smallest budget
     this is what fits at a step's cost instead of recompute-all's (12x on regnetx_002);
   - chain-dp (when its O(stages^4) DP fits in the time left) and greedy (a capped share; not
     on a long chain that has a schedule: one value at a time it cannot match a chain's).
5. Graphs of at most ``EXACT_MAX_GROUPS`` op groups also get the exact MILP in the time left:
   exact where it can be, near-optimal with a proven gap where it cannot.
6. Return the cheapest schedule within the budget, with the bound and gap; OPTIMAL when the
   bound meets it. Never worse than the classic schedules it ran.
"""

from __future__ import annotations

import contextlib
import math
import time

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from solvers import get_solver
from solvers.base import EXACT_MAX_GROUPS, InfeasibleBudgetError, SolveResult, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_within_cap, store_all_schedule
from solvers.block_plan import block_schedules
from solvers.ir.graph import RematGraph
from solvers.ir.reduce import reduce_graph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate
from solvers.linearize import linearize
from solvers.remat_bound import base_cost_bound, lower_bound
from solvers.repair import guess_states, improve_schedule, repair_to_budget
from solvers.saved_set import repair_saved_set

CHAIN_DP_MAX_STAGES = 40
"""chain-dp's table is O(stages^4) vector operations: past this it outlasts a minute."""
CHAIN_DP_SECONDS_AT_28 = 20.0
"""chain-dp's measured time on GPT-2-small's 28 stages (2 shared cores); scaled by stages^4 to
skip it when it would overrun the time limit (its DP cannot be interrupted)."""
FIRST_CLASSICS = ("blocks", "chen-greedy")
LONG_CHAIN_STAGES = 64
"""A forward graph cut into at least this many stages is a long chain (a time-stepping loop, an
unrolled RNN): rotor and revolve run early (their schedules recompute whole stages, at several
levels, which block plans and saved sets do not). Transformer and CNN stacks have 9-28 stages
(the examples, GPT-2-small) and keep the block plans' time; where chain schedules would win on
them is not measured yet."""
CHAIN_SOLVERS = ("rotor", "revolve")
CHAIN_SHARE = 0.25
"""Share of the time limit for each chain solver (they stop at their limit with their best)."""
LONG_CHAIN_FIRST = (("rotor", 0.3), ("chen-greedy", 0.2), ("revolve", 0.1))
"""On a long chain, before the bound, with their shares of the time limit: rotor (over
super-stages on chains too long for its DP) first, then chen-greedy's segments (rotor's coarse
family does not contain every segmentation), then revolve (checkpoints only: it re-tapes every
step, so it rarely beats the other two; measured at 1,000 steps, 10%: 0.509 extra against
rotor's 0.349)."""
LONG_CHAIN_LP_SECONDS = 5.0
"""On a long chain with a schedule, the bound LP runs only with this much of its share left
(with less, HiGHS stops at the base cost, which `solvers.remat_bound.base_cost_bound` gives at
once). At 1,000 steps (12k values) the LP takes 6.5-7.5 s with `LONG_CHAIN_SNAPSHOTS` and the
primal simplex, against 14-25 s with 8 snapshots and the dual simplex (2 cores)."""
LONG_CHAIN_LP_MAX_VALUES = 50_000
"""On a long chain with a schedule, the bound LP is not built past this many values: at 10,000
steps (120k values, 12 million coefficients) its build alone outlasts the default minute, and
it ended at the base cost after spending its share (about 18 s); at 1,000 steps (12k values) it
is solved in 6.5-7.5 s. Past the cap the base-cost bound comes at once."""
LONG_CHAIN_LP_SHARE = 0.75
"""On a long chain the bound LP gets this share of the time the chain schedules left, its build
included (at 10,000 steps the build alone outlasts a minute: it stops at the share's end): their
schedules are found in seconds, and the LP is what turns them into a proven gap (at 1,000 steps
it proves rotor's plans within 0.1-0.4%). The rest goes to the block plans, which do not beat
the chain schedules there."""
LONG_CHAIN_SNAPSHOTS = 4
"""Snapshot instants of the bound LP on a long chain (32 elsewhere): each adds rows over the
whole chain, and fewer only loosen the bound; measured on the 100- and 1,000-step loops at
5-50%, 4 snapshots prove the same bound as 32."""
SNAPSHOT_WORK = 20_000
"""Snapshots x values the bound LP gets elsewhere than on long chains: 32 snapshots, up to 96 on
graphs small enough (each snapshot adds about a row per value). On transformers GPT-2 2 x 256
(204 values) at 1.01x its floor 96 snapshots prove 1.1535 of store-all's cost against 1.1496 with
32 (0.7 s); on densenet121 (2,307 values) 96 add 0.02% for 12 s, so it keeps 32."""


def snapshots_for(values: int) -> int:
    """The bound LP's snapshot count for a graph of ``values`` values (not a long chain)."""
    return max(32, min(96, SNAPSHOT_WORK // max(1, values)))


TIGHT_BOUND_SNAPSHOTS = 32
TIGHT_BOUND_MAX_VALUES = 5_000
TIGHT_BOUND_MIN_SECONDS = 2.0
"""On a long chain whose best schedule is still more than `REPAIR_SKIP_GAP` above the bound,
the LP is solved again at the end with this many snapshots and rule 6's second runs
(`solvers.remat_bound`), by the dual simplex, with what time is left (at least the minimum),
on graphs of up to this many values. On the 1,045-group ResNet (1,644 values) at twice its
floor the bound rises 1.1581 -> 1.1599 of store-all's cost in 1.8 s (4 snapshots: 0.5 s); on
the 100-step loop (997 values) 5-10 s for +0.1-0.3%; at 1,000 steps (10k values) it does not
finish in a minute."""
LATE_CLASSICS = ("chain-dp", "greedy")
BLOCK_SHARE = 0.3
ROUNDING_SHARE = 0.15
"""Shares of the time limit for the block plan and the LP rounding (their repair loops)."""
REPAIR_SHARE = 0.2
"""Share of the time limit for the near-floor repair (`solvers.repair`): on densenet121 near
its floor its LP-seeded starts take 2-3 s each (2 shared cores)."""
REPAIR_SKIP_GAP = 0.01
"""The repair is skipped when the best schedule so far is within this gap of the bound."""
SWAP_SHARE = 0.4
"""Share of the time limit for the swaps from a chain solver's winner (`solvers.repair.
improve_schedule`, run before the near-floor repair when the best is a chain schedule more than
`REPAIR_SKIP_GAP` from the bound): on resnet_like(150) (about 5 ms a simulation) its 12
tie-break starts take ~17 s of the 24, and take rotor's 1.1835 to 1.1710 at 2x its floor (the
bound: 1.158), 1.2670 to 1.2504 at 1.5x; the whole solve ended at 40 s with 15 s of swaps."""
GREEDY_SHARE = 0.2
"""greedy simulates a few candidates per dropped value: cap it at this share of the limit."""


class _Progress:
    """A rich progress line per phase when verbose, silent otherwise."""

    def __init__(self, verbose: bool) -> None:
        self._stack = contextlib.ExitStack()
        self._bar = None
        if verbose:

            self._bar = self._stack.enter_context(Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=False))

    @contextlib.contextmanager
    def phase(self, text: str):
        task = self._bar.add_task(text, total=1) if self._bar else None
        try:
            yield
        finally:
            if self._bar is not None:
                self._bar.update(task, completed=1)

    def close(self) -> None:
        self._stack.close()


class _Best:
    """The cheapest schedule within the budget seen so far (on the original graph)."""

    def __init__(self, graph: RematGraph, budget: int, on_better=None) -> None:
        self.graph, self.budget, self.on_better = graph, budget, on_better
        self.schedule: Schedule | None = None
        self.sim: SimulationResult | None = None
        self.source = ""
        self.tried: dict[str, float | None] = {}

    def offer(self, name: str, schedule: Schedule | None) -> None:
        if schedule is None:
            self.tried.setdefault(name, None)
            return
        sim = simulate(self.graph, schedule)
        fits = sim.peak_bytes <= self.budget
        cost = sim.total_cost if fits else None
        if cost is not None and (self.tried.get(name) is None or cost < self.tried[name]):
            self.tried[name] = cost
        else:
            self.tried.setdefault(name, None)
        if fits and (self.sim is None or sim.total_cost < self.sim.total_cost - 1e-15):
            self.schedule, self.sim, self.source = schedule, sim, name
            if self.on_better is not None:
                self.on_better(sim.total_cost)


def _run_classic(name: str, graph: RematGraph, budget_bytes: int, best: _Best, progress: _Progress,
                 deadline: float, options: SolverOptions, share: float | None = None) -> None:
    left = deadline - time.perf_counter()
    if left < 0.5:
        best.tried.setdefault(name, None)
        return
    limit = max(0.5, min(left, share) if share is not None else left)
    with progress.phase(f"classic schedule: {name}"):
        try:
            answer = get_solver(name)(graph, budget_bytes, SolverOptions(
                time_limit_s=limit, threads=options.threads, milp_engine=options.milp_engine))
        except ValueError:  # a chain solver on a graph that is not a chain
            answer = None
        best.offer(name, answer.schedule if answer is not None else None)


def solve_hierarchical(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    store_all = store_all_schedule(graph)
    store_sim = simulate(graph, store_all)

    def report(objective, bound, final=False) -> None:
        options.report(start, objective, bound, final=final)

    def result(status, schedule, objective, bound, message) -> SolveResult:
        report(objective, bound, final=True)
        return SolveResult("hierarchical", status, schedule, objective, bound,
                           time.perf_counter() - start, message)

    if store_sim.peak_bytes <= budget_bytes:
        return result(SolveStatus.OPTIMAL, store_all, store_sim.total_cost, store_sim.total_cost,
                      "store-all fits the budget: no recomputation needed")
    progress = _Progress(options.verbose)
    try:
        with progress.phase("reducing the graph"):
            reduction = reduce_graph(graph)
        small = reduction.graph
        limit = options.time_limit_s
        stages = len(linearize(graph).stages)
        long_chain = stages >= LONG_CHAIN_STAGES
        bound_found: list[float] = []  # the bound, once proven

        def on_better(cost: float) -> None:
            report(cost, min(bound_found[0], cost) if bound_found else None)

        best = _Best(graph, budget_bytes, on_better=on_better)
        if long_chain:  # first: on a long chain these are the schedules that matter
            for name, share in LONG_CHAIN_FIRST:
                _run_classic(name, graph, budget_bytes, best, progress, deadline, options,
                             share=share * limit)
            if best.schedule is None:  # rotor again, with half of what is left
                _run_classic("rotor", graph, budget_bytes, best, progress, deadline, options,
                             share=0.5 * (deadline - time.perf_counter()))
        bound_limit = 0.25 * limit
        if long_chain:  # the LP gets its share of what the chain schedules left
            bound_limit = LONG_CHAIN_LP_SHARE * (deadline - time.perf_counter())
        with progress.phase(f"lower bound (LP over {len(small.ops)} values)"):
            if long_chain and best.schedule is not None and bound_limit < LONG_CHAIN_LP_SECONDS:
                bound = base_cost_bound(small, f"{max(bound_limit, 0.0):.0f} s left for the LP")
            elif long_chain and best.schedule is not None and len(small.ops) > LONG_CHAIN_LP_MAX_VALUES:
                bound = base_cost_bound(small, f"no LP over {len(small.ops):,} values "
                                               f"(more than {LONG_CHAIN_LP_MAX_VALUES:,})")
            else:
                # On a long chain the LP's build counts against its share too: at 10,000
                # steps it alone outlasts a minute.
                bound = lower_bound(small, budget_bytes, time_limit_s=max(1.0, bound_limit),
                                    snapshots=LONG_CHAIN_SNAPSHOTS if long_chain else snapshots_for(len(small.ops)),
                                    primal_simplex=long_chain, second_runs=not long_chain,
                                    deadline=(time.perf_counter() + max(1.0, bound_limit)
                                              if long_chain else math.inf))
        if bound.proven_infeasible:
            return result(SolveStatus.INFEASIBLE, None, None, math.inf,
                          f"no schedule fits {budget_bytes} bytes: {bound.message}")
        bound_found.append(bound.bound)
        report(best.sim.total_cost if best.sim else None,
               min(bound.bound, best.sim.total_cost) if best.sim else bound.bound)
        # The leanest classic schedule: what the smallest-budget search names for large graphs
        # (`solvers.checkmate.min_budget`), so every budget an error names has a schedule here.
        # On a long chain it is quadratic in the chain's length (each backward op recomputes
        # from the inputs) and costlier than any chain schedule: only when none fits, and not
        # past RECOMPUTE_ALL_MAX_STEPS recomputations (10,000 steps: 400 million).
        if not long_chain or best.schedule is None:
            best.offer("recompute-all", recompute_all_within_cap(graph))
        for name in FIRST_CLASSICS:  # cheap, and what "never worse than classic" needs first
            if name not in best.tried:
                _run_classic(name, graph, budget_bytes, best, progress, deadline, options)
        with progress.phase("repeated blocks: options per block kind, DP over the chain"):
            plans, block_note = block_schedules(
                small, budget_bytes, min(deadline, time.perf_counter() + BLOCK_SHARE * limit))
            for name, schedule in plans:
                best.offer(name, reduction.expand(schedule))
        keep = dict(bound.keep_fraction)
        # Without an LP solution (the base-cost bound) there is nothing to round: an empty saved
        # set recomputes every backward input from the model's inputs (quadratic on a chain).
        if not keep:
            best.tried.setdefault("lp-rounding", None)
        else:
            with progress.phase("rounding the bound's LP to a saved set"):
                stop = min(deadline, time.perf_counter() + ROUNDING_SHARE * limit)
                for threshold in (0.999, 0.5, 0.001):
                    if time.perf_counter() > stop:
                        break
                    saved = frozenset(v for v, f in keep.items() if f >= threshold)
                    schedule = repair_saved_set(small, saved, budget_bytes, stop, order=keep)
                    best.offer("lp-rounding",
                               None if schedule is None else reduction.expand(schedule))
        if (best.source in CHAIN_SOLVERS and best.schedule is not None
                and best.sim.total_cost > bound.bound * (1 + REPAIR_SKIP_GAP)):
            with progress.phase("swaps from the chain schedule: one value saved for others"):
                swapped = improve_schedule(graph, budget_bytes,
                                           min(deadline, time.perf_counter() + SWAP_SHARE * limit),
                                           best.schedule)
                best.offer("swaps", None if swapped is None else swapped.schedule)
        if best.sim is None or best.sim.total_cost > bound.bound * (1 + REPAIR_SKIP_GAP):
            with progress.phase("near-floor repair: saved, held or recomputed per reader"):
                guess = frozenset(v for v, f in keep.items() if f >= 0.5)
                repaired = repair_to_budget(
                    small, budget_bytes, min(deadline, time.perf_counter() + REPAIR_SHARE * limit),
                    guess_states(small, guess) if keep else ())
                best.offer("repair", None if repaired is None else reduction.expand(repaired.schedule))
        for name in LATE_CLASSICS:
            left = deadline - time.perf_counter()
            if name == "greedy" and long_chain and best.schedule is not None:
                best.tried.setdefault(name, None)  # one value at a time: no match for a chain's
                continue
            if name == "chain-dp" and (stages > CHAIN_DP_MAX_STAGES
                                       or CHAIN_DP_SECONDS_AT_28 * (stages / 28) ** 4 > left):
                best.tried.setdefault(name, None)
                continue
            _run_classic(name, graph, budget_bytes, best, progress, deadline, options,
                         share=GREEDY_SHARE * limit if name == "greedy" else None)
        if (long_chain and len(graph.groups) > EXACT_MAX_GROUPS  # else the exact MILP below has the time
                and best.sim is not None and keep  # the first LP was solved (not the base cost)
                and best.sim.total_cost > bound.bound * (1 + REPAIR_SKIP_GAP)
                and len(small.ops) <= TIGHT_BOUND_MAX_VALUES
                and deadline - time.perf_counter() >= TIGHT_BOUND_MIN_SECONDS):
            with progress.phase(f"a tighter bound ({TIGHT_BOUND_SNAPSHOTS} snapshots, second runs)"):
                tighter = lower_bound(small, budget_bytes, time_limit_s=deadline - time.perf_counter(),
                                      snapshots=TIGHT_BOUND_SNAPSHOTS, deadline=deadline)
            if not tighter.proven_infeasible and tighter.bound > bound.bound:  # (a schedule fits)
                bound = tighter
                bound_found[0] = bound.bound
                report(best.sim.total_cost, min(bound.bound, best.sim.total_cost))
        left = deadline - time.perf_counter()
        exact_bound = None
        if len(graph.groups) <= EXACT_MAX_GROUPS and left >= 1.0:
            with progress.phase(f"exact MILP ({len(graph.groups)} op groups)"):
                try:
                    exact = get_solver("milp")(graph, budget_bytes, SolverOptions(
                        time_limit_s=left, threads=options.threads, milp_engine=options.milp_engine))
                    best.offer("milp", exact.schedule)
                    exact_bound = exact.bound
                except InfeasibleBudgetError:
                    best.tried.setdefault("milp", None)
    finally:
        progress.close()
    tried = ", ".join(f"{k} {'-' if v is None else f'{v:.6g}'}" for k, v in best.tried.items())
    counts = reduction.counts.describe() if reduction.counts else ""
    if best.schedule is None:
        return result(SolveStatus.INFEASIBLE, None, None, bound.bound,
                      f"no schedule found within {budget_bytes} bytes (tried {tried}); {block_note}")
    objective = best.sim.total_cost
    proven = min(max(bound.bound, exact_bound or 0.0), objective)
    status = SolveStatus.OPTIMAL if objective <= proven * (1 + 1e-9) else SolveStatus.FEASIBLE
    source = best.source
    if source == "recompute-all":  # the last resort: say how far from the bound it may be
        source += (f" (the last resort: nothing cheaper fits; proven gap "
                   f"{100 * (objective - proven) / objective:.1f}%)")
    return result(status, best.schedule, objective, proven,
                  f"best: {source}; {block_note}; reduced: {counts}; tried: {tried}")
