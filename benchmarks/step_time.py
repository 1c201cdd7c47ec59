"""Step time at the same memory: remat-opt against what users would pick instead.

Per model, side by side in one process: plain autograd; per-block checkpointing
(``torch.utils.checkpoint``, non-reentrant: Hugging Face's ``gradient_checkpointing_enable``,
or a wrapper around each block for the vision model); the same blocks with a hand-written
selective-checkpoint policy that saves matmul and convolution outputs ("SAC save matmuls");
and remat-opt's graph runtime (at store-all and at per-block checkpointing's measured peak)
and eager runtime (at that peak, or the smallest budget it accepts, shown). Each strategy is a
copy of the same weights. Peaks are measured by `frontends.measure.step.measure_step` (CPU:
live tensor storages plus resident; CUDA: ``max_memory_allocated``); step times are medians of
interleaved rounds (every strategy once per round, in turn), so machine noise hits all alike.

Not here: ``torch.compile`` strategies (PyTorch's ``activation_memory_budget``, remat-opt's
``remat_backend``). On the CPU, Inductor's kernels allocate outside the dispatcher, so their peak
cannot be measured the way the others' is; `benchmarks/vs_pytorch.py` compares the min-cut
partitioner's memory and FLOPs instead.

    python benchmarks/step_time.py [--models gpt2,llama,resnet] [--rounds 15] [--threads 1]
        [--device cpu|cuda] [--size cpu|gpu] [--dtype float32|bfloat16] [--cost-model device]
        [--offload] [--out FILE.md]

``--offload`` adds remat-opt's graph and eager runtimes with ``offload="auto"`` at the same peak, their copies
priced on the link measured on the device (``link="measured"``), beside the recompute-only plan
(issue 39's GPU check). On the CPU the copies are synchronous host copies that stay in the same
memory: that row's peak and time say nothing about a GPU there.

remat-opt's plans price time with ``--cost-model`` (default ``device``); each plan's
``extra_time_s`` is shown beside the measured extra time (its median minus plain autograd's).

On a lent GPU: ``python benchmarks/step_time.py --device cuda --size gpu --models gpt2,llama
--rounds 10 --time-limit 30 --offload`` (issue 38's shapes; issue 39's offload row).
"""

from __future__ import annotations

import argparse
import copy
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_pytorch_peers import wrap_blocks  # noqa: E402

from frontends.capture.model_file import load_model_file  # noqa: E402
from frontends.measure.step import measure_step, unique_storage_bytes  # noqa: E402
from optimizer import InfeasibleBudgetError, apply_checkpointing, optimize  # noqa: E402
from solvers.planning.eager_plan import OFFLOADS  # noqa: E402

aten = torch.ops.aten
_SAVED_BY_SAC = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default,
                 aten._scaled_dot_product_flash_attention_for_cpu.default,
                 aten._scaled_dot_product_flash_attention.default,
                 aten._scaled_dot_product_efficient_attention.default}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_BY_SAC else CheckpointPolicy.PREFER_RECOMPUTE


def _sac_context():
    return create_selective_checkpoint_contexts(_save_matmuls)


@dataclass(frozen=True)
class Workload:
    """A model to copy per strategy, its call, and how to checkpoint a copy per block."""

    name: str
    description: str
    model: torch.nn.Module
    args: tuple
    kwargs: dict
    per_block: Callable[[torch.nn.Module, bool], torch.nn.Module]
    """``per_block(copy, selective)``: the copy checkpointed per block (with SAC when selective)."""


@dataclass
class Strategy:
    label: str
    module: torch.nn.Module
    predicted_peak: int | None = None
    budget_note: str = ""
    predicted_extra_s: float | None = None
    """The plan's ``extra_time_s``: what recomputation adds to plain autograd's step, priced by
    the cost model (compared with the measured median minus plain autograd's)."""
    measured_peak: int = 0
    times: list[float] | None = None


