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

`solve_revolve` applies it to a chain graph (every stage between articulation values is a
single op, `solvers.linearize`): step i computes the i-th value, its reversal runs the
stage's backward ops. Two facts of this IR that Griewank's model lacks are used: a backward
op reads its step's output, so a reversal may reuse the output the previous reversal started
from instead of re-evaluating it; and the first reversals carry only the small gradient of
the loss, so the last few states can be kept from the forward pass at no cost in peak. For
each number of such kept states, each slot count and both mappings the schedule is
simulated, and the cheapest that fits is returned. On uniform chains this matches the
exhaustive optimum at every budget tried (tests/test_revolve.py).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from optimizer.ir.graph import Phase, RematGraph
from optimizer.ir.schedule import Schedule
from optimizer.ir.simulator import SimulationResult, simulate
from solvers.base import SolveResult, SolverOptions, SolveStatus
from solvers.baselines import forward_closure
from solvers.chain_model import ChainModel, chain_model
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
def _table(steps: int, slots: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """E[l] (fewest evaluations reversing l steps with ``slots`` slots) and best splits."""
    if slots == 0:
        return (_INF, 1.0) + (_INF,) * (steps - 1), (0,) * (steps + 1)
    right, _ = _table(steps, slots - 1)
    cost = [_INF, 1.0] + [_INF] * (steps - 1)
    split = [0] * (steps + 1)
    for length in range(2, steps + 1):
        best, arg = _INF, 0
        for j in range(1, length):  # advance j steps, store x[j]
            c = j + right[length - j] + cost[j]
            if c < best:
                best, arg = c, j
        cost[length], split[length] = best, arg
    return tuple(cost), tuple(split)


def revolve_cost(steps: int, slots: int) -> float:
    """Fewest step evaluations reversing ``steps`` steps with ``slots`` slots (inf: impossible)."""
    if steps < 1:
        raise ValueError("need at least one step")
    return _table(steps, slots)[0][steps]


def revolve_schedule(steps: int, slots: int) -> RevolveSchedule:
    """The optimal reversal of ``steps`` uniform steps with ``slots`` slots (x[0] in one)."""
    if slots < 1:
        raise ValueError("revolve needs at least one slot (it holds the initial state)")
    total = revolve_cost(steps, slots)
    actions: list[Action] = []

    def reverse(s: int, e: int, c: int) -> None:
        """Reverse steps s+1..e; x[s] is current and stored (or is the working state if c == 0)."""
        while e - s > 1:
            j = _table(steps, c)[1][e - s] if c > 0 else 0
            actions.append(Action(Move.ADVANCE, s + j, s))
            if e - (s + j) > 1:
                actions.append(Action(Move.STORE, s + j))
            reverse(s + j, e, c - 1)
            if e - (s + j) > 1:
                actions.append(Action(Move.RELEASE, s + j))
            actions.append(Action(Move.RESTORE, s))
            e = s + j
        actions.append(Action(Move.ADVANCE, e, s))
        actions.append(Action(Move.REVERSE, e))

    reverse(0, steps, slots)
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
    """The chain model of ``graph``; ValueError unless its forward values form a line."""
    model = model or chain_model(graph)
    pinned = pinned_values(graph)
    n = model.n
    last = n if model.boundary[n] else n - 1
    for k in range(1, n + 1):
        droppable = [v for v in model.values[k] if v not in pinned]
        if k <= last and {graph[v].group for v in droppable} != {graph[model.boundary[k]].group}:
            raise ValueError(f"revolve needs a chain graph: stage {k} (up to "
                             f"{model.boundary[k]!r}) is not a single op")
        if k > last and droppable:
            raise ValueError("revolve needs a chain graph: values after the last articulation "
                             "value can be dropped")
        if not set(model.tape[k]) <= {model.boundary[k]}:
            raise ValueError(f"revolve needs a chain graph: the backward of stage {k} reads "
                             "values other than its input and output")
    if last < 1:
        raise ValueError("revolve needs a chain graph: no articulation values")
    return model


def revolve_backward(
    graph: RematGraph, model: ChainModel, schedule: RevolveSchedule, reuse_output: bool,
    steps: int | None = None,
) -> list[str]:
    """Backward compute order of an abstract schedule on the first steps of a chain graph.

    The forward pass runs every op once; the abstract schedule's first sweep is that pass.
    The chain has ``steps`` steps (all its stages with a boundary); those past the
    schedule's are kept from the forward pass and reversed first, with the stages after the
    last step (the loss). Later advances recompute values from the current state. With
    ``reuse_output``, the state a reversal starts from stays live until the next reversal,
    which reads it as its step's output, so that reversal needs no re-evaluation.
    """
    steps = schedule.steps if steps is None else steps
    v = model.boundary
    always = pinned_values(graph) | resident_names(graph)
    stored: set[int] = {0}
    held: set[int] = set()
    current: int | None = 0
    tape_input: int | None = None
    in_sweep = True
    out: list[str] = []

    def available() -> set[str]:
        states = stored | held | {i for i in (current, tape_input) if i is not None}
        return always | {v[i] for i in states if i > 0}

    for act in schedule.actions:
        if act.move is Move.ADVANCE:
            youturn = act.index == act.start + 1
            reused = reuse_output and youturn and act.index in held
            if not in_sweep and not reused:
                out.extend(forward_closure(graph, [v[act.index]], available()))
            tape_input = act.start if youturn else None
            current = act.index
        elif act.move is Move.STORE:
            stored.add(act.index)
        elif act.move is Move.RESTORE:
            current, tape_input = act.index, None
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
            current, tape_input = None, None
    return out


@dataclass(frozen=True)
class _Candidate:
    slots: int
    reuse: bool
    kept_top: int
    schedule: Schedule
    sim: SimulationResult


def solve_revolve(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """Revolve on a chain graph with the slot count (and mapping) that fits at least cost."""
    start = time.perf_counter()
    model = chain_steps(graph)
    steps = model.n if model.boundary[model.n] else model.n - 1
    forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
    best: _Candidate | None = None
    smallest: SimulationResult | None = None
    for kept_top in range(0, steps):
        least_peak: int | None = None
        for slots in range(1, steps - kept_top + 1):
            abstract = revolve_schedule(steps - kept_top, slots)
            for reuse in (False, True):
                backward = revolve_backward(graph, model, abstract, reuse, steps)
                schedule = Schedule.from_computes(graph, forward, backward)
                sim = simulate(graph, schedule)
                if smallest is None or sim.peak_bytes < smallest.peak_bytes:
                    smallest = sim
                if least_peak is None or sim.peak_bytes < least_peak:
                    least_peak = sim.peak_bytes
                if sim.peak_bytes <= budget_bytes and (
                    best is None or (sim.total_cost, sim.peak_bytes) < (best.sim.total_cost,
                                                                        best.sim.peak_bytes)):
                    best = _Candidate(slots, reuse, kept_top, schedule, sim)
            if abstract.forward_steps == 2 * abstract.steps - 1:
                break  # every step once more at most: more slots cannot help
        # Keeping more of the top only holds more from the forward pass.
        if least_peak is not None and least_peak > budget_bytes:
            break
        if time.perf_counter() - start > options.time_limit_s:
            break
    elapsed = time.perf_counter() - start
    if best is None:
        peak = smallest.peak_bytes if smallest is not None else None
        return SolveResult("revolve", SolveStatus.INFEASIBLE, None, None, None, elapsed,
                           f"revolve peaks at {peak} bytes at best ({steps} steps)")
    mapping = "outputs reused" if best.reuse else "outputs re-evaluated"
    return SolveResult("revolve", SolveStatus.HEURISTIC, best.schedule, best.sim.total_cost, None,
                       elapsed, f"{best.slots} slots for {steps - best.kept_top} steps, "
                       f"the last {best.kept_top} kept from the forward pass ({mapping})")
