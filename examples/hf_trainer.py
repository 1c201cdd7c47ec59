"""Train a transformers causal LM with Hugging Face's Trainer after remat-opt's eager runtime.

    python examples/hf_trainer.py [--budget 60%] [--steps 20]

Why this example: the eager runtime leaves the model the user's own ``nn.Module``, so a training
framework that owns the loop (Trainer: its own forward calls with keyword batches, optimizer,
scheduler, seeding) runs it unchanged. The script trains a small GPT-2 (built from a config, no
download) for ``--steps`` steps twice from the same weights and seed, without and with
``apply_checkpointing``, and checks that the logged losses are equal (checkpoint replays
dropout's RNG, so they agree to rounding). It prints the plan (regions, predicted peak, extra
compute) and both runs' losses. Trainer needs ``accelerate`` (``pip install accelerate``).

As a model file for the CLI (``remat-opt examples/hf_trainer.py --budget 60% --runtime eager``),
``get_model()`` returns the LM wrapped to return ``(loss, logits)`` from positional inputs.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VOCAB, SEQ, BATCH, SAMPLES = 256, 32, 4, 80


def build_lm():
    """GPT-2 shaped: 2 layers, width 64, 4 heads, vocabulary 256 (weights fixed by seed 0)."""
    import transformers  # heavy: only when the example runs

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                     n_positions=SEQ, bos_token_id=0, eos_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config).train()


def dataset() -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": (ids := torch.randint(0, VOCAB, (SEQ,), generator=g)), "labels": ids.clone()}
            for _ in range(SAMPLES)]


class LossAndLogits(torch.nn.Module):
    """For the CLI's model-file convention: positional (input_ids, labels) -> (loss, logits)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        out = self.lm(input_ids=input_ids, labels=labels)
        return out.loss, out.logits


def get_model() -> torch.nn.Module:
    return LossAndLogits(build_lm())


def get_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    batch = dataset()[:BATCH]
    ids = torch.stack([b["input_ids"] for b in batch])
    return ids, ids.clone()


def train(model: torch.nn.Module, steps: int, out_dir: str) -> list[float]:
    """``steps`` Trainer steps (AdamW, seed 0, CPU); the logged loss of every step."""
    from transformers import Trainer, TrainingArguments  # heavy: only when the example runs

    args = TrainingArguments(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=BATCH,
                             learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0,
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=dataset())
    trainer.train()
    return [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="60%", help="peak memory budget (bytes, 16GB, 60%%)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        import accelerate  # noqa: F401  # optional: Trainer's own requirement
    except ImportError:
        print("hf_trainer.py: Trainer needs accelerate: pip install accelerate", file=sys.stderr)
        return 2
    from optimizer.checkpointing import apply_checkpointing, describe

    torch.set_num_threads(1)
    plain = build_lm()
    checkpointed = copy.deepcopy(plain)
    batch = dataset()[:BATCH]
    example = {"input_ids": torch.stack([b["input_ids"] for b in batch]),
               "labels": torch.stack([b["labels"] for b in batch])}
    plan = apply_checkpointing(checkpointed, example_kwargs=example, budget=args.budget, time_limit=10)
    print(describe(plan))
    with tempfile.TemporaryDirectory() as out_dir:
        reference = train(plain, args.steps, out_dir)
        losses = train(checkpointed, args.steps, out_dir)
    print("losses without checkpointing:", " ".join(f"{x:.4f}" for x in reference))
    print("losses with checkpointing:   ", " ".join(f"{x:.4f}" for x in losses))
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
    same = len(losses) == len(reference) == args.steps and worst < 1e-5
    print(f"{len(losses)} steps, largest relative loss difference {worst:.2e}: "
          + ("equal" if same else "DIFFERENT"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
