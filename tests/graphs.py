"""Small hand-built and random graphs shared by the core and solver tests."""

from __future__ import annotations

import random

import pytest

from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.greedy import droppable
from solvers.ir.graph import Node, NodeKind, Phase, RematGraph, prune_dead
from solvers.ir.link import Link
from solvers.ir.simulator import simulate

F, B = Phase.FORWARD, Phase.BACKWARD


def op(name, phase, nbytes, inputs, cost=1.0, **kw) -> Node:
    return Node(name=name, kind=NodeKind.OP, phase=phase, bytes=nbytes, inputs=tuple(inputs),
                group=kw.pop("group", name), cost=cost, flops=cost, **kw)


def tiny_chain() -> RematGraph:
    """x, p -> a -> b -> loss; backward gb, ga, gp. Peaks hand-computed in the tests."""
    nodes = (
        Node("p", NodeKind.PARAMETER, F, 100),
        Node("x", NodeKind.INPUT, F, 10),
        op("a", F, 20, ["x", "p"]),
        op("b", F, 30, ["a"]),
        op("loss", F, 1, ["b"]),
        Node("t", NodeKind.TANGENT, B, 1),
        op("gb", B, 30, ["t", "b"], cost=2.0),
        op("ga", B, 20, ["gb", "a"], cost=2.0),
        op("gp", B, 100, ["ga", "x"], cost=2.0),
    )
    return RematGraph(nodes, forward_outputs=("loss",), user_outputs=("loss",),
                      backward_outputs=("gp",))


def chain(length: int, size: int = 10, fwd_cost: float = 1.0, bwd_cost: float = 2.0,
          sizes: list[int] | None = None, costs: list[float] | None = None) -> RematGraph:
    """A sequential network of `length` layers: the shape revolve and chain DPs are made for.

    Layer i's backward reads the layer's input activation and the incoming gradient.
    """
    sizes = sizes or [size] * length
    costs = costs or [fwd_cost] * length
    nodes = [Node("x", NodeKind.INPUT, F, sizes[0])]
    prev = "x"
    for i in range(length):
        nodes.append(op(f"f{i}", F, sizes[i], [prev], cost=costs[i]))
        prev = f"f{i}"
    nodes.append(op("loss", F, 1, [prev]))
    nodes.append(Node("t", NodeKind.TANGENT, B, 1))
    grad = "t"
    for i in reversed(range(length)):
        inp = "x" if i == 0 else f"f{i - 1}"
        reads = [grad, inp] if i == length - 1 else [grad, inp, f"f{i}"]
        nodes.append(op(f"g{i}", B, sizes[i], reads, cost=bwd_cost * costs[i]))
        grad = f"g{i}"
    return RematGraph(tuple(nodes), forward_outputs=("loss",), user_outputs=("loss",),
                      backward_outputs=(grad,))


