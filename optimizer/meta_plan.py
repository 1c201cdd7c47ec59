"""Plan a model that does not fit in this machine's memory: shapes only, nothing runs.

The model is built on the meta device (or given as FakeTensors), captured as FakeTensors on CPU
(`frontends.capture.fakify`: the same graph and byte counts as a real capture), planned by a solver
that scales (``hierarchical`` by default) and reported. No parameter, activation or gradient is
ever allocated, so GPT-2-XL's 48 x 1600 training step plans on a laptop.

Per data-parallel rank (DDP, FSDP2): `plan_rank_without_hardware` plans one rank of the same
capture with `solvers.planning.distributed_budget.plan_for_rank`, the optimizer measured over
what the rank steps; `largest_rank_batch` finds the largest micro-batch per rank that fits a
named GPU's memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from frontends.capture.costed_capture import capture_with_costs
from frontends.capture.meta_capture import MetaCapturer
from frontends.capture.output_selection import check_outputs
from frontends.capture.step import CapturedStep
from frontends.distributed.rank_loop import rank_training_loop
from frontends.measure.optimizer_memory import check_optimizer, training_loop
from frontends.torch_compat import FakeTensor, tree_map
from optimizer.split_plan import check_split, plan_step, step_planners
from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.checkmate.min_budget import peak_lower_bound
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import format_bytes
from solvers.ir.graph import RematGraph
from solvers.ir.plan import Plan
from solvers.ir.plan_text import format_plan
from solvers.planning.batch_scaling import ScalingMismatch
from solvers.planning.batch_search import DEFAULT_LIMIT, WhatIfError, search_max_batch, search_near
from solvers.planning.distributed_budget import (
    DataParallelConfig,
    RankPlan,
    format_rank_breakdown,
    plan_for_rank,
    rank_loop_terms,
    rank_offsets,
)


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


def _prepare(model: torch.nn.Module | Callable[[], torch.nn.Module], example_inputs: tuple, cost_model: str,
             optimizer: str | None, outputs: str) -> tuple[torch.nn.Module, tuple]:
    """The checked settings, the module on meta (or fake) and its inputs on meta."""
    if cost_model == "profile":
        raise ValueError("the profile cost model times ops on a device; plan without hardware "
                         "with cost_model='flops' or 'roofline:<device>'")
    check_optimizer(optimizer)
    check_outputs(outputs)
    module = _build(model)
    fake = any(isinstance(t, FakeTensor) for t in [*module.parameters(), *module.buffers()])
    return module, tuple(example_inputs) if fake else tree_map(_to_meta, tuple(example_inputs))


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
    check_split(split, split_mlp)
    module, inputs = _prepare(model, example_inputs, cost_model, optimizer, outputs)
    loop = training_loop(list(module.parameters()), optimizer, grad_accumulation, device=device)
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

    plan_captured, recompute_only = step_planners(solver, options, allocator, loop,
                                                  {"offload": offload, "link": link, "host_budget": host_budget})
    start = time.perf_counter()
    captured, plan = plan_step(capture_split, plan_captured, budget, split, split_mlp, allocator, recompute_only)
    plan_s = time.perf_counter() - start - capture_s
    fx_nodes = len(captured.gm.graph.nodes)
    report = format_plan(plan, name) + f"\n(planned from shapes alone: capture {capture_s:.1f} s, " \
        f"plan {plan_s:.1f} s; nothing was allocated or run)"
    return MetaPlan(plan=plan, capture_s=capture_s, plan_s=plan_s, fx_nodes=fx_nodes, report=report)


@dataclass(frozen=True)
class MetaRankPlan:
    """One data-parallel rank planned from shapes alone (`plan_rank_without_hardware`)."""

    ranked: RankPlan
    """The captured step's plan and the rank's view of it (breakdown, phase peaks, rank peak)."""
    capture_s: float
    plan_s: float
    fx_nodes: int
    report: str
    """The plan's report followed by the per-rank lines (`format_rank_breakdown`)."""


