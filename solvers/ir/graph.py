"""Framework-neutral graph IR shared by the frontends, the solvers and the simulator.

A `RematGraph` node is one *value*: a tensor storage produced by an op of the joint
forward+backward graph. Aliases (views, detach, getitem of a view op) are not nodes: their
consumers depend on the storage they alias, so memory is counted once per storage.

An op with several used outputs (``native_layer_norm``, ``native_dropout``) becomes several
sibling nodes that share one ``group``: they are always computed together (the op runs once
and allocates every output), but each can be freed on its own. The group's compute cost is
carried by its first node; ``temp_bytes`` holds outputs nobody uses, allocated and dropped
at once. Lifted constants (tensors the model's forward creates, which the capture holds as
``get_attr`` values) are `NodeKind.PARAMETER` values: like a buffer, every schedule has them from
the start, they are never freed or recomputed and get no gradient. This module imports no torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property


class Phase(enum.Enum):
    """Which half of the training step an op belongs to in plain autograd."""

    FORWARD = "forward"
    BACKWARD = "backward"


class NodeKind(enum.Enum):
    """Where a value comes from."""

    PARAMETER = "parameter"  # parameters, buffers, lifted constants: resident for the whole step
    INPUT = "input"  # user inputs: held by the caller for the whole step
    TANGENT = "tangent"  # output gradients: arrive when backward starts
    OP = "op"  # computed by the step; may be freed and recomputed


@dataclass(frozen=True)
class Node:
    """One value of the training step, with what it costs to hold and to compute."""

    name: str
    kind: NodeKind
    phase: Phase
    bytes: int
    inputs: tuple[str, ...] = ()
    group: str = ""
    """Op that produces this value; siblings of one multi-output op share it."""
    cost: float = 0.0
    """Seconds under the graph's cost model (carried by the first node of a group)."""
    flops: float = 0.0
    temp_bytes: int = 0
    """Bytes the op allocates but nobody uses; live only while the op runs."""
    random: bool = False
    """Draws random numbers. Without ``rng_state`` it is computed exactly once, in its own phase."""
    mutates: bool = False
    """Mutates state, has a side effect, or reads a buffer the step updates: computed exactly
    once, in its own phase."""
    module: str = ""
    """Module path that produced it (forward ops), for per-module summaries."""
    op: str = ""
    """Name of the op, for reports (e.g. ``aten.mm.default``)."""
    rng_state: str = ""
    """For a random op that can be replayed: the value holding the generator state saved right
    before its first run (also one of its inputs). A recomputation restores that state, draws the
    same numbers and puts the generator back, so only the first run advances the stream: it runs
    in forward, in the original order of the run-once ops (see `replays_rng`)."""
    reuses: tuple[str, ...] = ()
    """Inputs whose storage this op may take over: an elementwise op (``add``) whose output has that
    input's bytes, dtype and layout, run in place when the schedule frees the input right after it
    (`solvers.ir.inplace`), as eager autograd accumulates gradients in place."""

    @property
    def is_op(self) -> bool:
        return self.kind is NodeKind.OP

    @property
    def replays_rng(self) -> bool:
        """A random op that may be recomputed: its first run draws, later runs replay."""
        return self.random and bool(self.rng_state)

    @property
    def compute_once(self) -> bool:
        """Values that must not be recomputed, whatever the solver."""
        return (self.random and not self.rng_state) or self.mutates


