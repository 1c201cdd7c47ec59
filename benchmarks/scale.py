"""The scale benchmark: GPT-2-small's whole training graph planned by ``hierarchical``.

Captured from a meta-device model (nothing allocated). For GPT-2-small (12 x 768, 12 heads,
seq 512, batch 8, vocab 50257) at 30/50/70/90% of store-all *activation* memory (budget =
parameters + gradients + inputs + p * (store-all peak - those)): solve time, extra compute,
proven gap; the 48-layer variant's solve time against the 12-layer one; extra compute at the
memory of per-block checkpointing against ``blocks`` itself, with what each recomputes per
block; and GPT-2-XL planned from shapes alone. The preset as given (dropout 0.1, returns
``(loss, logits)``) and a variant without dropout returning the loss only.

    python benchmarks/scale.py --out benchmarks/scale.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from examples import gpt2  # noqa: E402
from frontends.capture.step import capture  # noqa: E402
from optimizer.meta_plan import plan_without_hardware  # noqa: E402
from solvers import get_solver  # noqa: E402
from solvers.base import SolverOptions  # noqa: E402
from solvers.baselines import store_all_schedule  # noqa: E402
from solvers.ir.reduce import reduce_graph  # noqa: E402
from solvers.ir.simulator import simulate  # noqa: E402
from solvers.planning.planner import block_of  # noqa: E402

FRACTIONS = (0.3, 0.5, 0.7, 0.9)


class LossOnly(torch.nn.Module):
    """The model's loss alone: the caller holds no logits (and gets no logits gradient)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args)[0]


def _capture(cfg, loss_only: bool):
    start = time.perf_counter()
    model = gpt2.get_model(cfg, device="meta")
    step = capture(LossOnly(model) if loss_only else model, gpt2.get_inputs(cfg, device="meta"))
    return step, time.perf_counter() - start


def _budget(graph, fraction: float) -> tuple[int, int]:
    fixed = graph.parameter_bytes + graph.gradient_bytes + graph.input_bytes
    peak = simulate(graph, store_all_schedule(graph)).peak_bytes
    return int(fixed + fraction * (peak - fixed)), peak


def _solve(graph, budget: int, limit: float):
    start = time.perf_counter()
    result = get_solver("hierarchical")(graph, budget, SolverOptions(time_limit_s=limit))
    return result, time.perf_counter() - start


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _best_classic(result) -> str:
    """The cheapest classic schedule the solver ran (from its message's 'tried' list)."""
    tried = result.message.split("tried: ")[-1].split(", ")
    classic = [t.rsplit(" ", 1) for t in tried if t.split(" ")[0] in ("chain-dp", "greedy", "chen-greedy", "blocks")]
    costs = [(float(c), n) for n, c in classic if c != "-"]
    return f"{min(costs)[1]} {min(costs)[0]:.4g}" if costs else "none fits"


def _rows(graph, limit: float, lines: list[str]) -> dict[float, float]:
    """One table row per budget; then, per block, what the 70% plan recomputes."""
    lines.append("| budget (% of activations) | bytes | status | solve time | extra compute | proven gap | bound's extra | source | best classic (cost) |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    times, selective = {}, None
    for fraction in FRACTIONS:
        budget, _ = _budget(graph, fraction)
        result, seconds = _solve(graph, budget, limit)
        times[fraction] = seconds
        if result.schedule is None:
            lines.append(f"| {100 * fraction:.0f}% | {budget / 1e9:.2f} GB | infeasible (proven) | {seconds:.1f} s | - | - | - | {result.message[:90]} | - |")
            continue
        extra = (result.objective - graph.base_cost) / graph.base_cost
        bound_extra = (result.bound - graph.base_cost) / graph.base_cost
        source = result.message.split(";")[0].removeprefix("best: ")
        if fraction == 0.7:
            selective = result.schedule
        lines.append(f"| {100 * fraction:.0f}% | {budget / 1e9:.2f} GB | {result.status.value} | {seconds:.1f} s | "
                     f"{_pct(extra)} | {_pct(result.gap)} | {_pct(bound_extra)} | {source} | {_best_classic(result)} |")
    if selective is not None:
        lines.append("")
        lines.append("What the 70% plan recomputes (extra runs per op kind; one block early, one late):")
        for block in _sample_blocks(graph):
            lines.append(f"- `{block}`: {_recomputed_ops(graph, selective, block)}")
    return times


def _sample_blocks(graph) -> list[str]:
    names = sorted({block_of(n.module) for n in graph.ops if block_of(n.module)[-1].isdigit()},
                   key=lambda b: int(b.rsplit(".", 1)[1]))
    return list(dict.fromkeys([names[0], names[-1]])) if names else []


def _recomputed_ops(graph, schedule, block: str) -> str:
    sim = simulate(graph, schedule)
    groups = {graph[name].group: times for name, times in sim.recomputed
              if block_of(graph[name].module) == block}
    ops = Counter(graph[graph.groups[g][0]].op.replace("aten.", "").replace(".default", "")
                  for g, times in groups.items() for _ in range(times - 1))
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(ops.items())) or "nothing"


