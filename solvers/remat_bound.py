"""A proven lower bound on the least compute of any schedule within a memory budget.

An LP relaxation that is small (O(values) columns, one memory row per backward op) and holds
for every schedule whose backward ops first run in the graph's order (the Checkmate family the
exact solvers search, and every schedule the classic solvers build). With B0 the instant the
output gradients arrive, for forward values v and forward op groups g:

- ``live[v]`` in [0, 1]: v is live at B0 (1 for forward outputs, which must be);
- ``again[g]`` in [0, 1]: g runs (at least once) in backward; 0 for run-once ops;
- ``held[v] >= live[v] - again[g(v)]`` and ``held[v] >= 1 - again[g(v)]``: a value backward
  reads that is never computed in backward is live from B0 until backward's last read of it.

Rules every schedule obeys, hence constraints:
1. backward reads v: v is live at B0 or computed in backward (``again >= 1 - live``), and
   if it is not computed in backward it is held (rule 1');
2. g runs in backward at time t: each op input u of g is live at t, so u was live at B0 or
   was computed in backward before t (``again[g(u)] >= again[g] - live[u]``);
3. at B0: resident bytes + tangents + the forward values live there fit the budget;
4. while backward op j runs (every one, or on large graphs a selection of ``MEMORY_ROWS``:
   dropping rows only loosens the LP): resident bytes, user outputs, the tangents (held to the end), j's
   inputs and outputs and temporaries, the forward values held past j (``held``) and the
   backward values made before j and read after it (live, or recomputed at their group's
   cost: ``1 - redo``) fit the budget;
5. snapshots (B0 and a few dozen backward ops, the busiest among them): at instant j, each
   forward value backward reads after j is live at j or computed after j, and a value computed
   after j needs each op input live at j or itself computed after j (followed ``_DEPTH`` ops
   back; older sources count as free, which only loosens). What is live at j fits the budget.
   This charges a recomputed value's sources while they wait, which rules 2-4 do not.
6. second runs (at the same backward snapshots): a value backward read at or before j that
   was not live at B0 was computed in backward before j, and so was each of its op inputs
   that was not live at B0 (and theirs, as far as rule 5 follows them). Such a value that is
   also computed after j (rule 5's choice instead of holding it across j) ran twice in
   backward: ``twice[g]`` pays its group's cost once more. On a chain this is the choice
   between holding a recomputed segment's early values and recomputing them again, which
   rules 1-5 price as free (``again`` counts one backward run however many there are).
Cost: every op of the (pruned) graph runs at least once, plus ``again[g] * cost[g]`` for each
group forward must run (ancestors of forward outputs and run-once ops), plus ``redo``. Rule 2
is what makes the bound useful on transformers: dropping a softmax output costs the whole
recompute chain back to a value that is kept, not just the softmax.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass

from solvers.highs_lp import LinearProgram, LpStatus
from solvers.ir.graph import Phase, RematGraph, prune_dead


@dataclass(frozen=True)
class BoundResult:
    bound: float
    """Lower bound on the total cost of any schedule within the budget (inf: none fits)."""
    base_cost: float
    """Cost of running every needed op once: the bound without the LP."""
    unavoidable_peak: int
    """Bytes live in every schedule at the tightest backward op, whatever is kept."""
    proven_infeasible: bool
    message: str = ""
    keep_fraction: tuple[tuple[str, float], ...] = ()
    """The LP's ``held`` (values backward reads) or ``live`` (others) per forward value: how
    much the relaxation wants it kept for backward, a guide for rounding to a schedule."""


def _forward_needed(graph: RematGraph) -> set[str]:
    """Forward groups every schedule runs in forward: ancestors of forward outputs and run-once
    ops (and those ops)."""
    stack = [n for n in (*graph.forward_outputs, *(o.name for o in graph.ops if o.compute_once
                                                    and o.phase is Phase.FORWARD)) if graph[n].is_op]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        node = graph[name]
        if node.group in seen or not node.is_op or node.phase is not Phase.FORWARD:
            continue
        seen.add(node.group)
        stack.extend(i for i in node.inputs if graph[i].is_op)
    return seen


def base_cost_bound(graph: RematGraph, why: str) -> BoundResult:
    """The bound without the LP: every needed op runs at least once (valid for every budget;
    proves nothing infeasible). For when there is no time left to build the LP."""
    base = float(sum(n.cost for n in prune_dead(graph).ops))
    return BoundResult(bound=base, base_cost=base, unavoidable_peak=0, proven_infeasible=False,
                       message=f"base cost only: {why}")


def lower_bound(graph: RematGraph, budget_bytes: int, time_limit_s: float = 30.0,
                snapshots: int = 32, primal_simplex: bool = False,
                deadline: float = math.inf, second_runs: bool = True) -> BoundResult:
    """The LP bound of the module docstring (see there for why each constraint is valid).

    ``primal_simplex``: solve the LP with the primal simplex (same optimum; faster on long
    chains, see `solvers.hierarchical.LONG_CHAIN_SNAPSHOTS`). ``deadline`` (a
    `time.perf_counter()` instant): when the bound must be known, the LP's build included. A
    10,000-step loop's LP has 12-13 million coefficients: building it took over a minute, and
    HiGHS took 35 s to set it up before its time limit could act. So the build stops at the
    deadline, an LP the time left cannot set up (`LP_SETUP_RATE`) is not started, both with
    the base cost, and the solve gets what is left. ``second_runs``: rule 6's rows (they
    tighten only with many snapshots: measured on a 1,000-step loop with 4 snapshots they cost
    a third more time and moved nothing)."""
    def late(where: str, nonzeros: int = 0) -> BoundResult | None:
        """The base-cost bound once the deadline has passed, or when the time left cannot set
        up ``nonzeros`` coefficients (HiGHS honours its limit only after that)."""
        left = deadline - time.perf_counter()
        if left <= 0:
            return base_cost_bound(graph, f"no time left to build the LP ({where})")
        if nonzeros / LP_SETUP_RATE > left:
            return base_cost_bound(graph, f"{left:.0f} s left, too little to set up the LP's "
                                          f"{nonzeros:,} coefficients ({where})")
        return None
    graph = prune_dead(graph)
    base = float(sum(n.cost for n in graph.ops))
    reads = _BackwardReads.of(graph)
    lp = LinearProgram()
    forward = _add_forward_rows(lp, graph, reads, budget_bytes)
    sweep = _sweep_backward(lp, graph, reads)
    # Bytes live in every schedule: a backward value read across j may be recomputed instead.
    worst = max((fixed + int(sum(redo.values()))
                 for fixed, redo in zip(sweep.fixed_at, sweep.redo_terms)), default=0)
    if worst > budget_bytes:
        return BoundResult(math.inf, base, worst, True,
                           f"at least {worst} bytes are live in every schedule")
    if (stop := late("memory rows")) is not None:
        return stop
    if (stop := _add_memory_rows(lp, graph, reads, forward, sweep, budget_bytes, late)) is not None:
        return stop
    twice: dict[str, int] = {}
    for j in _snapshot_points(sweep.fixed_at, snapshots):
        if (stop := late("snapshots")) is not None:
            return stop
        _add_snapshot(lp, graph, j, reads, forward, twice if second_runs else None, budget_bytes,
                      sweep.fixed_at, sweep.redo_terms, graph.resident_bytes + reads.tangent_bytes)
    if (stop := late("before the solve", lp.nonzeros)) is not None:
        return stop
    solution = lp.solve(min(time_limit_s, deadline - time.perf_counter()),
                        primal_simplex=primal_simplex)
    if solution.status is LpStatus.INFEASIBLE:
        return BoundResult(math.inf, base, worst, True, "the bound's LP is infeasible")
    if solution.status is not LpStatus.OPTIMAL or solution.objective is None:
        return BoundResult(base, base, worst, False, f"bound LP: {solution.status.value}; base cost only")
    extra = max(0.0, solution.objective) * (1 - 1e-9)
    values = solution.values
    fractions = tuple((v, float(values[forward.held[v]] if v in forward.held else values[k]))
                      for v, k in forward.live.items())
    return BoundResult(base + extra, base, worst, False, "LP bound", fractions)


@dataclass(frozen=True)
class _BackwardReads:
    """Who reads what in backward: the backward op groups in order, the last backward group that
    reads each value (``len(backward_groups)`` for a backward output, live at the end), the user
    outputs and the tangents' bytes (all arrive when backward starts)."""

    backward_groups: list
    last_read: dict[str, int]
    first_read: dict[str, int]
    users: set[str]
    tangent_bytes: int

    @classmethod
    def of(cls, graph: RematGraph) -> _BackwardReads:
        backward_groups = [ms for ms in graph.groups.values() if graph[ms[0]].phase is Phase.BACKWARD]
        last_read: dict[str, int] = {}
        first_read: dict[str, int] = {}
        for j, ms in enumerate(backward_groups):
            for inp in graph[ms[0]].inputs:
                last_read[inp] = j
                first_read.setdefault(inp, j)
        for name in graph.backward_outputs:
            last_read[name] = len(backward_groups)  # must be live when backward ends
        return cls(backward_groups, last_read, first_read, set(graph.user_outputs),
                   sum(graph[t].bytes for t in graph.tangents))


