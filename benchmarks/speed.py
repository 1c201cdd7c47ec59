"""What-if speed: the largest-batch question with and without cheap bounds, side by side.

The search probes batch sizes; before this, every probe of every strategy was a full solve.
`optimizer.planning.batch_search.cheap_fit` settles a probe from the lower bound (no schedule
fits: nothing to solve) or, for the searching solvers, from store-all, recompute-all or the
greedy schedule fitting (the solver tries them): only the probes in between and the plan at
the answer are solved. Both runs must give the same answers; this script checks it.

    python benchmarks/speed.py [--model examples/gpt.py] [--budget 1GiB] [--time-limit 60]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from frontends.model_file import load_model_file
from optimizer.app.whatif import WhatIfRequest, what_if
from solvers.base import SolverOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="examples/gpt.py")
    parser.add_argument("--budget", default="1GiB")
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    model, inputs = load_model_file(args.model)
    rows = []
    answers = {}
    for bounds in (False, True):
        request = WhatIfRequest(model_name=args.model, budget=args.budget, max_batch=True, plots=False,
                                options=SolverOptions(time_limit_s=args.time_limit), bounds=bounds)
        start = time.perf_counter()
        solves = []
        report = what_if(model, inputs, request, progress=solves.append)
        seconds = time.perf_counter() - start
        answers[bounds] = {f.strategy: f.max_batch for f in report.max_batch.fits}
        probes = sum(len(f.probes) for f in report.max_batch.fits)
        rows.append((bounds, seconds, probes, sum(" at batch " in s for s in solves)))
    same = answers[False] == answers[True]
    print(f"`--max-batch --budget {args.budget}` on {args.model}, time limit {args.time_limit:g} s; "
          f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}; same answers: {same}\n")
    print("| bounds | wall time (s) | probes | full solves |")
    print("|---|---:|---:|---:|")
    for bounds, seconds, probes, solved in rows:
        print(f"| {'cheap bounds first' if bounds else 'every probe solved'} | {seconds:.1f} | {probes} | {solved} |")
    print("\n| strategy | max batch |")
    print("|---|---:|")
    for strategy, batch in answers[True].items():
        print(f"| {strategy} | {batch} |")
    if not same:  # a strategy whose fit is not monotone in the batch: probe order changes its answer
        print(f"\nanswers differ: {answers}")


if __name__ == "__main__":
    main()
