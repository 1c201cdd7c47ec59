"""The plan: what remat-opt decided for one training step, and what it predicts.

`Plan` is frozen and documented field by field; the CLI's ``--json`` writes the same names.
All byte figures are peak memory of one training step, resident parameters and inputs included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from solvers.ir.schedule import Schedule


@dataclass(frozen=True)
class BudgetBreakdown:
    """How the budget splits: what is fixed by the model, and what is left for activations."""

    budget_bytes: int
    parameters_bytes: int
    """Parameters and buffers."""
    gradients_bytes: int
    """Parameter gradients produced by backward."""
    inputs_bytes: int
    """User inputs (held by the caller for the whole step)."""
    activations_bytes: int
    """What remains of the budget for activations (and output gradients): may be negative."""
    optimizer: str = "not counted"
    """The optimizer whose memory the plan counts (`solvers.planning.training_loop`), or "not counted"."""
    optimizer_bytes: int = 0
    """Optimizer state, resident through every forward and backward after the first step."""
    optimizer_step_bytes: int = 0
    """What the optimizer step allocates and frees on top of the state."""
    grad_accumulation: int = 1
    """Micro-batches per optimizer step."""
    accumulated_gradients_bytes: int = 0
    """``param.grad`` held through the later micro-batches' forward and backward (0 without accumulation)."""
    forward_backward_peak_bytes: int = 0
    """Forward + backward's planned peak with what the loop holds beside it (0: no loop counted)."""
    optimizer_step_peak_bytes: int = 0
    """The optimizer step's own peak (0: no optimizer counted)."""


@dataclass(frozen=True)
class ModuleSummary:
    """Per module: what forward keeps on device for backward, what it copies to host, and what
    backward recomputes (keep / recompute / offload, issue 39)."""

    module: str
    saved_bytes: int
    """Bytes saved on device at the phase boundary."""
    store_all_saved_bytes: int
    recomputed_ops: int
    recomputed_flops: float
    offloaded_bytes: int = 0
    """Bytes of the module's values copied to host memory and back (its share of ``Plan.offloaded``)."""


@dataclass(frozen=True)
class Plan:
    """A rematerialization plan, checked by the simulator."""

    status: str
    """Solver status: optimal, feasible (time limit, gap > 0), heuristic (classic schedule)."""
    solver: str
    cost_model: str
    budget_bytes: int
    predicted_peak_bytes: int
    """Simulated peak of the plan's schedule."""
    store_all_peak_bytes: int
    """Simulated peak of plain autograd (store-all) on the same graph."""
    extra_flops: float
    """FLOPs spent on recomputation."""
    extra_time_s: float
    """Seconds spent on recomputation under the cost model, plus the copy time of offloaded values
    compute does not hide (``stall_time_s``)."""
    step_flops: float
    """FLOPs of one plain training step (for percentages)."""
    step_time_s: float
    objective: float | None
    """Total time of the step under the cost model (seconds): compute, plus copy stalls when it offloads."""
    bound: float | None
    """Proven lower bound on the optimal objective (None when no bound is proven)."""
    gap: float | None
    """(objective - bound) / objective; 0 when optimal, None without a bound."""
    solve_time_s: float
    breakdown: BudgetBreakdown
    graph_nodes: int
    """Nodes of the captured joint graph (aten ops, views and placeholders)."""
    graph_values: int
    """Values (storages) the solver schedules."""
    saved: tuple[str, ...]
    """Values forward keeps for backward (on device, or on host for those in ``offloaded``)."""
    recomputed: tuple[tuple[str, int], ...]
    """(value, times computed) for every value computed more than once."""
    modules: tuple[ModuleSummary, ...]
    message: str = ""
    allocator: str = "none"
    """Allocator model included in the byte figures (block rounding, reserve, margin)."""
    schedule: Schedule | None = field(default=None, repr=False, compare=False)
    offloaded: tuple[tuple[str, int], ...] = ()
    """(value, bytes) of every saved value the plan copies to host memory and back (issue 39)."""
    transfer_time_s: float = 0.0
    """Seconds the copy streams are busy with those copies (hidden by compute or not)."""
    stall_time_s: float = 0.0
    """Seconds compute waits on copies: the part of ``transfer_time_s`` not hidden (in ``extra_time_s``)."""
    host_peak_bytes: int = 0
    """Most pinned host bytes held at once by offloaded values."""
    link: str = ""
    """The device-host link the copies were priced on (`solvers.ir.link.Link.describe`); "" without offload."""
    fits_without_offload: bool = True
    """False when the plan offloads because no recompute-only schedule of its solver fits the
    budget: then a row split (`optimizer.split_plan`) is the other way to fit, worth weighing."""

    @property
    def extra_percent(self) -> float:
        """Extra compute as a percentage of a plain step under the cost model."""
        return 100.0 * self.extra_time_s / self.step_time_s if self.step_time_s else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("schedule")
        data["recomputed"] = [list(item) for item in self.recomputed]
        data["saved"] = list(self.saved)
        data["offloaded"] = [list(item) for item in self.offloaded]
        data["extra_percent"] = self.extra_percent
        return data
