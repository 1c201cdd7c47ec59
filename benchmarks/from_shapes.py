"""Large models planned from shapes alone (issue 17): GPT-2-XL and a Llama-2-7B-shaped model.

Both are built on the meta device and planned with `optimizer.meta_plan.plan_without_hardware`
(capture on FakeTensors, `hierarchical`): nothing is allocated or run. Prints one markdown row per
model and budget: capture and plan seconds, planned peak, extra compute, proven gap.

    python benchmarks/from_shapes.py [--budgets 70%] [--time-limit 60]

Needs transformers for the Llama shape (its `LlamaForCausalLM`, SDPA, bf16, labels = the ids).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from examples import gpt2  # noqa: E402
from optimizer.meta_plan import plan_without_hardware  # noqa: E402
from solvers.base import InfeasibleBudgetError  # noqa: E402


def gpt2_xl():
    config = gpt2.get_config("xl")
    return (lambda: gpt2.get_model(config, device="meta")), gpt2.get_inputs(config, device="meta")


def llama_7b(seq: int = 4096):
    from transformers import LlamaConfig, LlamaForCausalLM  # optional: transformers

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                         max_position_embeddings=seq, attn_implementation="sdpa")

    def build():
        with torch.device("meta"):
            model = LlamaForCausalLM(config).to(torch.bfloat16)
        return model.train()

    ids = torch.randint(0, 32000, (1, seq), device="meta")
    return build, (ids, None, None, None, None, ids)  # input_ids ... labels: the loss is planned


MODELS = {"GPT-2-XL (48 x 1600, seq 1024, batch 1)": gpt2_xl,
          "Llama-2-7B shape (32 x 4096, seq 4096, batch 1, bf16)": llama_7b}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", nargs="+", default=["70%"])
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    print(f"time limit {args.time_limit:g} s; torch {torch.__version__}; load {os.getloadavg()[0]:.1f}\n")
    print("| model | budget | capture (s) | plan (s) | planned peak | extra compute | proven gap |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, make in MODELS.items():
        build, inputs = make()
        for budget in args.budgets:
            start = time.perf_counter()
            try:
                planned = plan_without_hardware(build, inputs, budget, time_limit=args.time_limit, name=name)
            except InfeasibleBudgetError as err:
                print(f"| {name} | {budget} | {time.perf_counter() - start:.1f} | - | infeasible: {err} | | |")
                continue
            plan = planned.plan
            gap = "-" if plan.gap is None else f"{plan.gap:.2%}"
            print(f"| {name} | {budget} | {planned.capture_s:.1f} | {planned.plan_s:.1f} | "
                  f"{plan.predicted_peak_bytes / 2**30:.2f} GiB | {plan.extra_percent:.2f}% | {gap} |", flush=True)


if __name__ == "__main__":
    main()