@dataclass(frozen=True)
class _ForwardVars:
    """The LP's forward variables: ``live`` (kept at the boundary), ``again`` (a forward group
    recomputed in backward, priced at its cost when backward needs it) and ``held`` (a value
    backward reads, held or recomputed)."""

    live: dict[str, int]
    again: dict[str, int]
    held: dict[str, int]


def _add_forward_rows(lp: LinearProgram, graph: RematGraph, reads: _BackwardReads,
                      budget_bytes: int) -> _ForwardVars:
    """Rules 1, 1' and 2 and the boundary's memory row (see the module docstring)."""
    fwd_needed = _forward_needed(graph)
    forward = [n for n in graph.ops if n.phase is Phase.FORWARD]
    users = reads.users
    live = {v.name: lp.add_var(0.0, 1.0 if v.name in graph.forward_outputs else 0.0, 1.0)
            for v in forward}
    again: dict[str, int] = {}
    for ms in graph.groups.values():
        first = graph[ms[0]]
        if first.phase is Phase.FORWARD:
            cost = sum(graph[m].cost for m in ms) if first.group in fwd_needed else 0.0
            again[first.group] = lp.add_var(cost, 0.0, 0.0 if first.compute_once else 1.0)
    held = {}
    for v in forward:
        if v.name in reads.last_read and v.name not in users:
            held[v.name] = lp.add_var(0.0, 0.0, 1.0)
            lp.add_row({held[v.name]: 1.0, live[v.name]: -1.0, again[v.group]: 1.0}, lower=0.0)
            lp.add_row({held[v.name]: 1.0, again[v.group]: 1.0}, lower=1.0)  # rule 1'
            lp.add_row({again[v.group]: 1.0, live[v.name]: 1.0}, lower=1.0)  # rule 1
    for g, ms in graph.groups.items():  # rule 2
        first = graph[ms[0]]
        if first.phase is not Phase.FORWARD or first.compute_once:
            continue
        for u in dict.fromkeys(first.inputs):
            node = graph[u]
            if node.is_op and node.phase is Phase.FORWARD and u not in users:
                lp.add_row({again[node.group]: 1.0, again[g]: -1.0, live[u]: 1.0}, lower=0.0)
    lp.add_row({live[v.name]: float(v.bytes) for v in forward},
               upper=budget_bytes - graph.resident_bytes - reads.tangent_bytes)
    return _ForwardVars(live, again, held)


