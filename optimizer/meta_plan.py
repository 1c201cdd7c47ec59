"""Plan a model that does not fit in this machine's memory: shapes only, nothing runs.

The model is built on the meta device (or given as FakeTensors), captured as FakeTensors on CPU
(`frontends.capture.fakify`: the same graph and byte counts as a real capture), planned by a solver
that scales (``hierarchical`` by default) and reported. No parameter, activation or gradient is
ever allocated, so GPT-2-XL's 48 x 1600 training step plans on a laptop.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from frontends.capture.costed_capture import capture_with_costs
from frontends.capture.output_selection import check_outputs
from frontends.capture.step import CapturedStep
from frontends.measure.optimizer_memory import check_optimizer, training_loop
from frontends.torch_compat import FakeTensor, tree_map
from optimizer.split_plan import check_split, falls_back, plan_with_split, split_when_infeasible
from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.ir.plan import Plan
from solvers.ir.plan_text import format_plan
from solvers.planning.planner import plan_graph


@dataclass(frozen=True)
class MetaPlan:
    """A plan made from shapes alone, with what it took to make it."""

    plan: Plan
    capture_s: float
    plan_s: float
    fx_nodes: int
    report: str
    """The CLI's report of the plan (nothing was run: no measured numbers)."""


def _build(model: torch.nn.Module | Callable[[], torch.nn.Module]) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    if not callable(model):
        raise TypeError(f"expected an nn.Module or a function building one, got {type(model).__name__}")
    with torch.device("meta"):  # tied weights stay tied (unlike model.to("meta"))
        built = model()
    if not isinstance(built, torch.nn.Module):
        raise TypeError(f"the model function returned {type(built).__name__}, not an nn.Module")
    return built


def _to_meta(x):
    return x.to("meta") if isinstance(x, torch.Tensor) and not x.is_meta else x


