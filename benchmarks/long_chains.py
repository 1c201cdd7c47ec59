"""Long chains: a time-stepping loop of residual cells, planned by remat-opt at 5-50% of store-all.

The model (issue 25): ``cell = nn.Sequential(nn.Linear(64, 64), nn.Tanh())`` applied ``steps``
times as ``h = h + 0.1 * cell(h)``, batch 256, loss ``h.sum()``. For each budget the table
gives remat-opt's plan (``optimize(..., solver="auto")``: its extra compute over the step, its
gap to the proven bound, planning time, predicted and, where measured, real peak), revolve's
formula for the same memory, and the cheapest nested ``torch.utils.checkpoint`` that fits
(measured peak).

- *extra*: recomputation over the cost of one plain step, in the graph's cost model (``flops``:
  max(FLOPs / 1 TFLOP/s, bytes / 100 GB/s) per op).
- *revolve on the graph*: the project's `revolve` solver on the captured graph at the same
  budget (its checkpoints are the graph's real values, so it holds what the budget holds).
- *revolve formula*: Griewank's fewest step evaluations E(l, c) = (r + 1) l - C(c + r, c + 1)
  for l = steps cells and c checkpoints, c = the activation budget over one state (64 KiB)
  minus 3 (a cell's backward holds a gradient, a tape and the state it reads); the first
  sweep is the forward pass, each of the l - 1 later reversals re-tapes its cell (Linear and
  tanh), the other E - 2l + 1 evaluations run the whole cell. Costs from the captured graph.
- *nested checkpoint*: ``torch.utils.checkpoint`` (non-reentrant) over segments of ``outer``
  steps, each split into checkpointed sub-segments of ``inner`` steps (one level when
  ``inner`` is 0): every op of the forward runs once per level more (the extra is that many
  forward passes). Peak measured with `frontends.measure.step.measure_step`.

    python benchmarks/long_chains.py --steps 100 1000 --out benchmarks/long_chains.md

The 100-step plans are run and measured (``--measure-up-to``); longer ones are planned on the
captured graph (`solvers.planning.planner.plan_graph`, what ``optimize`` calls). Nested
checkpointing is measured up to ``--nested-up-to`` steps (a 10,000-step eager run under the
memory tracker is not worth its time); ``--budgets`` picks the percentages. For the 10,000-step
planning target (capture + plan <= 5 minutes):

    python benchmarks/long_chains.py --steps 10000 --budgets 10 --time-limit 60 --measure-up-to 0 \
        --nested-up-to 0 --out /tmp/long_chains_10000.md
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import re
import sys
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from frontends.capture.costed_capture import capture_with_costs  # noqa: E402
from frontends.measure.step import measure_step  # noqa: E402
from optimizer.api import optimize  # noqa: E402
from solvers.base import SolverOptions  # noqa: E402
from solvers.baselines import store_all_schedule  # noqa: E402
from solvers.chain_model import chain_model  # noqa: E402
from solvers.ir.graph import Phase  # noqa: E402
from solvers.ir.simulator import simulate  # noqa: E402
from solvers.planning.planner import plan_graph  # noqa: E402
from solvers.revolve import revolve_cost  # noqa: E402

WIDTH, BATCH = 64, 256
FRACTIONS = (0.05, 0.10, 0.20, 0.50)


class Loop(nn.Module):
    """``steps`` residual updates h <- h + 0.1 cell(h); nested checkpointing when asked."""

    def __init__(self, steps: int, outer: int = 0, inner: int = 0) -> None:
        super().__init__()
        self.cell = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
        self.steps, self.outer, self.inner = steps, outer, inner

    def _run(self, h: torch.Tensor, count: int) -> torch.Tensor:
        for _ in range(count):
            h = h + 0.1 * self.cell(h)
        return h

    def _segment(self, h: torch.Tensor, count: int) -> torch.Tensor:
        if not self.inner:
            return self._run(h, count)
        done = 0
        while done < count:
            n = min(self.inner, count - done)
            h = checkpoint(self._run, h, n, use_reentrant=False)
            done += n
        return h

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if not self.outer:
            return self._run(h, self.steps).sum()
        done = 0
        while done < self.steps:
            n = min(self.outer, self.steps - done)
            h = checkpoint(self._segment, h, n, use_reentrant=False)
            done += n
        return h.sum()


def nested_configs(steps: int) -> list[tuple[int, int]]:
    root = max(1, round(math.sqrt(steps)))
    configs = {(root, 0), (2 * root, 0), (steps // 5, steps // 25), (steps // 10, steps // 50),
               (steps // 4, steps // 20), (steps // 2, steps // 10), (steps // 5, steps // 50)}
    return sorted(c for c in configs if c[0] >= 1 and (c[1] == 0 or c[1] >= 1))


def revolve_formula(steps: int, activation_bytes: int, state_bytes: int, cell_cost: float,
                    tape_cost: float, base_cost: float) -> tuple[int, float]:
    slots = activation_bytes // state_bytes - 3
    if slots < 1:
        return slots, math.inf
    evaluations = revolve_cost(steps, min(slots, steps))
    extra = (evaluations - 2 * steps + 1) * cell_cost + (steps - 1) * tape_cost
    return slots, extra / base_cost


def capture_graph(steps: int, cache: str | None):
    path = os.path.join(cache, f"loop{steps}.pkl") if cache else None
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f), math.nan
    torch.manual_seed(0)
    start = time.perf_counter()
    captured = capture_with_costs(Loop(steps), (torch.randn(BATCH, WIDTH),), None)
    graph = captured.graph
    seconds = time.perf_counter() - start
    loop = captured.stitched_loop
    print(f"captured {steps} steps in {seconds:.1f} s: "
          f"{loop.describe() if loop else 'traced whole'}", flush=True)
    if path:
        os.makedirs(cache, exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(graph, f)
    return graph, seconds


def cell_costs(graph) -> tuple[float, float, int]:
    """Cost of one whole cell, of re-taping it (Linear and tanh) and the bytes of its state."""
    model = chain_model(graph)
    k = model.n // 2  # a cell in the middle of the chain
    return model.advance[k].cost, model.retape[k].cost, model.x_bytes[k]


def run(steps: int, args) -> list[str]:
    graph, capture_s = capture_graph(steps, args.cache)
    store_all = simulate(graph, store_all_schedule(graph)).peak_bytes
    cell, tape, state = cell_costs(graph)
    forward_cost = sum(n.cost for n in graph.ops if n.phase is Phase.FORWARD)
    torch.manual_seed(0)
    x = torch.randn(BATCH, WIDTH)
    plans = []
    for fraction in args.budgets:
        budget = f"{round(fraction * 100)}%"
        options = SolverOptions(time_limit_s=args.time_limit)
        start = time.perf_counter()
        measured = None
        if steps <= args.measure_up_to:
            torch.manual_seed(0)
            model = Loop(steps)
            rm = optimize(model, (x,), budget, time_limit=args.time_limit)
            seconds = time.perf_counter() - start  # capture, plan and rewrite, not the run
            plan = rm.plan
            measured = measure_step(rm, (x,), repeats=1).peak_bytes
        else:
            plan = plan_graph(graph, budget, "auto", options)
            seconds = time.perf_counter() - start
        plans.append((budget, plan, measured, seconds))
        print(f"planned {steps} steps at {budget}: extra {plan.extra_time_s / plan.step_time_s:.3f} "
              f"in {plans[-1][3]:.1f} s ({plan.message[:80]})", flush=True)
    nested = []  # measured after the plans: the memory tracker is slow on long eager chains
    for outer, inner in nested_configs(steps) if steps <= args.nested_up_to else ():
        torch.manual_seed(0)
        peak = measure_step(Loop(steps, outer, inner), (x,), repeats=1).peak_bytes
        levels = 2 if inner else 1
        nested.append((peak, levels * forward_cost / graph.base_cost, f"{outer}x{inner}" if inner
                       else f"{outer}"))
        print(f"nested {outer}x{inner}: {peak:,} B", flush=True)
    rows = []
    for budget, plan, measured, seconds in plans:
        extra = plan.extra_time_s / plan.step_time_s
        slots, formula = revolve_formula(steps, plan.breakdown.activations_bytes, state, cell, tape,
                                         graph.base_cost)
        fits = [n for n in nested if n[0] <= plan.budget_bytes]
        best = min(fits, key=lambda n: n[1]) if fits else None
        revolve = re.search(r"tried: .*\brevolve (\d[\d.e+-]*)", plan.message)  # '-': it found none
        on_graph = (f"{float(revolve[1]) / plan.step_time_s - 1:.3f}" if revolve
                    else "none fits")
        chosen = re.search(r"best: ([\w-]+)", plan.message)
        source = chosen[1] if chosen else plan.solver
        nested_cell = ((f"{best[1]:.3f} ({best[2]}, {best[0]:,} B)" if best else "none fits")
                       if nested else "not measured")
        rows.append(
            f"| {steps} | {budget} ({plan.budget_bytes:,} B) | {extra:.3f} | "
            f"{'-' if plan.gap is None else f'{plan.gap:.1%}'} | {seconds:.1f} | "
            f"{plan.predicted_peak_bytes:,} | {'-' if measured is None else f'{measured:,}'} | "
            f"{formula:.3f} (c={slots}) | {on_graph} | "
            + nested_cell + f" | {source} |")
        print(rows[-1], flush=True)
    plan_s = ", ".join(f"{seconds:.1f} s" for *_, seconds in plans)
    head = (f"\n{steps} steps: {len(graph.ops):,} values, store-all peak {store_all:,} B; capture "
            + ("cached" if math.isnan(capture_s) else f"{capture_s:.1f} s") + f"; plan {plan_s}"
            + ("" if math.isnan(capture_s) or steps <= args.measure_up_to else
               f" (capture + plan: {', '.join(f'{capture_s + s:.1f} s' for *_, s in plans)})")
            + "; nested checkpoint measured: "
            + (", ".join(f"{name} {peak:,} B" for peak, _, name in nested) or "none") + "\n")
    return [head] + rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--measure-up-to", type=int, default=100,
                        help="run optimize() and measure the peak for chains up to this length")
    parser.add_argument("--nested-up-to", type=int, default=1000,
                        help="measure nested torch.utils.checkpoint for chains up to this length")
    parser.add_argument("--budgets", type=float, nargs="+", default=[f * 100 for f in FRACTIONS],
                        help="budgets in percent of store-all's peak")
    parser.add_argument("--cache", default=None, help="folder for captured graphs (pickles)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "long_chains.md"))
    args = parser.parse_args()
    args.budgets = [b / 100 for b in args.budgets]
    lines = ["# Long chains: residual time-stepping loops", "",
             "`python benchmarks/long_chains.py " + " ".join(sys.argv[1:]) + "` (CPU, flops cost "
             "model). extra: recomputation / plain step cost; gap: to the proven lower bound; "
             "time: planning (where the peak is measured: `optimize`, capture and rewrite included, "
             "the measured run not).", "",
             "| steps | budget | remat-opt extra | gap | time (s) | predicted peak | measured peak "
             "| revolve formula | revolve on the graph | nested checkpoint (extra, config, "
             "measured peak) | plan |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for steps in args.steps:
        out = run(steps, args)
        notes.append(out[0])
        lines += out[1:]
    lines += [""] + notes
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
