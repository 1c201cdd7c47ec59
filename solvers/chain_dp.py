"""Heterogeneous chain DP (rotor-style, Beaumont et al. 2019) over the stages of a chain model.

For a chain whose stages differ in cost and memory (`solvers.chain_model`), dynamic
programming finds the cheapest schedule of the family below, exactly for memory counted in
steps of ``q`` bytes (every size rounded up, the budget down, so a DP-feasible schedule
always fits). The family is rotor's, adapted to this IR, where a stage's backward may read
the stage's own output, and extended with one move the Checkmate MILP finds on chains:
dropping a checkpoint early and recomputing it later from the one before.

``solve(p, a, b, top)`` reverses stages a+1..b with the gradient of stage b ready; v[p] is
held by an ancestor (p <= a) and v[a] is live (dropped-able when a > p); ``top`` says whether
stage b's tape is live. Either b = a+1 (recompute the tape if needed, run B[b]) or pick
a < j < b and advance from v[a] to v[j], keeping v[j] (or v[j] and its tape, which then
stays), then either keep v[a]: reverse j+1..b anchored at a, then a+1..j; or drop v[a]
(a > p): reverse j+1..b anchored at p, recompute v[a] from v[p], then reverse a+1..j.
``spine(p, a)`` is the same for the forward pass, whose advances cost nothing extra,
crossing into backward at the last stage; both share one enumeration of these splits. The
objective is recomputation cost.

Memory per state is a vector over the free budget (numpy): O(n^4) vector operations for
n stages. The step q is the gcd of every byte count when that keeps the vectors short (the
DP is then exact), else a power of two. The schedule is always simulated; if the graph
breaks the chain model (a backward op reading far-away values), the DP budget is lowered by
the excess and solved again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce

import numpy as np

from solvers.base import SolveResult, SolverOptions, SolveStatus
from solvers.baselines import forward_closure, store_all_schedule
from solvers.chain_model import ChainModel, chain_model
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate
from solvers.segments import pinned_values, resident_names

_WORK = 4e8
"""Vector elements the DP may touch: with n stages, at most _WORK / n^4 memory levels."""
_MIN_LEVELS, _MAX_LEVELS = 64, 4096
_RETRIES = 6
_HEADROOM = 1.25
"""The DP table reaches this multiple of the budget, for models that overestimate."""
_INF = math.inf

# Choice codes stored per memory level; splits are 8 * j + 4 * keep_tape + 2 * top + drop.
_BASE = -1
_THROUGH = -2  # spine: run forward to the end keeping nothing new, then solve(p, a, n)
_LAST = -3  # spine at a = n-1: run the last stage keeping its tape

_State = tuple[int, int, int, bool]


@dataclass
class _Tables:
    """DP values and choices, vectors over free memory: solve[(p, a, b, top)], spine[(p, a)]."""

    solve: dict[_State, np.ndarray] = field(default_factory=dict)
    solve_choice: dict[_State, np.ndarray] = field(default_factory=dict)
    spine: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    spine_choice: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class ChainPlan:
    """A chain DP answer: expected extra cost, memory step, and the backward compute order."""

    extra_cost: float
    step_bytes: int
    backward: tuple[str, ...]


def memory_step(model: ChainModel, budget_bytes: int) -> int:
    """The gcd of every byte count when the DP stays small enough, else a power of two."""
    sizes = [*model.x_bytes, *model.tape_bytes, *model.held_bytes, *model.sweep,
             *model.sweep_tape, *model.fixed_forward, *model.fixed_before, *model.backward_peak]
    sizes += [r.peak for r in (*model.advance, *model.advance_tape, *model.retape)]
    gcd = reduce(math.gcd, [s for s in sizes if s > 0], 0) or 1
    max_levels = int(min(_MAX_LEVELS, max(_MIN_LEVELS, _WORK / max(model.n, 1) ** 4)))
    if budget_bytes // gcd <= max_levels:
        return gcd
    return 1 << math.ceil(math.log2(budget_bytes / max_levels))


class _DP:
    """The DP of the module docstring over a chain model, memory in units of ``q`` bytes."""

    def __init__(self, model: ChainModel, q: int, budget_bytes: int) -> None:
        self.m = model
        self.q = q
        self.levels = max(budget_bytes // q, 0) + 1
        self.free = np.arange(self.levels)
        self.t = _Tables()
        self.x = [self.units(b) for b in model.x_bytes]
        self.tape = [self.units(b) for b in model.tape_bytes]
        self.held = [self.units(b) for b in model.held_bytes]

    def units(self, nbytes: float) -> int:
        return math.ceil(nbytes / self.q)

    def _at(self, values: np.ndarray, by: int) -> np.ndarray:
        """values[F + by] for every F (infeasible below 0, clipped at the top)."""
        if by == 0:
            return values
        out = np.full(self.levels, _INF)
        if by < 0:
            if -by < self.levels:
                out[-by:] = values[: self.levels + by]
            return out
        keep = max(self.levels - by, 0)
        out[:keep] = values[by:]
        out[keep:] = values[-1]
        return out

    def _hold(self, j: int, keep: bool) -> int:
        return self.held[j] if keep else self.x[j]

    def _options(self, j: int) -> tuple[tuple[bool, bool], ...]:
        """(keep the tape while advancing, the left part starts with it live) for v[j].

        When the tape is at most v[j] itself, the right part ends with v[j] live anyway
        (its last backward reads it), so the left part may start from it for free.
        """
        m = self.m
        if set(m.tape[j]) <= {m.boundary[j]}:
            return ((False, False), (False, True))
        return ((False, False), (True, True))

    def _advance_need(self, a: int, j: int, keep: bool, fixed: int | None) -> int:
        """Units an advance from v[a] to v[j] needs (the forward pass when ``fixed`` is None)."""
        m = self.m
        worst = 0
        for k in range(a + 1, j + 1):
            carry = m.x_bytes[k - 1] if k - 1 > a else 0
            tape = k == j and keep
            if fixed is None:
                step = m.sweep_tape[k] if tape else m.sweep[k]
                worst = max(worst, m.fixed_forward[k] + carry + step)
            else:
                step = (m.advance_tape[k] if tape else m.advance[k]).peak
                worst = max(worst, fixed + carry + step)
        return self.units(worst)

    def _advance_cost(self, a: int, j: int, keep: bool) -> float:
        m = self.m
        cost = sum(m.advance[k].cost for k in range(a + 1, j))
        return cost + (m.advance_tape[j] if keep else m.advance[j]).cost

    def _again(self, p: int, a: int, j: int, left_top: bool, left_shift: int) -> np.ndarray:
        """Recompute the dropped v[a] from v[p] after the right part, then reverse a+1..j."""
        total = self._at(self.t.solve[(p, a, j, left_top)], left_shift)
        total = total + self._advance_cost(p, a, False)
        # Before the recomputation v[a] is not held: F + x[a] + left_shift is free.
        need = self._advance_need(p, a, False, self.m.fixed_before[j])
        return np.where(self.free + self.x[a] + left_shift >= need, total, _INF)

    def _consider(self, best: np.ndarray, choice: np.ndarray, total: np.ndarray, need: int,
                  code: int) -> tuple[np.ndarray, np.ndarray]:
        total = np.where(self.free >= need, total, _INF)
        better = total < best
        return np.where(better, total, best), np.where(better, code, choice)

    def run(self) -> None:
        n = self.m.n
        # solve(p, a, b) reads states of a shorter span b - p, or of the same span with a
        # larger a - p: iterate spans upwards and offsets downwards.
        for span in range(1, n + 1):
            for offset in range(span - 1, -1, -1):
                for p in range(0, n - span + 1):
                    for top in (False, True):
                        self._solve(p, p + offset, p + span, top)
        for a in range(n - 1, -1, -1):
            for p in range(a, -1, -1):
                self._spine(p, a)

    def _solve(self, p: int, a: int, b: int, top: bool) -> None:
        m, t = self.m, self.t
        best = np.full(self.levels, _INF)
        choice = np.full(self.levels, _BASE, dtype=np.int32)
        if b == a + 1:
            need = self.units(m.backward_peak[b] - (m.tape_bytes[b] if top else 0))
            cost = 0.0
            if not top and m.tape[b]:
                need = max(need, self.units(m.fixed_before[b] + m.retape[b].peak))
                cost = m.retape[b].cost
            best = np.where(self.free >= need, cost, _INF)
        best, choice = self._splits(best, choice, p, a, b,
                                    lambda anchor, j: t.solve[(anchor, j, b, top)],
                                    m.fixed_before[b], self.tape[b] if top else 0, costed=True)
        t.solve[(p, a, b, top)] = best
        t.solve_choice[(p, a, b, top)] = choice

    def _spine(self, p: int, a: int) -> None:
        m, t, n = self.m, self.t, self.m.n
        need = self._advance_need(a, n, False, None)
        best = np.where(self.free >= need, t.solve[(p, a, n, False)], _INF)
        choice = np.full(self.levels, _THROUGH, dtype=np.int32)
        if a == n - 1:  # the last stage keeps its tape across the boundary
            need = max(self._advance_need(a, n, True, None),
                       self.units(m.fixed_before[n] + m.held_bytes[n]))
            total = self._at(t.solve[(p, a, n, True)], -self.tape[n])
            best, choice = self._consider(best, choice, total, need, _LAST)
        best, choice = self._splits(best, choice, p, a, n, lambda anchor, j: t.spine[(anchor, j)],
                                    None, 0, costed=False)
        t.spine[(p, a)] = best
        t.spine_choice[(p, a)] = choice

    def _splits(self, best: np.ndarray, choice: np.ndarray, p: int, a: int, b: int,
                right: Callable[[int, int], np.ndarray], fixed: int | None, top_units: int,
                costed: bool) -> tuple[np.ndarray, np.ndarray]:
        """Improve ``best``/``choice`` with every split a < j < b, shared by solve and spine.

        ``right(anchor, j)`` is the table of the part after v[j] (solve's j+1..b, or the rest
        of the spine); ``fixed`` and ``top_units`` are the bytes held beside the advance and
        the tape units live on top (None and 0 in the forward pass, whose advances are not
        recomputation: ``costed`` False).
        """
        t = self.t
        for j in range(a + 1, b):
            for keep, left_top in self._options(j):
                need = self._advance_need(a, j, keep, fixed)
                hold = self._hold(j, keep)
                left_shift = top_units - (self.tape[j] if left_top else 0)
                cost = self._advance_cost(a, j, keep) if costed else 0.0
                code = 8 * j + 4 * keep + 2 * left_top
                # A kept tape needs v[j] (or includes it): the right part may not drop it.
                total = (self._at(right(j if keep else a, j), -hold)
                         + self._at(t.solve[(p, a, j, left_top)], left_shift) + cost)
                best, choice = self._consider(best, choice, total, need, code)
                if a > p:  # drop v[a] once v[j] is computed; recompute it from v[p] later
                    total = (self._at(right(j if keep else p, j), self.x[a] - hold)
                             + self._again(p, a, j, left_top, left_shift) + cost)
                    best, choice = self._consider(best, choice, total, need, code + 1)
        return best, choice

    # ------------------------------------------------------------------ schedule
    def backward_order(self, graph: RematGraph, free: int) -> list[str]:
        """The backward compute order of the DP's choice at ``free`` units."""
        m = self.m
        pinned = pinned_values(graph)
        available = pinned | resident_names(graph)
        out: list[str] = []
        top_level = self.levels - 1

        def clip(f: int) -> int:
            return min(f, top_level)

        def advance(targets: list[str]) -> None:
            targets = [v for v in targets if v]
            out.extend(forward_closure(graph, targets, available))
            available.update(targets)

        def drop(*names: str) -> None:
            available.difference_update(set(names) - pinned)

        def split(code: int) -> tuple[int, bool, bool, bool]:
            return code // 8, bool(code & 4), bool(code & 2), bool(code & 1)

        def descend(code: int, p: int, a: int, f: int, top_units: int,
                    right: Callable[[int, int, int], None],
                    reach: Callable[[list[str]], None]) -> None:
            """Replay a split choice of solve or spine (the twin of ``_DP._splits``).

            ``right(anchor, j, f)`` replays the part after v[j]; ``reach`` makes v[j] (and a
            kept tape) available: computed in backward, already there in the forward pass.
            """
            j, keep, left_top, drop_a = split(code)
            hold = self._hold(j, keep)
            reach([m.boundary[j], *(m.tape[j] if keep else ())])
            if drop_a:
                drop(m.boundary[a])
                right(j if keep else p, j, clip(f + self.x[a] - hold))
            else:
                right(j if keep else a, j, f - hold)
            if left_top:
                available.add(m.boundary[j])
            else:
                drop(m.boundary[j], *m.tape[j])
            if drop_a:
                advance([m.boundary[a]])
            left_shift = top_units - (self.tape[j] if left_top else 0)
            solve(p, a, j, left_top, clip(f + left_shift))

        def solve(p: int, a: int, b: int, top: bool, f: int) -> None:
            code = int(self.t.solve_choice[(p, a, b, top)][f])
            if code == _BASE:
                if not top and m.tape[b]:
                    advance(list(m.tape[b]))
                for members in m.backward[b]:
                    out.extend(members)
                drop(m.boundary[b], *m.tape[b])
                return
            descend(code, p, a, f, self.tape[b] if top else 0,
                    lambda anchor, j, g: solve(anchor, j, b, top, g), advance)

        def spine(p: int, a: int, f: int) -> None:
            code = int(self.t.spine_choice[(p, a)][f])
            if code == _THROUGH:
                solve(p, a, m.n, False, f)
                return
            if code == _LAST:
                available.update(m.tape[m.n])
                solve(p, a, m.n, True, f - self.tape[m.n])
                return
            descend(code, p, a, f, 0, spine, lambda targets: available.update(v for v in targets if v))

        spine(0, 0, free)
        return out