def _versus_blocks(graph, limit: float, lines: list[str]) -> None:
    blocks = get_solver("blocks")(graph, 10**15, SolverOptions())
    sim = simulate(graph, blocks.schedule)
    ours, seconds = _solve(graph, sim.peak_bytes, limit)
    ours_extra = (ours.objective - graph.base_cost) / graph.base_cost
    theirs = sim.extra_cost / graph.base_cost
    lines.append(f"At per-block checkpointing's peak ({sim.peak_bytes / 1e9:.2f} GB): `blocks` extra compute "
                 f"{_pct(theirs)}, `hierarchical` {_pct(ours_extra)} (gap {_pct(ours.gap)}, {seconds:.1f} s): "
                 f"ratio {ours_extra / theirs:.2f}.\n")
    for block in _sample_blocks(graph):
        lines.append(f"- `{block}` recomputed by hierarchical: {_recomputed_ops(graph, ours.schedule, block)}")
        lines.append(f"- `{block}` recomputed by blocks: {_recomputed_ops(graph, blocks.schedule, block)}")
    lines.append("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--skip-xl", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = ["# Scale benchmark: GPT-2 training graphs planned by `hierarchical`", "",
             f"Command: `python benchmarks/scale.py --out benchmarks/scale.md` (time limit {args.time_limit:.0f} s). "
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs shared with other jobs "
             f"(load average at start {os.getloadavg()[0]:.1f}); torch {torch.__version__}; cost model flops. "
             "Gap = (objective - proven bound) / objective on total step cost.", ""]
    small = gpt2.get_config("small")
    for title, cfg, loss_only in (("GPT-2-small preset (dropout 0.1, returns loss and logits)", small, False),
                                  ("GPT-2-small, dropout 0, returns the loss only", gpt2.get_config("small", dropout=0.0), True)):
        step, seconds = _capture(cfg, loss_only)
        graph = step.graph
        reduction = reduce_graph(graph, fx_nodes=len(step.gm.graph.nodes))
        _, peak = _budget(graph, 1.0)
        lines += [f"## {title}", "", f"Meta capture {seconds:.1f} s; {reduction.counts.describe()}; "
                  f"store-all peak {peak / 1e9:.2f} GB.", ""]
        times = _rows(graph, args.time_limit, lines)
        lines.append("")
        _versus_blocks(graph, args.time_limit, lines)
        print("\n".join(lines), flush=True)
    deep_cfg = gpt2.get_config("small", n_layers=48, dropout=0.0)
    step, seconds = _capture(deep_cfg, True)
    budget, _ = _budget(step.graph, 0.7)
    deep, deep_s = _solve(step.graph, budget, args.time_limit)
    shallow = times[0.7]
    lines += ["## 48 layers (dropout 0, loss only) at 70%", "",
              f"Meta capture {seconds:.1f} s, {len(step.graph.groups)} op groups; solve {deep_s:.1f} s vs "
              f"{shallow:.1f} s for 12 layers: ratio {deep_s / shallow:.2f}; status {deep.status.value}, "
              f"extra {_pct(None if deep.objective is None else (deep.objective - step.graph.base_cost) / step.graph.base_cost)}, "
              f"gap {_pct(deep.gap)}. ({deep.message.split('; reduced')[0]})", ""]
    if not args.skip_xl:
        xl = gpt2.get_config("xl")
        planned = plan_without_hardware(lambda: gpt2.get_model(xl, device="meta"),
                                        gpt2.get_inputs(xl, device="meta"), "70%",
                                        time_limit=args.time_limit, name="GPT-2-XL (48 x 1600, seq 1024)")
        lines += ["## GPT-2-XL planned from shapes alone (70% of store-all peak)", "", "```", planned.report, "```", ""]
    lines.append(f"Load average at the end: {os.getloadavg()[0]:.1f} (2 CPUs shared by several jobs: times are pessimistic).")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
