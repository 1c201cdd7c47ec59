"""Griewank & Walther binomial checkpointing ("revolve", ACM TOMS Algorithm 799).

The abstract problem: reverse a chain of L uniform steps x[i-1] -> x[i] with c checkpoint
slots (the initial state x[0] occupies one). Reversing step i needs x[i-1] and a taped
evaluation of step i, so every reversal but the first re-evaluates its step. Reversing
steps s+1..e from a held x[s] either evaluates-and-reverses the single step, or advances j
steps, stores x[s+j] in a free slot, reverses the right part with one slot fewer, then the
left part with all slots back: the cheapest split is a DP over (steps, slots).

`revolve_schedule` builds that optimal schedule and counts its extra forward steps;
`max_steps(c, r)` is the longest chain reversible with c slots evaluating no step more than
r + 1 times, found by the same structural recursion (the first split of such a schedule
leaves a left part reversible with one repetition fewer and a right part with one slot
fewer); `binomial_schedule` builds such a schedule, `min_recomputations` is the general DP
over splits that confirms nothing longer exists, and `replay` checks a schedule and counts,
independently of all of them.

`solve_revolve` applies it to a chain graph: step k is stage k of `solvers.linearize` (the
forward values between two articulation values, however many ops: a residual cell, a block),
its evaluation recomputes every op of the stage from v[k-1], and its reversal recomputes the
stage's tape (what its backward reads) right before running the stage's backward ops. Two
facts of this IR that Griewank's model lacks are used: a backward op may read its step's
output, so a reversal may reuse the output the previous reversal started from instead of
re-evaluating it; and the first reversals carry only the small gradient of the loss, so the
last few states (with their tapes) can be kept from the forward pass. Short chains try every
number of such kept states and every slot count (on uniform chains this matches the
exhaustive optimum at every budget tried, tests/solvers/test_revolve.py); long ones (10^3-10^4
steps) search the slot count by interpolation for a few numbers of kept states. Every
candidate is simulated and the cheapest that fits is returned. The split of each
subproblem comes from the closed form of the DP (`_evaluations`), so building a schedule is
about linear in its length.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from solvers.base import SolveResult, SolverOptions, SolveStatus
from solvers.baselines import forward_closure, store_all_schedule
from solvers.chain_model import ChainModel, chain_model
from solvers.ir.graph import Phase, RematGraph
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import SimulationResult, simulate
from solvers.segments import pinned_values, resident_names

_INF = float("inf")


class Move(enum.Enum):
    ADVANCE = "advance"
    """Evaluate steps start+1..stop from the current state x[start]; x[stop] becomes current."""
    STORE = "store"
    """Copy the current state x[index] into a free slot."""
    RESTORE = "restore"
    """Make the stored x[index] the current state."""
    RELEASE = "release"
    """Free the slot holding x[index]."""
    REVERSE = "reverse"
    """Reverse step index, taped by the ADVANCE to x[index] just before."""


@dataclass(frozen=True)
class Action:
    move: Move
    index: int
    start: int = -1
    """First state of an ADVANCE (it evaluates steps start+1..index)."""


@dataclass(frozen=True)
class RevolveSchedule:
    """An abstract reversal schedule of ``steps`` steps with ``slots`` checkpoint slots."""

    steps: int
    slots: int
    actions: tuple[Action, ...]
    forward_steps: int
    """Step evaluations in all (the first forward pass included)."""

    @property
    def extra_forward_steps(self) -> int:
        return self.forward_steps - self.steps


@dataclass(frozen=True)
class Replay:
    """What running an abstract schedule did."""

    evaluations: tuple[int, ...]
    """Times each step 1..L was evaluated (index 0 unused)."""
    max_slots: int
    """Most states stored at once (x[0] included)."""

    @property
    def max_recomputations(self) -> int:
        return max(self.evaluations[1:], default=1) - 1


@lru_cache(maxsize=None)
def _binomials(slots: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """C(c + r, c) and C(c + r, c + 1) for r = 0, 1, ... until the first reaches ``steps``."""
    first, second = [1], [0]
    r = 0
    while first[-1] < steps:
        r += 1
        first.append(math.comb(slots + r, slots))
        second.append(math.comb(slots + r, slots + 1))
    return np.array(first, dtype=np.int64), np.array(second, dtype=np.int64)


def _evaluations(lengths: np.ndarray, slots: int) -> np.ndarray:
    """Fewest step evaluations reversing each of ``lengths`` steps with ``slots`` slots.

    The closed form of the DP over splits (Griewank 1992): with r the least repetition count
    for which C(c + r, c) >= l, reversing l steps takes (r + 1) l - C(c + r, c + 1)
    evaluations (tests/solvers/test_revolve.py checks it against the DP and exhaustive search).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if slots == 0:
        return np.where(lengths == 1, 1.0, _INF)
    first, second = _binomials(slots, int(lengths.max(initial=1)))
    r = np.searchsorted(first, lengths, side="left")
    return ((r + 1) * lengths - second[r]).astype(float)


