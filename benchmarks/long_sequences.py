"""The longest sequence that fits one memory budget (issue 23's headline).

A Llama-shaped transformers model (``LlamaForCausalLM``: SDPA attention, SwiGLU MLP, RMSNorm,
vocab 32000, small width so it runs on a CPU) trained on one sequence of length n, loss only.
For each n in a doubling-then-bisecting search, three ways to fit ``--budget``:

* **per-block checkpoint**: ``torch.utils.checkpoint`` (non-reentrant) around every decoder layer,
  as people write it by hand; its peak is *measured* (remat-opt's live-storage tracker,
  parameters and inputs included, one step on the CPU);
* **remat-opt**: ``plan_only(model, inputs, budget)``: fits when a plan is found;
* **remat-opt + split k**: the same with ``split=k`` (the LM head and loss in k row chunks,
  `frontends.split.row_split`), for each k of ``--splits``;
* **remat-opt + split k + MLP m**: the last k with ``split_mlp=m`` too (every SwiGLU MLP in m
  token-row chunks, `frontends.split.mlp_split`), for each m of ``--mlp-splits``.

``--smallest-at N`` instead bisects, at one length N, the smallest budget each remat-opt way
plans (to ``--budget-step``), next to the planner's proven lower bound: where the longest-length
search cannot separate two ways, this says what one of them saves.

The planner's answer is trusted for the remat-opt rows (its simulated peaks match measured ones
elsewhere in the suite); ``--measure`` also runs the split plan at the longest length found and
reports its measured peak against the budget.

    python benchmarks/long_sequences.py --budget 256MiB --out benchmarks/long_sequences.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from frontends.measure.memory_tracker import track_live_memory  # noqa: E402
from optimizer import optimize, parse_bytes, plan_only  # noqa: E402
from solvers.base import InfeasibleBudgetError  # noqa: E402
from solvers.ir.budget import format_bytes  # noqa: E402

VOCAB = 32000


class LossOnly(torch.nn.Module):
    """A causal LM's training step as a loop runs it when it reads only the loss."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


def build(args: argparse.Namespace) -> torch.nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        num_hidden_layers=args.layers, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
        num_attention_heads=args.heads, num_key_value_heads=args.heads, vocab_size=VOCAB,
        max_position_embeddings=1 << 16, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    return LossOnly(transformers.LlamaForCausalLM(config).train())


def ids_of(n: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(n))


def per_block_peak(model: torch.nn.Module, n: int) -> int:
    """Measured peak of one step with ``checkpoint`` around every decoder layer."""
    from torch.utils.checkpoint import checkpoint

    layers = model.model.model.layers
    originals = [layer.forward for layer in layers]
    for layer, forward in zip(layers, originals):
        layer.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False, **k))(forward)
    try:
        return measured_peak(model, ids_of(n))
    finally:
        for layer in layers:
            del layer.forward


def measured_peak(module: torch.nn.Module, ids: torch.Tensor) -> int:
    params = module.model if hasattr(module, "plan") else module
    for p in params.parameters():
        p.grad = None
    with track_live_memory() as tracker:
        loss = module(ids)
        loss.backward()
        del loss
    resident = {id(t.untyped_storage()): t.untyped_storage().nbytes()
                for t in (*params.parameters(), *params.buffers(), ids)}
    return tracker.result.peak_bytes + sum(resident.values())


def planner_fits(model: torch.nn.Module, n: int, budget: int, split: int | None, time_limit: float,
                 split_mlp: int | None = None) -> bool:
    try:
        plan_only(model, (ids_of(n),), budget, time_limit=time_limit, split=split, split_mlp=split_mlp)
        return True
    except InfeasibleBudgetError:
        return False


