"""GPU check: do planned peaks, step times and gradients hold on a real CUDA device?

For the GPT example and a GPT-2-small-shaped model (12 layers, d 768, 12 heads, seq 512,
vocab 50257, batch 8 by default), in float32 with dropout off (so gradients are comparable):

* plain autograd: measured peak (``torch.cuda.max_memory_allocated``) vs the simulated store-all
  peak, step time, and the per-op profile's sum;
* the rewritten module at two budgets, the store-all peak and the midpoint between the
  recompute-all and store-all peaks: predicted peak (raw IR bytes, and with the allocator model:
  512-byte blocks plus the workspace measured before the step), measured peak, step time vs
  plain autograd, and the largest relative gradient error against plain autograd.

Planning uses the MILP where the graph is small enough (``--milp-max-values``), else the
other registered solvers in turn; the table says which solver made each plan and why.
Prints a Markdown table and writes it to ``--out``. ``--device cpu`` is a dry run of the small
GPT on CPU (CPU tracker, no allocator rounding) to check the script without a GPU.

    python benchmarks/gpu_check.py --out benchmarks/gpu_check.md [--batch 8] [--time-limit 30]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import multiprocessing
import os
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from frontends.capture.step import CapturedStep, capture  # noqa: E402
from frontends.graph_runtime.remat_module import RematModule  # noqa: E402
from frontends.measure.costs import FLOPS_MODEL, CostModel, roofline_model  # noqa: E402
from frontends.measure.profile import profile_step  # noqa: E402
from frontends.measure.step import StepMeasurement, measure_step  # noqa: E402
from solvers import SOLVERS  # noqa: E402
from solvers.base import SolverOptions  # noqa: E402
from solvers.baselines import recompute_all_schedule, store_all_schedule  # noqa: E402
from solvers.ir.allocator import AllocatorModel, allocator_for  # noqa: E402
from solvers.ir.graph import RematGraph  # noqa: E402
from solvers.ir.plan import Plan  # noqa: E402
from solvers.ir.simulator import simulate  # noqa: E402
from solvers.planning.planner import plan_graph  # noqa: E402

MiB = 1 << 20


@dataclass(frozen=True)
class Row:
    """One line of the table: a plan (or plain autograd) measured on the device."""

    model: str
    budget: str
    solver: str
    predicted_bytes: int
    planned_bytes: int
    """Predicted with the allocator model (block rounding + measured workspace)."""
    measured: StepMeasurement
    eager_step_s: float
    grad_error: float | None
    note: str = ""


# ----------------------------------------------------------------------------- models
def _gpt_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _models(device: torch.device, batch: int, small_only: bool) -> list[tuple[str, Any, tuple[Any, ...]]]:
    gpt = _gpt_module()
    models = [("gpt-example", lambda: gpt.get_model(dropout=0.0), gpt.get_inputs)]
    if not small_only:
        def gpt2() -> torch.nn.Module:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                return gpt.GPT(vocab_size=50257, seq_len=512, d_model=768, n_heads=12, n_layers=12, dropout=0.0)

        def tokens() -> tuple[torch.Tensor, torch.Tensor]:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1)
                t = torch.randint(0, 50257, (batch, 513))
            return t[:, :-1].contiguous(), t[:, 1:].contiguous()

        models.append((f"gpt2-small-shaped (batch {batch})", gpt2, tokens))
    return [(name, make, lambda get=get: tuple(x.to(device) for x in get())) for name, make, get in models]


def _known_device(device: torch.device) -> str | None:
    """The `frontends.measure.devices` key of a CUDA device, from its name (None when not in the table)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    memory = torch.cuda.get_device_properties(device).total_memory
    for key, marker in (("h200", "H200"), ("h100", "H100"), ("l4", " L4"), ("rtx4090", "4090"),
                        ("v100", "V100"), ("t4", " T4")):
        if marker in f" {name}":
            return key
    if "A100" in name:
        return "a100-80gb" if memory > 50e9 else "a100-40gb"
    return None