def plan_rank_without_hardware(
    model: torch.nn.Module | Callable[[], torch.nn.Module],
    example_inputs: tuple,
    budget: str | int,
    config: DataParallelConfig,
    *,
    solver: str = "hierarchical",
    options: SolverOptions | None = None,
    cost_model: str = "auto",
    name: str = "model",
    allocator=None,
    grad_outputs: str = "losses",
    optimizer: str | None = None,
    grad_accumulation: int = 1,
    device: str = "cpu",
    outputs: str = "all",
    offload: bool | str = False,
    link=None,
    host_budget: int | None = None,
) -> MetaRankPlan:
    """Capture ``model`` on shapes alone and plan one rank of ``config`` for a per-rank ``budget``.

    The same capture as `plan_without_hardware`, planned by `plan_for_rank`, so the per-rank
    terms are those of a captured model file (`optimizer.ranks.plan_model_for_rank`): the
    optimizer (a description) is measured on fake parameters of ``device`` over what the rank
    steps (FSDP: its shards, `frontends.distributed.rank_loop`). ``example_inputs``: one rank's
    micro-batch. ``offload``, ``link``, ``host_budget``: as in `plan_without_hardware`. Splits
    are not planned per rank (the rank budget's terms are measured for whole-tensor steps)."""
    module, inputs = _prepare(model, example_inputs, cost_model, optimizer, outputs)
    loop = rank_training_loop(list(module.parameters()), optimizer, grad_accumulation, config, device=device)
    start = time.perf_counter()
    captured = capture_with_costs(module, inputs, None, cost_model, grad_outputs, outputs=outputs)
    capture_s = time.perf_counter() - start
    ranked = plan_for_rank(captured.graph, budget, config, solver, options or SolverOptions(), allocator,
                           graph_nodes=len(captured.gm.graph.nodes), loop=loop, offload=offload, link=link,
                           host_budget=host_budget)
    plan_s = time.perf_counter() - start - capture_s
    report = (format_plan(ranked.plan, name) + "\n" + format_rank_breakdown(ranked)
              + f"\n(planned from shapes alone: capture {capture_s:.1f} s, plan {plan_s:.1f} s; "
                "nothing was allocated or run)")
    return MetaRankPlan(ranked=ranked, capture_s=capture_s, plan_s=plan_s,
                        fx_nodes=len(captured.gm.graph.nodes), report=report)


@dataclass(frozen=True)
class RankBatchFit:
    """The largest per-rank micro-batch whose rank plan fits the budget (`largest_rank_batch`)."""

    budget_bytes: int
    world_size: int
    strategy: str
    batch_dim: int
    base_batch: int
    """The example inputs' batch."""
    max_batch: int
    """0 when not even a micro-batch of 1 fits."""
    capped: bool
    """``limit`` fits: the true largest batch may be larger."""
    ranked: RankPlan | None
    """The rank's plan at ``max_batch`` (None when it is 0)."""
    probes: tuple[tuple[int, bool], ...]
    """(batch, fits) in the order the search tried them."""
    smallest_budget_bytes: int | None = None
    """When nothing fits: the smallest per-rank budget known to fit a micro-batch of 1, if known."""


def largest_rank_batch(
    model: torch.nn.Module | Callable[[], torch.nn.Module],
    example_inputs: tuple,
    budget: int,
    config: DataParallelConfig,
    *,
    solver: str = "hierarchical",
    options: SolverOptions | None = None,
    cost_model: str = "auto",
    allocator=None,
    optimizer: str | None = None,
    grad_accumulation: int = 1,
    device: str = "cpu",
    dtype: str | None = None,
    batch_dim: int | None = None,
    limit: int = DEFAULT_LIMIT,
    offload: bool | str = False,
    link=None,
    host_budget: int | None = None,
) -> RankBatchFit:
    """The largest micro-batch per rank of ``config`` whose rank plan (`plan_for_rank`, the
    rank's optimizer and accumulation counted) fits ``budget`` bytes per rank.

    Each probed batch is planned for the rank on the meta device (`MetaCapturer`): the search
    (`search_max_batch`) starts at the example's batch, doubles or halves, then bisects, on the
    graphs `MetaCapturer.fit_scaling` predicts from two captures; a capture right above the
    answer checks the fit, and the answer and the next batch are confirmed on checked graphs
    (else every probe is captured). The rank's optimizer does not depend on the batch, so it is
    measured once. ``dtype``: a ``--dtype`` name (`DTYPES`) the parameters and inputs are cast to.
    ``offload``, ``link``, ``host_budget``: as in `plan_without_hardware`; the recompute-only
    answer is searched first, then the batches above it with offloads (`_search_offloads_above`).
    """
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
        raise ValueError(f"the largest-batch search needs a per-rank budget in bytes, got {budget!r}: a "
                         "percentage of store-all's peak changes with the batch")
    module, inputs = _prepare(model, example_inputs, cost_model, optimizer, "all")
    capturer = MetaCapturer(module, inputs, batch_dim=batch_dim, dtype=dtype, cost_model=cost_model)
    if capturer.base_batch is None:
        raise WhatIfError("no input has a batch dimension to grow: give the inputs' batch dimension")
    loop = rank_training_loop(list(capturer.model.parameters()), optimizer, grad_accumulation, config,
                              device=device)
    plans: dict[int, RankPlan] = {}
    smallest: list[int | None] = [None]
    nodes = len(capturer.at().gm.graph.nodes)  # reported only: the fitted graphs have no fx graph

    def fits_graph(batch: int, graph: RematGraph, offloads: bool = False) -> bool:
        plans.pop(batch, None)
        if _below_lower_bound(graph, budget, config, loop, allocator):
            return False
        settings = {"offload": offload, "link": link, "host_budget": host_budget} if offloads else {}
        try:
            plans[batch] = plan_for_rank(graph, budget, config, solver, options or SolverOptions(), allocator,
                                         graph_nodes=nodes, loop=loop, **settings)
        except InfeasibleBudgetError as err:
            if batch == 1:
                smallest[0] = err.smallest_feasible_bytes or err.lower_bound_bytes
            return False
        return True

    def fits(batch: int) -> bool:  # a checked fit's graph, or a capture
        return fits_graph(batch, capturer.graph_at(batch))

    def _with_offloads(best: int, capped: bool, probes: tuple) -> RankBatchFit:
        if offload:
            best, capped, probes = _search_offloads_above(fits_graph, capturer.graph_at, best, capped, probes, limit)
        return _rank_batch_fit(budget, config, capturer, best, capped, plans.get(best), probes, smallest[0])

    start = min(capturer.base_batch, limit)
    if capturer.fit_scaling():
        # Search on the fit's extrapolation (no capture per probe), then check the fit by a capture
        # right above the answer and confirm the answer and the batch after it on checked graphs.
        def fits_predicted(batch: int) -> bool:
            covered = capturer.scaling.covers(batch)
            return fits_graph(batch, capturer.graph_at(batch) if covered else capturer.predicted_at(batch))

        try:
            best, capped, probes = search_max_batch(fits_predicted, limit, start=start)
        except ScalingMismatch:  # the extrapolation left whole numbers: the fit cannot be right
            capturer.scaling = None
        if capturer.scaling is not None and (capturer.check_scaling(min(best + 1, limit)) and (best == 0 or fits(best))
                and (capped or not fits(best + 1))):
            return _with_offloads(best, capped, probes)
    best, capped, probes = search_max_batch(fits, limit, start=start)  # every probe captured (or checked)
    return _with_offloads(best, capped, probes)