@dataclass(frozen=True)
class _BackwardSweep:
    """Per backward group j: the bytes live in every schedule (``fixed_at``), the ``redo``
    terms of backward values made before j, read after it and recomputable (``redo_terms``),
    and what j reads (``held_terms``: its reads and fixed bytes)."""

    fixed_at: list[int]
    redo_terms: list[dict[int, float]]
    held_terms: list[tuple[set[str], int]]


def _sweep_backward(lp: LinearProgram, graph: RematGraph, reads: _BackwardReads) -> _BackwardSweep:
    """Backward values made before j and read after it, kept by a sweep over j (each value
    enters once and leaves at its last read): linear in the graph, not quadratic."""
    users, last_read, backward_groups = reads.users, reads.last_read, reads.backward_groups
    resident = graph.resident_bytes
    user_bytes = sum(graph[u].bytes for u in users if graph[u].is_op)
    redo: dict[str, int] = {}
    fixed_at: list[int] = []
    redo_terms: list[dict[int, float]] = []
    held_terms: list[tuple[set[str], int]] = []
    across: dict[str, int] = {}
    leaving: dict[int, list[str]] = {}
    for j, ms in enumerate(backward_groups):
        for b in leaving.pop(j, ()):
            across.pop(b, None)
        if j > 0:
            for b in backward_groups[j - 1]:
                if last_read.get(b, -1) > j:
                    across[b] = graph[b].bytes
                    leaving.setdefault(last_read[b], []).append(b)
        first = graph[ms[0]]
        read_here = set(first.inputs)
        fixed = resident + user_bytes
        fixed += sum(graph[t].bytes for t in graph.tangents)  # held by the caller to the end
        fixed += sum(graph[m].bytes for m in ms) + first.temp_bytes
        if first.reuses:  # it may write into an input it reads (solvers.ir.inplace): no new bytes
            fixed -= first.bytes
        fixed += sum(graph[i].bytes for i in read_here if graph[i].is_op and i not in users)
        row: dict[int, float] = {}
        for b, nbytes in across.items():
            if b not in read_here:
                group = graph[b].group
                if group not in redo:
                    redo[group] = lp.add_var(sum(graph[m].cost for m in graph.groups[group]), 0.0, 1.0)
                fixed += nbytes
                row[redo[group]] = row.get(redo[group], 0.0) - float(nbytes)
        fixed_at.append(fixed)
        redo_terms.append(row)
        held_terms.append((read_here, fixed))
    return _BackwardSweep(fixed_at, redo_terms, held_terms)