def smallest_budget(model: torch.nn.Module, n: int, options: dict, time_limit: float,
                    step: int) -> tuple[int | None, int | None, dict[int, bool]]:
    """(smallest budget found to plan, to ``step`` bytes; proven lower bound; probes) at length n."""
    probes: dict[int, bool] = {}
    try:  # one byte: the planner's error names a budget that fits and the proven lower bound
        plan_only(model, (ids_of(n),), 1, time_limit=time_limit, **options)
        return 1, 1, probes
    except InfeasibleBudgetError as err:
        high, lower = err.smallest_feasible_bytes, err.lower_bound_bytes
    if high is None:
        return None, lower, probes
    low = (lower or 0) // step * step
    while high - low > step:
        mid = (low + high) // 2 // step * step
        if mid in (low, high):
            break
        t0 = time.perf_counter()
        try:
            plan_only(model, (ids_of(n),), mid, time_limit=time_limit, **options)
            probes[mid], high = True, mid
        except InfeasibleBudgetError:
            probes[mid], low = False, mid
        print(f"    {format_bytes(mid)}: {'fits' if probes[mid] else 'does not fit'} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return high, lower, probes


def longest(fits: Callable[[int], bool], start: int, stop: int, step: int) -> tuple[int, dict[int, bool]]:
    """Double from ``start`` while ``fits``, then bisect to ``step``: (longest n found, probes)."""
    probes: dict[int, bool] = {}

    def probe(n: int) -> bool:
        if n not in probes:
            t0 = time.perf_counter()
            probes[n] = fits(n)
            print(f"    n={n}: {'fits' if probes[n] else 'does not fit'} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
        return probes[n]

    if not probe(start):
        return 0, probes
    low, high = start, None
    while high is None and low * 2 <= stop:
        if probe(low * 2):
            low *= 2
        else:
            high = low * 2
    if high is None:
        return low, probes
    while high - low > step:
        mid = (low + high) // 2 // step * step
        if mid in (low, high):
            break
        if probe(mid):
            low = mid
        else:
            high = mid
    return low, probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--start", type=int, default=256)
    parser.add_argument("--stop", type=int, default=16384)
    parser.add_argument("--step", type=int, default=128, help="bisection resolution (tokens)")
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--splits", default="8,32", help="row chunk counts to try (comma list)")
    parser.add_argument("--mlp-splits", default="", help="MLP row chunk counts to try with the last of "
                                                         "--splits (comma list; empty: none)")
    parser.add_argument("--baselines", default="per-block,unsplit",
                        help="which of per-block, unsplit to search too (comma list; empty: none)")
    parser.add_argument("--measure", action="store_true", help="run the last way's plan at its longest n")
    parser.add_argument("--smallest-at", type=int, metavar="N",
                        help="instead: the smallest budget each remat-opt way plans at length N")
    parser.add_argument("--budget-step", default="4MiB", help="resolution of --smallest-at")
    parser.add_argument("--out", help="also write the report (markdown) here")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    budget = parse_bytes(args.budget)
    model = build(args)
    started = time.perf_counter()
    results = {}
    splits = [int(k) for k in args.splits.split(",") if k.strip()]
    mlp_splits = [int(m) for m in args.mlp_splits.split(",") if m.strip()]
    baselines = {b.strip() for b in args.baselines.split(",") if b.strip()}
    ways: list[tuple[str, Callable[[int], bool], dict]] = []
    if "per-block" in baselines:
        ways.append(("per-block checkpoint (measured)", lambda n: per_block_peak(model, n) <= budget, {}))
    if "unsplit" in baselines:
        ways.append(("remat-opt", lambda n: planner_fits(model, n, budget, None, args.time_limit), {}))
    ways += [(f"remat-opt + split {k}", lambda n, k=k: planner_fits(model, n, budget, k, args.time_limit),
              {"split": k}) for k in splits]
    ways += [(f"remat-opt + split {splits[-1]} + MLP {m}",
              lambda n, m=m: planner_fits(model, n, budget, splits[-1], args.time_limit, m),
              {"split": splits[-1], "split_mlp": m}) for m in mlp_splits if splits]
    if args.smallest_at:
        report_smallest(args, model, ways, started)
        return
    for name, fits, _ in ways:
        print(f"{name}:", flush=True)
        results[name] = longest(fits, args.start, args.stop, args.step)
    measured_line = ""
    last_name, _, last_options = ways[-1]
    n_last = results[last_name][0]
    if args.measure and n_last and last_options:
        module = optimize(model, (ids_of(n_last),), budget, time_limit=args.time_limit, **last_options)
        peak = measured_peak(module, ids_of(n_last))
        measured_line = (f"\nThe {last_name} plan at n = {n_last}, run on the CPU: measured peak {peak:,} B "
                         f"against the budget {budget:,} B (predicted {module.plan.predicted_peak_bytes:,} B).\n")
    base = results.get("per-block checkpoint (measured)", (0, {}))[0]
    lines = [f"# Longest sequence within {format_bytes(budget)} (issue 23)", "",
             f"`python benchmarks/long_sequences.py --budget {args.budget} --layers {args.layers} "
             f"--hidden {args.hidden} --heads {args.heads} --splits {args.splits}"
             f"{f' --mlp-splits {args.mlp_splits}' if args.mlp_splits else ''}"
             f"{f' --baselines {args.baselines!r}' if args.baselines != 'per-block,unsplit' else ''}"
             f"{f' --start {args.start}' if args.start != 256 else ''}"
             f"{' --measure' if args.measure else ''}`; "
             f"transformers LlamaForCausalLM ({args.layers} x {args.hidden}, {args.heads} heads, SwiGLU "
             f"{args.hidden * 8 // 3}, vocab {VOCAB}, SDPA), float32, batch 1, loss only; "
             f"{platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.perf_counter() - started:.0f} s. "
             f"Lengths probed by doubling from {args.start}, then bisecting to {args.step} tokens.", "",
             "| way to fit the budget | longest sequence | vs per-block checkpoint | lengths probed (fits: +) |",
             "|---|---|---|---|"]
    for name, (n, probes) in results.items():
        ratio = f"{n / base:.2f}x" if base else "n/a"
        probed = ", ".join(f"{k}{'+' if v else ''}" for k, v in sorted(probes.items()))
        lines.append(f"| {name} | {n:,} | {ratio} | {probed} |")
    report = "\n".join(lines) + "\n" + measured_line
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


def report_smallest(args: argparse.Namespace, model: torch.nn.Module, ways: list, started: float) -> None:
    n, step = args.smallest_at, parse_bytes(args.budget_step)
    lines = ["| way | smallest budget found | proven lower bound | budgets probed (fits: +) |",
             "|---|---|---|---|"]
    for name, _, options in ways:
        if "split" not in options:
            continue
        print(f"{name}:", flush=True)
        found, lower, probes = smallest_budget(model, n, options, args.time_limit, step)
        probed = ", ".join(f"{format_bytes(b)}{'+' if v else ''}" for b, v in sorted(probes.items()))
        lines.append(f"| {name} | {format_bytes(found) if found else 'none'} | "
                     f"{format_bytes(lower) if lower else 'n/a'} | {probed} |")
    head = (f"# Smallest budget at {n:,} tokens (issue 23)\n\n`python benchmarks/long_sequences.py "
            f"--smallest-at {n} --budget-step {args.budget_step} --layers {args.layers} --hidden {args.hidden} "
            f"--heads {args.heads} --splits {args.splits} --mlp-splits {args.mlp_splits}`; LlamaForCausalLM "
            f"({args.layers} x {args.hidden}, SwiGLU {args.hidden * 8 // 3}, vocab {VOCAB}), float32, batch 1, "
            f"loss only; {os.cpu_count()} cores, {time.perf_counter() - started:.0f} s.\n\n")
    report = head + "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
