"""The Markdown report of `vs_pytorch.py` and the issue's targets checked on its rows (the plot:
`vs_pytorch_plot`).

Extra FLOPs are a strategy's measured step FLOPs minus plain autograd's (``FlopCounterMode``
counts matmuls, convolutions and attention; pointwise ops count zero). remat-opt runs once per
objective: `TIME_OBJECTIVE` (the ``flops`` cost model: max(FLOPs / peak, bytes / bandwidth), its
default) and `FLOP_OBJECTIVE` (``flop-count``: the FLOPs FlopCounterMode counts, bytes only to
break ties). Each check uses the objective that minimizes what it measures:

1. FLOPs (`FLOP_OBJECTIVE`): at equal or lower measured peak, remat-opt's extra FLOPs are at
   most every peer's: for each peer run, the run with the fewest extra FLOPs among those whose
   measured peak is at most the peer's;
   time (`TIME_OBJECTIVE`): the same comparison in modelled time (the step's ops priced by the
   ``flops`` cost model);
2. both objectives: the measured peak is monotone in the budget and never above it;
3. FLOPs (`FLOP_OBJECTIVE`): on the transformer models, at per-block checkpointing's peak,
   remat-opt's extra FLOPs are at most half of per-block checkpointing's;
4. the eager runtime (`EAGER`, ``apply_checkpointing`` at the measured peak of each peer of
   `EAGER_PEERS`) spends no more FLOPs than that peer; its measured peak against the peer's is
   reported beside it. A model it cannot plan is *n/a* with the planner's message.
"""

from __future__ import annotations

import itertools
import os
import platform
from dataclasses import dataclass

TRANSFORMERS = ("gpt", "gpt2", "vit")
PEERS = ("per-block", "sac", "compile")
TIME_OBJECTIVE = "remat-opt"
"""remat-opt minimizing modelled time (its default ``flops`` cost model): the name runs before
the FLOP objective existed used, so their JSON still reads."""
FLOP_OBJECTIVE = "remat-opt (flop-count)"
"""remat-opt minimizing the FLOPs FlopCounterMode counts (the ``flop-count`` cost model)."""
OURS = (TIME_OBJECTIVE, FLOP_OBJECTIVE)
EAGER = "eager runtime"
"""remat-opt's eager runtime: ``apply_checkpointing`` (checkpoint regions with selective policies
on the user's model), planned with its default ``flops`` cost model."""
EAGER_PEERS = ("per-block", "sac")
"""The peers at whose measured peak the eager runtime is planned and compared."""
LABELS = {TIME_OBJECTIVE: "remat-opt, time objective", FLOP_OBJECTIVE: "remat-opt, FLOP objective",
          EAGER: "remat-opt eager runtime"}


def _mib(nbytes: int | None) -> str:
    return "" if nbytes is None else f"{nbytes / 2**20:.3f} MiB"


def extra_flops(row, plain) -> int:
    return row.metrics.flops - plain.metrics.flops


def _pct(extra: int, plain) -> str:
    return f"{extra / 1e6:.2f} M ({100 * extra / plain.metrics.flops:.1f}%)"


def modelled_extra(row, plain) -> float:
    """Extra modelled time (remat-opt's ``flops`` cost model on the ops that ran), % of plain's."""
    return 100 * (row.metrics.modelled_s / plain.metrics.modelled_s - 1)


@dataclass(frozen=True)
class Verdict:
    model: str
    what: str
    ok: bool | None
    """None: not applicable (the peer failed, or this run has no rows of that objective)."""
    detail: str


def by_model(rows) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for row in rows:
        grouped.setdefault(row.model, []).append(row)
    return grouped


def _ours(group, objective: str) -> list:
    return [r for r in group if r.strategy == objective and r.metrics is not None]


def _best_within(ours: list, peak_bytes: int, key):
    """The run of ``ours`` with the smallest ``key`` among those measured at most ``peak_bytes``."""
    fits = [r for r in ours if r.metrics.peak_bytes <= peak_bytes]
    return min(fits, key=key) if fits else None