def _search_offloads_above(fits_graph, graph_at, best: int, capped: bool, probes: tuple,
                           limit: int) -> tuple[int, bool, tuple]:
    """From the recompute-only answer ``best``, the largest batch a rank plan with offloads fits.

    A rank plan with offloads is never slower than the recompute-only one, and fits wherever it
    fits (`plan_for_rank` keeps the faster of the two that fit), so only batches above ``best``
    are probed; an answer above ``best`` was planned with offloads when probed, and ``best`` itself
    is replanned with them (a failing probe costs the solves and the smallest-budget search: a few
    probes, not a whole search)."""
    if capped:
        found = best
    else:
        found, capped, above = search_near(lambda b: b <= best or fits_graph(b, graph_at(b), True), limit,
                                           start=max(best, 1))
        probes = (*probes, *((b, ok) for b, ok in above if b > best))
    if found and found == best:
        fits_graph(found, graph_at(found), True)
    return found, capped, probes


def _rank_batch_fit(budget: int, config: DataParallelConfig, capturer: MetaCapturer, best: int, capped: bool,
                    ranked: RankPlan | None, probes: tuple, smallest: int | None) -> RankBatchFit:
    return RankBatchFit(
        budget_bytes=budget, world_size=config.world_size, strategy=config.strategy.value,
        batch_dim=capturer.batch_dim, base_batch=capturer.base_batch, max_batch=best, capped=capped,
        ranked=ranked, probes=probes, smallest_budget_bytes=smallest)


def _below_lower_bound(graph, budget: int, config: DataParallelConfig, loop, allocator) -> bool:
    """No schedule of ``graph`` fits the rank: the bound on every schedule's peak is above the graph
    budget `plan_for_rank` starts from (what it would find, minus its solves and min-budget search)."""
    allocator = allocator or AllocatorModel(block_bytes=1)
    offsets = rank_offsets(graph, config)
    held = rank_loop_terms(graph, config, loop).held_bytes
    graph_budget = budget - min(offsets.forward, offsets.backward, offsets.end) - held
    return peak_lower_bound(allocator.apply(graph)) > allocator.solver_budget(graph_budget)


def format_rank_batch(fit: RankBatchFit, name: str) -> str:
    """The CLI's answer to ``--max-batch`` per rank: the batch, its plan's extra time, the terms."""
    where = f"{fit.strategy} on {fit.world_size} ranks"
    tried = ", ".join(f"{b}{'' if ok else ' (no)'}" for b, ok in fit.probes)
    if not fit.max_batch or fit.ranked is None:
        hint = (f"; a micro-batch of 1 needs {format_bytes(fit.smallest_budget_bytes)} per rank"
                if fit.smallest_budget_bytes else "")
        return (f"{name}\n  largest batch      none fits {format_bytes(fit.budget_bytes)} per rank ({where})"
                f"{hint}\n  batches tried      {tried}")
    plan = fit.ranked.plan
    lines = [
        f"{name}",
        f"  largest batch      {fit.max_batch}{' (the search limit)' if fit.capped else ''} per rank "
        f"(dimension {fit.batch_dim}) within {format_bytes(fit.budget_bytes)} per rank ({where}); "
        f"global batch {fit.max_batch * fit.world_size}",
        f"  extra time         {plan.extra_time_s * 1000:.3g} ms of recomputation"
        f"{' and waits for copies' if plan.offloaded else ''} per step "
        f"({plan.extra_percent:.1f}% of a plain {plan.step_time_s * 1000:.3g} ms step, {plan.cost_model})",
        f"  batches tried      {tried}",
        format_plan(plan, f"{name} at batch {fit.max_batch}"),
        format_rank_breakdown(fit.ranked),
    ]
    return "\n".join(lines)