def _add_memory_rows(lp: LinearProgram, graph: RematGraph, reads: _BackwardReads, forward: _ForwardVars,
                     sweep: _BackwardSweep, budget_bytes: int, late) -> BoundResult | None:
    """Rule 4's rows: every backward op on graphs of up to MEMORY_ROWS of them; on larger ones
    the busiest half and evenly spaced others (fewer rows only loosen the LP: still a bound).
    The held values read after j are a prefix of them by last read (latest first): sliced,
    not filtered one by one (800 rows x 25,000 held values on a 10,000-step loop). Returns the
    base-cost bound when the deadline passes (``late``), else None."""
    held, last_read = forward.held, reads.last_read
    by_last = sorted(held, key=lambda v: -last_read[v])
    neg_last = [-last_read[v] for v in by_last]
    held_terms_by_last = [(held[v], float(graph[v].bytes)) for v in by_last]
    memory_rows = _memory_rows(sweep.fixed_at)
    if (stop := late("memory rows", lp.nonzeros + sum(
            bisect.bisect_left(neg_last, -j) for j in memory_rows))) is not None:
        return stop
    for j in memory_rows:
        if (stop := late("memory rows")) is not None:
            return stop
        read_here, fixed = sweep.held_terms[j]
        row = dict(sweep.redo_terms[j])
        row.update(held_terms_by_last[:bisect.bisect_left(neg_last, -j)])
        for v in read_here:
            if v in held and last_read[v] > j:
                del row[held[v]]
        lp.add_row(row, upper=budget_bytes - fixed)
    return None


LP_SETUP_RATE = 4e5
"""Coefficients per second that handing the LP to HiGHS and its presolve take before its time
limit can stop it (measured with a 0.1 s limit, 2 shared cores: 1.1-1.2 million in 2.3-2.4 s,
3.9 million in 6.6 s, 13.3 million, a 10,000-step loop's, in 35 s). With a deadline, an LP
that cannot be set up in the time left is not started: the bound is the base cost."""
_DEPTH = 4
"""Snapshot systems follow recomputation this many ops back; older sources count as free."""
MEMORY_ROWS = 800
"""Most backward ops that get their own memory row (rule 4); past it, a selection."""


