"""Solve time and objective / bound / gap of every solver on the example graphs at three budgets.

Writes a Markdown report (``--out``, default benchmarks/solver_table.md): per example graph, budget and
solver, the median wall time of ``--runs`` solves (graph captured once; model building included,
it is part of what a user waits for) and the objective, proven bound and gap of the last run
(identical in every run: the solvers are deterministic with one thread, except where a time
limit cuts a search short at a different point).

    python benchmarks/solver_table.py --runs 3 --time-limit 5 --out benchmarks/solver_table.md

Budgets sit between the leanest classic schedule's simulated peak (0) and store-all's (1):
fractions 0.2, 0.5 and 0.8. ``--exact-max-groups`` (default 80, as ``auto``) limits which graphs
the exact back-ends run on; larger ones run them once (``--big-runs``), not ``--runs`` times.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

from frontends.capture.costed_capture import capture_with_costs  # noqa: E402
from solvers import get_solver  # noqa: E402
from solvers.base import InfeasibleBudgetError, SolverOptions  # noqa: E402
from solvers.baselines import recompute_all_schedule, store_all_schedule  # noqa: E402
from solvers.ir.budget import format_bytes  # noqa: E402
from solvers.ir.simulator import simulate  # noqa: E402

FRACTIONS = (0.2, 0.5, 0.8)
SOLVERS = {  # label: (registered solver, MILP back-end)
    "milp-highs": ("milp", "highs"),
    "milp-cbc": ("milp", "cbc"),
    "cpsat": ("cpsat", "auto"),
    "auto": ("auto", "auto"),
    "greedy": ("greedy", "auto"),
    "chain-dp": ("chain-dp", "auto"),
}
EXACT = {"milp-highs", "milp-cbc", "cpsat"}


def _graphs(names: list[str]):
    import importlib.util

    from e2e_helpers import example_path, load_example

    for name in names:
        if name == "gpt-1-block":
            spec = importlib.util.spec_from_file_location("_gpt", example_path("gpt"))
            example = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(example)
            torch.manual_seed(0)
            model, inputs = example.GPT(n_layers=1, dropout=0.1), tuple(example.get_inputs())
        else:
            model, inputs = load_example(name, torch.float32)
        yield name, capture_with_costs(model, inputs, None).graph


def _one(label: str, graph, budget: int, time_limit: float):
    solver, backend = SOLVERS[label]
    options = SolverOptions(time_limit_s=time_limit, milp_engine=backend)
    start = time.perf_counter()
    try:
        result = get_solver(solver)(graph, budget, options)
    except (InfeasibleBudgetError, ValueError) as err:
        return time.perf_counter() - start, None, type(err).__name__
    return time.perf_counter() - start, result, ""


def _fmt(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "solver_table.md"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--big-runs", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=5.0)
    parser.add_argument("--exact-max-groups", type=int, default=80)
    parser.add_argument("--examples", default="mlp,convnet,gpt-1-block,gpt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    started = time.time()
    rows = ["| graph (op groups) | budget | solver | status | median s | objective (s) | "
            "extra % | bound (s) | gap |", "|---|---|---|---|---|---|---|---|---|"]
    for name, graph in _graphs(args.examples.split(",")):
        store = simulate(graph, store_all_schedule(graph)).peak_bytes
        lean = min(store, simulate(graph, recompute_all_schedule(graph)).peak_bytes)
        big = len(graph.groups) > args.exact_max_groups
        for fraction in FRACTIONS:
            budget = int(lean + fraction * (store - lean))
            share = 100 * budget / store
            where = f"{fraction:g}: {format_bytes(budget)} ({share:.0f}% of store-all)"
            for label in SOLVERS:
                runs = args.big_runs if big and label in EXACT else args.runs
                times, result, error = [], None, ""
                for _ in range(runs):
                    elapsed, result, error = _one(label, graph, budget, args.time_limit)
                    times.append(elapsed)
                median = statistics.median(times)
                note = f" ({runs} run{'s' if runs > 1 else ''})" if runs != args.runs else ""
                if result is None or result.schedule is None:
                    error = error or result.status.value
                    rows.append(f"| {name} ({len(graph.groups)}) | {where} | {label} | {error} | "
                                f"{median:.2f}{note} | | | | |")
                    print(rows[-1], flush=True)
                    continue
                extra = 100 * (result.objective / graph.base_cost - 1)
                rows.append(f"| {name} ({len(graph.groups)}) | {where} | {label} | "
                            f"{result.status.value} | {median:.2f}{note} | "
                            f"{_fmt(result.objective)} | {extra:.1f} | {_fmt(result.bound)} | "
                            f"{_fmt(result.gap, 3)} |")
                print(rows[-1], flush=True)
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    load_after = os.getloadavg()
    header = [
        "# Solver benchmark: time and objective / bound / gap per solver, graph and budget", "",
        f"Command: `python benchmarks/solver_table.py --runs {args.runs} --big-runs {args.big_runs} "
        f"--time-limit {args.time_limit:g} --examples {args.examples}`", "",
        f"Machine: {os.cpu_count()}-core {platform.machine()} ({cpu}), Python "
        f"{platform.python_version()}, torch {torch.__version__}, one thread per solver. "
        "**Shared** with other jobs while it ran: load average "
        f"{load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f} before and "
        f"{load_after[0]:.2f} / {load_after[1]:.2f} / {load_after[2]:.2f} after "
        f"({(time.time() - started) / 60:.0f} min); times are inflated and noisy, objectives "
        "and bounds are not.", "",
        "Times are the median of the runs, wall clock, model building included. Objective: the "
        "schedule's total modelled compute time (flops cost model); extra %: recomputation over "
        "one plain step; bound: the proven lower bound on the optimum (exact solvers only); gap: "
        "(objective - bound) / objective. Every exact solve is seeded with the cheapest fitting "
        "one of store-all, recompute-all, greedy and chain-dp and never returns worse; a "
        "back-end that stops without a solution of its own (CBC, often) returns that seed as "
        "status heuristic, without a bound. Graphs with more "
        f"than {args.exact_max_groups} op groups run the exact solvers {args.big_runs} time(s).",
        "",
    ]
    with open(args.out, "w") as fh:
        fh.write("\n".join(header + rows) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
