"""The public API: ``optimize(model, example_inputs, budget=...)`` -> a drop-in RematModule."""

from __future__ import annotations

import torch

from optimizer.budget import parse_bytes
from optimizer.plan import Plan
from optimizer.planner import plan_graph
from solvers.base import SolverOptions


def optimize(
    model: torch.nn.Module,
    example_inputs: tuple,
    budget: str | int,
    *,
    example_kwargs: dict | None = None,
    solver: str = "auto",
    time_limit: float = 60.0,
    threads: int = 1,
    verbose: bool = False,
):
    """Plan ``model``'s training step to fit ``budget`` and return the rewritten module.

    ``budget`` is peak bytes of one training step (parameters, gradients, inputs and
    activations): an integer, a string such as ``"16GB"`` (powers of 10) or ``"2GiB"``
    (powers of 2), or a percentage of plain autograd's peak (``"60%"``). ``solver`` is one of
    `solvers.SOLVERS`: ``auto`` (default: heuristics, then the exact MILP seeded by them when
    the graph is small enough), ``milp`` (the exact Checkmate MILP), ``greedy``, the classic
    schedules (``chen``, ``chen-greedy``, ``blocks``, ``revolve``, ``chain-dp``), ``store-all``
    and ``recompute-all``. ``rm(*example_inputs)`` returns what ``model(*example_inputs)`` returns;
    ``rm.plan`` says what was decided and predicted.
    """
    from frontends.capture import capture
    from frontends.remat_module import RematModule

    if not (isinstance(budget, str) and budget.strip().endswith("%")):
        parse_bytes(budget)  # a malformed budget fails before the (slow) capture
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    captured = capture(model, example_inputs, example_kwargs)
    plan = plan_graph(
        captured.graph, budget, solver,
        SolverOptions(time_limit_s=time_limit, threads=threads, verbose=verbose),
        graph_nodes=len(captured.gm.graph.nodes),
    )
    return RematModule(model, captured, plan, example_inputs, example_kwargs)


def plan_only(
    model: torch.nn.Module,
    example_inputs: tuple,
    budget: str | int,
    *,
    example_kwargs: dict | None = None,
    solver: str = "auto",
    time_limit: float = 60.0,
) -> Plan:
    """The plan without building the module (what-if use)."""
    from frontends.capture import capture

    captured = capture(model, tuple(example_inputs), example_kwargs)
    return plan_graph(captured.graph, budget, solver,
                      SolverOptions(time_limit_s=time_limit),
                      graph_nodes=len(captured.gm.graph.nodes))
