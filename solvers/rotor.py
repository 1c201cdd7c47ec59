"""Rotor (Beaumont et al. 2019): the heterogeneous-chain DP, vectorised for long chains.

The chain model (`solvers.chain_model`) gives each stage between two articulation values its
forward and backward costs and bytes: its output v[k], its tape (what its backward reads
besides v[k-1]), the transients of recomputing it. ``solve(a, b, top)`` reverses stages
a+1..b with v[a] held and the gradient of stage b ready (``top``: stage b's tape is live):
either b = a+1 (recompute the tape if it is not live, run B[b]), or advance from v[a] to some
v[j], a < j < b, keeping v[j] (and stage j's tape, rotor's "F_all", or not, "F_ck"), reverse
j+1..b with what is held then, and reverse a+1..j with all of it back. The forward pass is
the same recursion with free advances (``spine``). The objective is recomputation cost.

This is `solvers.chain_dp`'s family without its early-drop move (which makes that DP
O(stages^4)): O(stages^3 * levels) work, done as O(stages^2) numpy operations over every
split and memory level at once, with memory counted in units of ``q`` bytes (every size
rounded up, the budget down, so a DP-feasible schedule fits the model; the schedule is
simulated, and the DP budget lowered when the graph breaks the model). ``q`` is chosen by
`memory_step`.

Beyond rotor's two choices for what an advance keeps of stage j's tape (all or none), the DP
takes partial ones (`solvers.chain_model.TapeOptions`, ``TAPE_THRESHOLDS``): the tape values
that cost most to recompute per byte (a convolution's output, not its ReLU's), the rest
recomputed from them right before B[j]; ``top`` then says which option of stage b's tape is
live. The two original options are among them, so the DP's optimum can only improve; on a
generated 150-layer ResNet it costs 1.27 a step at 1.5x the floor where the whole-tape DP
costs 1.34 (`benchmarks/exact_scale.md`).

A chain too long for that work within the time limit (1,000 time steps: 1,004 stages x 251
levels) is solved over super-stages of consecutive stages (`solvers.chain_model.coarsen`),
as few per super-stage as the work limit and ``WORK_PER_SECOND`` allow: exact within the
coarser family (checkpoints only at super-stage boundaries), every schedule still simulated.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import reduce

import numpy as np

from solvers.base import SolveResult, SolverOptions, SolveStatus
from solvers.baselines import forward_closure, store_all_schedule
from solvers.chain_model import ChainModel, TapeOptions, chain_model, cost_thresholds, tape_options, whole_tape_options
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate
from solvers.linearize import linearize
from solvers.segments import pinned_values, resident_names

MAX_LEVELS = 256
CHUNK = 4e6
"""Most elements of one batched split array (rows of one span are processed in chunks)."""
WORK = 3e9
"""Element operations the DP may take: about stages^3 * levels * 2; more stages: refuse."""
_RETRIES = 6
_HEADROOM = 1.25
_INF = np.float64(np.inf)
_BASE, _THROUGH, _LAST = -1, -2, -3
"""Choice codes besides splits (4 * j + 2 * keep_tape + left part starts with the tape live)."""


def memory_step(model: ChainModel, budget_bytes: int, max_levels: int = MAX_LEVELS) -> int:
    """Bytes per memory unit (see the module docstring): the gcd of every byte count the DP
    reads if that is few enough levels (exact), else the gcd of the stages' own bytes (only
    the fixed bytes rounded), else the budget over ``max_levels``."""
    stage_bytes = [b for b in (*model.x_bytes, *model.tape_bytes, *model.held_bytes) if b > 0]
    every = stage_bytes + [b for b in (*model.sweep, *model.sweep_tape, *model.fixed_forward,
                                       *model.fixed_before, *model.backward_peak) if b > 0]
    every += [r.peak for r in (*model.advance, *model.advance_tape, *model.retape) if r.peak > 0]
    for sizes in (every, stage_bytes):
        gcd = reduce(math.gcd, sizes, 0)
        if gcd and budget_bytes // gcd <= max_levels:
            return gcd
    return max(1, math.ceil(budget_bytes / max_levels))


class RotorDP:
    """The DP of the module docstring; tables over (a, b) hold vectors over free units. ``top``
    (which of stage b's tape is live) ranges over the tape options
    (`solvers.chain_model.TapeOptions`; rotor's own: none or all of it)."""

    def __init__(self, model: ChainModel, q: int, budget_bytes: int,
                 options: TapeOptions | None = None) -> None:
        m = self.m = model
        o = self.o = options or whole_tape_options(model)
        n = self.n = model.n
        T = self.T = o.count
        self.q = q
        self.levels = max(budget_bytes // q, 0) + 1
        self.free = np.arange(self.levels)
        u = self.units
        self.x = np.array([u(b) for b in m.x_bytes])
        self.kept = np.array([[u(b) for b in row] for row in o.kept_bytes], dtype=np.int64)
        self.hold = np.array([[u(b) for b in row] for row in o.held_bytes], dtype=np.int64)
        adv = np.array([r.cost for r in m.advance])
        self.adv_prefix = np.concatenate([[0.0], np.cumsum(adv)])  # sum of advance[0..k-1]
        self.adv_cost = np.array([[r.cost for r in row] for row in o.advance])
        # Peak of stepping through stage k from v[k-1] (carrying v[k-1] unless it is v[a]),
        # per option (what of stage k's tape the step keeps).
        x = np.array(m.x_bytes, dtype=np.int64)
        self.carry = np.concatenate([[0], x[:-1]])
        self.step_bw = np.array([[r.peak for r in row] for row in o.advance], dtype=np.int64)
        self.step_fw = (np.array(m.fixed_forward, dtype=np.int64)[None, :]
                        + np.array(o.sweep, dtype=np.int64))
        L = self.levels
        # Tables padded on both sides of the levels (inf below 0, the top value above), so
        # that reading them at shifted levels is a single gather.
        self.P = np.full((T, n + 1, n + 1, 3 * L), _INF, dtype=np.float32)
        self.S = self.P[..., L:2 * L]
        self.choice = np.full((T, n + 1, n + 1, L), _BASE, dtype=np.int32)
        self.spine_P = np.full((n + 1, 3 * L), _INF, dtype=np.float32)
        self.spine = self.spine_P[:, L:2 * L]
        self.spine_choice = np.full((n + 1, self.levels), _THROUGH, dtype=np.int32)

    def units(self, nbytes: float) -> int:
        return math.ceil(nbytes / self.q)

    def _needs(self, a: np.ndarray, js: np.ndarray, fixed: np.ndarray, forward: bool) -> np.ndarray:
        """Units each advance from v[a] to v[j] needs at its worst, per tape option kept at
        v[j] (T, A, D), fixed bytes included; ``js`` is (A, D), a < j."""
        step = self.step_fw if forward else self.step_bw
        carry = np.where(js - 1 > a[:, None], self.carry[js], 0)
        through = step[0][js] + carry
        before = np.maximum.accumulate(through, axis=1)  # worst of stages a+1..j, shifted to
        before = np.concatenate([np.zeros((len(a), 1), np.int64), before[:, :-1]], axis=1)  # a+1..j-1
        need = np.maximum(before[None], step[:, js] + carry[None]) + fixed[None, :, None]
        return np.ceil(need / self.q)

    def _write(self, padded: np.ndarray, index: tuple, values: np.ndarray) -> None:
        """Store ``values`` (..., levels) into the padded rows ``padded[index]``."""
        L = self.levels
        padded[(*index, slice(L, 2 * L))] = values
        padded[(*index, slice(2 * L, 3 * L))] = values[..., -1:]

    def _gather(self, padded: np.ndarray, rows: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """``padded[rows][..., F + shift]`` for every level F (inf below 0, the top above):
        ``rows`` are flat row indices into ``padded`` viewed as (-1, 3 levels)."""
        L = self.levels
        idx = (rows * (3 * L) + L + np.clip(shift, -L, L))[..., None] + self.free
        return np.take(padded.reshape(-1), idx)

    def _row(self, top, a, b):
        return (top * (self.n + 1) + a) * (self.n + 1) + b

    def _splits(self, a: np.ndarray, span: int, rights: list[np.ndarray], top_units: list[np.ndarray],
                fixed: np.ndarray, forward: bool) -> list[tuple[np.ndarray, np.ndarray]]:
        """Best split a < j < a + span at every level, for each row a and each (padded table,
        rows) and top units given: ``table``'s row ``rows[row, j - a - 1]`` is the part after
        v[j] (solve's j+1..b, or the spine), ``top_units[t][row]`` the units of stage b's tape
        if it is live."""
        T = self.T
        js = a[:, None] + np.arange(1, span)[None, :]
        need = self._needs(a, js, fixed, forward)
        cost_between = self.adv_prefix[js] - self.adv_prefix[a + 1][:, None]  # stages a+1..j-1
        # Option t: advance to v[j] keeping option t of stage j's tape (held while the part
        # after v[j] is reversed), then reverse a+1..j starting with it live.
        hold = np.concatenate([self.hold[t][js] for t in range(T)], 1)
        need = np.concatenate(list(need), 1)
        if forward:
            cost = np.zeros(hold.shape)
        else:
            cost = np.concatenate([cost_between + self.adv_cost[t][js] for t in range(T)], 1)
        left_rows = np.concatenate([self._row(t, a[:, None], js) for t in range(T)], 1)
        left_tape = np.concatenate([self.kept[t][js] for t in range(T)], 1)
        valid = self.free >= need[..., None]
        codes = np.concatenate([T * js + t for t in range(T)], 1)
        results = []
        cost = cost.astype(np.float32)[..., None]
        for (table, right), units in zip(rights, top_units):
            total = (self._gather(table, np.concatenate([right] * T, 1), -hold)
                     + self._gather(self.P, left_rows, units[:, None] - left_tape) + cost)
            total = np.where(valid, total, _INF)
            arg = np.argmin(total, axis=1)  # (A, levels)
            value = np.take_along_axis(total, arg[:, None, :], axis=1)[:, 0, :]
            code = np.take_along_axis(codes, arg, axis=1)
            results.append((value, np.where(np.isfinite(value), code, _BASE)))
        return results

    def run(self, deadline: float = math.inf) -> bool:
        """Fill the tables; False when the deadline passed first."""
        m, n = self.m, self.n
        fixed_before = np.array(m.fixed_before, dtype=np.int64)
        T, o = self.T, self.o
        for b in range(1, n + 1):  # one stage: recompute what of the tape is not live, run B[b]
            for top in range(T):
                need = self.units(m.backward_peak[b] - o.kept_bytes[top][b])
                rest = o.rest[top][b]
                cost = 0.0
                if rest.order:
                    need = max(need, self.units(m.fixed_before[b] + rest.peak))
                    cost = rest.cost
                self._write(self.P, (top, b - 1, b), np.where(self.free >= need, cost, _INF))
        chunk = max(1, int(CHUNK // (T * max(n, 1) * self.levels)))
        for span in range(2, n + 1):
            starts = np.arange(0, n - span + 1)
            for lo in range(0, len(starts), chunk):
                a = starts[lo:lo + chunk]
                b = a + span
                js = a[:, None] + np.arange(1, span)[None, :]
                bs = np.broadcast_to(b[:, None], js.shape)
                rights = [(self.P, self._row(t, js, bs)) for t in range(T)]
                units = [self.kept[t][b] for t in range(T)]
                for top, (best, code) in enumerate(self._splits(a, span, rights, units,
                                                                fixed_before[b], False)):
                    self._write(self.P, (top, a, b), best)
                    self.choice[top, a, b] = code
            if time.perf_counter() > deadline:
                return False
        zero = np.zeros(1, np.int64)
        full = T - 1
        for a in range(n - 1, -1, -1):
            row = np.array([a])
            need = self._needs(row, np.arange(a + 1, n + 1)[None, :], zero, True)
            best = np.where(self.free >= need[0, 0, -1], self.S[0, a, n], _INF)
            choice = np.full(self.levels, _THROUGH, dtype=np.int32)
            if a == n - 1:  # the last stage keeps its tape across the boundary
                last = max(need[full, 0, -1], self.units(m.fixed_before[n] + o.held_bytes[full][n]))
                total = self._gather(self.P, np.array(self._row(full, a, n)), np.array(-self.kept[full][n]))
                total = np.where(self.free >= last, total, _INF)
                better = total < best
                best, choice = np.where(better, total, best), np.where(better, _LAST, choice)
            if n - a > 1:
                [(split, code)] = self._splits(row, n - a, [(self.spine_P, np.arange(a + 1, n)[None, :])],
                                               [zero], zero, True)
                better = split[0] < best
                best, choice = np.where(better, split[0], best), np.where(better, code[0], choice)
            self._write(self.spine_P, (a,), best)
            self.spine_choice[a] = choice
        return True

    # ------------------------------------------------------------------ schedule
    def backward_order(self, graph: RematGraph, free: int) -> list[str]:
        """The backward compute order of the DP's choice at ``free`` units."""
        m = self.m
        pinned = pinned_values(graph)
        available = pinned | resident_names(graph)
        out: list[str] = []
        top_level = self.levels - 1
        full = self.T - 1
        work: list = []

        def advance(targets) -> None:
            targets = [v for v in targets if v]
            out.extend(forward_closure(graph, targets, available))
            available.update(targets)

        def drop(*names: str) -> None:
            available.difference_update(set(names) - pinned)

        # An explicit stack of ("solve", a, b, top, f), ("spine", a, f) and callables.
        work.append(("spine", 0, free))
        while work:
            item = work.pop()
            if callable(item):
                item()
                continue
            if item[0] == "spine":
                _, a, f = item
                code = int(self.spine_choice[a, f])
                if code == _THROUGH:
                    work.append(("solve", a, m.n, 0, f))
                    continue
                if code == _LAST:
                    available.update(m.tape[m.n])
                    work.append(("solve", a, m.n, full, f - int(self.kept[full][m.n])))
                    continue
                b, top, top_units, forward = m.n, 0, 0, True
            else:
                _, a, b, top, f = item
                code = int(self.choice[top, a, b, f])
                if code == _BASE:
                    if top != full and m.tape[b]:  # what of the tape is not live
                        advance(m.tape[b])
                    for members in m.backward[b]:
                        out.extend(members)
                    drop(m.boundary[b], *m.tape[b])
                    continue
                top_units, forward = int(self.kept[top][b]), False
            j, option = divmod(code, self.T)
            hold = int(self.hold[option][j])
            targets = [m.boundary[j], *self.o.kept[option][j]]
            if forward:
                available.update(v for v in targets if v)
            else:
                advance(targets)
            right = ("spine", j, f - hold) if forward else ("solve", j, b, top, f - hold)
            shift = top_units - int(self.kept[option][j])
            left = ("solve", a, j, option, min(f + shift, top_level))

            def between(j=j, option=option) -> None:  # keep only what the left part starts with
                drop(*({m.boundary[j], *m.tape[j]} - set(self.o.kept[option][j])))

            work.extend([left, between, right])  # popped: right, between, left
        return out


TABLE_BYTES = 4e8
"""Most bytes of the DP's tables (two padded float32 tables over (a, b) and its choices)."""
WORK_PER_SECOND = 1.2e7
"""Element operations the DP does per second (measured: 104 stages x 101 levels, 2.3e8, in
11.5 s on the 2 shared cores at load 5, and slower at load 6-7): sizes the super-stages to
the time limit."""
DP_TIME_SHARE = 0.5
"""Share of the time left once the chain model is measured that the DP's table may take (the
rest: simulating its schedules). The model itself takes seconds on a 10,000-step loop, so the
DP is sized after it, not from the whole limit."""


TAPE_THRESHOLDS = 2
"""Partial-tape options between rotor's none and all (`solvers.chain_model.TapeOptions`): on
`benchmarks/cnn_graph.resnet_like` they keep the convolutions' outputs and recompute the
element-wise ops before each backward, which rotor's two options cannot (see
`benchmarks/exact_scale.md`). The DP's work grows with the square of the options' count."""


def dp_work(stages: int, levels: int, options: int = 2) -> float:
    """Element operations of the DP: stages^3 / 6 splits x levels x (top, kept) option pairs
    (at least rotor's original 6) x 2."""
    return stages ** 3 * levels * 2 * max(options * options, 6) / 6


def fits_work_limit(stages: int, levels: int, work: float = WORK, options: int = 2) -> bool:
    """Whether the DP over ``stages`` stages and ``levels`` memory levels is within its limits."""
    return (dp_work(stages, levels, options) <= work
            and (stages + 1) ** 2 * levels * 16 * max(options, 2) <= TABLE_BYTES)


def stages_per_unit(stages: int, levels: int, work: float, options: int = 2) -> int:
    """Fewest consecutive stages per super-stage that bring the DP within ``work``."""
    size = 1
    while size < stages and not fits_work_limit(math.ceil(stages / size), levels, work, options):
        size += 1
    return size


def solve_rotor(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """Rotor's DP over the chain of stages between the forward graph's articulation values;
    on a chain too long for the DP within its work limit and the time left,
    over super-stages of consecutive stages (`solvers.chain_model.coarsen`). The DP's schedule
    is simulated whatever the time; other memory levels only while one more simulation fits
    before the limit (seconds each on a 10,000-step loop)."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    store_all = store_all_schedule(graph)
    store_sim = simulate(graph, store_all)
    if store_sim.peak_bytes <= budget_bytes:
        return SolveResult("rotor", SolveStatus.HEURISTIC, store_all, store_sim.total_cost, None,
                           time.perf_counter() - start, "store-all fits the budget")
    best, run = _solve_once(graph, budget_bytes, start, deadline)
    if run is None or run.seconds > FIRST_RUN_SHARE * options.time_limit_s:
        return best
    stages = len(linearize(graph).stages)
    plans = [(FINER_LEVELS * MAX_LEVELS, run.size)] if run.rounded else []
    size = run.size
    while size > 1:
        size -= max(1, size // 3)
        plans.append((MAX_LEVELS, size))
    for levels_cap, size in plans:
        levels = run.levels * levels_cap // MAX_LEVELS
        ratio = dp_work(math.ceil(stages / size), levels) / dp_work(run.stages, run.levels)
        predicted = run.seconds - run.dp_seconds + run.dp_seconds * ratio
        if time.perf_counter() + predicted > start + FINER_SHARE * (deadline - start):
            continue
        other, _ = _solve_once(graph, budget_bytes, start, deadline, levels_cap, size)
        if other.objective is not None and (best.objective is None or other.objective < best.objective):
            best = other
    return best


FIRST_RUN_SHARE = 0.1
"""The finer runs (`FINER_LEVELS`) follow only a first run that took at most this share of the
time limit: a chain of tens of stages, not a long loop whose chain model alone takes seconds
(there the DP stays sized by `WORK_PER_SECOND`, measured under load)."""
FINER_SHARE = 0.6
FINER_LEVELS = 4
"""After the first DP (sized to the time limit), what else is tried, each while a run predicted
from the first one's (its DP's fill scaled by the work) ends within ``FINER_SHARE`` of the time
limit: this many times finer memory levels, then stages merged a third fewer at a time
(3 -> 2 -> 1); the cheapest schedule wins. Neither family contains the other (rounding,
super-stages' tapes): on `benchmarks/cnn_graph.resnet_like(150)` (18 s) at 1.5x its floor,
1,024 levels cost 1.267 a step against 256 levels' 1.289, and at 1.2x only single stages fit
(1.470). On the 1,000-step tanh loop (no partial options there) they cost up to 0.6 of the
limit for 0.03% (10% of store-all)."""


@dataclass(frozen=True)
class _Run:
    """What one DP run was sized to, and its seconds: to predict another's."""

    size: int
    stages: int
    levels: int
    seconds: float
    dp_seconds: float
    """Of ``seconds``, filling the DP's tables (the rest: measuring the chain, simulating)."""
    rounded: bool
    """Memory in ``budget / levels`` units (not a gcd of the byte counts: finer levels differ)."""


def _solve_once(graph: RematGraph, budget_bytes: int, start: float, deadline: float,
                max_levels: int = MAX_LEVELS, size: int | None = None
                ) -> tuple[SolveResult, _Run | None]:
    """Rotor's DP (with its tape options), by ``deadline``: stages merged ``size`` at a time
    (None: as the time left allows), memory in at most ``max_levels`` levels."""
    began_run = time.perf_counter()
    forced = size
    lin = linearize(graph)
    top_bytes = int(budget_bytes * _HEADROOM)

    def work_left(reserve: float = 0.0) -> float:
        """Element operations the DP may take: its share of the time left now, less ``reserve``
        seconds."""
        left = deadline - time.perf_counter() - reserve
        return min(WORK, WORK_PER_SECOND * DP_TIME_SHARE * max(left, 0.0))

    value_gcd = reduce(math.gcd, (n.bytes for n in graph.ops if n.bytes > 0), 0)
    guess = min(top_bytes // max(value_gcd, 1), max_levels) + 1
    thresholds = cost_thresholds(graph, TAPE_THRESHOLDS, frozenset(lin.articulation))
    T = len(thresholds) + 2
    size = forced or stages_per_unit(len(lin.stages), guess, work_left(), T)

    def measured(size: int) -> tuple[ChainModel, int, int]:
        model = chain_model(graph, size, lin)
        step = memory_step(model, top_bytes, max_levels)
        return model, step, top_bytes // step + 1

    began = time.perf_counter()
    model, step, levels = measured(size)
    took = time.perf_counter() - began
    if forced is not None and not fits_work_limit(model.n, levels, options=T):
        return SolveResult("rotor", SolveStatus.INFEASIBLE, None, None, None,
                           time.perf_counter() - start, "past the DP's work limit"), None
    # Measuring takes seconds on a long loop. When the DP no longer fits the time it left, or
    # the guess overstated the levels (a finer chain fits), measure once more, sized for the
    # time left after that measurement: re-sizing after every measurement chases the deadline.
    resized = stages_per_unit(len(lin.stages), levels, work_left(reserve=took), T)
    if forced is not None:
        pass
    elif resized < size or (resized > size and not fits_work_limit(model.n, levels, work_left(), T)):
        again = measured(resized)
        if resized > size or fits_work_limit(again[0].n, again[2], work_left(), T):
            size, (model, step, levels) = resized, again
    while not fits_work_limit(model.n, levels, options=T) and model.n > 2:  # more levels than guessed
        size = max(size + 1, stages_per_unit(len(lin.stages), levels, WORK, T))
        model, step, levels = measured(size)
    if not fits_work_limit(model.n, levels, options=T):
        raise ValueError(f"rotor: {model.n} stages x {levels} memory levels is past its work "
                         f"limit ({WORK:.0e} element operations)")
    dp = RotorDP(model, step, top_bytes, tape_options(graph, model, thresholds))

    def run_info() -> _Run:
        return _Run(size, model.n, levels, time.perf_counter() - began_run, filled - filling,
                    step == max(1, math.ceil(top_bytes / max_levels)))

    filling = time.perf_counter()
    if not dp.run(deadline):
        return SolveResult("rotor", SolveStatus.INFEASIBLE, None, None, None,
                           time.perf_counter() - start, "time limit reached while filling the DP"), None
    filled = time.perf_counter()
    forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
    tried: dict[int, tuple[Schedule, SimulationResult] | None] = {}
    durations: list[float] = []

    def affordable() -> bool:
        """The first simulation always; another only if one as long as the longest so far
        ends before the deadline."""
        return not durations or time.perf_counter() + max(durations) <= deadline

    def attempt(level: int) -> tuple[Schedule, SimulationResult] | None:
        if level not in tried:
            if level < 0 or not np.isfinite(dp.spine[0, level]):
                tried[level] = None
            else:
                began = time.perf_counter()
                schedule = Schedule.from_computes(graph, forward, dp.backward_order(graph, level))
                tried[level] = (schedule, simulate(graph, schedule))
                durations.append(time.perf_counter() - began)
        return tried[level]

    def fits(level: int) -> bool:
        found = attempt(level)
        return found is not None and found[1].peak_bytes <= budget_bytes

    level = min(budget_bytes // step, dp.levels - 1)
    feasible = np.flatnonzero(np.isfinite(dp.spine[0]))
    if feasible.size and feasible[0] > level:
        level = int(feasible[0])
    timed_out = False
    for tries in range(_RETRIES + 1):  # lower the DP's budget while its schedule breaks ours
        found = attempt(level)
        if found is None or found[1].peak_bytes <= budget_bytes or tries == _RETRIES:
            break
        if not affordable():
            timed_out = True
            break
        level -= max(math.ceil((found[1].peak_bytes - budget_bytes) / step), 1)
    if not fits(level):  # level was attempted: no new simulation here
        detail = f"memory step {step} bytes; {model.n} stages of {size}; no DP schedule fits"
        if timed_out:
            detail += " within the time limit"
        return SolveResult("rotor", SolveStatus.INFEASIBLE, None, None, None,
                           time.perf_counter() - start, detail), run_info()
    # Higher levels are worth simulating only up to the first one at the DP's least cost.
    costs = dp.spine[0, level:]
    low, high = level, level + int(np.argmax(costs <= costs.min())) + 1
    while high - low > 1 and affordable():
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    schedule, sim = attempt(low)  # type: ignore[misc]
    stages = f"{model.n} stages" + (f" of {size}" if size > 1 else "")
    return SolveResult("rotor", SolveStatus.HEURISTIC, schedule, sim.total_cost, None,
                       time.perf_counter() - start,
                       f"memory step {step} bytes; {stages}; DP budget {low * step} bytes"), run_info()