def _split(length: int, slots: int) -> int:
    """The first optimal split: advance j steps and store x[j] (the smallest best j)."""
    if slots <= 1:
        return length - 1
    j = np.arange(1, length)
    total = j + _evaluations(length - j, slots - 1) + _evaluations(j, slots)
    return int(j[np.argmin(total)])


def revolve_cost(steps: int, slots: int) -> float:
    """Fewest step evaluations reversing ``steps`` steps with ``slots`` slots (inf: impossible)."""
    if steps < 1:
        raise ValueError("need at least one step")
    return float(_evaluations(np.array([steps]), slots)[0])


def revolve_schedule(steps: int, slots: int) -> RevolveSchedule:
    """The optimal reversal of ``steps`` uniform steps with ``slots`` slots (x[0] in one).

    Reversing steps s+1..e from x[s] (current and stored) with c slots advances to the best
    split s + j, stores it unless a single step is left, reverses s+j+1..e with one slot
    fewer, releases it, restores x[s] and goes on with s+1..s+j; one step is advanced
    (taped) and reversed. An explicit stack: chains reach 10^5 steps and slots 10^3.
    """
    if slots < 1:
        raise ValueError("revolve needs at least one slot (it holds the initial state)")
    total = revolve_cost(steps, slots)
    if not math.isfinite(total):
        raise ValueError(f"{steps} steps cannot be reversed with {slots} slots")
    actions: list[Action] = []
    work: list[tuple[int, int, int] | Action] = [(0, steps, slots)]
    while work:
        item = work.pop()
        if isinstance(item, Action):
            actions.append(item)
            continue
        s, e, c = item
        if e - s == 1:
            actions.append(Action(Move.ADVANCE, e, s))
            actions.append(Action(Move.REVERSE, e))
            continue
        j = _split(e - s, c)
        actions.append(Action(Move.ADVANCE, s + j, s))
        store = e - (s + j) > 1
        if store:
            actions.append(Action(Move.STORE, s + j))
        # Pushed in reverse: right part, release, restore x[s], left part.
        work.append((s, s + j, c))
        work.append(Action(Move.RESTORE, s))
        if store:
            work.append(Action(Move.RELEASE, s + j))
        work.append((s + j, e, c - 1))
    return RevolveSchedule(steps, slots, tuple(actions), int(total))


def replay(schedule: RevolveSchedule) -> Replay:
    """Run an abstract schedule; raise ValueError on any move its state does not allow."""
    counts = [0] * (schedule.steps + 2)
    stored: set[int] = {0}
    current = 0
    taped = -1
    next_reverse = schedule.steps
    max_slots = 1
    for act in schedule.actions:
        if act.move is Move.ADVANCE:
            if act.start != current or act.index <= current:
                raise ValueError(f"advance from x[{act.start}] while x[{current}] is current")
            counts[current + 1] += 1
            counts[act.index + 1] -= 1
            taped, current = act.index, act.index
        elif act.move is Move.STORE:
            if act.index != current:
                raise ValueError(f"store of x[{act.index}] while x[{current}] is current")
            stored.add(act.index)
            max_slots = max(max_slots, len(stored))
        elif act.move is Move.RESTORE:
            if act.index not in stored:
                raise ValueError(f"restore of x[{act.index}], which is not stored")
            current, taped = act.index, -1
        elif act.move is Move.RELEASE:
            stored.discard(act.index)
        elif act.move is Move.REVERSE:
            if act.index != next_reverse or taped != act.index:
                raise ValueError(f"reverse of step {act.index} out of order or untaped")
            next_reverse -= 1
            taped = -1
    if next_reverse != 0:
        raise ValueError(f"steps 1..{next_reverse} were never reversed")
    if max_slots > schedule.slots:
        raise ValueError(f"{max_slots} slots used, {schedule.slots} available")
    evaluations, running = [0], 0
    for i in range(1, schedule.steps + 1):
        running += counts[i]
        evaluations.append(running)
    return Replay(tuple(evaluations), max_slots)


