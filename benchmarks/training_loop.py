"""The whole training iteration as the budget (issue 41): predicted against measured, on CPU.

For each model, runtime, budget and accumulation: plan with ``optimizer="adamw"``, train three
AdamW iterations (`frontends.measure.loop.measure_training_loop`: every live tensor, the state
included), and report the budget, the predicted and the measured iteration peak, and the terms
of the plan's breakdown. Then, from shapes alone, what a Llama-3-8B-shaped config needs per GPU
with each AdamW path next to accelerate's "training with Adam" figure (4 x the parameters).

    python benchmarks/training_loop.py [--out benchmarks/training_loop.md]
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from e2e_helpers import load_example, tiny_gpt2, tiny_llama  # noqa: E402

from frontends.capture.config_model import hf_config_model  # noqa: E402
from frontends.measure.loop import measure_training_loop  # noqa: E402
from frontends.measure.optimizer_memory import optimizer_memory  # noqa: E402
from optimizer import apply_checkpointing, optimize  # noqa: E402
from solvers.ir.budget import format_bytes  # noqa: E402


def _models():
    import transformers  # optional: the transformers rows need it

    transformers.logging.set_verbosity_error()
    gpt, inputs = load_example("gpt", torch.float32)
    yield "examples/gpt.py", gpt, inputs, {}
    tokens = torch.randint(1, 128, (8, 64), generator=torch.Generator().manual_seed(0))
    yield ("transformers GPT-2 2 x 64, 8 x 64", tiny_gpt2(transformers, torch.float32, attn_implementation="sdpa"),
           (), {"input_ids": tokens, "labels": tokens})
    llama = tiny_llama(128)[0].float()
    yield "transformers Llama 2 x 64, 8 x 64", llama, (), {"input_ids": tokens, "labels": tokens}


def _row(name, runtime, budget, k, model, args, kwargs) -> str:
    model = copy.deepcopy(model)
    try:
        if runtime == "graph":
            module = optimize(model, args, budget, example_kwargs=kwargs, optimizer="adamw", grad_accumulation=k,
                              time_limit=10)
            plan = module.plan
        else:
            module = model
            plan = apply_checkpointing(model, args, kwargs, budget=budget, optimizer="adamw", grad_accumulation=k,
                                       compare=False, time_limit=10).plan
    except ValueError as err:  # InfeasibleBudgetError
        return f"| {name} | {runtime} | {budget} | {k} | refused: {str(err).splitlines()[0][:90]} | | | | |"
    measured = measure_training_loop(module, args, kwargs, torch.optim.AdamW(module.parameters(), lr=1e-3),
                                     grad_accumulation=k)
    b = plan.breakdown
    diff = measured.peak_bytes - plan.predicted_peak_bytes
    return (f"| {name} | {runtime} | {budget} | {k} | {plan.budget_bytes:,} | {plan.predicted_peak_bytes:,} | "
            f"{measured.peak_bytes:,} | {diff:+,} | {b.optimizer_bytes:,} / {b.optimizer_step_peak_bytes:,} |")


def _llama3_8b() -> list[str]:
    model, _ = hf_config_model(str(ROOT / "examples" / "configs" / "llama3-8b.json"), batch=1, seq=4096)
    params = list(model.parameters())
    n_bytes = sum(p.numel() * p.element_size() for p in params)
    rows = ["", "**Llama-3-8B-shaped config (examples/configs/llama3-8b.json), bf16 weights, on a CUDA device, "
            "from shapes alone**", "",
            "| AdamW path | state | step temporaries | parameters + gradients + state + temporaries |",
            "|---|---:|---:|---:|"]
    for name in ("adamw", "adamw-fused"):
        memory = optimizer_memory(name, params, device="cuda")
        total = 2 * n_bytes + memory.state_bytes + memory.step_bytes
        rows.append(f"| {memory.name} | {format_bytes(memory.state_bytes)} | {format_bytes(memory.step_bytes)} | "
                    f"{format_bytes(total)} |")
    rows.append(f"| accelerate estimate-memory, training with Adam (4 x parameters) | | | {format_bytes(4 * n_bytes)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = [f"Command: `python benchmarks/training_loop.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
             f"torch {torch.__version__}, {platform.machine()}, CPU, float32, AdamW (lr 1e-3), three iterations, "
             "iterations 2 and 3 measured", "",
             "| model | runtime | budget | micro-batches | budget (B) | predicted (B) | measured (B) | "
             "measured - predicted | state / optimizer step peak (B) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, model, a, kw in _models():
        for runtime in ("graph", "eager"):
            for budget, k in (("60%", 1), ("80%", 1), ("80%", 2)):
                lines.append(_row(name, runtime, budget, k, model, a, kw))
                print(lines[-1], file=sys.stderr)
    lines += _llama3_8b()
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