# ----------------------------------------------------------------------------- steps
def _grads(model: torch.nn.Module, inputs: tuple[Any, ...], module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients of one step of ``module`` (``model`` or its rewrite), copied to CPU."""
    for p in model.parameters():
        p.grad = None
    out = module(*inputs)
    (out[0] if isinstance(out, (tuple, list)) else out).backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return grads


def _grad_error(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Largest over parameters of max |g - g_ref| / max |g_ref| (inf when a gradient is missing)."""
    worst = 0.0
    for name, ref in reference.items():
        if name not in grads:
            return float("inf")
        scale = ref.abs().max().item() or 1.0
        worst = max(worst, (grads[name] - ref).abs().max().item() / scale)
    return worst


def _solve_in_child(conn: Any, graph: RematGraph, budget: int, solver: str, time_limit: float) -> None:
    """Child process: its own process group, so a back-end's solver binary dies with it."""
    os.setpgid(0, 0)
    try:
        conn.send(("ok", plan_graph(graph, budget, solver, SolverOptions(time_limit_s=time_limit))))
    except Exception as err:  # noqa: BLE001 -- reported to the parent, which tries the next solver
        conn.send(("error", f"{type(err).__name__}: {str(err)[:100]}"))


def _plan_with_deadline(graph: RematGraph, budget: int, solver: str, time_limit: float) -> Plan | str:
    """``plan_graph`` under a hard wall-clock deadline (a back-end may overrun its own limit).

    Forked: the child only plans (pure Python plus the solver's binary), it never touches CUDA.
    Returns the plan, or why there is none.
    """
    deadline = 1.2 * time_limit + 10.0
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_solve_in_child, args=(send, graph, budget, solver, time_limit))
    child.start()
    try:
        if receive.poll(deadline):
            status, value = receive.recv()
            return value if status == "ok" else f"failed: {value}"
        return f"overran its {time_limit:.0f}s limit; stopped after {deadline:.0f}s"
    finally:
        if child.is_alive():
            os.killpg(child.pid, signal.SIGKILL)
        child.join()


def _plan(graph: RematGraph, budget: int, time_limit: float, milp_max_values: int) -> tuple[Plan, str]:
    """The first registered solver that fits ``budget``: MILP, other solvers, then baselines."""
    order = [s for s in SOLVERS if s not in ("store-all", "recompute-all")] + ["store-all", "recompute-all"]
    notes: list[str] = []
    for solver in order:
        if solver == "milp" and len(graph.ops) > milp_max_values:
            notes.append(f"milp skipped ({len(graph.ops)} values > {milp_max_values})")
            continue
        start = time.perf_counter()
        result = _plan_with_deadline(graph, budget, solver, time_limit)
        if isinstance(result, str):
            notes.append(f"{solver} {result}")
            continue
        notes.append(f"{solver}: {result.status} in {time.perf_counter() - start:.1f}s")
        return result, "; ".join(notes)
    raise RuntimeError(f"no solver fits {budget} bytes: {'; '.join(notes)}")