NO_FLOP_ROWS = "no flop-count rows (a run from before the FLOP objective): rerun vs_pytorch.py"


def _peer_verdicts(model: str, group: list, peer) -> list[Verdict]:
    """A peer run against the FLOP objective (extra FLOPs) and the time objective (modelled time)."""
    plain = group[0]
    name = f"{peer.strategy} {peer.setting}".rstrip()
    if peer.metrics is None:
        return [Verdict(model, f"1: FLOPs vs {name}", None, f"peer failed: {peer.error}")]
    peak = peer.metrics.peak_bytes
    verdicts = []
    flop_rows = _ours(group, FLOP_OBJECTIVE)
    best = _best_within(flop_rows, peak, lambda r: extra_flops(r, plain))
    if not flop_rows:
        verdicts.append(Verdict(model, f"1: FLOPs vs {name}", None, NO_FLOP_ROWS))
    elif best is None:
        verdicts.append(Verdict(model, f"1: FLOPs vs {name}", False, f"FLOP objective cannot reach {_mib(peak)}"))
    else:
        verdicts.append(Verdict(
            model, f"1: FLOPs vs {name}", extra_flops(best, plain) <= extra_flops(peer, plain),
            f"peer {_mib(peak)}, +{_pct(extra_flops(peer, plain), plain)}; FLOP objective "
            f"{_mib(best.metrics.peak_bytes)}, +{_pct(extra_flops(best, plain), plain)}"))
    time_rows = _ours(group, TIME_OBJECTIVE)
    fastest = _best_within(time_rows, peak, lambda r: r.metrics.modelled_s)
    if not time_rows:
        verdicts.append(Verdict(model, f"1t: modelled time vs {name}", None, "no time-objective rows in this run"))
        return verdicts
    verdicts.append(Verdict(
        model, f"1t: modelled time vs {name}",
        fastest is not None and fastest.metrics.modelled_s <= peer.metrics.modelled_s,
        f"peer {_mib(peak)}, {modelled_extra(peer, plain):+.1f}%; time objective " +
        (f"{_mib(fastest.metrics.peak_bytes)}, {modelled_extra(fastest, plain):+.1f}%" if fastest
         else f"cannot reach {_mib(peak)}")))
    return verdicts


def _monotone_verdict(model: str, ours: list, objective: str) -> Verdict:
    ordered = sorted(ours, key=lambda r: (r.budget_bytes, r.metrics.peak_bytes))
    over = [r for r in ordered if r.metrics.peak_bytes > r.budget_bytes]
    monotone = all(a.metrics.peak_bytes <= b.metrics.peak_bytes for a, b in itertools.pairwise(ordered))
    excess = ", ".join(f"{r.metrics.peak_bytes - r.budget_bytes} B over {r.budget_bytes} B" for r in over)
    return Verdict(model, f"2: peak monotone in budget, never above it ({LABELS[objective]})",
                   monotone and not over, f"{len(ordered)} budgets, monotone: {'yes' if monotone else 'no'}; "
                   f"above budget: {excess or 'none'}")


def check_targets(rows) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for model, group in by_model(rows).items():
        plain = group[0]
        verdicts += _eager_verdicts(model, group)
        for peer in (r for r in group if r.strategy in PEERS):
            verdicts += _peer_verdicts(model, group, peer)
        for objective in OURS:
            if _ours(group, objective):
                verdicts.append(_monotone_verdict(model, _ours(group, objective), objective))
        blocks = next((r for r in group if r.strategy == "per-block"), None)
        if model in TRANSFORMERS and blocks is not None and blocks.metrics is not None:
            what = "3: <= half of per-block's extra FLOPs at its peak (FLOP objective)"
            flop_rows = _ours(group, FLOP_OBJECTIVE)
            best = _best_within(flop_rows, blocks.metrics.peak_bytes, lambda r, p=plain: extra_flops(r, p))
            if not flop_rows:
                verdicts.append(Verdict(model, what, None, NO_FLOP_ROWS))
                continue
            ok = best is not None and 2 * extra_flops(best, plain) <= extra_flops(blocks, plain)
            verdicts.append(Verdict(model, what, ok, f"per-block +{_pct(extra_flops(blocks, plain), plain)}; FLOP "
                                    "objective " + (f"+{_pct(extra_flops(best, plain), plain)}" if best else "cannot reach it")))
    return verdicts