@lru_cache(maxsize=None)
def max_steps(slots: int, recomputations: int) -> int:
    """Longest chain reversible with ``slots`` slots and at most ``recomputations`` per step.

    The first split of such a schedule advances over a left part (whose steps are then
    evaluated once more, so it has one repetition fewer left) and reverses the right part
    with one slot fewer; a single step needs neither. Built from that structure, not from
    the closed form.
    """
    if slots < 0 or recomputations < 0:
        raise ValueError("slots and recomputations must be non-negative")
    if slots == 0 or recomputations == 0:
        return 1
    return max_steps(slots, recomputations - 1) + max_steps(slots - 1, recomputations)


def min_recomputations(steps: int, slots: int) -> int:
    """Fewest recomputations of the most-recomputed step over all reversals (DP on splits).

    A split at j evaluates the left part's steps once more while advancing over them; the
    right part keeps its own count with one slot fewer. -1 when no schedule exists.
    """
    inf = np.iinfo(np.int64).max // 2
    previous = np.full(steps + 1, inf, dtype=np.int64)  # slots - 1; 0 slots: one step only
    previous[1] = 1
    for _ in range(slots):
        rep = np.full(steps + 1, inf, dtype=np.int64)
        rep[1] = 1
        for length in range(2, steps + 1):
            left = 1 + rep[1:length]  # j = 1..length-1
            right = previous[length - 1:0:-1]  # length - j
            rep[length] = np.maximum(left, right).min()
        previous = rep
    best = int(previous[steps])
    return -1 if best >= inf else best - 1


def binomial_schedule(slots: int, recomputations: int) -> RevolveSchedule:
    """A schedule reversing `max_steps(slots, recomputations)` steps with those limits."""
    steps = max_steps(slots, recomputations)
    actions: list[Action] = []
    forward = 0
    # Explicit stack instead of recursion: chains reach 10^5 steps.
    work: list[tuple[str, int, int, int, int]] = [("reverse", 0, steps, slots, recomputations)]
    while work:
        kind, s, e, c, r = work.pop()
        if kind == "restore":
            actions.append(Action(Move.RESTORE, s))
            continue
        if kind == "release":
            actions.append(Action(Move.RELEASE, s))
            continue
        if e - s == 1:
            actions.append(Action(Move.ADVANCE, e, s))
            actions.append(Action(Move.REVERSE, e))
            forward += 1
            continue
        j = min(max_steps(c, r - 1), e - s - 1)
        actions.append(Action(Move.ADVANCE, s + j, s))
        forward += j
        store = e - (s + j) > 1
        if store:
            actions.append(Action(Move.STORE, s + j))
        # Pushed in reverse: right part, release, restore x[s], left part.
        work.append(("reverse", s, s + j, c, r - 1))
        work.append(("restore", s, s, 0, 0))
        if store:
            work.append(("release", s + j, s + j, 0, 0))
        work.append(("reverse", s + j, e, c - 1, r))
    return RevolveSchedule(steps, slots, tuple(actions), forward)


