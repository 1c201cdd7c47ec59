"""The whole training iteration's memory: forward, backward, the optimizer step, zero_grad.

A user's ``--budget 16GB`` is the loop's peak, not only forward+backward's. The loop adds two
things the captured step does not hold, and neither depends on the schedule, so a plan for the
loop is a plan of the captured graph with the budget lowered by a constant, plus one check:

* **Optimizer state** (AdamW's ``exp_avg`` and ``exp_avg_sq``, SGD's momentum): created by the
  first ``step()`` and resident from then on, through every later forward and backward.
* **Accumulated gradients** (``grad_accumulation=k > 1``): from the second micro-batch on,
  ``param.grad`` already holds the earlier micro-batches' sum while forward and backward run, and
  at the end of backward the new gradients exist next to it until autograd adds them in place.
  So every phase of those micro-batches holds one more copy of the gradients.
* **The step itself** runs after the last backward, on what is live then (parameters, buffers,
  inputs, gradients once, the outputs the caller still holds) plus the state, plus what the
  step allocates and frees (``torch._foreach_sqrt``'s copies, single-tensor AdamW's ``denom``):
  `OptimizerMemory.step_bytes`, measured by running the optimizer's own step on fake tensors
  (`frontends.measure.optimizer_memory`).

``zero_grad()`` (``set_to_none=True``, torch's default) frees the gradients before the next
forward. The loop this models drops the previous micro-batch's outputs before the next forward
(``loss.item()``, not a list of losses). Imports no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from solvers.base import InfeasibleBudgetError
from solvers.ir.budget import Budget
from solvers.ir.graph import RematGraph
from solvers.ir.plan import Plan
from solvers.ir.schedule import Schedule, StepKind
from solvers.ir.simulator import SimulationResult, simulate

OPTIMIZERS = ("adamw", "adamw-fused", "adam", "adamw-8bit", "sgd-momentum", "sgd")
"""Optimizer descriptions a plan takes in place of an instance (`frontends.measure.optimizer_memory`)."""


@dataclass(frozen=True)
class OptimizerMemory:
    """What an optimizer keeps and allocates, in bytes of the device its parameters live on."""

    name: str
    """What was measured: ``AdamW (single-tensor)``, ``adamw-8bit (estimated)``, ..."""
    state_bytes: int
    """State resident after the first step (every state tensor's storage, once)."""
    step_bytes: int
    """Peak the step allocates above the state, parameters and gradients, freed when it returns."""
    measured: bool = True
    """False where the figures come from a formula, not from running the optimizer's step."""

    def __post_init__(self) -> None:
        if self.state_bytes < 0 or self.step_bytes < 0:
            raise ValueError("optimizer state and step bytes are non-negative")


@dataclass(frozen=True)
class TrainingLoop:
    """The iteration around the captured step: which optimizer, how many micro-batches per step."""

    optimizer: OptimizerMemory | None = None
    """None: optimizer state is not counted (the plan says so)."""
    grad_accumulation: int = 1

    def __post_init__(self) -> None:
        k = self.grad_accumulation
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"grad_accumulation is a positive number of micro-batches per optimizer step, got {k!r}")

    @property
    def counts_anything(self) -> bool:
        return self.optimizer is not None or self.grad_accumulation > 1

    def held_bytes(self, graph: RematGraph) -> int:
        """Bytes held beside the captured step in every phase of its worst micro-batch."""
        state = self.optimizer.state_bytes if self.optimizer else 0
        return state + (graph.gradient_bytes if self.grad_accumulation > 1 else 0)

    def step_peak_bytes(self, end_bytes: int, graph: RematGraph) -> int:
        """The optimizer step's peak, from the captured step's live bytes when backward ends
        (gradients once; the output gradients autograd made for backward are gone)."""
        if self.optimizer is None:
            return 0
        tangents = sum(graph[t].bytes for t in graph.tangents)
        return end_bytes - tangents + self.optimizer.state_bytes + self.optimizer.step_bytes


def end_bytes(sim: SimulationResult) -> int:
    """Live bytes when backward ends: resident values, gradients, user outputs, output gradients."""
    return sim.live_curve[-1] if sim.live_curve else sim.peak_bytes