def _plan_at(graph: RematGraph, dp: _DP, level: int) -> ChainPlan | None:
    extra = float(dp.t.spine[(0, 0)][level])
    if not math.isfinite(extra):
        return None
    return ChainPlan(extra, dp.q, tuple(dp.backward_order(graph, level)))


def smallest_budget(model: ChainModel, budget_bytes: int, levels: int = _MIN_LEVELS) -> int | None:
    """About the least budget the chain DP finds feasible, searched up to ``budget_bytes``."""
    q = max(1, math.ceil(budget_bytes / levels))
    dp = _DP(model, q, budget_bytes)
    dp.run()
    feasible = np.flatnonzero(np.isfinite(dp.t.spine[(0, 0)]))
    return int(feasible[0]) * q if feasible.size else None


def solve_chain_dp(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """Rotor-style DP over the chain of stages between the forward graph's articulation values."""
    start = time.perf_counter()
    store_all = store_all_schedule(graph)
    store_sim = simulate(graph, store_all)
    if store_sim.peak_bytes <= budget_bytes:  # nothing to recompute: optimal at any step
        return SolveResult("chain-dp", SolveStatus.HEURISTIC, store_all, store_sim.total_cost,
                           None, time.perf_counter() - start, "store-all fits the budget")
    model = chain_model(graph)
    forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
    step = memory_step(model, budget_bytes)
    # One table serves every budget tried below: the model's own (sound when the graph is a
    # clean chain), lower ones when the graph breaks the model, higher ones when the model
    # is conservative (pinned values held for recomputations that never happen).
    dp = _DP(model, step, int(budget_bytes * _HEADROOM))
    tried: dict[int, tuple[Schedule, SimulationResult] | None] = {}

    def attempt(level: int) -> tuple[Schedule, SimulationResult] | None:
        if level not in tried:
            plan = _plan_at(graph, dp, level)
            if plan is None:
                tried[level] = None
            else:
                schedule = Schedule.from_computes(graph, forward, plan.backward)
                tried[level] = (schedule, simulate(graph, schedule))
        return tried[level]

    def fits(level: int) -> bool:
        found = attempt(level)
        return found is not None and found[1].peak_bytes <= budget_bytes

    dp.run()
    level = budget_bytes // step
    feasible = np.flatnonzero(np.isfinite(dp.t.spine[(0, 0)]))
    if feasible.size and feasible[0] > level:  # the model may overestimate: try its least
        level = int(feasible[0])
    last_sim: SimulationResult | None = None
    for _ in range(_RETRIES):
        found = attempt(level)
        if found is None or fits(level):
            break
        last_sim = found[1]
        level -= max(math.ceil((found[1].peak_bytes - budget_bytes) / step), 1)
    if fits(level):
        low, high = level, dp.levels
        while high - low > 1 and time.perf_counter() - start < options.time_limit_s:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        schedule, sim = attempt(low)  # type: ignore[misc]
        return SolveResult(
            solver="chain-dp", status=SolveStatus.HEURISTIC, schedule=schedule,
            objective=sim.total_cost, bound=None, solve_time_s=time.perf_counter() - start,
            message=f"memory step {step} bytes; {model.n} stages; DP budget {low * step} bytes",
        )
    detail = f"memory step {step} bytes; {model.n} stages"
    if last_sim is not None:
        detail += f"; its schedule peaks at {last_sim.peak_bytes} bytes"
    least = smallest_budget(model, store_sim.peak_bytes)
    if least is not None:
        detail += f"; the chain model needs about {least} bytes"
    return SolveResult("chain-dp", SolveStatus.INFEASIBLE, None, None, None,
                       time.perf_counter() - start, detail)
