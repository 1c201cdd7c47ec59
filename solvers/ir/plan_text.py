"""The text report of one `Plan` (the CLI's output; also the meta-device planner's report)."""

from __future__ import annotations

from solvers.ir.budget import format_bytes
from solvers.ir.plan import BudgetBreakdown, Plan

NOT_COUNTED = ("optimizer state is not counted: pass optimizer= (--optimizer), an instance or 'adamw', "
               "'sgd-momentum', ..., to plan the whole training iteration")
"""The report's line when the plan counts no optimizer."""


def _loop_lines(b: BudgetBreakdown) -> list[str]:
    """The training loop's terms (`solvers.planning.training_loop`), or the line saying there are none."""
    if b.forward_backward_peak_bytes == 0:
        return [f"    optimizer        {NOT_COUNTED}"]
    lines = [f"    optimizer        {format_bytes(b.optimizer_bytes)} state of {b.optimizer}"]
    if b.grad_accumulation > 1:
        lines.append(f"    accumulation     {format_bytes(b.accumulated_gradients_bytes)} of gradients held "
                     f"through {b.grad_accumulation} micro-batches")
    lines.append(f"  iteration          forward+backward peak {format_bytes(b.forward_backward_peak_bytes)}, "
                 f"optimizer step peak {format_bytes(b.optimizer_step_peak_bytes)} "
                 f"(+{format_bytes(b.optimizer_step_bytes)} temporaries)")
    return lines


def _offload_lines(plan: Plan) -> list[str]:
    """What goes through host memory, and what the copies cost (only the stall is in extra compute)."""
    total = sum(nbytes for _, nbytes in plan.offloaded)
    largest = sorted(plan.offloaded, key=lambda item: (-item[1], item[0]))[:3]
    names = ", ".join(f"{name} ({format_bytes(nbytes)})" for name, nbytes in largest)
    more = f" and {len(plan.offloaded) - len(largest)} more" if len(plan.offloaded) > len(largest) else ""
    return [f"  offloaded          {len(plan.offloaded)} saved values, {format_bytes(total)} to host and back "
            f"(host peak {format_bytes(plan.host_peak_bytes)}): {names}{more}",
            f"    link             {plan.link}: copies {plan.transfer_time_s:.3g} s, "
            f"{plan.stall_time_s:.3g} s of it not hidden by compute (in the extra time above)"]


def format_plan(plan: Plan, model_path: str) -> str:
    """The plan as the CLI prints it: the budget's breakdown, the peak, the extra compute, the
    solver's verdict and what each module saves and recomputes."""
    b = plan.breakdown
    pct = f"{plan.extra_percent:.1f}% of a step"
    gap = "n/a (no bound)" if plan.gap is None else f"{100 * plan.gap:.2f}%"
    lines = [
        f"remat-opt plan for {model_path}",
        f"  graph              {plan.graph_nodes} joint-graph nodes, {plan.graph_values} scheduled values",
        f"  store-all peak     {format_bytes(plan.store_all_peak_bytes)}",
        f"  budget             {format_bytes(plan.budget_bytes)}",
        f"    parameters       {format_bytes(b.parameters_bytes)}",
        f"    gradients        {format_bytes(b.gradients_bytes)}",
        f"    inputs           {format_bytes(b.inputs_bytes)}",
        f"    activations      {format_bytes(b.activations_bytes)} left for activations",
        *_loop_lines(b),
        f"  planned peak       {format_bytes(plan.predicted_peak_bytes)}"
        f" ({100 * plan.predicted_peak_bytes / plan.store_all_peak_bytes:.0f}% of store-all)",
        f"  extra compute      {plan.extra_flops:.3g} FLOPs, {plan.extra_time_s:.3g} s"
        f" ({pct}; cost model {plan.cost_model})",
        f"  solver             {plan.solver}: {plan.status}, gap {gap}, {plan.solve_time_s:.2f} s",
    ]
    if plan.offloaded:
        lines.extend(_offload_lines(plan))
    if plan.allocator != "none":
        lines.append(f"  allocator          {plan.allocator} (included in the peaks above)")
    if plan.message:
        lines.append(f"  note               {plan.message}")
    lines.extend(_module_lines(plan))
    return "\n".join(lines)


def _module_lines(plan: Plan) -> list[str]:
    """Keep / recompute (/ offload, when the plan offloads) per module: saved on device at the
    boundary, against store-all's, and the bytes that go through host memory instead."""
    offloads = bool(plan.offloaded)
    host = "  offloaded " if offloads else ""
    lines = [f"  per module         saved (store-all -> plan)    {host}  recomputed ops"]
    for m in plan.modules:
        if not (m.saved_bytes or m.store_all_saved_bytes or m.recomputed_ops or m.offloaded_bytes):
            continue
        to_host = f"  {format_bytes(m.offloaded_bytes):>10}" if offloads else ""
        lines.append(
            f"    {m.module:<20.20} {format_bytes(m.store_all_saved_bytes):>10} -> {format_bytes(m.saved_bytes):<10}"
            f"{to_host}  {m.recomputed_ops}"
        )
    return lines
