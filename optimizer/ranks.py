"""Plan a model for one rank of a data-parallel job: capture it, then plan per rank.

`plan_model_for_rank` captures a model and plans it for one rank of a DDP or FSDP2 job (the
CLI's ``--world-size N --strategy fsdp|ddp`` what-if; the budget terms are in
`solvers.planning.distributed_budget`). Running N local ranks is `frontends.distributed.gloo_ranks`.
"""

from __future__ import annotations

from typing import Any

import torch

from frontends.capture.costed_capture import capture_with_costs
from frontends.distributed.rank_loop import rank_training_loop
from frontends.measure.link_bandwidth import measured_link_settings
from solvers.ir.budget import Budget
from solvers.planning.distributed_budget import DataParallelConfig, RankPlan, plan_for_rank
from solvers.planning.request import PlanRequest

RANK_SETTINGS = ("solver", "time_limit", "threads", "verbose", "milp_engine", "cost_model", "allocator",
                 "optimizer", "grad_accumulation", "offload", "link", "host_budget")
"""The `PlanRequest` settings rank planning honours (it captures the step as it is: no splits)."""


def plan_model_for_rank(model: torch.nn.Module, example_inputs: tuple, budget: PlanRequest | Budget | int | str,
                        config: DataParallelConfig, **settings: Any) -> RankPlan:
    """Capture ``model``'s step on one rank's micro-batch (``example_inputs``) and plan it for a
    per-rank ``budget`` under ``config``; ``settings``: `RANK_SETTINGS`, as `optimize` takes them.
    With ``optimizer=`` (an instance over ``model``'s parameters, or a description such as
    ``"adamw"``) and ``grad_accumulation=``, the budget is the rank's whole training iteration:
    the optimizer is measured over what the rank steps (FSDP: its shards; `frontends.distributed.rank_loop`).
    With ``offload="auto"`` (``link``: a preset, a `Link` or ``"measured"`` on the model's device),
    saved values may go to host memory as in `optimizer.optimize`."""
    request = PlanRequest.of(budget, "plan_model_for_rank", RANK_SETTINGS, **measured_link_settings(model, settings))
    loop = rank_training_loop(list(model.parameters()), request.optimizer, request.grad_accumulation, config)
    captured = capture_with_costs(model, tuple(example_inputs), None, request.cost_model)
    return plan_for_rank(captured.graph, request.budget, config, request.solver, request.solver_options,
                         request.allocator, graph_nodes=len(captured.gm.graph.nodes), loop=loop,
                         **request.offload_settings)
