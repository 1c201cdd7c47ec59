"""The forward graph as a chain: articulation values and the stages between them.

The classic schedules (Chen's segments, the chain DPs) are defined on sequential networks.
A training graph branches (residual adds, attention's q/k/v) but its forward part still has
*articulation values*: values on every path from the step's inputs to its user outputs
(the residual stream between blocks, a ResNet block's output). Cutting the forward graph at
them linearises it: each stage between two consecutive articulation values is one "layer" of
the chain, however it branches inside. Keeping an articulation value is enough to recompute
everything after it without touching anything before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from solvers.baselines import kept_through_backward
from solvers.ir.derived import per_graph
from solvers.ir.graph import NodeKind, Phase, RematGraph

_SOURCE = "<source>"
_SINK = "<sink>"


@dataclass(frozen=True)
class Stage:
    """Forward values between two articulation values, in topological order."""

    index: int
    values: tuple[str, ...]
    """Forward op values of the stage (siblings included), in graph order."""
    boundary: str
    """The articulation value that ends the stage ('' for trailing values after the last one)."""


@dataclass(frozen=True)
class Linearization:
    """The forward graph cut at its articulation values."""

    articulation: tuple[str, ...]
    """Articulation values in topological order."""
    stages: tuple[Stage, ...]

    @cached_property
    def stage_of(self) -> dict[str, int]:
        """Forward value -> index of its stage."""
        return {v: s.index for s in self.stages for v in s.values}


def forward_dag(graph: RematGraph) -> nx.DiGraph:
    """Forward op values as a DAG, with a source before the inputs and a sink after the outputs.

    Edges join op values only: resident values (parameters, inputs) are always available, so
    they never separate anything (a label read by the loss is no bypass around the network).
    The source feeds the first ops computed from a user input; an op that reads only
    parameters (``arange``, a buffer update) starts no path, since whatever follows it can be
    recomputed from resident values alone. The sink follows the user outputs (the loss), or
    every forward output when there are none.
    """
    dag = nx.DiGraph()
    dag.add_node(_SOURCE)
    dag.add_node(_SINK)
    for node in graph.ops:
        if node.phase is not Phase.FORWARD:
            continue
        dag.add_node(node.name)
        op_inputs = [i for i in dict.fromkeys(node.inputs) if graph[i].is_op]
        for inp in op_inputs:
            dag.add_edge(inp, node.name)
        if not op_inputs and any(graph[i].kind is NodeKind.INPUT for i in node.inputs):
            dag.add_edge(_SOURCE, node.name)
    for name in graph.user_outputs or graph.forward_outputs:
        if graph[name].is_op:
            dag.add_edge(name, _SINK)
    return dag


def articulation_values(graph: RematGraph) -> tuple[str, ...]:
    """Forward values on every path from the inputs to the user outputs, in graph order.

    Only values that lie on some input-to-output path count (a branch that never reaches the
    loss, such as a BatchNorm running-stat update, separates nothing). On that subgraph a cut
    vertex of the undirected graph is exactly a value every source-to-sink path crosses.
    Values that must be kept anyway (run-once ops, outputs) are dropped from the list.
    """
    dag = forward_dag(graph)
    relevant = (nx.descendants(dag, _SOURCE) | {_SOURCE}) & (nx.ancestors(dag, _SINK) | {_SINK})
    if _SINK not in relevant:
        return ()
    sub = dag.subgraph(relevant).to_undirected()
    kept = kept_through_backward(graph)
    cuts = [
        v for v in nx.articulation_points(sub)
        if v not in (_SOURCE, _SINK) and v not in kept
    ]
    return tuple(sorted(cuts, key=graph.position))


def linearize(graph: RematGraph) -> Linearization:
    """Cut the forward values at the articulation values into stages, by graph position.

    Stage k holds the forward values after articulation value k-1 up to and including
    articulation value k; values after the last one form a final stage with no boundary.
    Built once per graph (`per_graph`): auto, hierarchical and each chain solver ask for it,
    and finding the articulation values of a 10,000-step loop takes seconds.
    """
    return per_graph(graph, _linearize)


def _linearize(graph: RematGraph) -> Linearization:
    cuts = articulation_values(graph)
    cut_positions = [graph.position(c) for c in cuts]
    stages: list[list[str]] = [[] for _ in range(len(cuts) + 1)]
    k = 0
    for node in graph.ops:
        if node.phase is not Phase.FORWARD:
            continue
        pos = graph.position(node.name)
        while k < len(cuts) and pos > cut_positions[k]:
            k += 1
        stages[k].append(node.name)
    # Siblings of an articulation value sit right after it: keep each group in one stage.
    for k in range(len(stages) - 1, 0, -1):
        while stages[k] and graph[stages[k][0]].group == graph[stages[k - 1][-1]].group:
            stages[k - 1].append(stages[k].pop(0))
    result = [Stage(k, tuple(vals), cuts[k] if k < len(cuts) else "")
              for k, vals in enumerate(stages)]
    if not result[-1].values:
        result.pop()
    return Linearization(articulation=cuts, stages=tuple(result))
