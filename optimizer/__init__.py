"""remat-opt: fit a PyTorch training step into a memory budget by recomputing activations.

Public API (imported lazily so that ``optimizer.ir.graph`` and the simulator stay torch-free)::

    from optimizer import optimize
    rm = optimize(model, example_inputs, budget="2GB", solver="milp", time_limit=60)
    loss = rm(*example_inputs); loss.backward()
    rm.plan  # what was decided and predicted

    torch.compile(model, backend=remat_backend(budget="60%"))   # plans every compiled graph
    plan_for_rank(graph, "40GB", DataParallelConfig(world_size=8, strategy="fsdp"))
    plan = apply_checkpointing(model, example_inputs, budget="60%")  # torch.utils.checkpoint, in place
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
]

_EXPORTS = {
    "optimize": "optimizer.app.api", "plan_only": "optimizer.app.api",
    "Plan": "optimizer.ir.plan", "BudgetBreakdown": "optimizer.ir.plan",
    "parse_bytes": "optimizer.ir.budget", "format_bytes": "optimizer.ir.budget",
    "RematGraph": "optimizer.ir.graph", "Schedule": "optimizer.ir.schedule",
    "simulate": "optimizer.ir.simulator",
    "InfeasibleBudgetError": "solvers.base", "SolverOptions": "solvers.base",
    "SolveStatus": "solvers.base", "RematModule": "frontends.graph_runtime.remat_module",
    "remat_backend": "frontends.compile.compile_backend", "find_graph_breaks": "frontends.compile.compile_backend",
    "DataParallelConfig": "optimizer.planning.distributed_budget",
    "plan_for_rank": "optimizer.planning.distributed_budget",
    "rank_breakdown": "optimizer.planning.distributed_budget",
    "apply_checkpointing": "frontends.eager_runtime.apply",
    "remove_checkpointing": "frontends.eager_runtime.eager_checkpoint",
    "load_checkpointing": "frontends.eager_runtime.eager_checkpoint",
    "save_checkpointing_plan": "frontends.eager_runtime.eager_checkpoint",
    "CheckpointPlan": "frontends.eager_runtime.eager_checkpoint",
    "RowSplitError": "frontends.split.row_split",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'optimizer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