@dataclass(frozen=True)
class RematGraph:
    """A training step as values in a topological order (forward ops before backward ops).

    ``forward_outputs`` must be live when forward ends (user outputs, updated buffers);
    ``user_outputs`` (a subset) stay live to the end of the step because the caller holds them;
    ``backward_outputs`` (parameter gradients) must be live when backward ends.
    """

    nodes: tuple[Node, ...]
    forward_outputs: tuple[str, ...]
    user_outputs: tuple[str, ...]
    backward_outputs: tuple[str, ...]
    cost_model: str = "flops"
    name: str = "graph"
    _index: dict[str, int] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        index = {node.name: i for i, node in enumerate(self.nodes)}
        if len(index) != len(self.nodes):
            raise ValueError("node names must be unique")
        for i, node in enumerate(self.nodes):
            for inp in node.inputs:
                if inp not in index:
                    raise ValueError(f"node {node.name!r} reads unknown value {inp!r}")
                if index[inp] >= i:
                    raise ValueError(f"nodes are not in topological order at {node.name!r}")
            if not node.is_op and node.inputs:
                raise ValueError(f"{node.kind.value} {node.name!r} cannot have inputs")
            if node.reuses and (not set(node.reuses) <= set(node.inputs) or node.compute_once or node.random
                                or any(self.nodes[index[r]].bytes != node.bytes for r in node.reuses)):
                raise ValueError(f"{node.name!r} may reuse only inputs of its own bytes, and no random "
                                 "or mutating op reuses one")
            if node.rng_state and (not node.random or node.rng_state not in node.inputs
                                   or not self.nodes[index[node.rng_state]].compute_once):
                raise ValueError(f"{node.name!r} replays {node.rng_state!r}: it must be a random op "
                                 "that reads that state, and the state a run-once value")
        for name in (*self.forward_outputs, *self.backward_outputs, *self.user_outputs):
            if name not in index:
                raise ValueError(f"output {name!r} is not a node")
        object.__setattr__(self, "_index", index)
        self._check_groups()

    def _check_groups(self) -> None:
        seen: set[str] = set()
        previous = None
        for node in self.ops:
            if node.group != previous:
                if node.group in seen:
                    raise ValueError(f"siblings of group {node.group!r} are not contiguous")
                seen.add(node.group)
                previous = node.group
        for members in self.groups.values():
            first = self.nodes[self._index[members[0]]]
            if len(members) > 1 and any(self.nodes[self._index[m]].reuses for m in members):
                raise ValueError(f"op {first.group!r} has several outputs: none of them may reuse an input")
            for name in members[1:]:
                sibling = self.nodes[self._index[name]]
                if sibling.inputs != first.inputs or sibling.phase != first.phase:
                    raise ValueError(f"siblings {first.name!r} and {name!r} differ in inputs or phase")

    # ----------------------------------------------------------------- lookups
    def __getitem__(self, name: str) -> Node:
        return self.nodes[self._index[name]]

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self.nodes)

    def position(self, name: str) -> int:
        return self._index[name]

    @cached_property
    def ops(self) -> tuple[Node, ...]:
        """Values the step computes, in topological order."""
        return tuple(n for n in self.nodes if n.is_op)

    @cached_property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Op groups in topological order: group name -> its sibling values."""
        result: dict[str, list[str]] = {}
        for node in self.ops:
            result.setdefault(node.group, []).append(node.name)
        return {g: tuple(v) for g, v in result.items()}

    @cached_property
    def users(self) -> dict[str, tuple[str, ...]]:
        """Value -> the op values that read it, in topological order."""
        result: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for node in self.nodes:
            for inp in dict.fromkeys(node.inputs):
                result[inp].append(node.name)
        return {k: tuple(v) for k, v in result.items()}

    @cached_property
    def resident_bytes(self) -> int:
        """Parameters, buffers, lifted constants and user inputs: live for the whole step."""
        return sum(n.bytes for n in self.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT))

    @cached_property
    def parameter_bytes(self) -> int:
        return sum(n.bytes for n in self.nodes if n.kind is NodeKind.PARAMETER)

    @cached_property
    def input_bytes(self) -> int:
        return sum(n.bytes for n in self.nodes if n.kind is NodeKind.INPUT)

    @cached_property
    def gradient_bytes(self) -> int:
        return sum(self[name].bytes for name in dict.fromkeys(self.backward_outputs))

    @cached_property
    def tangents(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes if n.kind is NodeKind.TANGENT)

    @cached_property
    def base_cost(self) -> float:
        """Cost of computing every op once (plain autograd)."""
        return sum(n.cost for n in self.ops)

    @cached_property
    def base_flops(self) -> float:
        return sum(n.flops for n in self.ops)

    def group_of(self, name: str) -> tuple[str, ...]:
        return self.groups[self[name].group]


def prune_dead(graph: RematGraph) -> RematGraph:
    """Drop ops that no output depends on (whole groups; run-once and random ops are always kept)."""
    needed = set(graph.forward_outputs) | set(graph.backward_outputs) | set(graph.user_outputs)
    needed |= {n.name for n in graph.ops if n.compute_once or n.random}  # random: the stream
    for node in reversed(graph.nodes):
        if node.name in needed:
            needed.update(node.inputs)
            if node.is_op:
                needed.update(graph.group_of(node.name))
    kept = tuple(n for n in graph.nodes if n.name in needed or not n.is_op)
    if len(kept) == len(graph.nodes):
        return graph
    return RematGraph(kept, graph.forward_outputs, graph.user_outputs, graph.backward_outputs,
                      graph.cost_model, graph.name)