# ---------------------------------------------------------------------------- on graphs
def chain_steps(graph: RematGraph, model: ChainModel | None = None) -> ChainModel:
    """The chain model of ``graph``; ValueError unless its stages can be revolve's steps.

    A stage may hold many ops (a residual cell, a transformer block): what counts is that
    stepping from v[k-1] recomputes every op of the stage, and that the stage's backward reads
    nothing but its input and values of its own stage (its *tape*, recomputed from v[k-1]
    right before it runs). Run-once ops (random without replay, mutating) and user outputs
    are pinned: kept from the forward pass, never recomputed.
    """
    model = model or chain_model(graph)
    pinned = pinned_values(graph)
    n = model.n
    last = n if model.boundary[n] else n - 1
    if last < 1:
        raise ValueError("revolve needs a chain graph: no articulation values")
    for k in range(1, n + 1):
        droppable = {v for v in model.values[k] if v not in pinned}
        if k > last and droppable:
            raise ValueError("revolve needs a chain graph: values after the last articulation "
                             "value can be dropped")
        if not set(model.tape[k]) <= droppable:
            raise ValueError(f"revolve needs a chain graph: the backward of stage {k} (up to "
                             f"{model.boundary[k]!r}) reads values of other stages")
    return model


def revolve_backward(
    graph: RematGraph, model: ChainModel, schedule: RevolveSchedule, reuse_output: bool,
    steps: int | None = None,
) -> list[str]:
    """Backward compute order of an abstract schedule on the first steps of a chain graph.

    The forward pass runs every op once; the abstract schedule's first sweep is that pass.
    The chain has ``steps`` steps (all its stages with a boundary); those past the
    schedule's are kept from the forward pass and reversed first, with the stages after the
    last step (the loss). Later advances recompute every op of the stages they cross from
    the current state; the advance that tapes step k (right before its reversal) recomputes
    only the stage's tape, which is all its backward reads. With ``reuse_output``, the state
    a reversal starts from stays live until the next reversal, which reads it as its step's
    output, so that reversal needs no re-evaluation of it.
    """
    steps = schedule.steps if steps is None else steps
    v = model.boundary
    always = pinned_values(graph) | resident_names(graph)
    stored: set[int] = {0}
    held: set[int] = set()
    current: int | None = 0
    in_sweep = True
    out: list[str] = []
    actions = schedule.actions

    index_of = {name: i for i, name in enumerate(v) if i > 0 and name}

    class Available:
        """What a recomputation may start from: ``always`` and the outputs of the states held
        (stored, held for reuse, current, ``extra``). A membership test, not a set: building
        one per advance was quadratic in the slots (seconds on a 10,000-step loop)."""

        def __init__(self, *extra: int) -> None:
            self.states = (current, *extra)

        def __contains__(self, name: object) -> bool:
            if name in always:
                return True
            i = index_of.get(name) if isinstance(name, str) else None
            return i is not None and (i in stored or i in held or i in self.states)

    def available(*extra: int) -> Available:
        return Available(*extra)

    for position, act in enumerate(actions):
        if act.move is Move.ADVANCE:
            following = actions[position + 1] if position + 1 < len(actions) else None
            taping = (following is not None and following.move is Move.REVERSE
                      and act.index == act.start + 1)
            if not in_sweep:
                if taping:  # the reversal reads the tape only, not the stage's output
                    targets = list(model.tape[act.index])
                else:
                    targets = [v[act.index]]
                out.extend(forward_closure(graph, targets, available(act.start)))
            current = act.index
        elif act.move is Move.STORE:
            stored.add(act.index)
        elif act.move is Move.RESTORE:
            current = act.index
        elif act.move is Move.RELEASE:
            stored.discard(act.index)
        elif act.move is Move.REVERSE:
            if in_sweep:
                in_sweep = False
                for k in range(model.n, schedule.steps, -1):
                    for members in model.backward[k]:
                        out.extend(members)
            for members in model.backward[act.index]:
                out.extend(members)
            held.discard(act.index)
            if reuse_output and act.index > 1:
                held.add(act.index - 1)
            current = None
    return out


@dataclass(frozen=True)
class _Candidate:
    slots: int
    reuse: bool
    kept_top: int
    schedule: Schedule
    sim: SimulationResult


