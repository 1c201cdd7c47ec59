"""An exact reference for small graphs: shortest path over every compute/free sequence.

Independent of the solvers: a state is (live forward values, backward ops done, past the
boundary); moves compute a forward op whose inputs are live, free a forward value, cross the
boundary once the forward outputs are live, or run the next backward op (in graph order).
Memory is checked exactly as the simulator does (inputs still live while an op allocates its
outputs and temporaries). Backward values are freed after their last read, which no schedule
can improve on, so only forward values need explicit frees. Graphs without run-once ops only.
"""

from __future__ import annotations

import heapq

from solvers.ir.graph import NodeKind, Phase, RematGraph


def exhaustive_optimum(graph: RematGraph, budget_bytes: int) -> float | None:
    """Least total cost of a schedule within ``budget_bytes``; None when none exists."""
    if any(n.compute_once for n in graph.ops):
        raise ValueError("the exhaustive reference does not model run-once ops")
    resident = {n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)}
    forward = [m for m in graph.groups.values() if graph[m[0]].phase is Phase.FORWARD]
    backward = [m for m in graph.groups.values() if graph[m[0]].phase is Phase.BACKWARD]
    final = set(graph.backward_outputs) | set(graph.user_outputs) | set(graph.tangents)  # tangents: held

    def backward_live(done: int) -> int:
        """Bytes of tangents and backward values live before backward op ``done`` runs."""
        produced = set(graph.tangents) | {v for g in backward[:done] for v in g}
        live = 0
        for v in produced:
            later = any(v in graph[g[0]].inputs for g in backward[done:])
            if v in final or later:
                live += graph[v].bytes
        return live

    carried = [backward_live(i) for i in range(len(backward) + 1)]

    def nbytes(names) -> int:
        return sum(graph[v].bytes for v in names)

    start: tuple[frozenset[str], int, bool] = (frozenset(), 0, False)
    best = {start: 0.0}
    heap = [(0.0, 0, start)]
    pushed = 0
    while heap:
        cost, _, state = heapq.heappop(heap)
        if cost > best[state]:
            continue
        live, done, in_backward = state
        if done == len(backward):
            return cost
        used = graph.resident_bytes + nbytes(live) + (carried[done] if in_backward else 0)
        moves: list[tuple[float, tuple[frozenset[str], int, bool]]] = []
        for members in forward:
            first = graph[members[0]]
            if any(m in live for m in members):
                continue
            if all(i in live or i in resident for i in first.inputs) and \
                    used + nbytes(members) + first.temp_bytes <= budget_bytes:
                moves.append((first.cost, (live | set(members), done, in_backward)))
        for v in live:
            if v not in graph.user_outputs:
                moves.append((0.0, (live - {v}, done, in_backward)))
        if not in_backward:
            arriving = nbytes(graph.tangents)  # all of them, read or not, at the boundary
            if all(o in live for o in graph.forward_outputs) and used + arriving <= budget_bytes:
                moves.append((0.0, (live, 0, True)))
        else:
            first = graph[backward[done][0]]
            reads = [i for i in first.inputs if graph[i].is_op and graph[i].phase is Phase.FORWARD]
            if all(i in live for i in reads) and \
                    used + nbytes(backward[done]) + first.temp_bytes <= budget_bytes:
                moves.append((first.cost, (live, done + 1, True)))
        for step_cost, nxt in moves:
            if cost + step_cost < best.get(nxt, float("inf")):
                best[nxt] = cost + step_cost
                pushed += 1
                heapq.heappush(heap, (cost + step_cost, pushed, nxt))
    return None
