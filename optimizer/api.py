"""The public API: ``optimize(model, example_inputs, budget=...)`` -> a drop-in RematModule."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from frontends.capture.costed_capture import capture_with_costs
from frontends.capture.output_selection import check_outputs
from frontends.capture.step import CapturedStep, capture
from frontends.graph_runtime.remat_module import RematModule, ShapePolicy
from frontends.measure.link_bandwidth import measured_link_settings
from frontends.measure.optimizer_memory import check_optimizer, training_loop
from optimizer.split_plan import check_split, chunks_of, plan_step, step_planners
from solvers.ir.budget import Budget
from solvers.ir.link import offload_link_of
from solvers.ir.plan import Plan
from solvers.planning.planner import plan_for_schedule, plan_graph
from solvers.planning.request import PlanRequest


def optimize(
    model: torch.nn.Module,
    example_inputs: tuple,
    budget: Budget | str | int,
    *,
    example_kwargs: dict | None = None,
    static: bool = False,
    on_larger: str = "error",
    **settings: Any,
):
    """Plan ``model``'s training step to fit ``budget`` and return the rewritten module.

    ``budget`` is peak bytes of one training step (parameters, gradients, inputs and
    activations): an integer, a string such as ``"16GB"`` (powers of 10) or ``"2GiB"``
    (powers of 2), or a percentage of plain autograd's peak (``"60%"``); a `Budget`. ``settings``
    are the fields of `solvers.planning.request.PlanRequest` (``solver``, ``time_limit``,
    ``threads``, ``verbose``, ``milp_engine``, ``cost_model``, ``allocator``, ``grad_outputs``,
    ``python_side_effects``, ``outputs``, ``split``, ``split_mlp``, ``optimizer``,
    ``grad_accumulation``); any other keyword raises
    `SettingsError` naming them. ``solver`` is one of
    `solvers.SOLVERS`: ``auto`` (default: heuristics, then the exact MILP seeded by them when
    the graph is small enough), ``milp`` (the exact Checkmate MILP), ``greedy``, the classic
    schedules (``chen``, ``chen-greedy``, ``blocks``, ``revolve``, ``chain-dp``), ``store-all``
    and ``recompute-all``. ``rm(*example_inputs)`` returns what ``model(*example_inputs)`` returns;
    ``rm.plan`` says what was decided and predicted. ``cost_model`` is ``flops``,
    ``roofline:<device>`` (see `frontends.measure.devices`) or ``profile`` (measured on the device the
    model lives on); ``allocator`` adds a CUDA allocator's rounding and margins to the peaks.
    ``grad_outputs="losses"`` plans a model that returns a scalar loss next to other outputs
    (``(loss, logits)``) for ``loss.backward()``: the other outputs carry no gradient, as under
    plain autograd, and backward through them raises; ``"all"`` plans backward from every output.
    ``python_side_effects="error"`` (default) refuses, with
    `frontends.capture.step.UnreplayableForwardError`, a forward that does in Python what the captured
    graph cannot replay (Python or numpy random draws, attributes it changes, module hooks,
    tensor hooks registered in forward, reseeding; docs/limits.md "What the graph runtime preserves");
    ``"ignore"`` plans it with the values of capture time.

    ``optimizer`` (docs/python-api.md "The whole training iteration"): the loop's optimizer, an
    instance or a description (``"adamw"``, ``"adamw-8bit"``, ``"sgd-momentum"``, ...); the budget
    is then the whole iteration's peak, optimizer state and the step's temporaries included, and
    ``plan.breakdown`` says what each holds. ``grad_accumulation=k`` counts the gradients held
    through k micro-batches. Without an optimizer its state is not counted (the report says so).

    Input sizes (docs/python-api.md "Input sizes"): the module runs inputs of any size up to the planned
    one in every dimension (a smaller last batch, a shorter sequence) with the planned schedule,
    captured again once per new size and simulated there, so the peak never exceeds the planned
    one. A larger input raises `frontends.graph_runtime.remat_module.InputMismatchError` naming the planned
    sizes (``on_larger="error"``) or is planned afresh at ``budget`` (``"replan"``); the last 8
    sizes are kept. ``static=True`` runs the planned sizes only.

    ``split`` (docs/python-api.md "Splitting huge ops"): ``k`` runs the LM head and its loss in k chunks of
    token rows, so the whole logits, log-softmax and gradient no longer set the memory floor
    (`frontends.split.row_split`); ``"auto"`` plans k in `optimizer.split_plan.SPLIT_CHOICES` and
    keeps the cheapest plan that fits (the message says which k); None (default, with
    ``split_mlp`` None too): no split where a whole-tensor plan fits, else the ``auto`` search,
    the finest split probed first (`optimizer.split_plan.split_when_infeasible`: the message
    says the planner split the step; where no split fits either,
    `solvers.planning.split_search.SplitInfeasibleError` names both floors); ``1``: never split.
    ``split_mlp`` likewise runs every MLP (``linear -> gelu/silu/... -> linear``, SwiGLU too) in
    m chunks of token rows (`frontends.split.mlp_split`), so its wide intermediate exists one chunk at
    a time where the plan recomputes it; None (default) means 1, or, under ``split="auto"``, that
    the MLPs are searched too (m = 2, 4, 8 with the head's best k).
    ``outputs="loss"`` (docs/python-api.md "Splitting huge ops") plans and returns the scalar losses only: the
    other returned tensors (the logits) are dropped from the step, so their memory stops counting,
    and ``rm(...)`` gives back the same structure with None in their place (a transformers
    ``ModelOutput`` with only ``loss`` set); ``"all"`` (default) returns everything.
    """
    request = PlanRequest.of(budget, "optimize", **measured_link_settings(model, settings))
    example_inputs = _as_tuple(example_inputs)
    ShapePolicy(on_larger=on_larger)  # a bad on_larger fails before the (slow) capture
    captured, plan = capture_and_plan(model, example_inputs, example_kwargs, request)
    head_chunks, mlp_chunks = chunks_of(captured)

    def recapture(args: tuple, kwargs: dict) -> CapturedStep:
        return capture(model, args, kwargs, cost_model=captured.cost_model, grad_outputs=request.grad_outputs,
                       python_side_effects=request.python_side_effects, split_rows=head_chunks,
                       outputs=request.outputs, split_mlp=mlp_chunks)

    loop = training_loop(list(model.parameters()), request.optimizer, request.grad_accumulation)

    def replan(larger: CapturedStep) -> Plan:
        return plan_graph(larger.graph, request.budget, request.solver, request.solver_options,
                          graph_nodes=len(larger.gm.graph.nodes), allocator=request.allocator, loop=loop,
                          **request.offload_settings)

    def reschedule(smaller: CapturedStep, planned: Plan, message: str) -> Plan:
        return plan_for_schedule(smaller.graph, planned.schedule, planned.budget_bytes, planned, message=message,
                                 link=offload_link_of(request.offload, request.link))

    shapes = ShapePolicy(static=static, on_larger=on_larger, recapture=None if static else recapture,
                         replan=replan, reschedule=reschedule)
    return RematModule(model, captured, plan, example_inputs, example_kwargs, shapes)


def _as_tuple(example_inputs) -> tuple:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def capture_and_plan(model, example_inputs: tuple, example_kwargs: dict | None,
                     request: PlanRequest) -> tuple[CapturedStep, Plan]:
    """Capture the step and plan it (for each row split asked for: see `optimizer.split_plan`;
    with none asked for, split only when no whole-tensor plan fits); a malformed split or
    outputs fails before the (slow) capture."""
    check_split(request.split, request.split_mlp)
    check_outputs(request.outputs)
    check_optimizer(request.optimizer)
    loop = training_loop(list(model.parameters()), request.optimizer, request.grad_accumulation)

    def capture_split(chunks: int, mlp_chunks: int) -> CapturedStep:
        return capture_with_costs(model, example_inputs, example_kwargs, request.cost_model, request.grad_outputs,
                                  request.python_side_effects, split_rows=chunks, outputs=request.outputs,
                                  split_mlp=mlp_chunks)

    plan_captured, recompute_only = step_planners(request.solver, request.solver_options, request.allocator, loop,
                                                  request.offload_settings)
    captured, plan = plan_step(capture_split, plan_captured, request.budget, request.split, request.split_mlp,
                               request.allocator, recompute_only)
    if captured.notes:  # what capture changed about the step (use_cache=False), said once
        plan = dataclasses.replace(plan, message="; ".join(filter(None, (plan.message, *captured.notes))))
    return captured, plan


def plan_only(
    model: torch.nn.Module,
    example_inputs: tuple,
    budget: Budget | str | int,
    *,
    example_kwargs: dict | None = None,
    **settings: Any,
) -> Plan:
    """The plan `optimize` would make, without building the module (what-if use); ``settings``
    as `optimize` takes them."""
    request = PlanRequest.of(budget, "plan_only", **measured_link_settings(model, settings))
    return capture_and_plan(model, _as_tuple(example_inputs), example_kwargs, request)[1]