EXHAUSTIVE_STEPS = 24
"""Chains of at most this many steps try every slot count and number of kept top steps; longer
ones search the slot count by bisection for a few numbers of kept top steps."""


class _Search:
    """Builds and simulates the schedule of each (kept top steps, slots, mapping) once."""

    def __init__(self, graph: RematGraph, model: ChainModel, steps: int, budget_bytes: int) -> None:
        self.graph, self.model, self.steps, self.budget = graph, model, steps, budget_bytes
        self.forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
        self.best: _Candidate | None = None
        self.smallest: SimulationResult | None = None
        # Reusing a reversal's starting state only helps where a backward reads its stage's output.
        self.mappings = (False, True) if any(
            model.boundary[k] in model.tape[k] for k in range(1, model.n + 1)) else (False,)
        self.simulations = 0
        self.durations: list[float] = []
        """Seconds of each `peak` call (its schedules built and simulated)."""

    def affordable(self, deadline: float) -> bool:
        """The first `peak` before ``deadline``; another only if one as long as the longest so
        far ends before it (each simulates whole schedules: seconds on a 10,000-step loop)."""
        if not self.durations:
            return time.perf_counter() < deadline
        return time.perf_counter() + max(self.durations) <= deadline

    def peak(self, kept_top: int, slots: int) -> int:
        """Least simulated peak over the mappings (recording the cheapest fitting candidate)."""
        began = time.perf_counter()
        abstract = revolve_schedule(self.steps - kept_top, slots)
        least: int | None = None
        for reuse in self.mappings:
            backward = revolve_backward(self.graph, self.model, abstract, reuse, self.steps)
            schedule = Schedule.from_computes(self.graph, self.forward, backward)
            sim = simulate(self.graph, schedule)
            self.simulations += 1
            if self.smallest is None or sim.peak_bytes < self.smallest.peak_bytes:
                self.smallest = sim
            least = sim.peak_bytes if least is None else min(least, sim.peak_bytes)
            if sim.peak_bytes <= self.budget and (
                    self.best is None or (sim.total_cost, sim.peak_bytes)
                    < (self.best.sim.total_cost, self.best.sim.peak_bytes)):
                self.best = _Candidate(slots, reuse, kept_top, schedule, sim)
        assert least is not None
        self.durations.append(time.perf_counter() - began)
        return least


def _exhaustive(search: _Search, deadline: float) -> None:
    steps = search.steps
    for kept_top in range(0, steps):
        least_peak: int | None = None
        for slots in range(1, steps - kept_top + 1):
            if not search.affordable(deadline):
                return
            peak = search.peak(kept_top, slots)
            least_peak = peak if least_peak is None else min(least_peak, peak)
            if revolve_cost(steps - kept_top, slots) == 2 * (steps - kept_top) - 1:
                break  # every step once more at most: more slots cannot help
        # Keeping more of the top only holds more from the forward pass.
        if least_peak is not None and least_peak > search.budget:
            break


def _kept_tops(steps: int) -> list[int]:
    """Numbers of top steps kept from the forward pass to try on a long chain: the first few,
    then tenths of the chain (with memory to spare, store-all over the top of the chain and
    revolve below it beats revolve over all of it)."""
    tops = [0, 1, 2] + [round(steps * f / 10) for f in range(1, 10)]
    return sorted({t for t in tops if 0 <= t < steps})