def _hf_per_block(model: torch.nn.Module, selective: bool) -> torch.nn.Module:
    options = {"use_reentrant": False}
    if selective:
        options["context_fn"] = _sac_context
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    return model


SHAPES = {
    "cpu": {"gpt2": dict(layers=4, width=256, heads=4, vocab=1024, batch=8, seq=256, dtype="float32"),
            "llama": dict(layers=4, width=256, heads=8, kv_heads=2, ffn=704, vocab=1024, batch=8, seq=256,
                          dtype="float32")},
    "gpu": {"gpt2": dict(layers=12, width=768, heads=12, vocab=50257, batch=8, seq=1024, dtype="float32"),
            "llama": dict(layers=8, width=2048, heads=16, kv_heads=4, ffn=5632, vocab=32000, batch=4, seq=2048,
                          dtype="bfloat16")},
}
"""``--size cpu``: small enough for one CPU thread. ``--size gpu``: issue 38's H200 shapes, GPT-2
small in float32 at 8 x 1024 and a Llama of 8 x 2048 (GQA 16/4, SwiGLU 5632) in bfloat16 at 4 x 2048."""


def _transformers_workloads(names: list[str], size: str, dtype: str | None,
                            device: torch.device) -> list[Workload]:
    import transformers  # optional: only these workloads need it

    transformers.logging.set_verbosity_error()
    out = []
    for name in ("gpt2", "llama"):
        if name not in names:
            continue
        shape = SHAPES[size][name]
        model_dtype = getattr(torch, dtype or shape["dtype"])
        tokens = torch.randint(1, shape["vocab"], (shape["batch"], shape["seq"]),
                               generator=torch.Generator().manual_seed(0)).to(device)
        batch = {"input_ids": tokens, "labels": tokens}
        torch.manual_seed(0)
        if name == "gpt2":
            config = transformers.GPT2Config(n_layer=shape["layers"], n_embd=shape["width"], n_head=shape["heads"],
                                             vocab_size=shape["vocab"], n_positions=shape["seq"],
                                             attn_implementation="sdpa")
            model = transformers.GPT2LMHeadModel(config)
            what = f"transformers GPT-2 {shape['layers']} x {shape['width']} (dropout 0.1)"
        else:
            config = transformers.LlamaConfig(num_hidden_layers=shape["layers"], hidden_size=shape["width"],
                                              num_attention_heads=shape["heads"],
                                              num_key_value_heads=shape["kv_heads"],
                                              intermediate_size=shape["ffn"], vocab_size=shape["vocab"],
                                              attn_implementation="sdpa")
            model = transformers.LlamaForCausalLM(config)
            what = (f"transformers Llama {shape['layers']} x {shape['width']} (GQA {shape['heads']}/"
                    f"{shape['kv_heads']}, SwiGLU {shape['ffn']})")
        model = model.to(device, model_dtype).train()
        out.append(Workload(name, f"{what}, batch {shape['batch']} x {shape['seq']}, {_name(model_dtype)}",
                            model, (), batch, _hf_per_block))
    return out


