"""Solver back-ends behind one signature: ``solve(graph, budget_bytes, options) -> SolveResult``.

Back-ends import their optional dependencies lazily, so listing them costs nothing.
"""

from __future__ import annotations

from typing import Callable

from optimizer.graph import RematGraph
from solvers.base import SolveResult, SolverOptions

Solver = Callable[[RematGraph, int, SolverOptions], SolveResult]


def _milp(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.milp import solve_milp

    return solve_milp(graph, budget, options)


def _store_all(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.baselines import solve_store_all

    return solve_store_all(graph, budget, options)


def _recompute_all(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.baselines import solve_recompute_all

    return solve_recompute_all(graph, budget, options)


def _chen(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.chen import solve_chen

    return solve_chen(graph, budget, options)


def _chen_greedy(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.chen import solve_chen_greedy

    return solve_chen_greedy(graph, budget, options)


def _blocks(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.blocks import solve_blocks

    return solve_blocks(graph, budget, options, every=1)


def _revolve(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.revolve import solve_revolve

    return solve_revolve(graph, budget, options)


def _chain_dp(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.chain_dp import solve_chain_dp

    return solve_chain_dp(graph, budget, options)


def _greedy(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.greedy import solve_greedy

    return solve_greedy(graph, budget, options)


def _auto(graph: RematGraph, budget: int, options: SolverOptions) -> SolveResult:
    from solvers.auto import solve_auto

    return solve_auto(graph, budget, options)


SOLVERS: dict[str, Solver] = {
    "auto": _auto,
    "milp": _milp,
    "store-all": _store_all,
    "recompute-all": _recompute_all,
    "chen": _chen,
    "chen-greedy": _chen_greedy,
    "blocks": _blocks,
    "revolve": _revolve,
    "chain-dp": _chain_dp,
    "greedy": _greedy,
}


def get_solver(name: str) -> Solver:
    try:
        return SOLVERS[name]
    except KeyError:
        raise ValueError(f"unknown solver {name!r}: choose one of {', '.join(SOLVERS)}") from None