def _eager_pairs(group) -> list[tuple]:
    """(peer row or None, the eager runtime's row at its peak) per peer of `EAGER_PEERS`."""
    pairs = []
    for peer_name in EAGER_PEERS:
        ours = next((r for r in group if r.strategy == EAGER and r.setting == f"= {peer_name}"), None)
        if ours is None:
            continue
        peer = next((r for r in group if r.strategy == peer_name and r.setting == ""), None)
        pairs.append((peer_name, peer, ours))
    return pairs


def _eager_verdicts(model: str, group: list) -> list[Verdict]:
    plain = group[0]
    verdicts = []
    for peer_name, peer, ours in _eager_pairs(group):
        what = f"4: eager runtime FLOPs <= {peer_name}'s at its peak"
        if peer is None or peer.metrics is None or ours.metrics is None:
            verdicts.append(Verdict(model, what, None, ours.error or f"{peer_name} failed"))
            continue
        over = ours.metrics.peak_bytes - peer.metrics.peak_bytes
        peak = "at or under it" if over <= 0 else f"{over} B ({100 * over / peer.metrics.peak_bytes:.2f}%) above it"
        verdicts.append(Verdict(
            model, what, extra_flops(ours, plain) <= extra_flops(peer, plain),
            f"peer {_mib(peer.metrics.peak_bytes)}, +{_pct(extra_flops(peer, plain), plain)}; eager runtime "
            f"{_mib(ours.metrics.peak_bytes)} ({peak}; predicted {_mib(ours.predicted_peak_bytes)}), "
            f"+{_pct(extra_flops(ours, plain), plain)}"))
    return verdicts


def _eager_table(groups) -> list[str]:
    """Per model and peer of `EAGER_PEERS`: the peer and the eager runtime planned at its peak."""
    lines = ["| model | peer | peer: measured peak, extra FLOPs | eager runtime: measured peak (predicted), "
             "extra FLOPs | no more FLOPs | peak <= peer's | grad err | regions / note |",
             "|---|---|---|---|---|---|---|---|"]
    for model, group in groups.items():
        plain = group[0]
        for peer_name, peer, ours in _eager_pairs(group):
            if peer is None or peer.metrics is None:
                lines.append(f"| {model} | {peer_name} | failed | | n/a | n/a | | {ours.error or ''} |")
                continue
            peer_cell = f"{_mib(peer.metrics.peak_bytes)}, +{_pct(extra_flops(peer, plain), plain)}"
            if ours.metrics is None:
                lines.append(f"| {model} | {peer_name} | {peer_cell} | n/a | n/a | n/a | | {ours.error} |")
                continue
            m = ours.metrics
            fewer = "yes" if extra_flops(ours, plain) <= extra_flops(peer, plain) else "**no**"
            fits = "yes" if m.peak_bytes <= peer.metrics.peak_bytes else (
                f"no (+{100 * (m.peak_bytes / peer.metrics.peak_bytes - 1):.2f}%)")
            lines.append(f"| {model} | {peer_name} | {peer_cell} | {_mib(m.peak_bytes)} "
                         f"({_mib(ours.predicted_peak_bytes)}), +{_pct(extra_flops(ours, plain), plain)} | "
                         f"{fewer} | {fits} | {m.grad_error:.1e} | {ours.note} |")
    return lines


