"""Dropout replayed: transformers GPT-2 with dropout 0.1 everywhere transformers puts it.

Measures, side by side in one run on this machine: per-block ``torch.utils.checkpoint`` (HF's
``gradient_checkpointing_enable``, non-reentrant) and remat-opt planned at that measured peak,
with random ops replayed (the default) and kept run-once (``replay_random=False``, the old
behaviour): smallest feasible budget, predicted and measured peak, extra FLOPs counted by
``FlopCounterMode``. Writes a Markdown table to stdout.

    python benchmarks/dropout_replay.py [--layers 4] [--width 256] [--seq 128] [--batch 8]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from frontends.capture.step import capture
from frontends.graph_runtime.remat_module import RematModule
from frontends.measure.step import measure_step
from solvers.base import SolverOptions
from solvers.checkmate.min_budget import smallest_feasible_budget
from solvers.planning.planner import plan_graph


def gpt2(layers: int, width: int, vocab: int, seq: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=max(1, width // 64),
                                     vocab_size=vocab, n_positions=seq, resid_pdrop=0.1,
                                     embd_pdrop=0.1, attn_pdrop=0.1)
    return transformers.GPT2LMHeadModel(config).train()


def step_flops(module, batch: dict) -> int:
    with FlopCounterMode(display=False) as counter:
        module(**batch).loss.backward()
    return counter.get_total_flops()


def fmt(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--time-limit", type=float, default=30.0)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    tokens = torch.randint(1, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": tokens, "labels": tokens}

    model = gpt2(args.layers, args.width, args.vocab, args.seq)
    plain = measure_step(model, (), batch, repeats=1).peak_bytes
    plain_flops = step_flops(model, batch)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    per_block = measure_step(model, (), batch, repeats=1).peak_bytes
    per_block_extra = step_flops(model, batch) - plain_flops

    rows = [("plain autograd", "", plain, plain, 0), ("per-block checkpoint", "", per_block, per_block,
                                                        per_block_extra)]
    options = SolverOptions(time_limit_s=args.time_limit)
    for label, replay in (("remat-opt, dropout kept", False), ("remat-opt, dropout replayed", True)):
        model = gpt2(args.layers, args.width, args.vocab, args.seq)
        start = time.perf_counter()
        captured = capture(model, (), batch, replay_random=replay)
        smallest = smallest_feasible_budget(captured.graph, options).smallest_bytes
        try:
            plan = plan_graph(captured.graph, per_block, "auto", options)
        except Exception as err:  # noqa: BLE001 - the finding is that it does not fit
            rows.append((label, f"{smallest:,}", f"infeasible ({type(err).__name__})", "", ""))
            continue
        rm = RematModule(model, captured, plan, (), batch)
        measured = measure_step(rm, (), batch, repeats=1).peak_bytes
        extra = step_flops(rm, batch) - plain_flops
        rows.append((label, f"{smallest:,}", plan.predicted_peak_bytes, measured, extra))
        print(f"{label}: planned in {time.perf_counter() - start:.1f} s")

    print(f"\nGPT-2 {args.layers} x {args.width}, vocab {args.vocab}, seq {args.seq}, batch {args.batch}, "
          f"dropout 0.1; budget = per-block checkpoint's measured peak ({per_block:,} B); "
          f"torch {torch.__version__}, {platform.machine()} {torch.get_num_threads()} threads\n")
    print("| strategy | smallest feasible budget (B) | predicted peak (B) | measured peak (B) | extra FLOPs |")
    print("|---|---:|---:|---:|---:|")
    for label, smallest, predicted, measured, extra in rows:
        print(f"| {label} | {smallest} | {fmt(predicted)} | {fmt(measured)} | {fmt(extra)} |")


if __name__ == "__main__":
    main()
