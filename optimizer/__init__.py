"""remat-opt: fit a PyTorch training step into a memory budget by recomputing activations.

Public API (imported lazily so that ``optimizer.graph`` and the simulator stay torch-free)::

    from optimizer import optimize
    rm = optimize(model, example_inputs, budget="2GB", solver="milp", time_limit=60)
    loss = rm(*example_inputs); loss.backward()
    rm.plan  # what was decided and predicted

    torch.compile(model, backend=remat_backend(budget="60%"))   # plans every compiled graph
    plan_for_rank(graph, "40GB", DataParallelConfig(world_size=8, strategy="fsdp"))
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "optimize", "plan_only", "Plan", "BudgetBreakdown", "parse_bytes", "format_bytes",
    "RematGraph", "Schedule", "simulate", "InfeasibleBudgetError", "SolverOptions",
    "SolveStatus", "RematModule", "remat_backend", "find_graph_breaks", "DataParallelConfig",
    "plan_for_rank", "rank_breakdown",
]

_EXPORTS = {
    "optimize": "optimizer.api", "plan_only": "optimizer.api",
    "Plan": "optimizer.plan", "BudgetBreakdown": "optimizer.plan",
    "parse_bytes": "optimizer.budget", "format_bytes": "optimizer.budget",
    "RematGraph": "optimizer.graph", "Schedule": "optimizer.schedule",
    "simulate": "optimizer.simulator",
    "InfeasibleBudgetError": "solvers.base", "SolverOptions": "solvers.base",
    "SolveStatus": "solvers.base", "RematModule": "frontends.remat_module",
    "remat_backend": "frontends.compile_backend", "find_graph_breaks": "frontends.compile_backend",
    "DataParallelConfig": "frontends.distributed_budget", "plan_for_rank": "frontends.distributed_budget",
    "rank_breakdown": "frontends.distributed_budget",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'optimizer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
