"""One step's budget shared by the graphs torch.compile splits it into (graph breaks).

A graph break cuts a training step into graphs that run forward in order ``1..n`` and backward in
reverse. While graph ``k`` runs, the other graphs still hold memory:

* every other graph's parameters and buffers (resident for the whole step);
* graphs before ``k`` (forward done, backward not yet): their inputs and the activations they
  saved for backward;
* graphs after ``k`` (their backward ran before ``k``'s): the gradients they produced.

So the step peaks at ``max_k (peak_k + sum_{j != k} params_j + sum_{j < k} (inputs_j + saved_j)
+ sum_{j > k} grads_j)``, an upper bound (parameters shared by two graphs count twice).

Policy (``sequential``): dynamo compiles graphs lazily, in execution order, during the first call,
so when graph ``k`` is planned only graphs ``1..k-1`` are known: graph ``k`` gets the whole budget
minus what those earlier graphs hold across it (parameters, inputs and saved activations). Graphs found
later cannot be deducted in advance; `step_peak_bound` checks the finished split and
`StepBudgetSummary.fits` says whether the bound still meets the budget. A percentage budget is
relative to each graph's own plain-autograd peak and needs no split. ``fullgraph=True`` (one
graph, nothing held by others) is the exact mode. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GraphFootprint:
    """What one planned graph holds, in bytes."""

    peak_bytes: int
    """Its own planned peak: its parameters, inputs, activations and gradients."""
    parameters_bytes: int
    """Parameters and buffers it reads (resident for the whole step)."""
    saved_bytes: int
    """Activations its forward saves for its backward (live from its forward to its backward)."""
    gradients_bytes: int
    """Parameter gradients its backward produces (live from its backward to the step's end)."""
    inputs_bytes: int = 0
    """Its inputs (the caller's, or an earlier graph's outputs): held while later graphs run."""


@dataclass(frozen=True)
class StepBudgetSummary:
    """How a step's budget was shared by its graphs, and whether the whole step fits."""

    graphs: int
    graph_breaks: int
    budget_bytes: int | None
    """The step's budget in bytes (None for a percentage budget, which is per graph)."""
    graph_budgets_bytes: tuple[int, ...]
    """The budget each graph was planned for, in compile order."""
    predicted_step_peak_bytes: int
    """`step_peak_bound` over all graphs: the step's peak, parameters and inputs included."""
    exact: bool
    """One graph: the plan's peak is the step's peak (what ``fullgraph=True`` guarantees)."""
    graph_peaks_bytes: tuple[int, ...] = ()
    """Each graph's own peak: the compiled one (read from Inductor's buffer plan) where
    Inductor compiled it, else the plan's."""
    compiled: bool = False
    """Every graph's peak is Inductor's compiled peak (fusion and buffer reuse included)."""
    extra_flops: float = 0.0
    """Recomputation the plans spend, all graphs together (FLOPs)."""
    extra_time_s: float = 0.0
    """The same under the cost model (seconds)."""
    fit_iterations: tuple[int, ...] = ()
    """Plans each graph's Inductor fit tried (0: planned once, no fit)."""
    fit_probes: int = 0
    """Trial Inductor compiles the fits ran (buffer planning only, no kernels)."""
    fit_seconds: float = 0.0
    """What the fits added to planning each graph once: their probes and re-plans (seconds)."""
    graph_strategies: tuple[str, ...] = ()
    """Where each graph's plan came from: the solver, or the seed the Inductor fit kept
    (``torch-min-cut amb=0.5``: torch's partition at that budget, compiled cheaper within it)."""

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.predicted_step_peak_bytes <= self.budget_bytes

    @property
    def unused_share(self) -> float:
        """Budget the step leaves unused: of the step's budget, or (a percentage budget, which
        is per graph) of the tightest graph's."""
        if self.budget_bytes is not None:
            return 1.0 - self.predicted_step_peak_bytes / self.budget_bytes
        shares = [1.0 - p / b for b, p in zip(self.graph_budgets_bytes, self.graph_peaks_bytes) if b > 0]
        return min(shares) if shares else 0.0


def held_across(earlier: Sequence[GraphFootprint]) -> int:
    """Bytes the graphs planned before a new one hold while it runs (parameters, inputs, saved)."""
    return sum(g.parameters_bytes + g.inputs_bytes + g.saved_bytes for g in earlier)


def graph_budget(step_budget_bytes: int, earlier: Sequence[GraphFootprint]) -> int:
    """The budget for the next graph under the ``sequential`` policy (may be <= 0: then the
    earlier graphs alone exceed the step's budget)."""
    return step_budget_bytes - held_across(earlier)


def step_peak_bound(graphs: Sequence[GraphFootprint]) -> int:
    """Upper bound on the peak of a step that runs ``graphs`` (see the module docstring)."""
    if not graphs:
        return 0
    params = [g.parameters_bytes for g in graphs]
    total_params = sum(params)
    worst = 0
    for k, g in enumerate(graphs):
        others = total_params - params[k]
        before = sum(e.inputs_bytes + e.saved_bytes for e in graphs[:k])
        after = sum(e.gradients_bytes for e in graphs[k + 1 :])
        worst = max(worst, g.peak_bytes + others + before + after)
    return worst


def summarize(budget_bytes: int | None, budgets: Sequence[int],
              graphs: Sequence[GraphFootprint], *, compiled: bool = False, extra_flops: float = 0.0,
              extra_time_s: float = 0.0, fit_iterations: Sequence[int] = (), fit_probes: int = 0,
              fit_seconds: float = 0.0, graph_strategies: Sequence[str] = ()) -> StepBudgetSummary:
    return StepBudgetSummary(
        graphs=len(graphs),
        graph_breaks=max(0, len(graphs) - 1),
        budget_bytes=budget_bytes,
        graph_budgets_bytes=tuple(budgets),
        predicted_step_peak_bytes=step_peak_bound(graphs),
        exact=len(graphs) == 1,
        graph_peaks_bytes=tuple(g.peak_bytes for g in graphs),
        compiled=compiled,
        extra_flops=extra_flops,
        extra_time_s=extra_time_s,
        fit_iterations=tuple(fit_iterations),
        graph_strategies=tuple(graph_strategies),
        fit_probes=fit_probes,
        fit_seconds=fit_seconds,
    )
