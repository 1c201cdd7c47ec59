"""remat-opt: fit a PyTorch training step into a memory budget by recomputing activations.

The top floor: every entry point users call (api, checkpointing, compile, ranks, cli, what-if,
reports); it may import the frontends (torch) and the torch-free core in `solvers`. Public API,
imported lazily so that ``import optimizer`` loads no torch until a name is used::

    from optimizer import optimize
    rm = optimize(model, example_inputs, budget="2GB", solver="milp", time_limit=60)
    loss = rm(*example_inputs); loss.backward()
    rm.plan  # what was decided and predicted

    torch.compile(model, backend=remat_backend(budget="60%"))   # plans every compiled graph
    plan_for_rank(graph, "40GB", DataParallelConfig(world_size=8, strategy="fsdp"))
    plan = apply_checkpointing(model, example_inputs, budget="60%")  # torch.utils.checkpoint, in place
    request = PlanRequest.of("60%", "me", solver="greedy")  # one request, for any entry point above
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "optimize", "plan_only", "Plan", "BudgetBreakdown", "parse_bytes", "format_bytes",
    "RematGraph", "Schedule", "simulate", "InfeasibleBudgetError", "SolverOptions",
    "SolveStatus", "RematModule", "remat_backend", "find_graph_breaks", "DataParallelConfig",
    "plan_for_rank", "rank_breakdown", "apply_checkpointing", "remove_checkpointing",
    "load_checkpointing", "save_checkpointing_plan", "CheckpointPlan", "RowSplitError",
    "Budget", "PlanRequest", "SettingsError",
]

_EXPORTS = {
    "optimize": "optimizer.api", "plan_only": "optimizer.api",
    "Plan": "solvers.ir.plan", "BudgetBreakdown": "solvers.ir.plan",
    "parse_bytes": "solvers.ir.budget", "format_bytes": "solvers.ir.budget",
    "RematGraph": "solvers.ir.graph", "Schedule": "solvers.ir.schedule",
    "simulate": "solvers.ir.simulator",
    "InfeasibleBudgetError": "solvers.base", "SolverOptions": "solvers.base",
    "SolveStatus": "solvers.base", "RematModule": "frontends.graph_runtime.remat_module",
    "remat_backend": "optimizer.compile", "find_graph_breaks": "optimizer.compile",
    "DataParallelConfig": "solvers.planning.distributed_budget",
    "plan_for_rank": "solvers.planning.distributed_budget",
    "rank_breakdown": "solvers.planning.distributed_budget",
    "apply_checkpointing": "optimizer.checkpointing",
    "remove_checkpointing": "frontends.eager_runtime.eager_checkpoint",
    "load_checkpointing": "frontends.eager_runtime.eager_checkpoint",
    "save_checkpointing_plan": "frontends.eager_runtime.eager_checkpoint",
    "CheckpointPlan": "frontends.eager_runtime.eager_checkpoint",
    "RowSplitError": "frontends.split.row_split",
    "Budget": "solvers.ir.budget", "PlanRequest": "solvers.planning.request",
    "SettingsError": "solvers.planning.request",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'optimizer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