def _resnet_workload(dtype: torch.dtype, device: torch.device) -> Workload:
    """examples/resnet.py as its file builds it (the same at every ``--size``)."""
    path = Path(__file__).resolve().parent.parent / "examples" / "resnet.py"
    model, inputs = load_model_file(str(path))
    inputs = tuple(x.to(device, dtype) if x.is_floating_point() else x.to(device) for x in inputs)
    return Workload("resnet", f"examples/resnet.py, batch {inputs[0].shape[0]}, {_name(dtype)}",
                    model.to(device, dtype).train(), inputs, {},
                    lambda m, selective: wrap_blocks(m, "resnet", selective=selective))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _strategies(work: Workload, time_limit: float, cost_model: str, log: Callable[[str], None],
                offload: bool = False) -> list[Strategy]:
    """Plain, per-block, SAC; then remat-opt at per-block's measured peak (and with offload)."""
    def fresh() -> torch.nn.Module:
        return copy.deepcopy(work.model)

    strategies = [Strategy("plain autograd", fresh()),
                  Strategy("per-block checkpoint", work.per_block(fresh(), False)),
                  Strategy("SAC, save matmuls", work.per_block(fresh(), True))]
    for s in strategies:
        s.measured_peak = _peak(s.module, work)
    budget = strategies[1].measured_peak
    start = time.perf_counter()
    rm = optimize(fresh(), work.args, "100%", example_kwargs=work.kwargs, solver="store-all", cost_model=cost_model)
    strategies.append(Strategy("remat-opt graph, store-all", rm, rm.plan.predicted_peak_bytes,
                               predicted_extra_s=rm.plan.extra_time_s))
    rm = optimize(fresh(), work.args, budget, example_kwargs=work.kwargs, time_limit=time_limit, cost_model=cost_model)
    strategies.append(Strategy("remat-opt graph, at per-block's peak", rm, rm.plan.predicted_peak_bytes,
                               predicted_extra_s=rm.plan.extra_time_s))
    log(f"{work.name}: graph runtime planned in {time.perf_counter() - start:.1f} s")
    if offload:
        start = time.perf_counter()
        rm = optimize(fresh(), work.args, budget, example_kwargs=work.kwargs, time_limit=time_limit,
                      cost_model=cost_model, offload="auto", link="measured")
        moved = sum(nbytes for _, nbytes in rm.plan.offloaded)
        note = (f"{len(rm.plan.offloaded)} values, {moved / 2**20:.0f} MiB to host over {rm.plan.link}"
                if rm.plan.offloaded else "no offload won (recompute only)")
        strategies.append(Strategy("remat-opt graph + offload, at per-block's peak", rm,
                                   rm.plan.predicted_peak_bytes, note, predicted_extra_s=rm.plan.extra_time_s))
        log(f"{work.name}: offload planned in {time.perf_counter() - start:.1f} s ({note})")
        start = time.perf_counter()
        eager = fresh()
        try:
            plan = apply_checkpointing(eager, work.args, work.kwargs, budget=budget, compare=False,
                                       time_limit=time_limit, cost_model=cost_model, offload="auto", link="measured")
            regions = [r for r in plan.regions if r.option in OFFLOADS]
            moved = sum(nbytes for _, nbytes in plan.plan.offloaded)
            note = (f"{len(regions)} modules, {moved / 2**20:.0f} MiB to host over {plan.plan.link}" if regions
                    else "no offload won (recompute only)")
            strategies.append(Strategy("remat-opt eager + offload, at per-block's peak", eager,
                                       plan.predicted_peak_bytes, note, predicted_extra_s=plan.extra_time_s))
        except InfeasibleBudgetError as err:
            note = f"refused per-block's peak: {str(err).splitlines()[0][:80]}"
        log(f"{work.name}: eager offload planned in {time.perf_counter() - start:.1f} s ({note})")
    eager = fresh()
    try:
        plan = apply_checkpointing(eager, work.args, work.kwargs, budget=budget, compare=False, time_limit=time_limit,
                                   cost_model=cost_model)
        note = ""
    except InfeasibleBudgetError as err:
        smallest = err.smallest_feasible_bytes or _smallest_eager(work, budget, time_limit)
        plan = apply_checkpointing(eager, work.args, work.kwargs, budget=smallest, compare=False,
                                   time_limit=time_limit, cost_model=cost_model)
        note = f"refused per-block's peak; at {smallest:,} B (+{smallest - budget:,})"
    strategies.append(Strategy("remat-opt eager runtime, at per-block's peak", eager,
                               plan.predicted_peak_bytes, note, predicted_extra_s=plan.extra_time_s))
    for s in strategies[3:]:
        s.measured_peak = _peak(s.module, work)
    return strategies


