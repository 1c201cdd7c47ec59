"""Does the profile cost model add up? Per-op times summed vs a measured training step, on CPU.

The ``profile`` model prices each op by timing it alone; a plan's predicted step time is their
sum. This benchmark checks that sum against real steps of the same model: plain autograd and
the rewritten module at store-all (which runs exactly the captured graph's ops). Rounds are
interleaved (profile, eager step, rewritten step, again) so drifting machine load hits all three
alike; each figure is the median over rounds. Target: within 15% of the eager step.

On a loaded machine (load average above the core count) the step's wall-clock includes the time
the OS runs other processes, while per-op medians mostly pick un-preempted samples; the eager
step's CPU time (``time.process_time``) is shown beside it as the contention-free reference.

    python benchmarks/profile_vs_step.py [--threads 1] [--rounds 5] [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from frontends.capture.model_file import load_model_file  # noqa: E402
from frontends.capture.step import capture  # noqa: E402
from frontends.graph_runtime.remat_module import RematModule  # noqa: E402
from frontends.measure.profile import profile_step  # noqa: E402
from frontends.measure.step import measure_step  # noqa: E402
from solvers.planning.planner import plan_graph  # noqa: E402

TOLERANCE = 0.15


@dataclass(frozen=True)
class Row:
    """Medians over rounds, in seconds."""

    model: str
    ops: int
    profile_sum_s: float
    profile_groups_s: float
    eager_step_s: float
    eager_cpu_s: float
    """CPU time of the eager step (all threads of this process)."""
    remat_step_s: float

    @property
    def ratio(self) -> float:
        """All timed nodes (views included) over the eager step."""
        return self.profile_sum_s / self.eager_step_s

    @property
    def cpu_ratio(self) -> float:
        """All timed nodes over the eager step's CPU time."""
        return self.profile_sum_s / self.eager_cpu_s

    @property
    def groups_ratio(self) -> float:
        """The IR's ops only (what a plan's step time sums) over the eager step."""
        return self.profile_groups_s / self.eager_step_s


def _mark(ratio: float) -> str:
    return f"{ratio:.3f} {'ok' if abs(ratio - 1.0) <= TOLERANCE else 'OFF'}"


def _gpt_d256() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """A heavier GPT (4 x 256, seq 128, batch 8) where kernels, not Python, dominate the step."""
    spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
    assert spec is not None and spec.loader is not None
    gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpt)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = gpt.GPT(vocab_size=512, seq_len=128, d_model=256, n_heads=4, n_layers=4, dropout=0.0)
        tokens = torch.randint(0, 512, (8, 129))
    return model, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def _models() -> list[tuple[str, torch.nn.Module, tuple[Any, ...]]]:
    found = [(name, *load_model_file(str(ROOT / "examples" / f"{name}.py"))) for name in ("mlp", "gpt", "convnet")]
    return [*found, ("gpt-4x256", *_gpt_d256())]


def _cpu_time_step(model: torch.nn.Module, inputs: tuple[Any, ...], repeats: int) -> float:
    """Median process CPU time of an eager forward + backward (no time spent descheduled)."""
    times = []
    for _ in range(repeats + 1):
        for p in model.parameters():
            p.grad = None
        start = time.process_time()
        out = model(*inputs)
        (out[0] if isinstance(out, (tuple, list)) else out).backward()
        times.append(time.process_time() - start)
    for p in model.parameters():
        p.grad = None
    return statistics.median(times[1:])


def run(name: str, model: torch.nn.Module, inputs: tuple[Any, ...], rounds: int, repeats: int) -> Row:
    captured = capture(model, inputs)
    plan = plan_graph(captured.graph, 10**15, "store-all")
    remat = RematModule(model, capture(model, inputs), plan, inputs)  # a capture compiles once
    totals, groups, eager, eager_cpu, rewritten = [], [], [], [], []
    for _ in range(rounds):
        profile = profile_step(captured, model, inputs, warmup=1, repeats=repeats, refresh=True)
        totals.append(profile.total_seconds)
        groups.append(sum(profile.seconds_by_group(captured.graph).values()))
        eager.append(measure_step(model, inputs, warmup=1, repeats=repeats).step_time_s)
        eager_cpu.append(_cpu_time_step(model, inputs, repeats))
        rewritten.append(measure_step(remat, inputs, warmup=1, repeats=repeats).step_time_s)
    return Row(
        model=name, ops=len(profile.node_seconds),
        profile_sum_s=statistics.median(totals), profile_groups_s=statistics.median(groups),
        eager_step_s=statistics.median(eager), eager_cpu_s=statistics.median(eager_cpu), remat_step_s=statistics.median(rewritten),
    )


def table(rows: list[Row], threads: int, load: tuple[float, float]) -> str:
    lines = [
        f"CPU, {threads} thread(s), torch {torch.__version__}, {os.cpu_count()} cores, load average "
        f"{load[0]:.1f} before / {load[1]:.1f} after; medians over rounds; target: profile sum "
        f"within {TOLERANCE:.0%} of the eager step",
        "",
        "| model | nodes timed | all nodes (ms) | IR ops only (ms) | eager step (ms) | eager step CPU time (ms) "
        "| rewritten store-all step (ms) | all / eager | IR ops / eager | all / eager CPU time | all / rewritten |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.ops} | {r.profile_sum_s * 1e3:.2f} | {r.profile_groups_s * 1e3:.2f} "
            f"| {r.eager_step_s * 1e3:.2f} | {r.eager_cpu_s * 1e3:.2f} | {r.remat_step_s * 1e3:.2f} "
            f"| {_mark(r.ratio)} | {_mark(r.groups_ratio)} | {_mark(r.cpu_ratio)} "
            f"| {r.profile_sum_s / r.remat_step_s:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadiest)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per round")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    load_before = os.getloadavg()[0]
    rows = [run(name, model, inputs, args.rounds, args.repeats) for name, model, inputs in _models()]
    text = table(rows, args.threads, (load_before, os.getloadavg()[0]))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
