"""Graph runtime at store-all against plain autograd, the two alone (issue 38's 1.01x target).

Why apart from `benchmarks/step_time.py`: there eight strategies' models share the process and
take turns, and the store-all ratio moved by +-5% between runs; here only the two run, in
alternating order each round (plain first on even rounds, store-all first on odd ones), on the
same workloads step_time.py builds. Prints one line per model: the medians, their ratio, and the
median of each round's own ratio (paired: a slow spell of the machine hits both of a round).

    python benchmarks/store_all_ab.py [--models gpt2,llama,resnet] [--rounds 21]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import step_time  # noqa: E402  (the workloads and the timed step of the step-time benchmark)

from optimizer import optimize  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,llama,resnet")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = args.models.split(",")
    device = torch.device("cpu")
    workloads = step_time._transformers_workloads(names, "cpu", None, device)
    if "resnet" in names:
        workloads.append(step_time._resnet_workload(torch.float32, device))
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} alternating rounds, medians")
    for work in workloads:
        plain = copy.deepcopy(work.model)
        store_all = optimize(copy.deepcopy(work.model), work.args, "100%", example_kwargs=work.kwargs,
                             solver="store-all")
        times: dict[str, list[float]] = {"plain": [], "store-all": []}
        pair = [("plain", plain), ("store-all", store_all)]
        for _ in range(3):  # warm-up: lazy state, allocator
            for _, module in pair:
                step_time._step(module, work, device)
        for index in range(args.rounds):
            for name, module in (pair if index % 2 == 0 else pair[::-1]):
                times[name].append(step_time._step(module, work, device))
        a, b = statistics.median(times["plain"]), statistics.median(times["store-all"])
        paired = statistics.median(s / p for p, s in zip(times["plain"], times["store-all"]))
        print(f"{work.name}: plain {1e3 * a:.2f} ms, graph runtime at store-all {1e3 * b:.2f} ms, "
              f"ratio of medians {b / a:.3f}, median of the rounds' ratios {paired:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
