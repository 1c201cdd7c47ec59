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

Imports no torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.baselines import store_all_schedule
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import format_bytes, resolve_budget
from solvers.ir.graph import RematGraph
from solvers.ir.plan import Plan
from solvers.ir.simulator import simulate
from solvers.planning.planner import plan_graph

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

    @property
    def fixed_bytes(self) -> int:
        return self.parameters_bytes + self.gradients_bytes + self.communication_bytes + self.inputs_bytes


def _shard(n_bytes: int, world_size: int) -> int:
    return -(-n_bytes // world_size)  # FSDP pads each parameter to a multiple of the world size


def _fsdp_units(graph: RematGraph, config: DataParallelConfig) -> tuple[int, ...]:
    return config.unit_bytes or (graph.gradient_bytes,)


def rank_breakdown(graph: RematGraph, budget_bytes: int, config: DataParallelConfig) -> RankBreakdown:
    """The per-rank terms for ``graph``'s parameters and gradients under ``config``."""
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
    fixed = resident_params + resident_grads + communication + graph.input_bytes
    return RankBreakdown(
        budget_bytes=budget_bytes, world_size=config.world_size, strategy=config.strategy.value,
        parameters_bytes=resident_params, gradients_bytes=resident_grads,
        communication_bytes=communication, inputs_bytes=graph.input_bytes,
        activations_bytes=budget_bytes - fixed,
    )


@dataclass(frozen=True)
class PhasePeaks:
    """A schedule's live bytes in the graph's own accounting (full parameters resident)."""

    forward_bytes: int
    """Peak while forward runs."""
    backward_bytes: int
    """Peak while backward runs (from the tangents' arrival on)."""
    end_bytes: int
    """Live when backward ends: resident values, gradients, user outputs."""


def phase_peaks(graph: RematGraph, schedule) -> PhasePeaks:
    """Forward peak, backward peak and final live bytes of ``schedule`` (one simulator walk)."""
    n_forward = len(schedule.forward)
    peaks = [graph.resident_bytes, 0]
    last = [0]

    def observe(index: int, live_bytes: int, _live, _width: int) -> None:
        phase = 0 if index < n_forward else 1
        peaks[phase] = max(peaks[phase], live_bytes)
        last[0] = live_bytes

    simulate(graph, schedule, observe)
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
    breakdown: RankBreakdown
    predicted_rank_peak_bytes: int
    """The largest of the plan's phase peaks moved by the rank's offsets (`rank_offsets`)."""
    graph_budget_bytes: int
    """The single-process budget the graph was planned for."""
    phase_peaks: PhasePeaks | None = None
    """The plan's forward, backward and end-of-backward live bytes (one process)."""
    offsets: RankOffsets | None = None
    """What the strategy adds to each phase on a rank."""


def plan_for_rank(graph: RematGraph, budget: int | str, config: DataParallelConfig,
                  solver: str = "auto", options: SolverOptions | None = None,
                  allocator: AllocatorModel | None = None, graph_nodes: int = 0) -> RankPlan:
    """Plan ``graph`` so that one rank under ``config`` peaks within ``budget`` (bytes, a size,
    or a percentage of the rank's plain-autograd peak)."""
    offsets = rank_offsets(graph, config)
    store_all = offsets.rank_peak(phase_peaks(graph, store_all_schedule(graph)))
    budget_bytes = resolve_budget(budget, store_all)
    breakdown = rank_breakdown(graph, budget_bytes, config)
    # The offsets differ by phase: plan for the smallest, then lower the graph's budget by what
    # the rank overshoots in another phase (a forward peak under FSDP's gather buffer).
    graph_budget = budget_bytes - min(offsets.forward, offsets.backward, offsets.end)
    for _ in range(_REPLANS):
        if graph_budget <= graph.resident_bytes:
            raise InfeasibleBudgetError(budget_bytes, None, f" ({config.strategy.value} on "
                                        f"{config.world_size} ranks keeps {breakdown.fixed_bytes} "
                                        "bytes resident)")
        try:
            plan = plan_graph(graph, graph_budget, solver, options or SolverOptions(),
                              graph_nodes=graph_nodes, allocator=allocator)
        except InfeasibleBudgetError as err:
            smallest = (None if err.smallest_feasible_bytes is None
                        else err.smallest_feasible_bytes + budget_bytes - graph_budget)
            raise InfeasibleBudgetError(budget_bytes, smallest, f" per rank ({config.strategy.value}, "
                                        f"{config.world_size} ranks)") from None
        peaks = phase_peaks(graph, plan.schedule)
        rank_peak = offsets.rank_peak(peaks)
        if rank_peak <= budget_bytes:
            return RankPlan(plan=plan, breakdown=breakdown, graph_budget_bytes=graph_budget,
                            predicted_rank_peak_bytes=rank_peak, phase_peaks=peaks, offsets=offsets)
        graph_budget -= rank_peak - budget_bytes
    raise InfeasibleBudgetError(budget_bytes, None, f" per rank ({config.strategy.value}, "
                                f"{config.world_size} ranks): no plan found after {_REPLANS} tries")


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
        f"    activations      {format_bytes(b.activations_bytes)} left for activations",
        (f"  rank peak          {format_bytes(ranked.predicted_rank_peak_bytes)} planned"
         f" (the graph planned for {format_bytes(ranked.graph_budget_bytes)} in one process)"),
    ]
    if ranked.phase_peaks is not None and ranked.offsets is not None:
        o, p = ranked.offsets, ranked.phase_peaks
        lines.append(f"    by phase         forward {format_bytes(p.forward_bytes + o.forward)}, backward "
                     f"{format_bytes(p.backward_bytes + o.backward)}, after backward "
                     f"{format_bytes(p.end_bytes + o.end)}")
    return "\n".join(lines)