def _recapture(model: torch.nn.Module, inputs: tuple[Any, ...], graph: RematGraph, cost: CostModel) -> CapturedStep:
    """A fresh capture for a RematModule (one capture compiles once), checked to be the same IR."""
    again = capture(model, inputs, cost_model=cost)
    if tuple(n.name for n in again.graph.nodes) != tuple(n.name for n in graph.nodes):
        raise RuntimeError("capturing the model twice gave different graphs; plans would not transfer")
    return again


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_model(name: str, make: Any, get_inputs: Any, device: torch.device, args: argparse.Namespace,
                log: list[str]) -> list[Row]:
    """Plain autograd plus two planned budgets for one model."""
    start = time.perf_counter()
    model = make().to(device)
    inputs = get_inputs()
    allocator = allocator_for(device.type)
    known = _known_device(device)
    cost = roofline_model(known, torch.float32) if known else FLOPS_MODEL
    reference = _grads(model, inputs, model)
    eager = measure_step(model, inputs, warmup=2, repeats=args.repeats)
    captured = capture(model, inputs, cost_model=cost)
    graph = captured.graph
    profile = profile_step(captured, model, inputs, warmup=1, repeats=args.repeats)
    store = simulate(graph, store_all_schedule(graph)).peak_bytes
    lean = simulate(graph, recompute_all_schedule(graph)).peak_bytes
    log.append(
        f"- {name}: {len(captured.gm.graph.nodes)} joint nodes, {len(graph.ops)} values; eager step "
        f"{eager.step_time_s * 1e3:.1f} ms; per-op profile sum {profile.total_seconds * 1e3:.1f} ms "
        f"({profile.total_seconds / eager.step_time_s:.2f} x step); {cost.name} predicts "
        f"{graph.base_cost * 1e3:.1f} ms"
    )
    rounded = allocator.apply(graph)
    resident_rounded = rounded.resident_bytes

    def planned(schedule_peak: int, measured: StepMeasurement) -> int:
        reserve = max(0, measured.resident_bytes - resident_rounded) if device.type == "cuda" else 0
        return AllocatorModel(block_bytes=allocator.block_bytes, workspace_reserve_bytes=reserve).planned_peak(schedule_peak)

    rows = [Row(name, "plain autograd", "-", store, planned(simulate(rounded, store_all_schedule(rounded)).peak_bytes, eager),
                eager, eager.step_time_s, None)]
    for label, budget in (("store-all peak", store), ("midpoint", (store + lean) // 2)):
        plan, note = _plan(graph, budget, args.time_limit, args.milp_max_values)
        module = RematModule(model, _recapture(model, inputs, graph, cost), plan, inputs)
        measured = measure_step(module, inputs, warmup=2, repeats=args.repeats)
        error = _grad_error(_grads(model, inputs, module), reference)
        assert plan.schedule is not None
        peak_rounded = simulate(rounded, plan.schedule).peak_bytes
        rows.append(Row(name, f"{label} ({budget / MiB:.1f} MiB)", plan.solver, plan.predicted_peak_bytes,
                        planned(peak_rounded, measured), measured, eager.step_time_s, error, note))
        del module
        _release(device)
    log.append(f"  ({time.perf_counter() - start:.0f} s for this model)")
    del model, inputs
    _release(device)
    return rows


# ----------------------------------------------------------------------------- report
def _pct(measured: int, predicted: int) -> str:
    return f"{100.0 * (measured - predicted) / predicted:+.2f}%"


def table(rows: list[Row], header: str, log: list[str]) -> str:
    lines = [header, "", *log, "",
             "| model | budget | solver | predicted peak (MiB) | planned, allocator model (MiB) "
             "| measured peak (MiB) | measured vs predicted | measured vs planned | step (ms) "
             "| plain autograd (ms) | slowdown | max rel. grad error |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        error = "-" if r.grad_error is None else f"{r.grad_error:.2e}"
        lines.append(
            f"| {r.model} | {r.budget} | {r.solver} | {r.predicted_bytes / MiB:.2f} | {r.planned_bytes / MiB:.2f} "
            f"| {r.measured.peak_bytes / MiB:.2f} | {_pct(r.measured.peak_bytes, r.predicted_bytes)} "
            f"| {_pct(r.measured.peak_bytes, r.planned_bytes)} | {r.measured.step_time_s * 1e3:.1f} "
            f"| {r.eager_step_s * 1e3:.1f} | {r.measured.step_time_s / r.eager_step_s:.2f}x | {error} |"
        )
    notes = [f"- {r.model}, {r.budget}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + (["", "Solver choices:", *notes] if notes else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: dry run of the small GPT only, to check the script without a GPU")
    parser.add_argument("--batch", type=int, default=8, help="batch of the GPT-2-small-shaped model")
    parser.add_argument("--time-limit", type=float, default=30.0,
                        help="seconds per solve (each attempt is killed after 1.2x + 10 s)")
    parser.add_argument("--milp-max-values", type=int, default=600,
                        help="skip the MILP on graphs with more values than this (it would not finish)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per measurement")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is available (torch.cuda.is_available() is False); "
              "this check needs a GPU. Use --device cpu for a dry run on CPU.", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    if args.device == "cpu":
        torch.set_num_threads(1)  # multi-threaded CPU ops stall when another process holds a core
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    header = (f"GPU check on {what}, torch {torch.__version__}, float32, TF32 "
              f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}, dropout off")
    rows: list[Row] = []
    log: list[str] = []
    started = time.perf_counter()
    for name, make, get_inputs in _models(device, args.batch, small_only=device.type == "cpu"):
        try:
            rows.extend(check_model(name, make, get_inputs, device, args, log))
        except Exception:  # noqa: BLE001 -- keep the other model's results; show what broke
            log.append(f"- {name}: FAILED\n```\n{traceback.format_exc(limit=6)}```")
            _release(device)
    log.append(f"- total {time.perf_counter() - started:.0f} s")
    text = table(rows, header, log)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if rows and all("FAILED" not in line for line in log) else 1


if __name__ == "__main__":
    raise SystemExit(main())
