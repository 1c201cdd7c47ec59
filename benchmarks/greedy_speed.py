"""greedy's speed before and after the per-graph tables, side by side on the same graphs.

`solvers/greedy.py`, `solvers/ir/schedule.py` and `solvers/ir/simulator.py` as they were at
``--baseline`` (read with `git show`, loaded as private modules next to the working tree's) against
the working tree's: one `greedy` solve of each per graph and budget, alternating old and new,
``--repeats`` times. The table has the medians of wall time and of CPU time (what the solve itself
spent; on a shared machine the wall time also counts other processes). Both implementations must
return the same status, schedule, objective and message: the script checks it on every solve and
says so. The time limit is large, so that neither stops early (a deadline would make the answers
depend on speed).

    python benchmarks/greedy_speed.py [--repeats 3] [--gpt2] [--out benchmarks/greedy_speed.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import solvers.greedy as new_greedy  # noqa: E402
from frontends.capture.meta_capture import MetaCapturer  # noqa: E402
from frontends.capture.model_file import load_model_file  # noqa: E402
from frontends.capture.step import capture  # noqa: E402
from solvers.base import SolverOptions  # noqa: E402
from solvers.baselines import recompute_all_schedule, store_all_schedule  # noqa: E402
from solvers.ir.allocator import AllocatorModel  # noqa: E402
from solvers.ir.graph import RematGraph  # noqa: E402
from solvers.ir.simulator import simulate  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BASELINE = "6c37dc3"
"""The last commit before the per-graph tables (greedy ~8 ms per candidate on examples/gpt.py)."""
SWAPPED = ("solvers/ir/schedule.py", "solvers/ir/simulator.py", "solvers/greedy.py")
TIME_LIMIT_S = 3600.0


def _source_at(commit: str, path: str) -> str:
    """``path`` as it was at ``commit``; before the layers moved (c9c4516) the IR was optimizer/ir/."""
    for candidate in (path, path.replace("solvers/ir/", "optimizer/ir/")):
        shown = subprocess.run(["git", "show", f"{commit}:{candidate}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            return shown.stdout.replace("optimizer.ir.", "solvers.ir.")
    raise SystemExit(f"{path} is not in {commit}")


def load_baseline(commit: str) -> ModuleType:
    """The baseline's greedy, importing the baseline's schedule and simulator (the rest is shared)."""
    names = [path[:-3].replace("/", ".") for path in SWAPPED]
    current = {name: sys.modules[name] for name in names}
    try:
        with tempfile.TemporaryDirectory(prefix="greedy_baseline_") as folder:
            for path, name in zip(SWAPPED, names):
                source = _source_at(commit, path)
                file = os.path.join(folder, path.replace("/", "__"))
                with open(file, "w") as handle:
                    handle.write(source)
                spec = importlib.util.spec_from_file_location(name, file)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module  # the next baseline module imports this one
                spec.loader.exec_module(module)
                current[f"baseline {name}"] = module
    finally:
        for name in names:
            sys.modules[name] = current[name]
    return current["baseline solvers.greedy"]


def graphs(with_gpt2: bool) -> list[tuple[str, RematGraph, int]]:
    """(label, graph, budget): examples/gpt.py at batch 3000 and a 1 GiB budget (a what-if probe),
    and graphs at 30% of the way from recompute-all's peak to store-all's."""
    out = []
    alloc = AllocatorModel(block_bytes=1)
    model, inputs = load_model_file(os.path.join(ROOT, "examples/gpt.py"))
    capturer = MetaCapturer(model, inputs)
    out.append(("examples/gpt.py, batch 3000, 1 GiB", alloc.apply(capturer.at(3000).graph),
                alloc.solver_budget(1 << 30)))
    named = [("examples/gpt.py, batch 8", alloc.apply(capturer.at(8).graph))]
    for name in ("mlp", "convnet"):
        model, inputs = load_model_file(os.path.join(ROOT, f"examples/{name}.py"))
        named.append((f"examples/{name}.py", capture(model, inputs).graph))
    if with_gpt2:
        from examples import gpt2

        cfg = gpt2.get_config("small")
        named.append(("GPT-2-small (meta), batch 8",
                      capture(gpt2.get_model(cfg, device="meta"), gpt2.get_inputs(cfg, device="meta")).graph))
    for label, graph in named:
        store = simulate(graph, store_all_schedule(graph)).peak_bytes
        lean = simulate(graph, recompute_all_schedule(graph)).peak_bytes
        out.append((f"{label}, 30% of the way to store-all", graph, int(lean + 0.3 * (store - lean))))
    return out


def plain(result) -> tuple:
    """What must match, free of either implementation's classes."""
    schedule = result.schedule
    steps = None if schedule is None else tuple(
        tuple((s.kind.value, s.node) for s in part) for part in (schedule.forward, schedule.backward))
    return result.status.value, steps, result.objective, result.message


def timed(solve, graph: RematGraph, budget: int) -> tuple[float, float, tuple]:
    graph = dataclasses.replace(graph)  # a new graph object: no tables or cached lookups kept from a last solve
    wall, cpu = time.perf_counter(), time.process_time()
    result = solve(graph, budget, SolverOptions(time_limit_s=TIME_LIMIT_S))
    return time.perf_counter() - wall, time.process_time() - cpu, plain(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--gpt2", action="store_true", help="also GPT-2-small (~690 op groups; minutes)")
    parser.add_argument("--out", default=None, help="also write the table to this Markdown file")
    args = parser.parse_args()
    old_greedy = load_baseline(args.baseline)
    cases = graphs(args.gpt2)
    load_before = os.getloadavg()[0]
    rows, all_same = [], True
    for label, graph, budget in cases:
        times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        answers = set()
        for _ in range(args.repeats):
            for which, module in (("old", old_greedy), ("new", new_greedy)):
                wall, cpu, answer = timed(module.solve_greedy, graph, budget)
                times[which].append((wall, cpu))
                answers.add(answer)
        same = len(answers) == 1
        all_same &= same
        (old_wall, old_cpu), (new_wall, new_cpu) = (
            tuple(statistics.median(t[k] for t in times[w]) for k in (0, 1)) for w in ("old", "new"))
        status = next(iter(answers))[0] if same else "differ"
        rows.append(f"| {label} | {len(graph.groups)} | {status} | {old_wall:.3f} | {new_wall:.3f} | "
                    f"{old_wall / new_wall:.1f}x | {old_cpu:.3f} | {new_cpu:.3f} | {old_cpu / new_cpu:.1f}x | "
                    f"{'yes' if same else 'NO'} |")
        print(rows[-1], flush=True)
    lines = [
        f"`python benchmarks/greedy_speed.py{' --gpt2' if args.gpt2 else ''}`: one `greedy` solve, baseline "
        f"{args.baseline} (old) against the working tree (new), alternating, median of {args.repeats}; "
        f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, load {load_before:.1f} before and {os.getloadavg()[0]:.1f} after. "
        f"Same answers (status, schedule, objective, message) on every solve: {'yes' if all_same else 'NO'}.",
        "",
        "| graph, budget | op groups | status | old wall (s) | new wall (s) | speed-up | old CPU (s) | "
        "new CPU (s) | speed-up (CPU) | same answer |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
        *rows,
    ]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")
    if not all_same:
        sys.exit("the old and new greedy returned different answers")


if __name__ == "__main__":
    main()