def _smallest_eager(work: Workload, budget: int, time_limit: float) -> int:
    """The eager runtime's smallest accepted budget above ``budget``, in 0.5% steps."""
    for step in range(1, 41):
        trial = int(budget * (1 + 0.005 * step))
        try:
            apply_checkpointing(copy.deepcopy(work.model), work.args, work.kwargs, budget=trial, compare=False,
                                time_limit=time_limit)
            return trial
        except InfeasibleBudgetError:
            continue
    raise RuntimeError("the eager runtime accepts no budget within 20% of per-block checkpointing's peak")


def _peak(module: torch.nn.Module, work: Workload) -> int:
    """The step's peak as if ``module`` were alone on its device: on CUDA the other strategies'
    copies (and their gradients) are resident too, so the peak is taken above what was allocated
    before the step, plus this copy's own parameters, buffers and inputs."""
    gc.collect()
    device = next(module.parameters()).device
    if device.type != "cuda":
        return measure_step(module, work.args, work.kwargs, warmup=1, repeats=1).peak_bytes
    _step(module, work, device)  # warm-up: lazy state, cuBLAS workspaces
    for p in module.parameters():
        p.grad = None
    own = unique_storage_bytes([*module.parameters(), *module.buffers(),
                                *[t for t in (*work.args, *work.kwargs.values()) if isinstance(t, torch.Tensor)]])
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    _step(module, work, device)
    return torch.cuda.max_memory_allocated(device) - before + own


def _step(module: torch.nn.Module, work: Workload, device: torch.device) -> float:
    for p in module.parameters():
        p.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = module(*work.args, **work.kwargs)
    loss = out.loss if hasattr(out, "loss") else out[0] if isinstance(out, (tuple, list)) else out
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run(work: Workload, rounds: int, time_limit: float, device: torch.device, cost_model: str, log,
        offload: bool = False) -> list[str]:
    strategies = _strategies(work, time_limit, cost_model, log, offload)
    for s in strategies:
        _step(s.module, work, device)  # warm-up
        s.times = []
    for _ in range(rounds):
        for s in strategies:
            s.times.append(_step(s.module, work, device))
    reference = statistics.median(strategies[1].times)
    plain = statistics.median(strategies[0].times)
    rows = [f"\n**{work.description}** (budget: per-block checkpointing's measured peak, "
            f"{strategies[1].measured_peak:,} B)\n",
            "| strategy | measured peak (B) | predicted peak (B) | median step (ms) | vs per-block "
            f"| extra vs plain, measured (ms) | extra, predicted ({cost_model}, ms) | note |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in strategies:
        median = statistics.median(s.times)
        predicted = f"{s.predicted_peak:,}" if s.predicted_peak is not None else ""
        extra = f"{(s.predicted_extra_s or 0.0) * 1e3:.1f}" if s.predicted_extra_s is not None else ""
        rows.append(f"| {s.label} | {s.measured_peak:,} | {predicted} | {median * 1e3:.1f} | "
                    f"{median / reference:.3f}x | {(median - plain) * 1e3:+.1f} | {extra} | {s.budget_note} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,llama,resnet")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", default="cpu", choices=sorted(SHAPES))
    parser.add_argument("--dtype", choices=("float32", "bfloat16"),
                        help="every model in this dtype (default: the size's own, see SHAPES)")
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--cost-model", default="device",
                        help="remat-opt's cost model (default device: time measured on this CPU or the "
                             "GPU's datasheet roofline); its extra_time_s is shown beside the measured extra")
    parser.add_argument("--offload", action="store_true",
                        help="also the graph and eager runtimes with offload='auto' on the measured link (see above)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    names = args.models.split(",")
    workloads = _transformers_workloads(names, args.size, args.dtype, device)
    if "resnet" in names:
        workloads.append(_resnet_workload(getattr(torch, args.dtype or "float32"), device))
    lines = [f"Command: `python benchmarks/step_time.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
             f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} thread(s), "
             f"device {device}, {args.rounds} interleaved rounds"]
    for work in workloads:
        table = run(work, args.rounds, args.time_limit, device, args.cost_model, lambda m: print(m, file=sys.stderr),
                    args.offload)
        print("\n".join(table), file=sys.stderr)
        lines += table
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
