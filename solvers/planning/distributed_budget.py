"""Per-rank budgets for data-parallel training: what DDP and FSDP2 keep resident on each rank.

The budget is bytes of one rank's device memory. Data parallelism changes the resident terms
around the activations, not the activations themselves (each rank runs the same graph on its own
micro-batch), so a plan for the rank is a plan of the captured graph with the budget moved by the
difference between the rank's resident terms and the single-process ones the graph accounts for
(full parameters resident, full gradients produced by backward):

* **DDP** keeps a full parameter replica and full gradients, plus the reducer's flat gradient
  buckets (``bucket_cap_mb``, default 25 MiB, a 1 MiB first bucket): together one more copy of
  the gradients, allocated when DDP wraps the model (measured: 1,348,096 B for the GPT example's
  1,348,096 B of gradients); ``gradient_as_bucket_view=True`` makes the gradients views into the
  buckets and removes that copy (construction then allocates ~0 B; its step is not measured).
* **FSDP2** (``fully_shard``) keeps 1/N of every trained parameter and gradient (padded to a
  multiple of N) and, around them, buffers that live only in some phases, so the rank's peak is
  the largest of three phase peaks of the plan, each moved by what FSDP adds then
  (`rank_offsets`). A remat-opt module wrapped as one unit (``fully_shard(rm)``, the root)
  gathers every parameter before forward and keeps them unsharded until backward ends; the
  all-gather's output buffer (N x padded shard) stays alive through the whole forward (the
  root frees it in its post-forward hook); after backward FSDP frees the unsharded parameters
  and then allocates the reduce-scatter input (N x padded gradient shard) while the full
  gradients still live. Measured on two gloo
  ranks with `frontends.measure.resize_tracker` (FSDP2 grows and frees its unsharded parameters with
  ``storage.resize_``, which a dispatch-mode tracker does not see): see tests/frontends/distributed/test_distributed.py.

With a `TrainingLoop` (an optimizer, gradient accumulation: `solvers.planning.training_loop`) the
budget is the rank's whole iteration (`rank_loop_terms`):

* **DDP**: every rank runs the optimizer on its full replica: the full state, and the step's
  temporaries on full gradients, beside the buckets. Accumulation holds full gradients through
  the later micro-batches, with ``no_sync()`` or without (``param.grad`` accumulates either way).
* **FSDP2**: the optimizer sees the DTensor shards, so its state is that of 1/N of each
  parameter (measured over the shards' shapes: `frontends.distributed.rank_loop`), and the step
  runs after backward on the parameter and gradient shards alone (the unsharded parameters and
  full gradients are gone). Accumulation holds the gradient shards (FSDP2 reduce-scatters every
  micro-batch and adds into ``sharded_param.grad``), or, with ``set_requires_gradient_sync(False)``
  on all micro-batches but the last (``no_sync=True``), full unsharded gradients (FSDP2 keeps
  ``unsharded_param.grad`` across them and reduce-scatters the sum in the last).

Measured on two gloo ranks, examples/gpt.py, three AdamW iterations (tests/frontends/distributed/
test_distributed_optimizer.py): each rank's forward+backward peak equals the prediction to the
byte for DDP (k=1; k=2 with ``no_sync``) and FSDP2 (k=1; k=2 with and without ``no_sync``); the step's peak is
predicted with the outputs of the last micro-batch still held, as the single-process loop is.

Imports no torch.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass

from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.baselines import store_all_schedule
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import format_bytes, resolve_budget
from solvers.ir.graph import RematGraph
from solvers.ir.link import Link, offload_link_of
from solvers.ir.plan import Plan
from solvers.ir.schedule import StepKind
from solvers.ir.simulator import simulate
from solvers.planning.planner import plan_graph
from solvers.planning.training_loop import TrainingLoop

DDP_BUCKET_CAP_BYTES = 25 * 2**20
"""``DistributedDataParallel(bucket_cap_mb=25)``: torch reads the cap as MiB."""


class Strategy(enum.Enum):
    SINGLE = "single"
    DDP = "ddp"
    FSDP = "fsdp"


@dataclass(frozen=True, kw_only=True)
class DataParallelConfig:
    """How the model is replicated or sharded across ranks."""

    world_size: int
    """Ranks the model is replicated (DDP) or sharded (FSDP) over."""
    strategy: Strategy
    unit_bytes: tuple[int, ...] = ()
    """FSDP: full parameter bytes of each ``fully_shard`` unit; empty: one unit, all parameters."""
    prefetch: bool = True
    """FSDP: the next unit is all-gathered while one runs (two units in flight)."""
    gradient_as_bucket_view: bool = False
    """DDP: gradients are views into the buckets (no second copy of the gradients)."""
    bucket_cap_bytes: int = DDP_BUCKET_CAP_BYTES
    no_sync: bool = False
    """Gradient accumulation reduces only the last micro-batch (DDP's ``no_sync()``, FSDP2's
    ``set_requires_gradient_sync(False)``): FSDP2 then accumulates full, unsharded gradients."""

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, Strategy):
            object.__setattr__(self, "strategy", parse_strategy(self.strategy))
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world size must be a positive integer, got {self.world_size!r}")
        if self.strategy is Strategy.SINGLE and self.world_size != 1:
            raise ValueError("strategy 'single' runs on one rank: use --strategy ddp or fsdp")
        if any(b < 0 for b in self.unit_bytes) or self.bucket_cap_bytes <= 0:
            raise ValueError("unit and bucket sizes must be positive byte counts")


def parse_strategy(name: str | Strategy) -> Strategy:
    try:
        return name if isinstance(name, Strategy) else Strategy(str(name).strip().lower())
    except ValueError:
        raise ValueError(f"unknown strategy {name!r}: choose one of "
                         f"{', '.join(s.value for s in Strategy)}") from None


@dataclass(frozen=True)
class RankBreakdown:
    """One rank's budget: what data parallelism keeps resident, and what is left for activations."""

    budget_bytes: int
    world_size: int
    strategy: str
    parameters_bytes: int
    """Resident parameters and buffers on this rank (FSDP: its shards; DDP: a full replica)."""
    gradients_bytes: int
    """Gradients this rank keeps after the step (FSDP: its shards; DDP: full)."""
    communication_bytes: int
    """FSDP: all-gathered parameters in flight and the unit's gradients before reduce-scatter;
    DDP: the reducer's gradient buckets."""
    inputs_bytes: int
    activations_bytes: int
    """What is left of the budget for activations (may be negative)."""
    optimizer: str = "not counted"
    """The optimizer whose state this rank holds (measured over what the rank's optimizer sees)."""
    optimizer_bytes: int = 0
    """Its state on this rank (FSDP: of the shards; DDP: of the full replica)."""
    optimizer_step_bytes: int = 0
    """What its step allocates and frees on this rank."""
    grad_accumulation: int = 1
    accumulated_gradients_bytes: int = 0
    """Gradients held through the later micro-batches (FSDP: shards, or full with ``no_sync``)."""

    @property
    def fixed_bytes(self) -> int:
        return (self.parameters_bytes + self.gradients_bytes + self.communication_bytes + self.inputs_bytes
                + self.optimizer_bytes + self.accumulated_gradients_bytes)