def plan_without_hardware(
    model: torch.nn.Module | Callable[[], torch.nn.Module],
    example_inputs: tuple,
    budget: str | int,
    *,
    solver: str = "hierarchical",
    time_limit: float = 60.0,
    cost_model: str = "auto",
    verbose: bool = False,
    name: str = "model",
    allocator=None,
    grad_outputs: str = "losses",
    optimizer: str | None = None,
    grad_accumulation: int = 1,
    device: str = "cpu",
    offload: bool | str = False,
    link=None,
    host_budget: int | None = None,
    split: int | str | None = None,
    split_mlp: int | str | None = None,
    outputs: str = "all",
) -> MetaPlan:
    """Capture ``model`` on shapes alone and plan it for ``budget`` (report only).

    ``model``: a module on the meta device (or made of FakeTensors), or a function that builds
    it (called under ``torch.device("meta")``). ``example_inputs``: tensors of the right shapes
    and dtypes, on any device (moved to meta). ``cost_model``: ``flops`` or
    ``roofline:<device>`` (``profile`` would have to run the ops). ``allocator``: an
    `solvers.ir.allocator.AllocatorModel` for a CUDA device's rounding and margins.
    ``grad_outputs``: as in `optimizer.optimize`. ``optimizer`` (a description, `OPTIMIZERS`)
    and ``grad_accumulation``: the whole iteration as the budget, the optimizer's memory measured
    on fake parameters of ``device`` (``cuda``: torch's foreach path, step counters on the host).
    ``offload`` (``"auto"`` or False), ``link`` and ``host_budget``: saved values may go to host
    memory and back (`solvers.planning.planner.plan_graph`). ``split`` and ``split_mlp``: the
    LM head + loss and the MLPs in row chunks, as in `optimizer.optimize`; None (both, default)
    splits only when no whole-tensor plan fits (`optimizer.split_plan.split_when_infeasible`:
    the plan's message says so), ``1`` never splits. ``outputs="loss"``: the step returns its
    losses only, so the logits stop counting (`optimizer.optimize`). Capture and planning times
    add up every candidate captured and planned.
    """
    if cost_model == "profile":
        raise ValueError("the profile cost model times ops on a device; plan without hardware "
                         "with cost_model='flops' or 'roofline:<device>'")
    check_optimizer(optimizer)
    check_split(split, split_mlp)
    check_outputs(outputs)
    module = _build(model)
    loop = training_loop(list(module.parameters()), optimizer, grad_accumulation, device=device)
    fake = any(isinstance(t, FakeTensor) for t in [*module.parameters(), *module.buffers()])
    inputs = tuple(example_inputs) if fake else tree_map(_to_meta, tuple(example_inputs))
    capture_s = 0.0

    def capture_split(chunks: int, mlp_chunks: int) -> CapturedStep:
        nonlocal capture_s
        start = time.perf_counter()
        try:
            return capture_with_costs(module, inputs, None, cost_model, grad_outputs, split_rows=chunks,
                                      outputs=outputs, split_mlp=mlp_chunks)
        finally:
            capture_s += time.perf_counter() - start

    options = SolverOptions(time_limit_s=time_limit, verbose=verbose)

    def plan_captured(captured: CapturedStep, budget_or_bytes: str | int) -> Plan:
        return plan_graph(captured.graph, budget_or_bytes, solver, options, graph_nodes=len(captured.gm.graph.nodes),
                          allocator=allocator, loop=loop, offload=offload, link=link, host_budget=host_budget)

    def recompute_only(captured: CapturedStep, budget_or_bytes: str | int) -> Plan:
        return plan_graph(captured.graph, budget_or_bytes, solver, options, graph_nodes=len(captured.gm.graph.nodes),
                          allocator=allocator, loop=loop)

    start = time.perf_counter()
    if falls_back(split, split_mlp):  # unsplit; split only where no whole-tensor plan fits (as optimize does)
        captured = capture_split(1, 1)
        try:
            plan = plan_captured(captured, budget)
        except InfeasibleBudgetError as err:
            captured, plan = split_when_infeasible(capture_split, plan_captured, captured, err, allocator)
        else:
            if plan.offloaded:
                captured, plan = _offload_or_split(captured, plan, capture_split, plan_captured, recompute_only,
                                                   budget, allocator)
    else:
        captured, plan = plan_with_split(capture_split, plan_captured, budget, split, allocator, split_mlp)
    plan_s = time.perf_counter() - start - capture_s
    fx_nodes = len(captured.gm.graph.nodes)
    report = format_plan(plan, name) + f"\n(planned from shapes alone: capture {capture_s:.1f} s, " \
        f"plan {plan_s:.1f} s; nothing was allocated or run)"
    return MetaPlan(plan=plan, capture_s=capture_s, plan_s=plan_s, fx_nodes=fx_nodes, report=report)


def _offload_or_split(unsplit: CapturedStep, offloaded: Plan, capture_split: Callable[[int, int], CapturedStep],
                      plan_captured: Callable[[CapturedStep, str | int], Plan],
                      recompute_only: Callable[[CapturedStep, str | int], Plan], budget: str | int,
                      allocator) -> tuple[CapturedStep, Plan]:
    """The unsplit step fits with offloads: where it fits no other way, splitting (what the planner
    does without offload) is the other way to fit, and may well be cheaper (a tiny step cannot hide
    a copy's latency), so the faster of the two is kept; where a recompute-only plan fits, the
    planner already chose offload over it."""
    try:
        recompute_only(unsplit, budget)
        return unsplit, offloaded
    except InfeasibleBudgetError as err:
        unsplit_error = err
    try:
        split_captured, split_plan = split_when_infeasible(capture_split, plan_captured, unsplit, unsplit_error,
                                                           allocator)
    except InfeasibleBudgetError:
        return unsplit, offloaded
    if split_plan.objective < offloaded.objective:
        return split_captured, dataclasses.replace(split_plan, message="; ".join(filter(None, (
            split_plan.message, f"the unsplit step fits only with offloads, and takes "
                                f"{offloaded.objective:.4g} s that way"))))
    return unsplit, dataclasses.replace(offloaded, message="; ".join(filter(None, (
        offloaded.message, f"faster than splitting the step ({split_plan.objective:.4g} s)"))))
