"""remat-opt against PyTorch's own rematerialization, measured by running one training step each.

Per model (the examples plus GPT-2 tiny, ViT, ResNet and UNet) and strategy: plain autograd,
``torch.utils.checkpoint`` around each block, selective activation checkpointing (save matmuls
and convolutions) around each block, ``torch.compile`` with the min-cut partitioner at several
``activation_memory_budget`` values, and remat-opt (``solver=auto``) at a budget equal to EACH
peer's measured peak plus a few percentages of plain autograd's. Every step is really run and
measured (`vs_pytorch_measure`): peak live tensor bytes, FLOPs, median step time (ratio to plain
autograd of the same run), planning/compile time, gradient error vs plain autograd. Models run
in float64 with dropout off, so gradients are comparable to 1e-10.

    python benchmarks/vs_pytorch.py                 # writes benchmarks/vs_pytorch.{md,png}
    python benchmarks/vs_pytorch.py --quick --out-md /tmp/q.md --out-png /tmp/q.png
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import inspect
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # before the script's folder: the project's packages win over benchmarks/*.py
sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # this benchmark's sibling modules

import torch  # noqa: E402
from torch import nn  # noqa: E402
from vs_pytorch_measure import StepMetrics, StepState, measure_strategy  # noqa: E402
from vs_pytorch_peers import compile_min_cut, memory_budget, wrap_blocks  # noqa: E402

MODELS = ("mlp", "gpt", "convnet", "gpt2", "vit", "resnet", "unet")
COMPILE_BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1)
PERCENTAGES = (80, 60, 40)


@dataclass(frozen=True)
class Row:
    """One strategy at one setting on one model; ``error`` when it could not run."""

    model: str
    strategy: str
    """plain, per-block, sac, compile, remat-opt."""
    setting: str
    metrics: StepMetrics | None
    prepare_s: float | None
    """Planning (remat-opt: capture + solve + rewrite) or compilation time (compile: first step
    minus a plain step)."""
    error: str | None = None
    budget_bytes: int | None = None
    """remat-opt: the budget it was given."""
    predicted_peak_bytes: int | None = None
    planned_extra_flops: float | None = None
    store_all_peak_bytes: int | None = None
    """remat-opt: simulated peak of plain autograd on its captured graph."""
    note: str = ""

    @classmethod
    def from_json(cls, data: dict) -> Row:
        metrics = StepMetrics(**data["metrics"]) if data.get("metrics") else None
        return cls(**{**data, "metrics": metrics})


def load_model(name: str, dtype: torch.dtype, device: torch.device) -> tuple[nn.Module, tuple]:
    """An example's model (dropout off) and inputs in ``dtype`` on ``device``."""
    spec = importlib.util.spec_from_file_location(f"_vs_{name}", os.path.join(ROOT, "examples", f"{name}.py"))
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # dataclasses in the file look their module up here
    spec.loader.exec_module(example)
    kwargs = {"dropout": 0.0} if "dropout" in inspect.signature(example.get_model).parameters else {}
    model = example.get_model(**kwargs).to(device=device, dtype=dtype).train()
    inputs = tuple(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
                   for t in example.get_inputs())
    return model, inputs


def _one_line(err: BaseException) -> str:
    """The error and its root cause, one line (dynamo wraps backend failures)."""
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    text = f"{type(err).__name__}"
    if root is not err:
        text += f" <- {type(root).__name__}"
    message = next((line.strip() for line in str(root).splitlines() if line.strip()), "")
    return f"{text}: {message[:220]}"


