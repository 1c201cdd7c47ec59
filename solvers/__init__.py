"""The torch-free core (the bottom floor): `ir` (graph, simulator, budget), the solver back-ends
behind one signature, ``solve(graph, budget_bytes, options) -> SolveResult``, and `planning`.

`SOLVERS` maps each name the API and the CLI accept to the module and function that implement
it; modules (and their optional dependencies) are imported only when a solver is used.
"""

from __future__ import annotations

import importlib
from typing import Callable

from solvers.base import SolveResult, SolverOptions
from solvers.ir.graph import RematGraph

Solver = Callable[[RematGraph, int, SolverOptions], SolveResult]

SOLVERS: dict[str, tuple[str, str]] = {
    "auto": ("solvers.auto", "solve_auto"),
    "milp": ("solvers.checkmate.milp", "solve_milp"),
    "cpsat": ("solvers.checkmate.cpsat", "solve_cpsat"),
    "greedy": ("solvers.greedy", "solve_greedy"),
    "store-all": ("solvers.baselines", "solve_store_all"),
    "recompute-all": ("solvers.baselines", "solve_recompute_all"),
    "chen": ("solvers.chen", "solve_chen"),
    "chen-greedy": ("solvers.chen", "solve_chen_greedy"),
    "blocks": ("solvers.blocks", "solve_blocks"),
    "revolve": ("solvers.revolve", "solve_revolve"),
    "chain-dp": ("solvers.chain_dp", "solve_chain_dp"),
    "rotor": ("solvers.rotor", "solve_rotor"),
    "hierarchical": ("solvers.hierarchical", "solve_hierarchical"),
    "intervals": ("solvers.checkmate.intervals", "solve_intervals"),
}


def get_solver(name: str) -> Solver:
    try:
        module, function = SOLVERS[name]
    except KeyError:
        raise ValueError(f"unknown solver {name!r}: choose one of {', '.join(SOLVERS)}") from None
    return getattr(importlib.import_module(module), function)