def _memory_rows(fixed_at: list[int]) -> list[int]:
    """Backward ops whose memory row the LP gets: all of them up to ``MEMORY_ROWS``, else the
    busiest half of that many and evenly spaced others."""
    n = len(fixed_at)
    if n <= MEMORY_ROWS:
        return list(range(n))
    busiest = sorted(range(n), key=lambda j: -fixed_at[j])[: MEMORY_ROWS // 2]
    spaced = [round(i * (n - 1) / (MEMORY_ROWS // 2 - 1)) for i in range(MEMORY_ROWS // 2)]
    return sorted({*busiest, *spaced})


def _snapshot_points(fixed_at: list[int], count: int) -> list[int]:
    """B0 (-1), the backward ops with the most unavoidable bytes, and evenly spaced others."""
    if count <= 0 or not fixed_at:
        return []
    busiest = sorted(range(len(fixed_at)), key=lambda j: -fixed_at[j])[: count // 4]
    spaced = [round(i * (len(fixed_at) - 1) / max(1, count - len(busiest) - 2))
              for i in range(count - len(busiest) - 1)]
    return sorted({-1, *busiest, *spaced})


def _add_snapshot(lp: LinearProgram, graph: RematGraph, j: int, reads_of: _BackwardReads,
                  forward: _ForwardVars, twice: dict[str, int] | None, budget_bytes: int,
                  fixed_at: list[int], redo_terms, b0_fixed: int) -> None:
    """Rule 5 of the module docstring at instant j (-1: B0), and rule 6 unless ``twice`` is
    None. ``live_j`` costs bytes at j; ``later_j`` (computed after j) implies ``again``."""
    backward_groups, last_read, users = reads_of.backward_groups, reads_of.last_read, reads_of.users
    again, held = forward.again, forward.held
    if j < 0:
        reads = set(graph.forward_outputs)
        fixed, row = b0_fixed + sum(graph[v].bytes for v in reads if graph[v].is_op), {}
    else:
        reads = set(graph[backward_groups[j][0]].inputs)
        fixed, row = fixed_at[j], dict(redo_terms[j])
    needed = [v for v, last in last_read.items() if last > j and v not in reads and v not in users
              and graph[v].is_op and graph[v].phase is Phase.FORWARD]
    live_j: dict[str, int] = {}
    later_j: dict[str, int] = {}
    frontier = list(needed)
    for depth in range(_DEPTH + 1):
        next_frontier = []
        for v in frontier:
            if v in live_j:
                continue
            node = graph[v]
            live_j[v] = lp.add_var(0.0, 0.0, 1.0)
            later_j[v] = lp.add_var(0.0, 0.0, 0.0 if node.compute_once else 1.0)
            row[live_j[v]] = float(node.bytes)
            if not node.compute_once:
                lp.add_row({again[node.group]: 1.0, later_j[v]: -1.0}, lower=0.0)
            if depth < _DEPTH:
                next_frontier.extend(
                    u for u in dict.fromkeys(node.inputs)
                    if graph[u].is_op and graph[u].phase is Phase.FORWARD
                    and u not in reads and u not in users)
        frontier = next_frontier
    for v in needed:
        lp.add_row({live_j[v]: 1.0, later_j[v]: 1.0}, lower=1.0)
        if v in held:
            lp.add_row({live_j[v]: 1.0, held[v]: -1.0}, lower=0.0)
    for v in live_j:
        for u in dict.fromkeys(graph[v].inputs):
            if u in live_j:
                lp.add_row({live_j[u]: 1.0, later_j[u]: 1.0, later_j[v]: -1.0}, lower=0.0)
    lp.add_row(row, upper=budget_bytes - fixed)
    if j >= 0 and twice is not None:
        _add_second_runs(lp, graph, j, reads_of, forward, twice, live_j, later_j)


def _add_second_runs(lp: LinearProgram, graph: RematGraph, j: int, reads_of: _BackwardReads,
                     forward: _ForwardVars, twice: dict[str, int], live_j: dict[str, int],
                     later_j: dict[str, int]) -> None:
    """Rule 6 at backward op j. ``before[u]``: u was computed in backward before j runs; each
    value backward reads at or before j is live at B0 or ``before``, and so is each op input
    (within ``live_j``) of a ``before`` value; ``before`` and ``later_j`` together imply
    ``twice`` for u's group, one variable per group shared by every snapshot."""
    live, first_read = forward.live, reads_of.first_read
    before: dict[str, int] = {}

    def before_var(u: str) -> int:
        if u not in before:
            before[u] = lp.add_var(0.0, 0.0, 1.0)
        return before[u]

    for w, first in first_read.items():  # not live at B0: made in backward before its first read
        if first <= j and w in live:
            lp.add_row({before_var(w): 1.0, live[w]: 1.0}, lower=1.0)
    stack = list(before)
    while stack:  # x made in backward before j: each op input u was live then (at B0, or made)
        x = stack.pop()
        for u in dict.fromkeys(graph[x].inputs):
            if u in live_j and u in live:
                fresh = u not in before
                lp.add_row({before_var(u): 1.0, live[u]: 1.0, before[x]: -1.0}, lower=0.0)
                if fresh:
                    stack.append(u)
    for u, b in before.items():
        if u in later_j and not graph[u].compute_once:
            group = graph[u].group
            if group not in twice:
                twice[group] = lp.add_var(sum(graph[m].cost for m in graph.groups[group]), 0.0, 1.0)
            lp.add_row({twice[group]: 1.0, b: -1.0, later_j[u]: -1.0}, lower=-1.0)