def _slot_search(search: _Search, kept_top: int, deadline: float, guess: int) -> int | None:
    """The most slots that fit with ``kept_top`` top steps kept (None: not even one).

    The peak grows about linearly with the slots (one more stored state each) and the cost
    falls: a secant search from ``guess`` inside a shrinking bracket (halving when a guess
    makes little progress) needs a handful of simulations. It starts from the guess, not from
    one slot, whose schedule is quadratic in the chain's length."""
    length = search.steps - kept_top
    # Past this many slots each step is evaluated twice at most: more cannot help.
    useful = next((c for c in range(1, length + 1) if revolve_cost(length, c) == 2 * length - 1),
                  length)
    peaks: dict[int, int] = {}
    low, high = 0, useful + 1  # low fits (0: none known to); high does not (or is past useful)
    slots = min(max(guess, 1), useful)
    previous: int | None = None
    halve = False
    while high - low > 1 and search.affordable(deadline):
        peaks[slots] = search.peak(kept_top, slots)
        width = high - low
        low, high = (slots, high) if peaks[slots] <= search.budget else (low, slots)
        if high - low <= 1:
            break
        if previous is not None and previous != slots and not halve:
            slope = (peaks[slots] - peaks[previous]) / (slots - previous)
        else:
            slope = 0.0
        if slope > 0:
            target = slots + (search.budget - peaks[slots]) / slope
            nxt = math.floor(target) if peaks[slots] > search.budget else math.ceil(target)
        elif low == 0:
            nxt = slots // 2
        else:
            nxt = (low + high) // 2 if high <= useful else 2 * low
        previous, slots = slots, min(max(nxt, low + 1), high - 1)
        halve = not halve and (high - low) * 2 > width  # little progress: halve next
        if halve:
            slots = (low + high) // 2 if high <= useful else min(2 * max(low, 1), high - 1)
    for extra in (high, high + 1):  # the peak is not strictly monotone: look a little further
        if low and extra <= useful and extra not in peaks and search.affordable(deadline):
            if search.peak(kept_top, extra) <= search.budget:
                low = extra
    return low or None


def _slot_guess(search: _Search) -> int:
    """Slots the budget holds by bytes: what store-all's peak keeps beyond fixed bytes, per step."""
    graph, model = search.graph, search.model
    fixed = graph.resident_bytes + graph.gradient_bytes + sum(graph[t].bytes for t in graph.tangents)
    state = max(1, sum(model.x_bytes) // max(1, model.n))
    return max(1, (search.budget - fixed) // state - 3)


def _bisect(search: _Search, deadline: float) -> None:
    """Long chains: the best slot count for a few numbers of top steps kept from the forward
    pass; each search is seeded by the previous one (a kept step holds about what a slot
    does, and its tape)."""
    previous: tuple[int, int] | None = None
    for kept_top in _kept_tops(search.steps):
        guess = _slot_guess(search)
        if previous is not None:
            guess = max(1, previous[1] - 2 * (kept_top - previous[0]))
        slots = _slot_search(search, kept_top, deadline, guess)
        if slots is None:
            break  # the leanest reversal does not fit: keeping more of the top cannot either
        previous = (kept_top, slots)
        if not search.affordable(deadline):
            break


def solve_revolve(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """Revolve on a chain graph with the slot count (and mapping) that fits at least cost."""
    start = time.perf_counter()
    model = chain_steps(graph)
    steps = model.n if model.boundary[model.n] else model.n - 1
    store_all = store_all_schedule(graph)
    store_sim = simulate(graph, store_all)
    if store_sim.peak_bytes <= budget_bytes:  # nothing to recompute: the least cost there is
        return SolveResult("revolve", SolveStatus.HEURISTIC, store_all, store_sim.total_cost, None,
                           time.perf_counter() - start, "store-all fits the budget")
    search = _Search(graph, model, steps, budget_bytes)
    deadline = start + options.time_limit_s
    if steps <= EXHAUSTIVE_STEPS:
        _exhaustive(search, deadline)
    else:
        _bisect(search, deadline)
    elapsed = time.perf_counter() - start
    best = search.best
    if best is None:
        peak = search.smallest.peak_bytes if search.smallest is not None else None
        peak = store_sim.peak_bytes if peak is None else min(peak, store_sim.peak_bytes)  # also offered
        return SolveResult("revolve", SolveStatus.INFEASIBLE, None, None, None, elapsed,
                           f"revolve peaks at {peak} bytes at best ({steps} steps)")
    mapping = "outputs reused" if best.reuse else "outputs re-evaluated"
    return SolveResult("revolve", SolveStatus.HEURISTIC, best.schedule, best.sim.total_cost, None,
                       elapsed, f"{best.slots} slots for {steps - best.kept_top} steps, "
                       f"the last {best.kept_top} kept from the forward pass ({mapping}; "
                       f"{search.simulations} schedules simulated)")
