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
from typing import Iterable, NamedTuple, Sequence

from solvers.ir.derived import per_graph
from solvers.ir.graph import NodeKind, RematGraph


class StepKind(enum.Enum):
    COMPUTE = "compute"
    FREE = "free"
    OFFLOAD = "offload"
    """Start copying a live device value to a pinned host buffer (the device-to-host stream). The
    device value stays live, and readable, until an ordinary ``free``, which waits for the copy:
    that free is where device memory is released. The host copy counts against the host budget
    until the value is reloaded (or the step ends)."""
    RELOAD = "reload"
    """Start copying an offloaded value back (the host-to-device stream): its device bytes are
    allocated here and it is live again; the first compute that reads it waits for the copy."""


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


def offload(node: str) -> Step:
    return Step(StepKind.OFFLOAD, node)


def reload(node: str) -> Step:
    return Step(StepKind.RELOAD, node)


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
        tables = per_graph(graph, _ScheduleTables)
        return _derive_frees(tables, _group_runs(graph, tables, forward),
                             _group_runs(graph, tables, backward))


_NOTHING_PENDING: frozenset[str] = frozenset()


class _Group(NamedTuple):
    """What liveness needs of one op group, read off its first node once per graph."""

    members: tuple[str, ...]
    inputs: tuple[str, ...]
    """The first node's inputs, each once, in order, without the resident ones (never freed)."""
    pinned: tuple[str, ...]
    """Members that are user outputs (held by the caller from their first computation)."""
    compute_once: bool
    replays_rng: bool
    computes_reversed: tuple[Step, ...]
    """``compute(m)`` for each member, last member first (steps are emitted back to front)."""


class _ScheduleTables:
    """Per-graph lookups for `Schedule.from_computes` (built once per graph, see `per_graph`)."""

    def __init__(self, graph: RematGraph) -> None:
        self.resident = frozenset(
            n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT))
        self.pinned = frozenset(graph.user_outputs)
        self.needed_at_end = frozenset(graph.user_outputs) | frozenset(graph.backward_outputs) \
            | frozenset(graph.tangents)  # held by the caller until the step ends (see the simulator)
        self.tangents = graph.tangents
        self.forward_outputs = graph.forward_outputs
        self.frees = {n.name: free(n.name) for n in graph.nodes}
        self.group_of: dict[str, _Group] = {}
        """Op value -> its op group."""
        for members in graph.groups.values():
            first = graph[members[0]]
            group = _Group(
                members=members,
                inputs=tuple(i for i in dict.fromkeys(first.inputs) if i not in self.resident),
                pinned=tuple(m for m in members if m in self.pinned),
                compute_once=first.compute_once,
                replays_rng=first.replays_rng,
                computes_reversed=tuple(compute(m) for m in reversed(members)),
            )
            for m in members:
                self.group_of[m] = group


def _group_runs(graph: RematGraph, tables: _ScheduleTables, names: Iterable[str]) -> list[_Group]:
    """The op groups computed, in order: each mention of a group member stands for the whole
    group, once per run of mentions of its members."""
    runs: list[_Group] = []
    pending: set[str] | frozenset[str] = _NOTHING_PENDING
    group_of = tables.group_of
    for name in names:
        if name in pending:
            pending.discard(name)  # type: ignore[union-attr]
            continue
        group = group_of.get(name)
        if group is None:  # not an op: the graph's own lookup (and its error)
            group = group_of[graph.group_of(name)[0]]
        runs.append(group)
        members = group.members
        pending = set(members) - {name} if len(members) > 1 else _NOTHING_PENDING
    return runs


def _derive_frees(tables: _ScheduleTables, forward: list[_Group], backward: list[_Group]) -> Schedule:
    """Backward liveness over the compute runs: drop dead runs, free after last reads."""
    resident = tables.resident
    pinned = tables.pinned
    frees = tables.frees
    needed: set[str] = set(tables.needed_at_end)

    def walk(runs: list[_Group], first_runs: set[int], offset: int,
             drawing_runs: frozenset[int] = frozenset()) -> list[Step]:
        # The runs' steps, last first: each kept run's frees after it (last first), then its
        # computes (last first). ``drawing_runs``: the first forward run of each replayable
        # random op, kept like a run-once op.
        steps_reversed: list[Step] = []
        for index in range(len(runs) - 1, -1, -1):
            run, inputs, run_pinned, compute_once, _, computes_reversed = runs[index]
            # A user output is held by the caller from its first computation to the end of the
            # step: a later run of its op makes a throwaway copy, never a new instance.
            members: Sequence[str] = run
            if run_pinned and index + offset not in first_runs:
                members = [m for m in run if m not in pinned]
            if len(members) == 1:
                m = members[0]
                if m in needed:
                    needed.discard(m)
                    frees_after = []
                elif compute_once or index in drawing_runs:
                    frees_after = [] if m in pinned else [m]
                else:
                    continue  # nobody reads this computation
            else:
                for m in members:
                    if m in needed:
                        break
                else:  # nobody reads this computation
                    if not compute_once and index not in drawing_runs:
                        continue
                frees_after = [m for m in members if m not in needed and m not in pinned]
                for m in members:
                    needed.discard(m)
            for inp in inputs:
                if inp not in needed:
                    frees_after.append(inp)
                    needed.add(inp)
            if len(frees_after) == 1:
                steps_reversed.append(frees[frees_after[0]])
            elif frees_after:
                steps_reversed.extend([frees[m] for m in reversed(dict.fromkeys(frees_after))])
            steps_reversed.extend(computes_reversed)
        return steps_reversed

    first_runs: set[int] = set()
    seen: set[str] = set()
    for index, run in enumerate(forward + backward):
        if run.pinned:
            fresh = [m for m in run.pinned if m not in seen]
            if fresh:
                first_runs.add(index)
                seen.update(fresh)
    backward_reversed = walk(backward, first_runs, len(forward))
    # Tangents arrive at the start of backward and stay (they are in needed_at_end).
    boundary_frees = [t for t in tables.tangents if t not in needed]
    needed.difference_update(tables.tangents)
    # Forward outputs must be live when forward ends; dropped at the boundary if unread later.
    for name in tables.forward_outputs:
        if name not in needed and name not in resident:
            boundary_frees.append(name)
            needed.add(name)
    drawn: set[str] = set()
    drawing_runs = set()
    for index, run in enumerate(forward):
        if run.replays_rng and run.members[0] not in drawn:
            drawn.add(run.members[0])
            drawing_runs.add(index)
    forward_reversed = walk(forward, first_runs, 0, frozenset(drawing_runs))
    missing = sorted(needed - resident)
    if missing:
        raise ValueError(f"schedule reads values it never computes: {missing[:5]}")
    backward_reversed.extend([frees[n] for n in reversed(dict.fromkeys(boundary_frees))])
    return Schedule(forward=tuple(reversed(forward_reversed)), backward=tuple(reversed(backward_reversed)))
