"""Where does the graph runtime's store-all step spend time that plain autograd does not? Op by op.

Per model, profiled training steps (three by default, averaged) of plain autograd and of
remat-opt's graph runtime at store-all (nothing recomputed: the same math, so every difference is how it is run), after two
warm-up steps each. The table lists the ops (aten ops on the CPU, kernels on CUDA) whose total
time differs most between the two, with call counts, then the step totals: a slower graph runtime
shows here as an op eager does not run (a mask, a copy, a layout change), another kernel for the
same op (math instead of flash attention), or many more calls.

    python benchmarks/kernel_diff.py [--device cpu|cuda] [--size cpu|gpu] [--models gpt2,llama]
        [--top 15] [--steps 3] [--out FILE.md]

On a lent GPU (issue 38's shapes): ``python benchmarks/kernel_diff.py --device cuda --size gpu``.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_time import SHAPES, _step, _transformers_workloads  # noqa: E402

from optimizer import optimize  # noqa: E402


def _profile(module: torch.nn.Module, work, device: torch.device,
             steps: int) -> tuple[dict[str, tuple[float, float]], float]:
    """(op or kernel name -> (calls, seconds) per step), wall seconds per profiled step."""
    for _ in range(2):
        _step(module, work, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        wall = sum(_step(module, work, device) for _ in range(steps)) / steps
    table: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for event in prof.key_averages():
        if device.type == "cuda":
            seconds = getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0)) / 1e6
            if seconds <= 0:
                continue  # host-only records: the kernels they launch carry the device time
        else:
            if not event.key.startswith("aten::"):
                continue
            seconds = event.self_cpu_time_total / 1e6
        table[event.key][0] += event.count
        table[event.key][1] += seconds
    return {k: (c / steps, s / steps) for k, (c, s) in table.items()}, wall


def compare(work, device: torch.device, top: int, steps: int) -> list[str]:
    plain = copy.deepcopy(work.model)
    graph = optimize(copy.deepcopy(work.model), work.args, "100%", example_kwargs=work.kwargs, solver="store-all",
                     cost_model="flops")
    plain_ops, plain_wall = _profile(plain, work, device, steps)
    graph_ops, graph_wall = _profile(graph, work, device, steps)
    names = set(plain_ops) | set(graph_ops)
    rows = sorted(names, key=lambda n: -abs(graph_ops.get(n, (0, 0.0))[1] - plain_ops.get(n, (0, 0.0))[1]))
    unit = "kernel" if device.type == "cuda" else "aten op"
    out = [f"\n**{work.description}** ({unit}s by the largest difference in self time, per step, "
           f"{steps} profiled steps each)\n",
           f"| {unit} | plain calls | plain ms | graph calls | graph ms | graph - plain ms |",
           "|---|---:|---:|---:|---:|---:|"]
    for name in rows[:top]:
        pc, ps = plain_ops.get(name, (0, 0.0))
        gc_, gs = graph_ops.get(name, (0, 0.0))
        shown = name if len(name) <= 70 else name[:67] + "..."
        out.append(f"| `{shown}` | {pc:g} | {ps * 1e3:.2f} | {gc_:g} | {gs * 1e3:.2f} | {(gs - ps) * 1e3:+.2f} |")
    plain_total = sum(s for _, s in plain_ops.values())
    graph_total = sum(s for _, s in graph_ops.values())
    out.append(f"| **all** | {sum(c for c, _ in plain_ops.values()):g} | {plain_total * 1e3:.2f} | "
               f"{sum(c for c, _ in graph_ops.values()):g} | {graph_total * 1e3:.2f} | "
               f"{(graph_total - plain_total) * 1e3:+.2f} |")
    out.append(f"\nProfiled steps, wall clock each: plain {plain_wall * 1e3:.1f} ms, graph runtime {graph_wall * 1e3:.1f} ms "
               "(the profiler's own overhead included).")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", default="cpu", choices=sorted(SHAPES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per strategy (averaged)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    lines = [f"Command: `python benchmarks/kernel_diff.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
             f"torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), device "
             f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"]
    for work in _transformers_workloads(args.models.split(","), args.size, None, device):
        lines += compare(work, device, args.top, args.steps)
        print("\n".join(lines[-args.top - 6:]), flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