class ModelBench:
    """Runs every strategy on one model against the plain-autograd reference."""

    def __init__(self, name: str, args: argparse.Namespace, dtype: torch.dtype, device: torch.device):
        self.name, self.args = name, args
        self.model, self.inputs = load_model(name, dtype, device)
        self.rows: list[Row] = []
        self.reference: StepState | None = None

    def _fresh(self) -> tuple[nn.Module, dict, dict]:
        model = copy.deepcopy(self.model)
        return model, dict(model.named_parameters()), dict(model.named_buffers())

    def _measure(self, module, params, buffers, probe=None) -> tuple[StepMetrics, StepState]:
        return measure_strategy(module, params, buffers, self.inputs, reference=self.reference,
                                probe=probe, repeats=self.args.repeats)

    def run(self) -> list[Row]:
        model, params, buffers = self._fresh()
        metrics, self.reference = self._measure(model, params, buffers)
        self.rows.append(Row(self.name, "plain", "", metrics, 0.0))
        for selective, strategy in ((False, "per-block"), (True, "sac")):
            self._peer(strategy, "", lambda m, s=selective: (wrap_blocks(m, self.name, selective=s), None))
        for fraction in self.args.compile_budgets:
            self._compiled(fraction)
        self._remat_opt()
        return self.rows

    def _peer(self, strategy: str, setting: str, build) -> None:
        model, params, buffers = self._fresh()
        try:
            module, probe = build(model)
            metrics, _ = self._measure(module, params, buffers, probe)
            self.rows.append(Row(self.name, strategy, setting, metrics, 0.0))
        except Exception as err:  # a peer that fails is a result, not a crash
            self.rows.append(Row(self.name, strategy, setting, None, None, error=_one_line(err)))

    def _compiled(self, fraction: float) -> None:
        torch._dynamo.reset()
        model, params, buffers = self._fresh()
        setting = f"budget {fraction:g}"
        try:
            compiled = compile_min_cut(model)
            with memory_budget(fraction):
                metrics, _ = self._measure(compiled.module, params, buffers, compiled.probe)
        except Exception as err:
            self.rows.append(Row(self.name, "compile", setting, None, None, error=_one_line(err)))
            return
        graphs = compiled.probe.graphs
        note = "" if graphs["forward"] == 1 else f"{graphs['forward']} graphs (graph breaks)"
        plain_time = self.rows[0].metrics.time_s
        self.rows.append(Row(self.name, "compile", setting, metrics,
                             max(metrics.first_step_s - plain_time, 0.0), note=note))
        torch._dynamo.reset()

    def _remat_opt(self) -> None:
        from frontends.capture import capture
        from optimizer.allocator import allocator_for
        from optimizer.planner import plan_graph
        from solvers.base import InfeasibleBudgetError, SolverOptions

        captured = capture(copy.deepcopy(self.model), self.inputs)  # planning graph for all budgets
        allocator = allocator_for(self.inputs[0].device.type)  # CUDA: 512-byte blocks, as measured
        budgets: dict[int | str, list[str]] = {}
        for row in self.rows:
            if row.metrics is not None:
                label = f"= {row.strategy} {row.setting}".strip()
                budgets.setdefault(row.metrics.peak_bytes, []).append(label)
        for percent in self.args.percentages:
            budgets.setdefault(f"{percent}%", []).append(f"{percent}% of plain")
        options = SolverOptions(time_limit_s=self.args.time_limit)
        for budget, labels in budgets.items():
            setting = ", ".join(labels)
            start = time.perf_counter()
            try:
                plan = plan_graph(captured.graph, budget, "auto", options, allocator=allocator)
                module = self._rewrite(plan)
                prepare_s = time.perf_counter() - start  # what optimize() costs
                metrics, _ = self._measure(module, dict(module.model.named_parameters()),
                                           dict(module.model.named_buffers()))
            except InfeasibleBudgetError as err:
                self.rows.append(Row(self.name, "remat-opt", setting, None, None, error=_one_line(err),
                                     budget_bytes=err.budget_bytes))
                continue
            except Exception as err:  # a failure of remat-opt is reported, not hidden
                self.rows.append(Row(self.name, "remat-opt", setting, None, None,
                                     error="remat-opt failed: " + _one_line(err)))
                continue
            self.rows.append(Row(self.name, "remat-opt", setting, metrics, prepare_s,
                                 budget_bytes=plan.budget_bytes, predicted_peak_bytes=plan.predicted_peak_bytes,
                                 planned_extra_flops=plan.extra_flops,
                                 store_all_peak_bytes=plan.store_all_peak_bytes, note=plan.message[:80]))

    def _rewrite(self, plan):
        """The RematModule for ``plan`` on a fresh capture of a fresh copy of the model: a
        capture serves one module (AOTAutograd's compile step consumes the joint graph's
        metadata, and deep-copying a capture corrupts memory), and capture is deterministic, so
        the plan made on the first capture's graph names the same values."""
        from frontends.capture import capture
        from frontends.remat_module import RematModule

        model = copy.deepcopy(self.model)
        return RematModule(model, capture(model, self.inputs), plan, self.inputs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer budgets, one repeat")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per strategy (median)")
    parser.add_argument("--time-limit", type=float, default=10.0, help="remat-opt solver limit (s)")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--out-md", default=os.path.join(ROOT, "benchmarks", "vs_pytorch.md"))
    parser.add_argument("--out-png", default=os.path.join(ROOT, "benchmarks", "vs_pytorch.png"))
    parser.add_argument("--json", help="also write every row as JSON here")
    parser.add_argument("--from-json", help="only re-render the report and plot from such a JSON file")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    args.compile_budgets, args.percentages = COMPILE_BUDGETS, PERCENTAGES
    if args.quick:
        args.repeats, args.time_limit = 1, min(args.time_limit, 3.0)
        args.compile_budgets, args.percentages = (1.0, 0.3), (60,)
    return args


def main(argv: list[str] | None = None) -> None:
    from vs_pytorch_report import write_plot, write_report

    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.from_json:
        with open(args.from_json) as fh:
            saved = json.load(fh)
        rows, run = [Row.from_json(r) for r in saved["rows"]], saved["run"]
    else:
        started = time.perf_counter()
        rows = []
        for name in args.models:
            model_start = time.perf_counter()
            rows += ModelBench(name, args, getattr(torch, args.dtype), device).run()
            print(f"{name}: {time.perf_counter() - model_start:.0f} s", file=sys.stderr, flush=True)
        command = "python benchmarks/vs_pytorch.py " + " ".join(sys.argv[1:] if argv is None else argv)
        run = {"command": command.strip(), "device": str(device), "dtype": args.dtype,
               "elapsed_s": time.perf_counter() - started, "load": os.getloadavg(),
               "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"run": run, "rows": [asdict(row) for row in rows]}, fh, indent=1)
    write_report(rows, args.out_md, run=run, plot_name=os.path.basename(args.out_png))
    write_plot(rows, args.out_png)
    print(f"wrote {args.out_md} and {args.out_png}", file=sys.stderr)


if __name__ == "__main__":
    main()