def _shard(n_bytes: int, world_size: int) -> int:
    return -(-n_bytes // world_size)  # FSDP pads each parameter to a multiple of the world size


def _fsdp_units(graph: RematGraph, config: DataParallelConfig) -> tuple[int, ...]:
    return config.unit_bytes or (graph.gradient_bytes,)


def rank_breakdown(graph: RematGraph, budget_bytes: int, config: DataParallelConfig,
                   loop: TrainingLoop | None = None) -> RankBreakdown:
    """The per-rank terms for ``graph``'s parameters and gradients under ``config``, and
    ``loop``'s optimizer state and accumulated gradients (`rank_loop_terms`)."""
    params, grads = graph.parameter_bytes, graph.gradient_bytes
    if config.strategy is Strategy.FSDP:
        units = _fsdp_units(graph, config)
        largest = max(units)
        in_flight = largest * (2 if config.prefetch and len(units) > 1 else 1)
        # FSDP shards the parameters that train (the gradients' bytes); buffers stay whole.
        resident_params = _shard(grads, config.world_size) + (params - grads)
        resident_grads = _shard(grads, config.world_size)
        communication = in_flight + config.world_size * _shard(largest, config.world_size)
    elif config.strategy is Strategy.DDP:
        resident_params, resident_grads = params, grads
        communication = 0 if config.gradient_as_bucket_view else grads
    else:
        resident_params, resident_grads, communication = params, grads, 0
    terms = rank_loop_terms(graph, config, loop or TrainingLoop())
    opt = terms.loop.optimizer
    fixed = (resident_params + resident_grads + communication + graph.input_bytes + terms.held_bytes)
    return RankBreakdown(
        budget_bytes=budget_bytes, world_size=config.world_size, strategy=config.strategy.value,
        parameters_bytes=resident_params, gradients_bytes=resident_grads,
        communication_bytes=communication, inputs_bytes=graph.input_bytes,
        activations_bytes=budget_bytes - fixed, optimizer=opt.name if opt else "not counted",
        optimizer_bytes=opt.state_bytes if opt else 0, optimizer_step_bytes=opt.step_bytes if opt else 0,
        grad_accumulation=terms.loop.grad_accumulation, accumulated_gradients_bytes=terms.accumulated_bytes,
    )


@dataclass(frozen=True)
class RankLoopTerms:
    """What a rank's training loop adds to the captured step (`solvers.planning.training_loop`)."""

    loop: TrainingLoop
    """The loop, its optimizer measured over what this rank's optimizer sees."""
    accumulated_bytes: int
    """Gradients held through every phase of the later micro-batches (0 without accumulation)."""
    step_offset: int
    """What the strategy adds to the single-process state at the optimizer step: DDP's buckets;
    FSDP's shards of parameters and gradients in place of the full ones (negative)."""

    @property
    def held_bytes(self) -> int:
        """Held beside every phase of the worst micro-batch: optimizer state, accumulated gradients."""
        return (self.loop.optimizer.state_bytes if self.loop.optimizer else 0) + self.accumulated_bytes

    def step_peak(self, graph: RematGraph, end_bytes: int) -> int:
        """The optimizer step's peak on the rank, from the plan's live bytes when backward ends
        (one process's accounting); 0 without an optimizer."""
        if self.loop.optimizer is None:
            return 0
        return self.loop.step_peak_bytes(end_bytes, graph) + self.step_offset


def rank_loop_terms(graph: RematGraph, config: DataParallelConfig, loop: TrainingLoop) -> RankLoopTerms:
    """``loop`` on a rank under ``config``: accumulated gradients (FSDP: shards, or full with
    ``no_sync``; DDP: full) and the step's offset (see the module docstring)."""
    grads = graph.gradient_bytes
    accumulated = 0
    if loop.grad_accumulation > 1:
        sharded = config.strategy is Strategy.FSDP and not config.no_sync
        accumulated = _shard(grads, config.world_size) if sharded else grads
    if config.strategy is Strategy.FSDP:  # parameters and gradients both as shards at the step
        step_offset = 2 * (_shard(grads, config.world_size) - grads)
    elif config.strategy is Strategy.DDP:
        step_offset = 0 if config.gradient_as_bucket_view else grads
    else:
        step_offset = 0
    return RankLoopTerms(loop=loop, accumulated_bytes=accumulated, step_offset=step_offset)


@dataclass(frozen=True)
class PhasePeaks:
    """A schedule's live bytes in the graph's own accounting (full parameters resident)."""

    forward_bytes: int
    """Peak while forward runs."""
    backward_bytes: int
    """Peak while backward runs (from the tangents' arrival on)."""
    end_bytes: int
    """Live when backward ends: resident values, gradients, user outputs."""


def phase_peaks(graph: RematGraph, schedule, link: Link | None = None) -> PhasePeaks:
    """Forward peak, backward peak and final live bytes of ``schedule`` (one simulator walk;
    ``link``: the one a schedule with offloads was planned on)."""
    n_forward = len(schedule.forward)
    peaks = [graph.resident_bytes, 0]
    last = [0]

    def observe(index: int, live_bytes: int, _live, _width: int) -> None:
        phase = 0 if index < n_forward else 1
        peaks[phase] = max(peaks[phase], live_bytes)
        last[0] = live_bytes

    copies = any(s.kind in (StepKind.OFFLOAD, StepKind.RELOAD) for s in schedule.steps)
    simulate(graph, schedule, observe, link if copies else None)
    return PhasePeaks(forward_bytes=peaks[0], backward_bytes=peaks[1], end_bytes=last[0])


@dataclass(frozen=True)
class RankOffsets:
    """Bytes a rank holds beyond the graph's single-process accounting, per phase.

    FSDP2, one unit around the remat module (the root, which FSDP does not reshard after
    forward): the rank keeps its parameter shards throughout; the all-gather's output buffer
    (world size x padded shard) lives through the whole forward (freed by the root's
    post-forward); after backward FSDP frees the unsharded parameters, then allocates the
    reduce-scatter input (world size x padded gradient shard) while the full gradients live.
    Several units: each phase holds the units
    in flight instead of every parameter (not measured). DDP: the buckets, all the time."""

    forward: int
    backward: int
    end: int

    @property
    def worst(self) -> int:
        return max(self.forward, self.backward, self.end)

    def rank_peak(self, peaks: PhasePeaks) -> int:
        return max(peaks.forward_bytes + self.forward, peaks.backward_bytes + self.backward,
                   peaks.end_bytes + self.end)


def rank_offsets(graph: RematGraph, config: DataParallelConfig) -> RankOffsets:
    """What ``config`` adds to each phase's live bytes (negative: holds less than one process)."""
    if config.strategy is Strategy.FSDP:
        world, grads = config.world_size, graph.gradient_bytes
        units = _fsdp_units(graph, config)
        largest = max(units)
        shard = _shard(grads, world)
        gather_buffer = world * _shard(largest, world)
        if len(units) == 1:  # the root unit: every parameter unsharded through forward and backward
            # After backward FSDP frees the unsharded parameters first, then allocates the
            # reduce-scatter input while the full gradients still live.
            return RankOffsets(forward=shard + gather_buffer, backward=shard,
                               end=shard + gather_buffer - grads)
        in_flight = largest * (2 if config.prefetch else 1)
        params = shard - grads + in_flight  # shards, plus the units in flight instead of all
        backward = params + shard - grads + largest  # gradients: shards, one unit's full
        return RankOffsets(forward=params + gather_buffer, backward=backward,
                           end=backward - largest + gather_buffer)
    if config.strategy is Strategy.DDP:
        buckets = 0 if config.gradient_as_bucket_view else graph.gradient_bytes
        return RankOffsets(forward=buckets, backward=buckets, end=buckets)
    return RankOffsets(0, 0, 0)


def rank_offset(graph: RematGraph, config: DataParallelConfig) -> int:
    """The largest per-phase offset (`rank_offsets`): a plan whose single-process peak is
    within ``budget - rank_offset`` keeps the rank within ``budget`` in every phase."""
    return rank_offsets(graph, config).worst


@dataclass(frozen=True)
class RankPlan:
    """A plan for one rank: the graph's plan, and the rank's view of it."""

    plan: Plan
    """The captured step's plan (its budget and peaks are one process's; with a loop, its
    breakdown's optimizer and iteration fields are this rank's)."""
    breakdown: RankBreakdown
    predicted_rank_peak_bytes: int
    """The largest of the plan's phase peaks moved by the rank's offsets (`rank_offsets`) and
    what the loop holds, and the optimizer step's peak on the rank."""
    graph_budget_bytes: int
    """The single-process budget the graph was planned for."""
    phase_peaks: PhasePeaks | None = None
    """The plan's forward, backward and end-of-backward live bytes (one process)."""
    offsets: RankOffsets | None = None
    """What the strategy adds to each phase on a rank."""
    held_bytes: int = 0
    """What the loop holds beside every phase (optimizer state, accumulated gradients)."""
    step_peak_bytes: int = 0
    """The optimizer step's peak on the rank (0: no optimizer counted)."""


def rank_peak(graph: RematGraph, schedule, config: DataParallelConfig, loop: TrainingLoop | None = None) -> int:
    """The rank's predicted iteration peak for ``schedule`` under ``config`` and ``loop``."""
    terms = rank_loop_terms(graph, config, loop or TrainingLoop())
    peaks = phase_peaks(graph, schedule)
    return max(rank_offsets(graph, config).rank_peak(peaks) + terms.held_bytes,
               terms.step_peak(graph, peaks.end_bytes))


def plan_for_rank(graph: RematGraph, budget: int | str, config: DataParallelConfig,
                  solver: str = "auto", options: SolverOptions | None = None,
                  allocator: AllocatorModel | None = None, graph_nodes: int = 0,
                  loop: TrainingLoop | None = None, *, offload: bool | str = False,
                  link: Link | str | None = None, host_budget: int | None = None) -> RankPlan:
    """Plan ``graph`` so that one rank under ``config`` peaks within ``budget`` (bytes, a size,
    or a percentage of the rank's plain-autograd peak). With ``loop`` (its optimizer measured
    over what the rank's optimizer sees: `frontends.distributed.rank_loop`), the budget is the
    rank's whole training iteration (`rank_loop_terms`). ``offload``, ``link``, ``host_budget``:
    as in `plan_graph`; an offloaded value leaves the rank's device as it leaves one process's
    (the rank's terms are parameters, gradients and communication, which stay)."""
    offload_link = offload_link_of(offload, link)
    offsets = rank_offsets(graph, config)
    terms = rank_loop_terms(graph, config, loop or TrainingLoop())
    held = terms.held_bytes
    store_all_peaks = phase_peaks(graph, store_all_schedule(graph))
    store_all_step = terms.step_peak(graph, store_all_peaks.end_bytes)
    store_all = max(offsets.rank_peak(store_all_peaks) + held, store_all_step)
    budget_bytes = resolve_budget(budget, store_all)
    breakdown = rank_breakdown(graph, budget_bytes, config, terms.loop)
    where = f"{config.strategy.value} on {config.world_size} ranks"
    if store_all_step > budget_bytes:  # the step's peak hardly depends on the schedule
        raise InfeasibleBudgetError(budget_bytes, None, f": the optimizer step alone peaks at {store_all_step} "
                                    f"bytes per rank ({where}: parameters, gradients, optimizer state and "
                                    "the step's temporaries)", lower_bound_bytes=store_all_step)
    # The offsets differ by phase: plan for the smallest, then lower the graph's budget by what
    # the rank overshoots in another phase (a forward peak under FSDP's gather buffer).
    graph_budget = budget_bytes - min(offsets.forward, offsets.backward, offsets.end) - held
    fit = functools.partial(_fit_rank, graph, budget_bytes, graph_budget, solver, options or SolverOptions(),
                            allocator, graph_nodes, offsets, terms, breakdown, where)
    if offload_link is None:
        return fit()
    # At the first graph budget plan_graph already keeps the faster of the offload and the
    # recompute-only plan. But an offload plan can peak in another phase and need a lower graph
    # budget, where it may not fit at all: then the recompute-only rank plan is planned too, and
    # the faster of the two that fit is kept.
    try:
        offloaded = fit(offload=offload, link=offload_link, host_budget=host_budget)
    except InfeasibleBudgetError:
        offloaded = None
    if offloaded is not None and offloaded.graph_budget_bytes == graph_budget:
        return offloaded
    try:
        plain = fit()
    except InfeasibleBudgetError:
        if offloaded is None:
            raise
        return offloaded
    return plain if offloaded is None else min(offloaded, plain, key=lambda ranked: ranked.plan.extra_time_s)


def _fit_rank(graph: RematGraph, budget_bytes: int, graph_budget: int, solver: str, options: SolverOptions,
              allocator: AllocatorModel | None, graph_nodes: int, offsets: RankOffsets, terms: RankLoopTerms,
              breakdown: RankBreakdown,
              where: str, *, offload: bool | str = False, link: Link | None = None,
              host_budget: int | None = None) -> RankPlan:
    """A plan of ``graph`` whose rank peak fits ``budget_bytes``: planned at ``graph_budget``,
    then replanned lower by each overshoot (at most `_REPLANS` tries)."""
    for _ in range(_REPLANS):
        if graph_budget <= graph.resident_bytes:
            raise InfeasibleBudgetError(budget_bytes, None, f" ({where} keeps {breakdown.fixed_bytes} "
                                        "bytes resident)")
        try:
            plan = plan_graph(graph, graph_budget, solver, options, graph_nodes=graph_nodes, allocator=allocator,
                              offload=offload, link=link, host_budget=host_budget)
        except InfeasibleBudgetError as err:
            smallest = (None if err.smallest_feasible_bytes is None
                        else err.smallest_feasible_bytes + budget_bytes - graph_budget)
            raise InfeasibleBudgetError(budget_bytes, smallest, f" per rank ({where})") from None
        peaks = phase_peaks(graph, plan.schedule, link)
        forward_backward = offsets.rank_peak(peaks) + terms.held_bytes
        step = terms.step_peak(graph, peaks.end_bytes)
        peak = max(forward_backward, step)
        if peak <= budget_bytes:
            return RankPlan(plan=_with_rank_loop(plan, breakdown, forward_backward, step),
                            breakdown=breakdown, graph_budget_bytes=graph_budget,
                            predicted_rank_peak_bytes=peak, phase_peaks=peaks, offsets=offsets,
                            held_bytes=terms.held_bytes, step_peak_bytes=step)
        # Below the plan's own peak, not the budget it had: a plan well under its graph budget
        # would otherwise come back unchanged, overshooting by as much (seen: 180 B a try).
        graph_budget = min(graph_budget, plan.predicted_peak_bytes) - (peak - budget_bytes)
    raise InfeasibleBudgetError(budget_bytes, None, f" per rank ({where}): no plan found after {_REPLANS} tries")


def _with_rank_loop(plan: Plan, b: RankBreakdown, forward_backward: int, step: int) -> Plan:
    """``plan`` whose breakdown names the rank's optimizer and iteration peaks (when a loop is counted)."""
    if b.optimizer == "not counted" and b.grad_accumulation == 1:
        return plan
    return dataclasses.replace(plan, breakdown=dataclasses.replace(
        plan.breakdown, optimizer=f"{b.optimizer} per rank", optimizer_bytes=b.optimizer_bytes,
        optimizer_step_bytes=b.optimizer_step_bytes, grad_accumulation=b.grad_accumulation,
        accumulated_gradients_bytes=b.accumulated_gradients_bytes,
        forward_backward_peak_bytes=forward_backward, optimizer_step_peak_bytes=step))


_REPLANS = 6
"""Plans tried per rank budget: each lowers the graph's budget by the last overshoot."""


def format_rank_breakdown(ranked: RankPlan) -> str:
    """The per-rank lines of the CLI report (after the plan's own report)."""
    b = ranked.breakdown
    comm = ("unsharded parameters in flight + the all-gather buffer"
            if b.strategy == Strategy.FSDP.value else "gradient buckets")
    held = "shards" if b.strategy == Strategy.FSDP.value else "full replica"
    lines = [
        f"  per rank           {b.strategy} on {b.world_size} ranks, budget {format_bytes(b.budget_bytes)}",
        f"    parameters       {format_bytes(b.parameters_bytes)} ({held})",
        f"    gradients        {format_bytes(b.gradients_bytes)} ({held})",
        f"    communication    {format_bytes(b.communication_bytes)} ({comm})",
        f"    inputs           {format_bytes(b.inputs_bytes)}",
        *_rank_loop_lines(b, held),
        f"    activations      {format_bytes(b.activations_bytes)} left for activations",
        (f"  rank peak          {format_bytes(ranked.predicted_rank_peak_bytes)} planned"
         f" (the graph planned for {format_bytes(ranked.graph_budget_bytes)} in one process)"),
    ]
    if ranked.phase_peaks is not None and ranked.offsets is not None:
        o, p = ranked.offsets, ranked.phase_peaks
        h = ranked.held_bytes
        lines.append(f"    by phase         forward {format_bytes(p.forward_bytes + o.forward + h)}, backward "
                     f"{format_bytes(p.backward_bytes + o.backward + h)}, after backward "
                     f"{format_bytes(p.end_bytes + o.end + h)}"
                     + (f", optimizer step {format_bytes(ranked.step_peak_bytes)}" if ranked.step_peak_bytes else ""))
    return "\n".join(lines)


def _rank_loop_lines(b: RankBreakdown, held: str) -> list[str]:
    """The optimizer's state and the accumulated gradients on the rank, or that none is counted."""
    if b.optimizer == "not counted" and b.grad_accumulation == 1:
        return ["    optimizer        not counted (--optimizer NAME counts its state per rank)"]
    lines = []
    if b.optimizer != "not counted":
        lines.append(f"    optimizer        {format_bytes(b.optimizer_bytes)} state of {b.optimizer} over the "
                     f"{held} (+{format_bytes(b.optimizer_step_bytes)} step temporaries)")
    if b.grad_accumulation > 1:
        lines.append(f"    accumulation     {format_bytes(b.accumulated_gradients_bytes)} of gradients held "
                     f"through {b.grad_accumulation} micro-batches")
    return lines
