"""The memory floor with and without splitting the LM head and loss into row chunks (issue 23).

Captured from meta-device models (nothing allocated), dropout 0. For a 4-layer GPT-2-shaped
model (vocab 50257, small width) returning the loss only and returning (loss, logits), for
k = 1 (unsplit), 2, 4, 8 row chunks (`frontends.row_split`): store-all's peak, the proven lower
bound on every schedule's peak (`solvers.checkmate.min_budget.peak_lower_bound`), the smallest
feasible budget found (`smallest_feasible_budget`: CP-SAT peak minimization on small graphs,
else the leanest classic schedule), then a plan (``auto`` solver) at one budget every k
reaches (the unsplit smallest found x 1.05): planning time, extra FLOPs, the step's own FLOPs.
``--gpt2-small`` adds GPT-2-small (12 x 768, seq 512, batch 8) floor rows and plans at 30% and
20%; ``--measure`` runs the 4-layer model (loss only, real float32 tensors on the CPU) at 30% of
its unsplit store-all peak, split in 8: measured peak against budget and prediction, gradients
against eager. ``--mlp`` adds an MLP-heavy GPT-2 shape (4 x 256, seq 128, batch 16, vocab 1024:
the 2048 x 1024 MLP intermediate is the largest activation) and bisects the smallest budget the
planner reaches with the head split in 8, without and with every MLP split in 8 too
(`frontends.mlp_split`), next to each one's proven lower bound.

    python benchmarks/split_floor.py --out benchmarks/split_floor.md [--gpt2-small] [--measure] [--mlp]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from benchmarks.scale import LossOnly  # noqa: E402
from examples import gpt2  # noqa: E402
from frontends.capture import CapturedStep, capture  # noqa: E402
from optimizer import optimize  # noqa: E402
from optimizer.ir.simulator import simulate  # noqa: E402
from optimizer.planning.planner import plan_graph  # noqa: E402
from solvers.base import InfeasibleBudgetError, SolverOptions  # noqa: E402
from solvers.baselines import store_all_schedule  # noqa: E402
from solvers.checkmate.min_budget import peak_lower_bound, smallest_feasible_budget  # noqa: E402
from tests.e2e_helpers import clone, max_relative_error, measured_peak, train_step  # noqa: E402

CHUNKS = (1, 2, 4, 8)
SMALL_4_LAYERS = gpt2.GPT2Config(n_layers=4, d_model=128, n_heads=4, seq_len=256, batch=4,
                                 vocab_size=50257, dropout=0.0)
GPT2_SMALL = gpt2.get_config("small", dropout=0.0)
MLP_HEAVY = gpt2.GPT2Config(n_layers=4, d_model=256, n_heads=4, seq_len=128, batch=16, vocab_size=1024,
                            dropout=0.0)
BISECT_STEP = 1 << 20
COMMON_BUDGET_MARGIN = 1.05


@dataclass(frozen=True)
class Floor:
    chunks: int
    step: CapturedStep
    capture_s: float
    store_all: int
    lower: int
    smallest: int
    exact: bool
    method: str


def _floor(cfg: gpt2.GPT2Config, loss_only: bool, chunks: int, limit: float) -> Floor:
    start = time.perf_counter()
    model = gpt2.get_model(cfg, device="meta")
    step = capture(LossOnly(model) if loss_only else model, gpt2.get_inputs(cfg, device="meta"),
                   split_rows=chunks)
    took = time.perf_counter() - start
    found = smallest_feasible_budget(step.graph, SolverOptions(time_limit_s=limit))
    return Floor(chunks, step, took, simulate(step.graph, store_all_schedule(step.graph)).peak_bytes,
                 max(peak_lower_bound(step.graph), found.lower_bytes), found.smallest_bytes, found.exact,
                 found.method)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def _variant(cfg: gpt2.GPT2Config, loss_only: bool, limit: float, fractions: tuple[float, ...],
             plan_chunks: tuple[int, ...], lines: list[str]) -> None:
    floors = [_floor(cfg, loss_only, k, limit) for k in CHUNKS]
    reference = floors[0].store_all
    logits = cfg.batch * cfg.seq_len * cfg.vocab_size * 4
    lines += ["", f"**{'loss only' if loss_only else 'returns (loss, logits)'}** "
              f"(logits {_mb(logits)}; percentages of the unsplit store-all peak {_mb(reference)}):", "",
              "| k | capture | values | store-all | proven lower bound | smallest found | how |",
              "|---|---|---|---|---|---|---|"]
    for f in floors:
        lines.append(f"| {f.chunks} | {f.capture_s:.1f} s | {len(f.step.graph.ops)} | {_mb(f.store_all)} | "
                     f"{_mb(f.lower)} ({100 * f.lower / reference:.1f}%) | {_mb(f.smallest)} "
                     f"({100 * f.smallest / reference:.1f}%){' exact' if f.exact else ''} | {f.method} |")
    budgets = [int(floors[0].smallest * COMMON_BUDGET_MARGIN)] + [int(reference * p) for p in fractions]
    planned = [f for f in floors if f.chunks in plan_chunks]
    if not planned:
        return
    lines += ["", f"Plans (solver auto, time limit {limit:g} s); the first budget is the unsplit smallest "
              f"found x {COMMON_BUDGET_MARGIN}, which every k reaches; budgets below a k's proven lower "
              "bound are not planned:", "",
              "| budget | k | status | planning time | extra FLOPs | extra compute | proven gap | "
              "step FLOPs vs k=1 | predicted peak |", "|---|---|---|---|---|---|---|---|---|"]
    base_flops = floors[0].step.graph.base_flops
    for budget in budgets:
        for f in planned:
            where = f"{_mb(budget)} ({100 * budget / reference:.0f}%) | {f.chunks}"
            if budget < f.lower:
                continue
            start = time.perf_counter()
            try:
                plan = plan_graph(f.step.graph, budget, "auto", SolverOptions(time_limit_s=limit))
            except InfeasibleBudgetError as err:
                lines.append(f"| {where} | infeasible (smallest found {_mb(err.smallest_feasible_bytes or 0)}) | "
                             f"{time.perf_counter() - start:.1f} s | - | - | - | - | - |")
                continue
            gap = "-" if plan.gap is None else f"{100 * plan.gap:.2f}%"
            lines.append(f"| {where} | {plan.status} | {time.perf_counter() - start:.1f} s | "
                         f"{plan.extra_flops / 1e9:.2f} GFLOP | {plan.extra_percent:.2f}% | {gap} | "
                         f"{100 * (plan.step_flops / base_flops - 1):+.4f}% | {_mb(plan.predicted_peak_bytes)} |")


def _measure(cfg: gpt2.GPT2Config, fraction: float, chunks: int, limit: float, lines: list[str]) -> None:
    """Run the plan: measured peak (live tensors, parameters and inputs included) vs the budget."""
    model = LossOnly(gpt2.get_model(cfg))
    inputs = gpt2.get_inputs(cfg)
    start = time.perf_counter()
    rm = optimize(clone(model), inputs, f"{100 * fraction:g}%", split=chunks, time_limit=limit)
    planned = time.perf_counter() - start
    peak = measured_peak(rm, inputs)
    (loss, *_), grads = train_step(rm, inputs)
    (expected_loss, *_), expected = train_step(model, inputs)
    plan = rm.plan
    lines += ["", f"**Run on the CPU** (loss only, float32, real tensors): `optimize(model, inputs, "
              f"\"{100 * fraction:g}%\", split={chunks})`, the unsplit step's proven floor being above "
              "that budget:", "",
              "| budget | predicted peak | measured peak | extra compute | capture + plan | loss rel. error | "
              "max grad rel. error |", "|---|---|---|---|---|---|---|",
              f"| {plan.budget_bytes:,} B | {plan.predicted_peak_bytes:,} B | {peak:,} B | "
              f"{plan.extra_percent:.2f}% | {planned:.1f} s | "
              f"{abs(float(loss) - float(expected_loss)) / abs(float(expected_loss)):.1e} | "
              f"{max_relative_error(grads, expected):.1e} |", "",
              f"Plan message: {plan.message}"]


def _smallest_planned(step: CapturedStep, limit: float) -> tuple[int, int]:
    """(smallest budget the ``auto`` planner plans, to `BISECT_STEP`; the proven lower bound)."""
    lower = peak_lower_bound(step.graph)
    try:
        plan_graph(step.graph, 1, "auto", SolverOptions(time_limit_s=limit))
        return 1, lower
    except InfeasibleBudgetError as err:
        high, lower = err.smallest_feasible_bytes, max(lower, err.lower_bound_bytes or 0)
    low = lower
    while high - low > BISECT_STEP:
        mid = (low + high) // 2
        try:
            high = plan_graph(step.graph, mid, "auto", SolverOptions(time_limit_s=limit)).predicted_peak_bytes
        except InfeasibleBudgetError:
            low = mid
    return high, lower


def _mlp_split_floor(cfg: gpt2.GPT2Config, limit: float, lines: list[str]) -> None:
    """The smallest planned budget, head split in 8, without and with the MLPs split in 8."""
    lines += ["", f"**MLP split** (loss only; `capture(..., split_rows=8, split_mlp=m)`, then the `auto` "
              f"planner bisected to {BISECT_STEP >> 20} MiB):", "",
              "| MLP chunks | store-all | proven lower bound | smallest budget planned | capture |",
              "|---|---|---|---|---|"]
    for mlp in (1, 8):
        start = time.perf_counter()
        step = capture(LossOnly(gpt2.get_model(cfg, device="meta")), gpt2.get_inputs(cfg, device="meta"),
                       split_rows=8, split_mlp=mlp)
        took = time.perf_counter() - start
        store_all = simulate(step.graph, store_all_schedule(step.graph)).peak_bytes
        smallest, lower = _smallest_planned(step, limit)
        lines.append(f"| {mlp} | {_mb(store_all)} | {_mb(lower)} | {_mb(smallest)} "
                     f"({100 * smallest / store_all:.1f}% of store-all) | {took:.1f} s |")
        print(f"done: MLP split {mlp} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    if mlp > 1:
        lines += ["", f"Capture note: {step.notes[-1]}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--gpt2-small", action="store_true", help="add GPT-2-small floor rows and plans")
    parser.add_argument("--measure", action="store_true", help="run the 4-layer model's split plan")
    parser.add_argument("--mlp", action="store_true", help="add the MLP-heavy shape's MLP split floor")
    parser.add_argument("--mlp-only", action="store_true", help="only the MLP split floor (implies --mlp)")
    args = parser.parse_args()
    start = time.perf_counter()
    lines = ["# Splitting the LM head and loss: the memory floor", "",
             "Command: `python benchmarks/split_floor.py" + (" --gpt2-small" if args.gpt2_small else "")
             + (" --measure" if args.measure else "") + (" --mlp-only" if args.mlp_only else " --mlp" if args.mlp else "")
             + (f" --time-limit {args.time_limit:g}" if args.time_limit != 30.0 else "")
             + (f" --out {args.out}`" if args.out else "`"),
             f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores (shared), torch {torch.__version__}, "
             "cost model flops, float32, models on the meta device. Percentages are of the whole store-all "
             "peak of the unsplit step (what `optimize(..., \"30%\")` means), not of activation memory "
             "as in benchmarks/scale.md.", ""]
    configs = [("4-layer GPT-2 shape", SMALL_4_LAYERS, {True: (0.5, 0.3, 0.2), False: (0.5,)}, CHUNKS)]
    args.mlp = args.mlp or args.mlp_only
    if args.mlp_only:
        configs = []
    if args.gpt2_small:  # planned at 30% and 20% loss only, split in 8 (its planning takes minutes)
        configs.append(("GPT-2-small", GPT2_SMALL, {True: (0.3, 0.2), False: ()}, (8,)))
    for name, cfg, fractions, plan_chunks in configs:
        lines += [f"## {name}: {cfg.n_layers} x {cfg.d_model}, {cfg.n_heads} heads, seq {cfg.seq_len}, "
                  f"batch {cfg.batch}, vocab {cfg.vocab_size}, dropout 0"]
        for loss_only in (True, False):
            _variant(cfg, loss_only, args.time_limit, fractions[loss_only],
                     plan_chunks if fractions[loss_only] else (), lines)
            print(f"done: {name}, {'loss only' if loss_only else 'loss and logits'} "
                  f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        if args.measure and cfg is SMALL_4_LAYERS:
            _measure(cfg, 0.3, 8, args.time_limit, lines)
        lines.append("")
    if args.mlp:
        lines += [f"## MLP-heavy GPT-2 shape: {MLP_HEAVY.n_layers} x {MLP_HEAVY.d_model}, seq {MLP_HEAVY.seq_len}, "
                  f"batch {MLP_HEAVY.batch}, vocab {MLP_HEAVY.vocab_size}, dropout 0"]
        _mlp_split_floor(MLP_HEAVY, args.time_limit, lines)
        lines.append("")
    lines.append(f"Total wall time: {time.perf_counter() - start:.0f} s.")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(report)


if __name__ == "__main__":
    main()
