"""Data-parallel planning that touches torch: capture a model and plan it for one rank.

`plan_model_for_rank` captures a model and plans it for one rank of a DDP or FSDP2 job (the
CLI's ``--world-size N --strategy fsdp|ddp`` what-if; the budget terms are in
`optimizer.planning.distributed_budget`). Running N local ranks is `frontends.distributed.gloo_ranks`.
"""

from __future__ import annotations

import torch

from frontends.capture.costed_capture import capture_with_costs
from optimizer.ir.allocator import AllocatorModel
from optimizer.planning.distributed_budget import DataParallelConfig, RankPlan, plan_for_rank
from solvers.base import SolverOptions


def plan_model_for_rank(model: torch.nn.Module, example_inputs: tuple, budget: int | str,
                        config: DataParallelConfig, *, solver: str = "auto", time_limit: float = 60.0,
                        cost_model: str = "flops", allocator: AllocatorModel | None = None,
                        milp_engine: str = "auto", verbose: bool = False) -> RankPlan:
    """Capture ``model``'s step on one rank's micro-batch (``example_inputs``) and plan it for a
    per-rank ``budget`` under ``config``."""
    captured = capture_with_costs(model, tuple(example_inputs), None, cost_model)
    options = SolverOptions(time_limit_s=time_limit, verbose=verbose, milp_engine=milp_engine)
    return plan_for_rank(captured.graph, budget, config, solver, options, allocator,
                         graph_nodes=len(captured.gm.graph.nodes))