def random_graph(seed: int, n_forward: int = 5) -> RematGraph:
    """A random forward DAG plus a backward that mirrors it, as autograd would build it.

    Some ops have two outputs (siblings), one may be random (dropout-like).
    """
    rng = random.Random(seed)
    nodes = [Node("x", NodeKind.INPUT, F, rng.randint(1, 8)),
             Node("p", NodeKind.PARAMETER, F, rng.randint(1, 8))]
    fwd: list[str] = []
    random_used = False
    for i in range(n_forward):
        pool = ["x", "p"] + fwd
        k = rng.randint(1, min(2, len(pool)))
        inputs = sorted(set(rng.sample(pool[-3:] if rng.random() < 0.7 else pool, k)),
                        key=lambda s: pool.index(s))
        cost = rng.choice([1.0, 2.0, 5.0])
        name = f"v{i}"
        is_random = not random_used and rng.random() < 0.2
        random_used |= is_random
        if rng.random() < 0.2:
            nodes.append(op(name + "a", F, rng.randint(1, 10), inputs, cost=cost, group=name, random=is_random))
            nodes.append(Node(name + "b", NodeKind.OP, F, rng.randint(1, 10), tuple(inputs),
                              group=name, random=is_random))
            fwd += [name + "a", name + "b"]
        else:
            nodes.append(op(name, F, rng.randint(1, 10), inputs, cost=cost, random=is_random))
            fwd.append(name)
    nodes.append(op("loss", F, 1, [fwd[-1]]))
    nodes.append(Node("t", NodeKind.TANGENT, B, 1))
    grads = {"loss": "t"}
    users: dict[str, list[str]] = {}
    for node in nodes:
        for inp in node.inputs:
            users.setdefault(inp, []).append(node.name)
    bwd_outputs = []
    for node in reversed(list(nodes)):
        if node.kind is NodeKind.TANGENT or node.name == "loss":
            continue
        incoming = [grads[u] for u in users.get(node.name, []) if u in grads]
        if not incoming:
            continue
        name = f"g_{node.name}"
        reads = incoming + ([i for i in node.inputs] if node.is_op else [])
        reads = sorted(set(reads), key=[n.name for n in nodes].index)
        nodes.append(op(name, B, max(1, node.bytes), reads, cost=rng.choice([1.0, 2.0, 4.0])))
        grads[node.name] = name
        if not node.is_op:
            bwd_outputs.append(name)
    graph = RematGraph(tuple(nodes), forward_outputs=("loss",), user_outputs=("loss",),
                       backward_outputs=tuple(bwd_outputs))
    return prune_dead(graph)



def toy_step_graph() -> RematGraph:
    """1,000 bytes of parameters and of gradients, 100 of input, a chain of three 2,000-byte
    activations: keeping only one of them for backward lowers the peak by about 2,000 bytes.
    Each op costs 1.0 and counts no FLOPs (the per-rank budget tests' toy step)."""
    def step_op(name, phase, size, inputs):
        return Node(name, NodeKind.OP, phase, size, inputs, group=name, cost=1.0)

    nodes = (
        Node("w", NodeKind.PARAMETER, F, 1000), Node("x", NodeKind.INPUT, F, 100),
        step_op("a", F, 2000, ("w", "x")), step_op("b", F, 2000, ("a",)), step_op("c", F, 2000, ("b",)),
        step_op("loss", F, 8, ("c",)), Node("t", NodeKind.TANGENT, B, 8),
        step_op("dc", B, 10, ("t", "c")), step_op("db", B, 10, ("dc", "b")), step_op("da", B, 10, ("db", "a")),
        step_op("dw", B, 1000, ("da", "x")),
    )
    return RematGraph(nodes, ("loss",), ("loss",), ("dw",))


def store_and_lean_peaks(graph: RematGraph) -> tuple[int, int]:
    """(store-all peak, recompute-all peak): the budgets between them need recomputation."""
    return (simulate(graph, store_all_schedule(graph)).peak_bytes,
            simulate(graph, recompute_all_schedule(graph)).peak_bytes)



def small_offload_cases():
    """(graph, budget, link): random graphs with at most 6 droppable values, each at five budgets
    from below the leanest peak to store-all's, on a link drawn per graph: brute force's size."""
    for seed in range(0, 60, 2):
        graph = random_graph(seed, 4 + seed % 5)
        if len(droppable(graph)) > 6:
            continue
        high, low = store_and_lean_peaks(graph)
        link = Link("t", random.Random(seed).choice([1.0, 4.0, 20.0]), 4.0, latency_s=0.1)
        for budget in sorted({low - 8, low - 3, low, (low + high) // 2, high}):
            yield graph, budget, link


def check_exact_result(graph: RematGraph, budget: int, result, tol: float = 1e-6) -> None:
    """An exact solver's result: its schedule runs, fits, costs what the result says, and its
    bound (if any) is not above its objective."""
    assert result.schedule is not None
    sim = simulate(graph, result.schedule)
    assert sim.peak_bytes <= budget
    assert result.objective == pytest.approx(sim.total_cost, abs=tol)
    if result.bound is not None:
        assert result.bound <= result.objective + tol

