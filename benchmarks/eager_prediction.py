"""Predicted vs measured peak of the eager runtime on small transformers models (issue 16).

``python benchmarks/eager_prediction.py``: a GPT-2 (2 x 64, dropout 0.1) and a Llama (2 x 64,
SDPA, SwiGLU) in float64 on CPU, ``apply_checkpointing`` at a few budgets, one step measured
with remat-opt's live-storage tracker (parameters and inputs added). Needs ``transformers``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from frontends.measure.memory_tracker import track_live_memory  # noqa: E402
from optimizer import apply_checkpointing  # noqa: E402
from solvers.base import InfeasibleBudgetError  # noqa: E402


class LossAndLogits(torch.nn.Module):
    """A causal LM as the step a training loop runs: (loss, logits) of ids -> ids."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        out = self.model(input_ids=ids, labels=labels)
        return out.loss, out.logits


def build(kind: str) -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    ids_gen = torch.Generator().manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
        return (LossAndLogits(transformers.GPT2LMHeadModel(config).double().train()),
                torch.randint(1, 128, (4, 16), generator=ids_gen))
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                                      max_position_embeddings=64, attn_implementation="sdpa")
    return (LossAndLogits(transformers.LlamaForCausalLM(config).double().train()),
            torch.randint(1, 128, (4, 32), generator=ids_gen))


def measured_peak(model: torch.nn.Module, ids: torch.Tensor) -> int:
    for p in model.parameters():
        p.grad = None
    with track_live_memory() as tracker:
        out = model(ids, ids)
        out[0].backward()
        del out
    resident = {id(t.untyped_storage()): t.untyped_storage().nbytes()
                for t in (*model.parameters(), *model.buffers(), ids)}
    return tracker.result.peak_bytes + sum(resident.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=5.0)
    args = parser.parse_args()
    sweeps = (("gpt2", ("100%", "90%", "75%")), ("llama", ("100%", "92%", "85%", "80%", "75%")))
    print("| model | budget | predicted | measured | measured / predicted - 1 | regions |")
    print("|---|---|---|---|---|---|")
    for kind, budgets in sweeps:
        for budget in budgets:
            model, ids = build(kind)
            try:
                plan = apply_checkpointing(model, (ids, ids), budget=budget, compare=False,
                                           time_limit=args.time_limit)
            except InfeasibleBudgetError as err:
                print(f"| {kind} | {budget} | infeasible: {str(err).splitlines()[0][:60]} | | | |")
                continue
            torch.manual_seed(1)
            measured = measured_peak(model, ids)
            print(f"| {kind} | {budget} | {plan.predicted_peak_bytes:,} | {measured:,} | "
                  f"{measured / plan.predicted_peak_bytes - 1:+.2%} | {len(plan.regions)} |")


if __name__ == "__main__":
    main()
