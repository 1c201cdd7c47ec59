"""The schedule: an explicit, ordered list of compute and free steps in two phases.

The forward part runs when the module is called; whatever is live when it ends is what
forward saves for backward. The backward part starts when the output gradients arrive.
A value may be computed more than once (rematerialization), in either phase.

Solvers only decide *what is computed when*; `Schedule.from_computes` derives the frees the
way fx's generated code does (each value dropped right after its last read), so the
schedule the simulator checks is the one the rewritten module runs.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from optimizer.ir.graph import NodeKind, RematGraph


class StepKind(enum.Enum):
    COMPUTE = "compute"
    FREE = "free"


@dataclass(frozen=True)
class Step:
    kind: StepKind
    node: str

    def __str__(self) -> str:
        return f"{self.kind.value}({self.node})"


def compute(node: str) -> Step:
    return Step(StepKind.COMPUTE, node)


def free(node: str) -> Step:
    return Step(StepKind.FREE, node)


@dataclass(frozen=True)
class Schedule:
    """Ordered steps of one training step, split at the forward/backward boundary."""

    forward: tuple[Step, ...]
    backward: tuple[Step, ...]

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.forward + self.backward

    def computes(self, phase: str | None = None) -> tuple[str, ...]:
        """Names computed, in order (``phase`` None, 'forward' or 'backward')."""
        steps = {"forward": self.forward, "backward": self.backward, None: self.steps}[phase]
        return tuple(s.node for s in steps if s.kind is StepKind.COMPUTE)

    def compute_counts(self) -> Counter[str]:
        return Counter(self.computes())

    @classmethod
    def from_computes(
        cls, graph: RematGraph, forward: Sequence[str], backward: Sequence[str]
    ) -> "Schedule":
        """Build a schedule from compute orders, freeing each value after its last read.

        Siblings of a multi-output op are added where the op is computed (a solver may name
        any one of them). Computations nobody reads are dropped, except ops that must run
        exactly once (random, mutating), and the first forward run of a replayable random op
        (it draws from the generator), whose removal would change the program.
        """
        fwd = _expand_groups(graph, forward)
        bwd = _expand_groups(graph, backward)
        return _derive_frees(graph, fwd, bwd)


def _expand_groups(graph: RematGraph, names: Iterable[str]) -> list[str]:
    """Replace each mention of a group member by the whole group, once per run of mentions."""
    out: list[str] = []
    pending: set[str] = set()
    for name in names:
        if name in pending:
            pending.discard(name)
            continue
        members = graph.group_of(name)
        out.extend(members)
        pending = set(members) - {name}
    return out


def _group_runs(graph: RematGraph, names: list[str]) -> list[tuple[str, ...]]:
    runs: list[tuple[str, ...]] = []
    i = 0
    while i < len(names):
        members = graph.group_of(names[i])
        runs.append(tuple(names[i : i + len(members)]))
        i += len(members)
    return runs


def _derive_frees(graph: RematGraph, forward: list[str], backward: list[str]) -> Schedule:
    """Backward liveness over the compute runs: drop dead runs, free after last reads."""
    resident = {n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)}
    needed: set[str] = set(graph.user_outputs) | set(graph.backward_outputs)

    def walk(runs: list[tuple[str, ...]], first_runs: set[int], offset: int,
             drawing_runs: frozenset[int] = frozenset()) -> list[list]:
        # Returns per run: [run, frees_after_run]; processed in reverse. ``drawing_runs``: the
        # first forward run of each replayable random op, kept like a run-once op.
        kept: list[list] = []
        for index in reversed(range(len(runs))):
            run = runs[index]
            first = graph[run[0]]
            # A user output is held by the caller from its first computation to the end of the
            # step: a later run of its op makes a throwaway copy, never a new instance.
            members = [m for m in run if m not in pinned or index + offset in first_runs]
            live_later = [m for m in members if m in needed]
            if not live_later and not first.compute_once and index not in drawing_runs:
                continue  # nobody reads this computation
            frees_after = [m for m in members if m not in needed and m not in pinned]
            for m in members:
                needed.discard(m)
            for inp in dict.fromkeys(first.inputs):
                if inp not in needed and inp not in resident:
                    frees_after.append(inp)
                    needed.add(inp)
            kept.append([run, frees_after])
        kept.reverse()
        return kept

    pinned = set(graph.user_outputs)
    fwd_groups, bwd_groups = _group_runs(graph, forward), _group_runs(graph, backward)
    first_runs: set[int] = set()
    seen: set[str] = set()
    for index, run in enumerate(fwd_groups + bwd_groups):
        fresh = [m for m in run if m in pinned and m not in seen]
        if fresh:
            first_runs.add(index)
            seen.update(fresh)
    bwd_runs = walk(bwd_groups, first_runs, len(fwd_groups))
    # Tangents arrive at the start of backward; those never read are dropped there.
    boundary_frees = [t for t in graph.tangents if t not in needed]
    needed.difference_update(graph.tangents)
    # Forward outputs must be live when forward ends; dropped at the boundary if unread later.
    for name in graph.forward_outputs:
        if name not in needed and name not in resident:
            boundary_frees.append(name)
            needed.add(name)
    drawn: set[str] = set()
    drawing_runs = set()
    for index, run in enumerate(fwd_groups):
        if graph[run[0]].replays_rng and run[0] not in drawn:
            drawn.add(run[0])
            drawing_runs.add(index)
    fwd_runs = walk(fwd_groups, first_runs, 0, frozenset(drawing_runs))
    missing = sorted(needed - resident)
    if missing:
        raise ValueError(f"schedule reads values it never computes: {missing[:5]}")

    def emit(runs: list[list]) -> list[Step]:
        steps: list[Step] = []
        for members, frees_after in runs:
            steps.extend(compute(m) for m in members)
            steps.extend(free(m) for m in dict.fromkeys(frees_after))
        return steps

    backward_steps = [free(n) for n in dict.fromkeys(boundary_frees)] + emit(bwd_runs)
    return Schedule(forward=tuple(emit(fwd_runs)), backward=tuple(backward_steps))
