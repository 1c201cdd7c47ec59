"""The public API: ``optimize(model, example_inputs, budget=...)`` -> a drop-in RematModule."""

from __future__ import annotations

import dataclasses

import torch

from frontends.capture.costed_capture import capture_with_costs
from frontends.capture.output_selection import check_outputs
from frontends.capture.step import CapturedStep, capture
from frontends.graph_runtime.remat_module import RematModule, ShapePolicy
from optimizer.app.split_plan import check_split, chunks_of, plan_with_split
from optimizer.ir.allocator import AllocatorModel
from optimizer.ir.budget import parse_bytes
from optimizer.ir.plan import Plan
from optimizer.planning.planner import plan_graph
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
    cost_model: str = "flops",
    allocator: AllocatorModel | None = None,
    milp_engine: str = "auto",
    grad_outputs: str = "losses",
    python_side_effects: str = "error",
    static: bool = False,
    on_larger: str = "error",
    split: str | int | None = None,
    outputs: str = "all",
    split_mlp: str | int | None = None,
):
    """Plan ``model``'s training step to fit ``budget`` and return the rewritten module.

    ``budget`` is peak bytes of one training step (parameters, gradients, inputs and
    activations): an integer, a string such as ``"16GB"`` (powers of 10) or ``"2GiB"``
    (powers of 2), or a percentage of plain autograd's peak (``"60%"``). ``solver`` is one of
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

    Input sizes (docs/python-api.md "Input sizes"): the module runs inputs of any size up to the planned
    one in every dimension (a smaller last batch, a shorter sequence) with the planned schedule,
    captured again once per new size and simulated there, so the peak never exceeds the planned
    one. A larger input raises `frontends.graph_runtime.remat_module.InputMismatchError` naming the planned
    sizes (``on_larger="error"``) or is planned afresh at ``budget`` (``"replan"``); the last 8
    sizes are kept. ``static=True`` runs the planned sizes only.

    ``split`` (docs/python-api.md "Splitting huge ops"): ``k`` runs the LM head and its loss in k chunks of
    token rows, so the whole logits, log-softmax and gradient no longer set the memory floor
    (`frontends.split.row_split`); ``"auto"`` plans k in `optimizer.app.split_plan.SPLIT_CHOICES` and
    keeps the cheapest plan that fits (the message says which k); None (default): no split.
    ``split_mlp`` likewise runs every MLP (``linear -> gelu/silu/... -> linear``, SwiGLU too) in
    m chunks of token rows (`frontends.split.mlp_split`), so its wide intermediate exists one chunk at
    a time where the plan recomputes it; None (default) means 1, or, under ``split="auto"``, that
    the MLPs are searched too (m = 2, 4, 8 with the head's best k).
    ``outputs="loss"`` (docs/python-api.md "Splitting huge ops") plans and returns the scalar losses only: the
    other returned tensors (the logits) are dropped from the step, so their memory stops counting,
    and ``rm(...)`` gives back the same structure with None in their place (a transformers
    ``ModelOutput`` with only ``loss`` set); ``"all"`` (default) returns everything.
    """
    example_inputs = _as_tuple(example_inputs)
    options = SolverOptions(time_limit_s=time_limit, threads=threads, verbose=verbose, milp_engine=milp_engine)
    ShapePolicy(on_larger=on_larger)  # a bad on_larger fails before the (slow) capture
    captured, plan = _capture_and_plan(model, example_inputs, example_kwargs, budget, solver,
                                       options, cost_model, allocator, grad_outputs, python_side_effects,
                                       split, outputs, split_mlp)
    head_chunks, mlp_chunks = chunks_of(captured)

    def recapture(args: tuple, kwargs: dict) -> CapturedStep:
        return capture(model, args, kwargs, cost_model=captured.cost_model, grad_outputs=grad_outputs,
                       python_side_effects=python_side_effects, split_rows=head_chunks,
                       outputs=outputs, split_mlp=mlp_chunks)

    def replan(larger: CapturedStep) -> Plan:
        return plan_graph(larger.graph, budget, solver, options,
                          graph_nodes=len(larger.gm.graph.nodes), allocator=allocator)

    shapes = ShapePolicy(static=static, on_larger=on_larger, recapture=None if static else recapture,
                         replan=replan)
    return RematModule(model, captured, plan, example_inputs, example_kwargs, shapes)


def _as_tuple(example_inputs) -> tuple:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _capture_and_plan(model, example_inputs: tuple, example_kwargs: dict | None, budget,
                      solver: str, options: SolverOptions, cost_model: str,
                      allocator: AllocatorModel | None, grad_outputs: str = "losses",
                      python_side_effects: str | None = None, split: str | int | None = None,
                      outputs: str = "all", split_mlp: str | int | None = None):
    """Capture the step and plan it (for each row split asked for: see `optimizer.app.split_plan`);
    a malformed budget or split fails before the (slow) capture."""
    if not (isinstance(budget, str) and budget.strip().endswith("%")):
        parse_bytes(budget)
    check_split(split, split_mlp)
    check_outputs(outputs)

    def capture_split(chunks: int, mlp_chunks: int) -> CapturedStep:
        return capture_with_costs(model, example_inputs, example_kwargs, cost_model, grad_outputs,
                                  python_side_effects, split_rows=chunks, outputs=outputs,
                                  split_mlp=mlp_chunks)

    def plan_captured(captured: CapturedStep, budget_or_bytes) -> Plan:
        return plan_graph(captured.graph, budget_or_bytes, solver, options,
                          graph_nodes=len(captured.gm.graph.nodes), allocator=allocator)

    if split is None and split_mlp is None:
        captured = capture_split(1, 1)
        plan = plan_captured(captured, budget)
    else:
        captured, plan = plan_with_split(capture_split, plan_captured, budget, split, allocator, split_mlp)
    if captured.notes:  # what capture changed about the step (use_cache=False), said once
        plan = dataclasses.replace(plan, message="; ".join(filter(None, (plan.message, *captured.notes))))
    return captured, plan


def plan_only(
    model: torch.nn.Module,
    example_inputs: tuple,
    budget: str | int,
    *,
    example_kwargs: dict | None = None,
    solver: str = "auto",
    time_limit: float = 60.0,
    threads: int = 1,
    verbose: bool = False,
    cost_model: str = "flops",
    allocator: AllocatorModel | None = None,
    milp_engine: str = "auto",
    grad_outputs: str = "losses",
    python_side_effects: str = "error",
    split: str | int | None = None,
    outputs: str = "all",
    split_mlp: str | int | None = None,
) -> Plan:
    """The plan `optimize` would make, without building the module (what-if use)."""
    options = SolverOptions(time_limit_s=time_limit, threads=threads, verbose=verbose, milp_engine=milp_engine)
    return _capture_and_plan(model, _as_tuple(example_inputs), example_kwargs, budget, solver,
                             options, cost_model, allocator, grad_outputs, python_side_effects, split,
                             outputs, split_mlp)[1]
