"""Plan every example at several budgets with every solver; measure the default plan's peak.

Writes a Markdown table (stdout, or --out FILE): per example and budget, each solver's
simulated peak and extra compute (% of a plain step under the flops cost model) and solve time,
and for the default solver (auto) the peak measured when the rewritten module runs on CPU.

    python benchmarks/examples_table.py --out benchmarks/examples_table.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from frontends.capture.model_file import load_model_file  # noqa: E402
from frontends.capture.step import capture  # noqa: E402
from frontends.measure.step import measure_step  # noqa: E402
from optimizer.api import optimize  # noqa: E402
from solvers.base import InfeasibleBudgetError, SolverOptions  # noqa: E402
from solvers.ir.budget import format_bytes  # noqa: E402
from solvers.planning.planner import plan_graph  # noqa: E402

EXAMPLES = ("mlp", "gpt", "convnet")
BUDGETS = ("90%", "75%", "60%")
SOLVERS = ("auto", "greedy", "chain-dp", "chen-greedy", "blocks", "recompute-all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--time-limit", type=float, default=20.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    rows = ["| example | budget | solver | status | planned peak | extra compute | solve s | measured peak |",
            "|---|---|---|---|---|---|---|---|"]
    for name in EXAMPLES:
        model, inputs = load_model_file(os.path.join(root, f"{name}.py"))
        graph = capture(model, inputs).graph
        for budget in BUDGETS:
            for solver in SOLVERS:
                options = SolverOptions(time_limit_s=args.time_limit)
                try:
                    plan = plan_graph(graph, budget, solver, options)
                except (InfeasibleBudgetError, ValueError) as err:
                    rows.append(f"| {name} | {budget} | {solver} | no fit | | | | {type(err).__name__} |")
                    continue
                measured = ""
                if solver == "auto":
                    rm = optimize(model, inputs, budget, solver="auto", time_limit=args.time_limit)
                    m = measure_step(rm, inputs, repeats=1)
                    measured = (f"{format_bytes(m.peak_bytes)} "
                                f"({100 * (m.peak_bytes / rm.plan.predicted_peak_bytes - 1):+.2f}%)")
                rows.append(
                    f"| {name} | {budget} of {format_bytes(plan.store_all_peak_bytes)} | {solver} | "
                    f"{plan.status} | {format_bytes(plan.predicted_peak_bytes)} | "
                    f"{plan.extra_percent:.1f}% | {plan.solve_time_s:.2f} | {measured} |")
            print(rows[-1], flush=True)
    header = (f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
              f"one intra-op thread; {time.strftime('%Y-%m-%d')}.\n\n")
    table = header + "\n".join(rows) + "\n"
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(table)


if __name__ == "__main__":
    main()