def _summary_table(groups, objective: str) -> list[str]:
    """Per model: each kind of peer (compile at 0.5) against ``objective``'s best run at <= its
    peak: by extra FLOPs for the FLOP objective, by extra modelled time for the time objective."""
    by_flops = objective == FLOP_OBJECTIVE
    unit = "extra FLOPs" if by_flops else "extra modelled time"
    peers = (("per-block", ""), ("sac", ""), ("compile", "budget 0.5"))
    heads = " | ".join(f"{f'{s} {t}'.strip()}: peak, {unit} | {LABELS[objective]} at <= that peak" for s, t in peers)
    lines = [f"| model | plain peak | {heads} |", "|---|---|" + "---|---|" * len(peers)]
    for model, group in groups.items():
        plain = group[0]

        def share(row, plain=plain) -> float:
            return 100 * extra_flops(row, plain) / plain.metrics.flops if by_flops else modelled_extra(row, plain)

        ours = _ours(group, objective)
        cells = [model, _mib(plain.metrics.peak_bytes)]
        for strategy, setting in peers:
            peer = next((r for r in group if r.strategy == strategy and r.setting == setting), None)
            if peer is None or peer.metrics is None:
                cells += ["failed" if peer is not None else "not run", ""]
                continue
            cells.append(f"{_mib(peer.metrics.peak_bytes)}, {share(peer):+.1f}%")
            best = _best_within(ours, peer.metrics.peak_bytes, share)
            if best is None:
                cells.append("not run" if not ours else "cannot reach it")
                continue
            loses = " (more)" if share(best) > share(peer) else ""
            cells.append(f"{_mib(best.metrics.peak_bytes)}, {share(best):+.1f}%{loses}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _model_table(group) -> list[str]:
    plain = group[0]
    lines = [("| strategy | setting | measured peak | vs plain | extra FLOPs | extra modelled | step time "
              "| prepare s | grad err | buffers err | remat-opt budget / predicted peak / planned extra FLOPs "
              "| notes |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in group:
        if r.metrics is None:
            lines.append(f"| {r.strategy} | {r.setting} | failed | | | | | | | | {_mib(r.budget_bytes)} | {r.error} |")
            continue
        m = r.metrics
        planned = ""
        if r.strategy in (*OURS, EAGER):
            planned = (f"{_mib(r.budget_bytes)} / {_mib(r.predicted_peak_bytes)} / "
                       f"{r.planned_extra_flops / 1e6:.2f} M")
        lines.append(
            f"| {r.strategy} | {r.setting} | {_mib(m.peak_bytes)} | "
            f"{100 * m.peak_bytes / plain.metrics.peak_bytes:.1f}% | {_pct(extra_flops(r, plain), plain)} | "
            f"{modelled_extra(r, plain):+.1f}% | {m.time_s * 1e3:.1f} ms ({m.time_s / plain.metrics.time_s:.2f}x) | "
            f"{r.prepare_s:.1f} | {m.grad_error:.1e} | {m.state_error:.1e} | {planned} | {r.note} |")
    return lines


METHOD = """\
How each strategy is built and measured (`benchmarks/vs_pytorch.py`, `vs_pytorch_peers.py`,
`vs_pytorch_measure.py`):

- *plain*: the model as is. *per-block*: `torch.utils.checkpoint(block, use_reentrant=False)`
  around each block; *sac*: the same with `create_selective_checkpoint_contexts` and a policy
  that saves `mm`/`addmm`/`bmm`/`baddbmm`/`convolution` outputs and recomputes every other op.
  Blocks: {blocks}.
- *compile*: `torch.compile(model, backend=aot_autograd(fw_compiler, bw_compiler,
  partition_fn=min_cut_rematerialization_partition))`, no Inductor, under
  `torch._functorch.config.activation_memory_budget` = the setting, `torch._dynamo.reset()`
  before each. The compilers run the generated graphs as they are (boxed, so backward frees each
  saved value after its last use, as remat-opt's rewritten graphs do).
- *remat-opt*: `plan_graph(..., solver="auto")` on one capture of the model per objective at a
  budget equal to each peer's measured peak (and a few percentages of plain autograd's measured
  peak), then the plan applied to a fresh capture as `RematModule` (what `optimize` does);
  *prepare* is that capture + solve + rewrite. remat-opt plans for the budget less the loss's
  seed gradient (one scalar; one 512-byte block on CUDA), which autograd holds through backward
  and its plans do not count (README, Known limits): so a plan that fills its budget is measured
  at the budget, and "never above the budget" is checked against the budget asked for. The two
  objectives use the same solver, time limit and budgets; only the capture's cost model differs:
  `flops` for the time objective (*{time}*), `flop-count` for the FLOP objective (*{flop}*).
- A `TorchDispatchMode` around a `torch.compile`d module makes dynamo run it eagerly, even with
  its code cached (checked: the compiled graphs were not called). So compiled modules are
  measured from inside: while a measurement is armed, the fw/bw compilers' wrappers run each
  compiled graph under the same storage tracker (one ledger for the whole step), under
  `FlopCounterMode`, or under the cost-model counter, and the measurement fails if the compiled
  graphs did not run. Outside the graphs a step allocates only the loss's seed gradient, which
  is made explicitly (`torch.ones_like(loss)`, as `.backward()` does) under the tracker. Cross-check: at `activation_memory_budget=1.0` the compiled step's peak measured
  this way vs remat-opt's simulated store-all peak of its own capture: {crosscheck}.
- FLOPs and modelled time are counted in separate steps: `FlopCounterMode`'s module hooks make a
  `RematModule` step run extra copies, which would inflate the modelled time.
"""


OBJECTIVES_TEXT = """\
remat-opt runs at every budget twice, once per objective, with the same solver settings:

- *{time}* (strategy `remat-opt`): the `flops` cost model, remat-opt's default, prices an op at
  max(FLOPs / 1 TFLOP/s, bytes moved / 100 GB/s), so recomputing a large pointwise op costs the
  memory traffic it makes. It minimizes modelled step time.
- *{flop}* (strategy `remat-opt (flop-count)`): the `flop-count` cost model prices an op by the
  FLOPs `FlopCounterMode` counts (matmuls, convolutions, attention), plus a thousandth of its
  memory time to break ties, so pointwise recomputation is nearly free. It minimizes the
  issue's measure.

`FlopCounterMode` counts only matmul, convolution and attention FLOPs: recomputing a GELU, a
softmax or a LayerNorm counts zero, however many bytes it moves. So the issue's FLOP targets
(1: fewer extra FLOPs than every peer at <= its measured peak; 3: at most half of per-block
checkpointing's extra FLOPs at its peak on the transformers) are checked on the FLOP objective's
rows, which minimize exactly that count; the modelled-time comparison (1t) is checked on the
time objective's rows, which minimize modelled time; monotonicity and never-above-budget (2) are
checked for each objective on its own rows. The time objective's extra FLOPs, and the FLOP
objective's modelled time, are in the per-model tables.""".format(time=LABELS[TIME_OBJECTIVE],
                                                                  flop=LABELS[FLOP_OBJECTIVE])


def _crosscheck(groups) -> str:
    parts = []
    for model, group in groups.items():
        compiled = next((r for r in group if r.strategy == "compile" and r.setting == "budget 1"
                         and r.metrics is not None), None)
        ours = next((r for r in group if r.strategy in OURS and r.store_all_peak_bytes), None)
        if compiled and ours:
            diff = compiled.metrics.peak_bytes - ours.store_all_peak_bytes
            parts.append(f"{model} {compiled.metrics.peak_bytes} vs {ours.store_all_peak_bytes} B ({diff:+d})")
    return "; ".join(parts) or "no data"


def write_report(rows, path: str, *, run: dict, plot_name: str) -> None:
    import torch
    from vs_pytorch_peers import BLOCKS

    load = run["load"]
    machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores (shared with other jobs), torch "
               f"{torch.__version__}, device {run['device']}, one intra-op thread; load average at the "
               f"end of the run {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    groups = by_model(rows)
    blocks = ", ".join(f"{m}: `{'`, `'.join(BLOCKS[m])}`" for m in groups if m in BLOCKS)
    out = ["# remat-opt vs PyTorch's own rematerialization (measured)", "",
           (f"Command: `{run['command']}` ({run['elapsed_s']:.0f} s). Machine: {machine}. "
            f"{run['when']}. Models in {run['dtype']}, dropout off."), "",
           ("Every number is from one real training step. *measured peak*: "
           "live tensor storages (CPU tracker; inside the compiled graphs for `torch.compile`) plus "
           "parameters, buffers and inputs; *extra FLOPs*: step FLOPs (`FlopCounterMode`) minus plain "
           "autograd's, in millions and % of a plain step; *extra modelled*: the ops that ran priced by "
           "remat-opt's `flops` cost model (max(FLOPs / 1 TFLOP/s, bytes moved / 100 GB/s), its objective), "
           "% over plain autograd; *step time*: median, ratio to plain autograd "
           "of this run; *prepare*: remat-opt capture + solve + rewrite, or compile time; *grad err*: "
           "max relative gradient difference to plain autograd; *buffers err*: BatchNorm running stats "
           "and counters after one step vs plain autograd (1.0: a counter differs)."), "",
           f"![peak vs extra FLOPs]({plot_name})", "", "## Method", "",
           METHOD.format(blocks=blocks, crosscheck=_crosscheck(groups), time=LABELS[TIME_OBJECTIVE],
                         flop=LABELS[FLOP_OBJECTIVE])]
    has_flop_rows = any(r.strategy == FLOP_OBJECTIVE for r in rows)
    out += ["## Two objectives, and which check uses which", "", OBJECTIVES_TEXT, ""]
    if not has_flop_rows:
        out += [(f"**This run has no {LABELS[FLOP_OBJECTIVE]} rows** (it predates it, or ran with "
                 "`--objectives time`): the FLOP targets are *n/a*; rerun to check them."), ""]
    out += ["## Summary: extra FLOPs (FLOP objective)", "",
            ("Extra FLOPs (`FlopCounterMode`) in % of a plain step, the issue's measure; *(more)*: the "
             "FLOP objective spends more FLOPs than the peer at equal or lower measured peak."), ""]
    out += _summary_table(groups, FLOP_OBJECTIVE) + [""]
    out += ["## Summary: extra modelled time (time objective)", "",
            ("Extra modelled time (the ops that ran, priced by the `flops` cost model) in % of a plain "
             "step; *(more)*: the time objective's step is modelled slower than the peer's at equal or "
             "lower measured peak."), ""]
    out += _summary_table(groups, TIME_OBJECTIVE) + [""]
    if any(r.strategy == EAGER for r in rows):
        out += ["## Eager runtime at the peers' peaks", "",
                ("remat-opt's eager runtime (`apply_checkpointing(model, inputs, budget=peer's measured peak "
                 "- seed gradient)`: `torch.utils.checkpoint` regions with selective-checkpoint policies on "
                 "the model itself, planned for counted FLOPs, `cost_model=\"flop-count\"`, since the target "
                 "compares FLOPs) against per-block "
                 "checkpointing and hand-written SAC at their measured peaks. *not applicable*: nothing "
                 "the eager runtime may checkpoint saves memory (modules that update state, such as "
                 "BatchNorm in training, are not checkpointed; nor ops outside submodules)."), ""]
        out += _eager_table(groups) + [""]
    verdicts = check_targets(rows)
    out += ["## Targets", "", ("1 and 3 (FLOPs) use the FLOP objective's rows, 1t (modelled time) the "
                               "time objective's, 2 each objective's own, 4 the eager runtime's."), "",
            "| model | target | met | detail |", "|---|---|---|---|"]
    for v in verdicts:
        met = "n/a" if v.ok is None else ("yes" if v.ok else "**no**")
        out.append(f"| {v.model} | {v.what} | {met} | {v.detail} |")
    for model, group in groups.items():
        out += ["", f"## {model}", ""] + _model_table(group)
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")
