"""Replace a graph's per-op costs, e.g. by measured times, without touching anything else.

Capture prices ops with an analytic model; a profile measures them on the device. Solvers only
read ``Node.cost``, so swapping the numbers (and the model's name, which every report shows) is
all a measured plan needs. The group's cost sits on its first node, as in `solvers.ir.graph`.
This module imports no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from solvers.ir.graph import Node, RematGraph


def with_costs(
    graph: RematGraph,
    seconds_by_group: Mapping[str, float],
    cost_model_name: str,
    *,
    default: float | None = None,
) -> RematGraph:
    """``graph`` with each op group's cost set to ``seconds_by_group[group]``.

    Keys that are not groups of ``graph`` (views, ops the IR folded away) are ignored. A group
    without a time raises ValueError unless ``default`` gives one: a silently kept analytic cost
    would mix two models under one name.
    """
    missing = [g for g in graph.groups if g not in seconds_by_group]
    if missing and default is None:
        raise ValueError(f"no time for {len(missing)} op group(s), e.g. {missing[:5]}")
    for group in graph.groups:
        seconds = seconds_by_group.get(group, default)
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"time for op group {group!r} must be finite and >= 0, got {seconds!r}")
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.is_op:
            first = graph.groups[node.group][0] == node.name
            cost = float(seconds_by_group.get(node.group, default or 0.0)) if first else 0.0
            node = dataclasses.replace(node, cost=cost)
        nodes.append(node)
    return dataclasses.replace(graph, nodes=tuple(nodes), cost_model=cost_model_name)
