"""What-if speed: the questions users ask, timed side by side in one run (issue 17).

- ``--max-batch --budget 1GiB`` with every strategy: the fitted path (graphs predicted from
  captures at three batches, searches started at the bounds, strategies on ``--jobs`` workers)
  against the same with torch's min-cut left out (its partitioner, torch's code, runs 11 times
  per batch it confirms), and, with ``--slow-path``, against a capture and a full solve at every
  probe on one core (what the CLI did before; about 18 minutes on examples/gpt.py here). The
  answers must be equal: the script says so.
- ``--sweep 20%:100%:10`` on one core and on ``--jobs`` workers (the same points).
- PyTorch's min-cut partitioner on the same joint graph at one ``activation_memory_budget``: the
  yardstick the issue compares with.
- With ``--gpt2-small``: `hierarchical` on GPT-2-small (12 x 768, seq 512, batch 8, loss only, no
  dropout, captured on the meta device) at 50%, 70% and 90% of store-all's activations, as
  benchmarks/scale.py plans it: solve time and proven gap.

    python benchmarks/speed.py [--model examples/gpt.py] [--budget 1GiB] [--time-limit 60] [--jobs N] [--slow-path]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from benchmarks.scale import _budget, _capture, _solve  # noqa: E402
from examples import gpt2  # noqa: E402
from frontends.capture.meta_capture import MetaCapturer  # noqa: E402
from frontends.capture.model_file import load_model_file  # noqa: E402
from frontends.compile.torch_partitioner import partition_schedule  # noqa: E402
from optimizer.whatif import WhatIfRequest, what_if  # noqa: E402
from solvers.base import SolverOptions  # noqa: E402
from solvers.planning.parallel import default_jobs  # noqa: E402
from solvers.planning.sweep import ALL_STRATEGIES, TORCH_STRATEGY, parse_sweep  # noqa: E402


def max_batch(model, inputs, args, *, bounds: bool, jobs: int, strategies=ALL_STRATEGIES):
    request = WhatIfRequest(model_name=args.model, budget=args.budget, max_batch=True, plots=False,
                            options=SolverOptions(time_limit_s=args.time_limit), bounds=bounds, jobs=jobs,
                            strategies=strategies)
    start = time.perf_counter()
    report = what_if(model, inputs, request)
    seconds = time.perf_counter() - start
    result = report.max_batch
    return seconds, {f.strategy: f.max_batch for f in result.fits}, result.captures, \
        sum(len(f.probes) for f in result.fits)


def sweep(model, inputs, args, jobs: int):
    request = WhatIfRequest(model_name=args.model, sweep=parse_sweep(args.sweep), plots=False,
                            options=SolverOptions(time_limit_s=args.time_limit), jobs=jobs)
    start = time.perf_counter()
    report = what_if(model, inputs, request)
    seconds = time.perf_counter() - start
    points = [(p.strategy, p.budget_bytes, p.setting, p.status, p.peak_bytes) for p in report.sweep.points]
    return seconds, points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="examples/gpt.py")
    parser.add_argument("--budget", default="1GiB")
    parser.add_argument("--sweep", default="20%:100%:10")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--gpt2-small", action="store_true", help="also time GPT-2-small's plans (slow)")
    parser.add_argument("--skip-what-if", action="store_true", help="only the --gpt2-small rows")
    parser.add_argument("--slow-path", action="store_true",
                        help="also time a capture and full solve at every probe on one core (slow)")
    args = parser.parse_args()
    if args.gpt2_small:
        gpt2_small(args.time_limit)
    if args.skip_what_if:
        return
    model, inputs = load_model_file(args.model)
    load = os.getloadavg()[0]
    rows = []
    fast = max_batch(model, inputs, args, bounds=True, jobs=args.jobs)
    rows.append((f"fitted graphs, bounds first, {args.jobs} jobs", *fast))
    no_torch = tuple(s for s in ALL_STRATEGIES if s != TORCH_STRATEGY)
    rows.append((f"the same without {TORCH_STRATEGY}", *max_batch(model, inputs, args, bounds=True, jobs=args.jobs,
                                                                strategies=no_torch)))
    if args.slow_path:
        rows.append(("capture + full solve at every probe, 1 job", *max_batch(model, inputs, args, bounds=False,
                                                                              jobs=1)))
    one, points_one = sweep(model, inputs, args, 1)
    many, points_many = sweep(model, inputs, args, args.jobs)
    step = MetaCapturer(model, inputs).at()
    partition_times = []
    for _ in range(3):
        start = time.perf_counter()
        partition_schedule(step, 0.5)
        partition_times.append(time.perf_counter() - start)

    print(f"{args.model}, time limit {args.time_limit:g} s; torch {torch.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} cores, load {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end\n")
    print(f"`--max-batch --budget {args.budget}`, every strategy unless said:\n")
    print("| path | wall time (s) | captures | probes |")
    print("|---|---:|---:|---:|")
    for name, seconds, _, captures, probes in rows:
        print(f"| {name} | {seconds:.1f} | {captures} | {probes} |")
    answers = [r[2] for r in rows]
    same = all(a == {k: v for k, v in answers[0].items() if k in a} for a in answers[1:])
    print(f"\nMax batch per strategy (same answers on every path: {same}): "
          + ", ".join(f"{k} {v:,}" for k, v in answers[0].items()))
    if not same:
        print(f"\nanswers differ: {answers}")
    print(f"\n`--sweep {args.sweep}` (every strategy): {one:.1f} s on 1 job, {many:.1f} s on {args.jobs} jobs; "
          f"same points: {[p[:4] for p in points_one] == [p[:4] for p in points_many]}")
    print(f"\nPyTorch's min-cut partitioner on the same joint graph at activation_memory_budget=0.5: "
          f"{statistics.median(partition_times):.2f} s (median of 3)")


def gpt2_small(time_limit: float) -> None:
    load = os.getloadavg()[0]
    step, capture_s = _capture(dataclasses.replace(gpt2.PRESETS["small"], dropout=0.0), loss_only=True)
    print(f"GPT-2-small (loss only, no dropout): capture {capture_s:.1f} s, {len(step.graph.groups)} op groups; "
          f"load {load:.1f}\n")
    print("| budget (% of activations) | solve time (s) | extra compute | proven gap | status |")
    print("|---|---:|---:|---:|---|")
    for fraction in (0.5, 0.7, 0.9):
        budget, _ = _budget(step.graph, fraction)
        result, seconds = _solve(step.graph, budget, time_limit)
        extra = "-" if result.objective is None else f"{100 * (result.objective / step.graph.base_cost - 1):.2f}%"
        gap = "-" if result.gap is None else f"{100 * result.gap:.2f}%"
        print(f"| {100 * fraction:.0f}% | {seconds:.1f} | {extra} | {gap} | {result.status.value} |")
    print()


if __name__ == "__main__":
    main()
