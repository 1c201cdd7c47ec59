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
* **FSDP2** (``fully_shard``) keeps 1/N of every parameter and gradient (padded to a multiple of
  N), plus the all-gathered unit(s) in flight: the largest unit's full parameters, twice with
  prefetching (the next unit is gathered while one runs), and in backward that unit's full
  gradients before they are reduce-scattered. A remat-opt module wrapped as one FSDP unit
  (``fully_shard(rm)``) gathers every parameter at once.

Imports no torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from optimizer.allocator import AllocatorModel
from optimizer.budget import format_bytes, resolve_budget
from optimizer.graph import RematGraph
from optimizer.plan import Plan
from optimizer.planner import plan_graph
from optimizer.simulator import simulate
from solvers.base import InfeasibleBudgetError, SolverOptions
from solvers.baselines import store_all_schedule

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


def rank_breakdown(graph: RematGraph, budget_bytes: int, config: DataParallelConfig) -> RankBreakdown:
    """The per-rank terms for ``graph``'s parameters and gradients under ``config``."""
    params, grads = graph.parameter_bytes, graph.gradient_bytes
    if config.strategy is Strategy.FSDP:
        units = config.unit_bytes or (params,)
        largest = max(units)
        in_flight = largest * (2 if config.prefetch and len(units) > 1 else 1)
        resident_params = _shard(params, config.world_size)
        resident_grads = _shard(grads, config.world_size)
        communication = in_flight + min(largest, grads)
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


def rank_offset(graph: RematGraph, config: DataParallelConfig) -> int:
    """Rank-resident bytes minus what the graph's own accounting holds (full parameters and
    gradients): add it to a single-process peak to get the rank's peak."""
    rank = rank_breakdown(graph, 0, config)
    return rank.fixed_bytes - (graph.parameter_bytes + graph.gradient_bytes + graph.input_bytes)


@dataclass(frozen=True)
class RankPlan:
    """A plan for one rank: the graph's plan, and the rank's view of it."""

    plan: Plan
    breakdown: RankBreakdown
    predicted_rank_peak_bytes: int
    """The plan's peak moved to the rank's resident terms (`rank_offset`)."""
    graph_budget_bytes: int
    """The single-process budget the graph was planned for."""


def plan_for_rank(graph: RematGraph, budget: int | str, config: DataParallelConfig,
                  solver: str = "auto", options: SolverOptions | None = None,
                  allocator: AllocatorModel | None = None, graph_nodes: int = 0) -> RankPlan:
    """Plan ``graph`` so that one rank under ``config`` peaks within ``budget`` (bytes, a size,
    or a percentage of the rank's plain-autograd peak)."""
    offset = rank_offset(graph, config)
    store_all = simulate(graph, store_all_schedule(graph)).peak_bytes
    budget_bytes = resolve_budget(budget, store_all + offset)
    breakdown = rank_breakdown(graph, budget_bytes, config)
    graph_budget = budget_bytes - offset
    if graph_budget <= graph.resident_bytes:
        raise InfeasibleBudgetError(budget_bytes, None, f" ({config.strategy.value} on "
                                    f"{config.world_size} ranks keeps {breakdown.fixed_bytes} bytes resident)")
    try:
        plan = plan_graph(graph, graph_budget, solver, options or SolverOptions(),
                          graph_nodes=graph_nodes, allocator=allocator)
    except InfeasibleBudgetError as err:
        smallest = None if err.smallest_feasible_bytes is None else err.smallest_feasible_bytes + offset
        raise InfeasibleBudgetError(budget_bytes, smallest, f" per rank ({config.strategy.value}, "
                                    f"{config.world_size} ranks)") from None
    return RankPlan(plan=plan, breakdown=breakdown, graph_budget_bytes=graph_budget,
                    predicted_rank_peak_bytes=plan.predicted_peak_bytes + offset)


def format_rank_breakdown(ranked: RankPlan) -> str:
    """The per-rank lines of the CLI report (after the plan's own report)."""
    b = ranked.breakdown
    comm = ("all-gathered unit(s) in flight + unsharded gradients before reduce-scatter"
            if b.strategy == Strategy.FSDP.value else "gradient buckets")
    held = "shards" if b.strategy == Strategy.FSDP.value else "full replica"
    return "\n".join([
        f"  per rank           {b.strategy} on {b.world_size} ranks, budget {format_bytes(b.budget_bytes)}",
        f"    parameters       {format_bytes(b.parameters_bytes)} ({held})",
        f"    gradients        {format_bytes(b.gradients_bytes)} ({held})",
        f"    communication    {format_bytes(b.communication_bytes)} ({comm})",
        f"    inputs           {format_bytes(b.inputs_bytes)}",
        f"    activations      {format_bytes(b.activations_bytes)} left for activations",
        (f"  rank peak          {format_bytes(ranked.predicted_rank_peak_bytes)} planned"
         f" (the graph planned for {format_bytes(ranked.graph_budget_bytes)} in one process)"),
    ])
