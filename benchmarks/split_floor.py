"""The memory floor with and without splitting the LM head and loss into row chunks (issue 23).

Captured from meta-device models (nothing allocated), dropout 0. For a 4-layer GPT-2-shaped
model (vocab 50257, small width) returning the loss only and returning (loss, logits), for
k = 1 (unsplit), 2, 4, 8 row chunks (`frontends.split.row_split`): store-all's peak, the proven lower
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
(`frontends.split.mlp_split`), next to each one's proven lower bound. ``--gpt2-small-preset`` takes
GPT-2-small as a user gets it: the ``small`` preset unchanged (dropout 0.1 on embeddings,
attention probabilities and residuals, replayed by the plan; train mode), returning
(loss, logits) (``outputs="all"``), captured on the meta device unsplit, with the head split in 8,
and with the head in 8 and every MLP in 4: floor rows, the terms that set each proven lower
bound, then plans at 30% (and 20% when some split reaches 30%) for those three and for
``split="auto"`` (`optimizer.split_plan.plan_with_split`, the search `optimize` runs).

    python benchmarks/split_floor.py --out benchmarks/split_floor.md [--gpt2-small] [--measure] [--mlp]
    python benchmarks/split_floor.py --gpt2-small-preset --out /tmp/preset.md
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
from frontends.capture.step import CapturedStep, capture  # noqa: E402
from optimizer import optimize  # noqa: E402
from optimizer.split_plan import plan_with_split  # noqa: E402
from solvers.base import InfeasibleBudgetError, SolverOptions  # noqa: E402
from solvers.baselines import store_all_schedule  # noqa: E402
from solvers.checkmate.data import prepare  # noqa: E402
from solvers.checkmate.min_budget import peak_lower_bound, smallest_feasible_budget  # noqa: E402
from solvers.ir.simulator import simulate  # noqa: E402
from solvers.planning.planner import plan_graph  # noqa: E402
from tests.e2e_helpers import clone, max_relative_error, measured_peak, train_step  # noqa: E402

CHUNKS = (1, 2, 4, 8)
SMALL_4_LAYERS = gpt2.GPT2Config(n_layers=4, d_model=128, n_heads=4, seq_len=256, batch=4,
                                 vocab_size=50257, dropout=0.0)
GPT2_SMALL = gpt2.get_config("small", dropout=0.0)
MLP_HEAVY = gpt2.GPT2Config(n_layers=4, d_model=256, n_heads=4, seq_len=128, batch=16, vocab_size=1024,
                            dropout=0.0)
GPT2_SMALL_PRESET = gpt2.get_config("small")  # dropout 0.1 where GPT-2 has it
PRESET_SPLITS = ((1, 1), (8, 1), (8, 4))
"""(head chunks, MLP chunks) of the preset's floor rows and plans, next to ``split="auto"``."""
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


def _bound_terms(graph) -> str:
    """Which term of `solvers.checkmate.data.lower_bound_bytes` sets the proven lower bound, with
    its parts (resident: parameters, inputs and the like; the same arithmetic, to explain it)."""
    data = prepare(graph)
    size = data.value_bytes
    resident = data.resident_bytes
    outputs = sum(size[v] for v in data.forward_outputs)
    terms = [(resident + data.tangent_bytes + outputs,
              f"boundary: resident {_mb(resident)} + forward outputs {_mb(outputs)}")]
    for g in range(data.n_groups):
        if data.needed[g]:
            inputs = sum(size[v] for v in data.inputs[g])
            terms.append((resident + inputs + data.group_bytes[g] + data.temp_bytes[g],
                          f"op {data.groups[g][0]}: resident {_mb(resident)} + its inputs {_mb(inputs)} + "
                          f"outputs and temporaries {_mb(data.group_bytes[g] + data.temp_bytes[g])}"))
    final = sum(size[v] for v in data.final_outputs)
    held = sum(size[v] for v in data.held)
    producers = {data.producer[v] for v in data.final_outputs}
    extra = 0
    if producers and None not in producers:
        extra = min(data.temp_bytes[g] + sum(size[v] for v in data.inputs[g] if v not in data.final_outputs)
                    + sum(size[v] for v in data.members[g] if v not in data.final_outputs) for g in producers)
    terms.append((resident + final + extra,
                  f"end: resident {_mb(resident)} + final outputs {_mb(final)} (returned forward outputs "
                  f"{_mb(held)} of them) + the last op's other inputs {_mb(extra)}"))
    bound, text = max(terms, key=lambda t: t[0])
    return text if bound == peak_lower_bound(graph) else f"{text} (does not add up to the bound)"