def loop_budget(loop: TrainingLoop, graph: RematGraph, budget: Budget | int | str, store_all_peak: int,
                store_all_end: int) -> tuple[int, int]:
    """(the iteration's budget in bytes, the budget left for the captured step's schedule).

    A percentage is of plain autograd's iteration peak. Raises `InfeasibleBudgetError` when the
    optimizer step alone (which no schedule changes) does not fit."""
    held = loop.held_bytes(graph)
    step_peak = loop.step_peak_bytes(store_all_end, graph)
    budget_bytes = Budget.of(budget).resolve(max(store_all_peak + held, step_peak))
    if step_peak > budget_bytes:
        raise InfeasibleBudgetError(budget_bytes, None, f": the optimizer step alone peaks at {step_peak} bytes "
                                    "(parameters, gradients, optimizer state and the step's temporaries)",
                                    lower_bound_bytes=step_peak)
    return budget_bytes, budget_bytes - held


def iteration_error(err: InfeasibleBudgetError, held: int) -> InfeasibleBudgetError:
    """``err`` (no schedule fits the step's budget) restated in the iteration's bytes: ``held``
    (`TrainingLoop.held_bytes`) added back to every figure; ``err`` itself when nothing is held."""
    if not held:
        return err

    def lift(n: int | None) -> int | None:
        return None if n is None else n + held

    return InfeasibleBudgetError(err.budget_bytes + held, lift(err.smallest_feasible_bytes),
                                 f"{err.detail} (optimizer state and accumulated gradients hold {held} bytes of it)",
                                 exact=err.exact, lower_bound_bytes=lift(err.lower_bound_bytes))


def accumulating_peak(graph: RematGraph, schedule: Schedule) -> int:
    """Forward+backward's peak in a later micro-batch when autograd adds each gradient into
    ``param.grad`` as soon as it is produced and frees it (eager autograd, so the eager runtime):
    every ``param.grad`` is held throughout, and a new gradient lives only while it is made.
    (The graph runtime returns all gradients when its backward ends: there `held_bytes` is exact.)"""
    sizes = {g: graph[g].bytes for g in dict.fromkeys(graph.backward_outputs)}
    total = sum(sizes.values())
    steps = schedule.steps
    worst = 0

    def observe(index: int, live_bytes: int, live: set[str], width: int) -> None:
        nonlocal worst
        computing = ({s.node for s in steps[index:index + width]}
                     if width and index < len(steps) and steps[index].kind is StepKind.COMPUTE else set())
        made = sum(n for g, n in sizes.items() if g in live and g not in computing)
        worst = max(worst, live_bytes - made + total)

    copies = any(s.kind in (StepKind.OFFLOAD, StepKind.RELOAD) for s in steps)
    simulate(graph, schedule, observe, link="pcie4" if copies else None)  # bytes do not depend on the link's speed
    return worst


def with_loop(plan: Plan, loop: TrainingLoop, graph: RematGraph, plan_end: int, store_all_end: int,
              in_place_accumulation: RematGraph | None = None) -> Plan:
    """``plan`` (made for the budget `loop_budget` left the step) restated for the iteration:
    its budget, peaks and breakdown include what the loop holds and the optimizer step.
    ``plan_end`` and ``store_all_end``: `end_bytes` of the plan's and of store-all's schedules.
    ``in_place_accumulation``: the graph the plan's schedule runs on, where the runtime
    accumulates each gradient as it is made (`accumulating_peak`; the eager runtime), not all
    at the end of backward."""
    if not loop.counts_anything:
        return plan
    opt = loop.optimizer
    held = loop.held_bytes(graph)
    parts = dataclasses.replace(
        plan.breakdown, budget_bytes=plan.breakdown.budget_bytes + held,
        optimizer=opt.name if opt else "not counted", optimizer_bytes=opt.state_bytes if opt else 0,
        optimizer_step_bytes=opt.step_bytes if opt else 0, grad_accumulation=loop.grad_accumulation,
        accumulated_gradients_bytes=graph.gradient_bytes if loop.grad_accumulation > 1 else 0,
        forward_backward_peak_bytes=(accumulating_peak(in_place_accumulation, plan.schedule)
                                     + (opt.state_bytes if opt else 0)
                                     if in_place_accumulation is not None and loop.grad_accumulation > 1
                                     else plan.predicted_peak_bytes + held),
        optimizer_step_peak_bytes=loop.step_peak_bytes(plan_end, graph))
    return dataclasses.replace(
        plan, budget_bytes=plan.budget_bytes + held, breakdown=parts,
        predicted_peak_bytes=max(parts.forward_backward_peak_bytes, parts.optimizer_step_peak_bytes),
        store_all_peak_bytes=max(plan.store_all_peak_bytes + held, loop.step_peak_bytes(store_all_end, graph)))