def _preset(cfg: gpt2.GPT2Config, limit: float, lines: list[str]) -> None:
    """GPT-2-small as the preset has it (dropout on, train mode), returning (loss, logits)."""
    captured: dict[tuple[int, int], tuple[CapturedStep, float]] = {}

    def capture_split(k: int, m: int) -> CapturedStep:
        if (k, m) not in captured:
            start = time.perf_counter()
            model = gpt2.get_model(cfg, device="meta")
            assert model.training
            step = capture(model, gpt2.get_inputs(cfg, device="meta"), split_rows=k, outputs="all", split_mlp=m)
            captured[k, m] = step, time.perf_counter() - start
        return captured[k, m][0]

    def plan_captured(step: CapturedStep, budget: int) -> object:
        return plan_graph(step.graph, budget, "auto", SolverOptions(time_limit_s=limit),
                          graph_nodes=len(step.gm.graph.nodes))

    def name(k: int, m: int) -> str:
        return f"k={k}" + (f", MLPs in {m}" if m > 1 else "")

    rows = []
    for k, m in PRESET_SPLITS:
        step = capture_split(k, m)
        found = smallest_feasible_budget(step.graph, SolverOptions(time_limit_s=limit))
        rows.append(((k, m), step, simulate(step.graph, store_all_schedule(step.graph)).peak_bytes,
                     max(peak_lower_bound(step.graph), found.lower_bytes), found))
        print(f"done: preset floor {name(k, m)}", file=sys.stderr, flush=True)
    reference = rows[0][2]
    logits = cfg.batch * cfg.seq_len * cfg.vocab_size * 4
    lines += ["", f"**returns (loss, logits), dropout {cfg.dropout:g}, train mode** (logits {_mb(logits)}; "
              f"percentages of the unsplit store-all peak {_mb(reference)}):", "",
              "| split | capture | values | store-all | proven lower bound | smallest found | how |",
              "|---|---|---|---|---|---|---|"]
    for (k, m), step, store_all, lower, found in rows:
        lines.append(f"| {name(k, m)} | {captured[k, m][1]:.1f} s | {len(step.graph.ops)} | {_mb(store_all)} | "
                     f"{_mb(lower)} ({100 * lower / reference:.1f}%) | {_mb(found.smallest_bytes)} "
                     f"({100 * found.smallest_bytes / reference:.1f}%){' exact' if found.exact else ''} | "
                     f"{found.method} |")
    lines += ["", "What sets each proven lower bound (`solvers.checkmate.data.lower_bound_bytes`'s largest term):",
              ""]
    lines += [f"- {name(k, m)}: {_bound_terms(step.graph)}" for (k, m), step, *_ in rows]
    notes = [n for (k, m), step, *_ in rows if (k, m) == PRESET_SPLITS[-1] for n in step.notes]
    lines += ["", "Capture notes (head in 8, MLPs in 4): " + "; ".join(notes)]

    lines += ["", f"Plans (solver auto, time limit {limit:g} s per plan; `split=\"auto\"` is "
              "`plan_with_split` over k = 1, 2, 4, 8 then MLP chunks 2, 4, 8 with the best k, as `optimize` "
              "runs it, one capture per candidate not counted in its time); a budget below a split's "
              "proven lower bound is not planned:", "",
              "| budget | split | status | planning time | extra FLOPs | extra compute | proven gap | "
              "step cost vs unsplit plain step | predicted peak | chosen / smallest found |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    base_cost = rows[0][1].graph.base_cost
    for fraction in (0.3, 0.2):
        budget = int(reference * fraction)
        where = f"{_mb(budget)} ({100 * fraction:.0f}%)"
        feasible = False
        for (k, m), step, _, lower, _ in rows:
            if budget < lower:
                lines.append(f"| {where} | {name(k, m)} | infeasible: below the proven lower bound "
                             f"{_mb(lower)} | - | - | - | - | - | - | - |")
                continue
            start = time.perf_counter()
            try:
                plan = plan_captured(step, budget)
            except InfeasibleBudgetError as err:
                lines.append(f"| {where} | {name(k, m)} | infeasible | {time.perf_counter() - start:.1f} s | - | - | "
                             f"- | - | - | smallest found {_mb(err.smallest_feasible_bytes or 0)} |")
                continue
            feasible = True
            lines.append(_plan_row(where, name(k, m), plan, time.perf_counter() - start, base_cost, ""))
            print(f"done: preset {where} {name(k, m)}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        before = sum(t for _, t in captured.values())
        try:
            step, plan = plan_with_split(capture_split, plan_captured, f"{100 * fraction:g}%", "auto", None)
        except InfeasibleBudgetError as err:
            took = time.perf_counter() - start - (sum(t for _, t in captured.values()) - before)
            lower = "" if err.lower_bound_bytes is None else f", proven lower bound {_mb(err.lower_bound_bytes)}"
            lines.append(f"| {where} | auto | infeasible | {took:.1f} s | - | - | - | - | - | smallest found "
                         f"{_mb(err.smallest_feasible_bytes or 0)}{lower}: {err} |")
        else:
            feasible = True
            took = time.perf_counter() - start - (sum(t for _, t in captured.values()) - before)
            chosen = plan.message.rsplit("split='auto' ", 1)[-1]
            lines.append(_plan_row(where, "auto", plan, took, base_cost, chosen))
        print(f"done: preset {where} auto", file=sys.stderr, flush=True)
        if not feasible:
            break


def _plan_row(where: str, split: str, plan, took: float, base_cost: float, chosen: str) -> str:
    """A plan's row; the step cost (the plan's objective, which ``split="auto"`` minimizes) is over
    the unsplit graph's plain step under the cost model, so rows of different splits compare."""
    gap = "-" if plan.gap is None else f"{100 * plan.gap:.2f}%"
    return (f"| {where} | {split} | {plan.status} | {took:.1f} s | {plan.extra_flops / 1e9:.2f} GFLOP | "
            f"{plan.extra_percent:.2f}% | {gap} | {100 * (plan.objective / base_cost - 1):+.2f}% | "
            f"{_mb(plan.predicted_peak_bytes)} | {chosen} |")


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
    parser.add_argument("--gpt2-small-preset", action="store_true",
                        help="GPT-2-small as the preset has it (dropout 0.1, train mode, returns loss and "
                             "logits): floor rows and plans at 30%%/20%% for k = 1, 8, 8 with MLPs in 4, "
                             "and split='auto'")
    args = parser.parse_args()
    start = time.perf_counter()
    lines = ["# Splitting the LM head and loss: the memory floor", "",
             "Command: `python benchmarks/split_floor.py" + (" --gpt2-small" if args.gpt2_small else "")
             + (" --gpt2-small-preset" if args.gpt2_small_preset else "")
             + (" --measure" if args.measure else "") + (" --mlp-only" if args.mlp_only else " --mlp" if args.mlp else "")
             + (f" --time-limit {args.time_limit:g}" if args.time_limit != 30.0 else "")
             + (f" --out {args.out}`" if args.out else "`"),
             f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores (shared), torch {torch.__version__}, "
             "cost model flops, float32, models on the meta device. Percentages are of the whole store-all "
             "peak of the unsplit step (what `optimize(..., \"30%\")` means), not of activation memory "
             "as in benchmarks/scale.md.", ""]
    configs = [("4-layer GPT-2 shape", SMALL_4_LAYERS, {True: (0.5, 0.3, 0.2), False: (0.5,)}, CHUNKS)]
    args.mlp = args.mlp or args.mlp_only
    if args.mlp_only or (args.gpt2_small_preset and not (args.gpt2_small or args.measure or args.mlp)):
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
    if args.gpt2_small_preset:
        c = GPT2_SMALL_PRESET
        lines += [f"## GPT-2-small preset: {c.n_layers} x {c.d_model}, {c.n_heads} heads, seq {c.seq_len}, "
                  f"batch {c.batch}, vocab {c.vocab_size}, dropout {c.dropout:g}, returns (loss, logits)"]
        _preset(c, args.time_limit, lines)
        lines.append("")
    lines.append(f"Total wall time: {time.perf_counter() - start:.0f} s.")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(report)


if __name__ == "__main__":
    main()
