"""remat-opt against PyTorch's own rematerialization, measured by running one training step each.

Per model (the examples plus GPT-2 tiny, ViT, ResNet and UNet) and strategy: plain autograd,
``torch.utils.checkpoint`` around each block, selective activation checkpointing (save matmuls
and convolutions) around each block, ``torch.compile`` with the min-cut partitioner at several
``activation_memory_budget`` values, remat-opt's eager runtime (``apply_checkpointing``:
checkpoint regions with selective policies on the model itself) at the measured peak of per-block
checkpointing and of SAC, and remat-opt (``solver=auto``) at a budget equal to EACH
peer's measured peak plus a few percentages of plain autograd's, once per objective: modelled
time (the ``flops`` cost model, remat-opt's default) and counted FLOPs (``flop-count``: what
``FlopCounterMode`` counts, so pointwise recomputation is nearly free). Every step is really run and
measured (`vs_pytorch_measure`): peak live tensor bytes, FLOPs, median step time (ratio to plain
autograd of the same run), planning/compile time, gradient error vs plain autograd. Models run
in float64 with dropout off, so gradients are comparable to 1e-10.

    python benchmarks/vs_pytorch.py                 # writes benchmarks/vs_pytorch.{md,png}
    python benchmarks/vs_pytorch.py --quick --out-md /tmp/q.md --out-png /tmp/q.png
    python benchmarks/vs_pytorch.py --models gpt,vit --objectives flop-count --json /tmp/r.json
    python benchmarks/vs_pytorch.py --from-json /tmp/r.json --out-md /tmp/r.md --out-png /tmp/r.png
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
from vs_pytorch_report import EAGER, EAGER_PEERS, FLOP_OBJECTIVE, TIME_OBJECTIVE  # noqa: E402

from frontends.measure.costs import FLOP_COUNT_MODEL, FLOPS_MODEL, CostModel  # noqa: E402

MODELS = ("mlp", "gpt", "convnet", "gpt2", "vit", "resnet", "unet")
COMPILE_BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1)
PERCENTAGES = (80, 60, 40)
OBJECTIVES: dict[str, CostModel] = {TIME_OBJECTIVE: FLOPS_MODEL, FLOP_OBJECTIVE: FLOP_COUNT_MODEL}
"""remat-opt's strategy name per objective -> the cost model its planning capture prices ops with."""


@dataclass(frozen=True)
class Row:
    """One strategy at one setting on one model; ``error`` when it could not run."""

    model: str
    strategy: str
    """plain, per-block, sac, compile, a key of `OBJECTIVES` (remat-opt per objective), or `EAGER`
    (remat-opt's eager runtime, ``apply_checkpointing``)."""
    setting: str
    metrics: StepMetrics | None
    prepare_s: float | None
    """Planning (remat-opt: capture + solve + rewrite) or compilation time (compile: first step
    minus a plain step)."""
    error: str | None = None
    budget_bytes: int | None = None
    """remat-opt and the eager runtime: the budget its measured peak must fit (a peer's measured peak, or a percentage of
    plain autograd's); it plans for this less ``seed_bytes``."""
    seed_bytes: int = 0
    """remat-opt: the loss's seed gradient its plans do not count, held back from the budget."""
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

    def __init__(self, name: str, args: argparse.Namespace, model: nn.Module, inputs: tuple):
        self.name, self.args = name, args
        self.model, self.inputs = model, inputs
        self.rows: list[Row] = []
        self.reference: StepState | None = None

    def _fresh(self) -> tuple[nn.Module, dict, dict]:
        model = copy.deepcopy(self.model)
        return model, dict(model.named_parameters()), dict(model.named_buffers())

    def _measure(self, module, params, buffers, probe=None) -> tuple[StepMetrics, StepState]:
        return measure_strategy(module, params, buffers, self.inputs, reference=self.reference,
                                probe=probe, repeats=self.args.repeats)

    def run(self) -> list[Row]:
        self.run_plain()
        for selective, strategy in ((False, "per-block"), (True, "sac")):
            self._peer(strategy, "", lambda m, s=selective: (wrap_blocks(m, self.name, selective=s), None))
        for fraction in self.args.compile_budgets:
            self._compiled(fraction)
        self.remat_opt()
        self.eager_runtime()
        return self.rows

    def run_plain(self) -> None:
        """The reference step: plain autograd, first row; every later gradient is checked against it."""
        model, params, buffers = self._fresh()
        metrics, self.reference = self._measure(model, params, buffers)
        self.rows.append(Row(self.name, "plain", "", metrics, 0.0))

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

    def budgets(self) -> dict[int, str]:
        """remat-opt's budgets in bytes: each peer's measured peak and each percentage of plain
        autograd's measured peak, each with the runs it stands for."""
        labels: dict[int, list[str]] = {}
        for row in self.rows:
            if row.metrics is not None and row.strategy not in OBJECTIVES and row.strategy != EAGER:
                labels.setdefault(row.metrics.peak_bytes, []).append(f"= {row.strategy} {row.setting}".strip())
        for percent in self.args.percentages:
            budget = self.rows[0].metrics.peak_bytes * percent // 100
            labels.setdefault(budget, []).append(f"{percent}% of plain")
        return {budget: ", ".join(names) for budget, names in labels.items()}

    def seed_bytes(self) -> int:
        """The loss's seed gradient, which autograd's engine holds through backward and
        remat-opt's plans do not count (README, Known limits): one scalar of the model's dtype,
        one 512-byte block of the CUDA caching allocator."""
        if self.inputs[0].device.type == "cuda":
            return 512
        return next(p for p in self.model.parameters() if p.is_floating_point()).element_size()

    def remat_opt(self, budgets: dict[int, str] | None = None) -> None:
        """Every budget (default: `budgets`) once per objective, with the same solver and
        settings: the objectives differ only in the cost model their planning capture prices
        ops with. Each plan is made for the budget less the seed gradient, so that a plan that
        fills it is measured at the budget, not one scalar above it."""
        from frontends.capture.step import capture

        budgets = self.budgets() if budgets is None else budgets
        for strategy in self.args.objectives:
            captured = capture(copy.deepcopy(self.model), self.inputs, cost_model=OBJECTIVES[strategy])
            for budget, setting in budgets.items():  # one planning graph for all budgets
                self.rows.append(self._remat_opt_row(strategy, captured.graph, budget, setting))

    def _remat_opt_row(self, strategy: str, graph, budget: int, setting: str) -> Row:
        from solvers.base import InfeasibleBudgetError, SolverOptions
        from solvers.ir.allocator import allocator_for
        from solvers.planning.planner import plan_graph

        allocator = allocator_for(self.inputs[0].device.type)  # CUDA: 512-byte blocks, as measured
        options = SolverOptions(time_limit_s=self.args.time_limit)
        seed = self.seed_bytes()
        start = time.perf_counter()
        try:
            plan = plan_graph(graph, budget - seed, "auto", options, allocator=allocator)
            module = self._rewrite(plan)
            prepare_s = time.perf_counter() - start  # what optimize() costs
            metrics, _ = self._measure(module, dict(module.model.named_parameters()),
                                       dict(module.model.named_buffers()))
        except InfeasibleBudgetError as err:
            return Row(self.name, strategy, setting, None, None, error=_one_line(err), budget_bytes=budget,
                       seed_bytes=seed)
        except Exception as err:  # a failure of remat-opt is reported, not hidden
            return Row(self.name, strategy, setting, None, None, error="remat-opt failed: " + _one_line(err),
                       budget_bytes=budget, seed_bytes=seed)
        return Row(self.name, strategy, setting, metrics, prepare_s, budget_bytes=budget, seed_bytes=seed,
                   predicted_peak_bytes=plan.predicted_peak_bytes,
                   planned_extra_flops=plan.extra_flops, store_all_peak_bytes=plan.store_all_peak_bytes,
                   note=plan.message[:80])

    def eager_runtime(self) -> None:
        """The eager runtime (``apply_checkpointing``: torch.utils.checkpoint regions with
        selective-checkpoint policies on the model itself) at the measured peak of each peer of
        `EAGER_PEERS`, planned like remat-opt for the budget less the seed gradient. A model it
        cannot plan (nothing checkpointable saves memory, e.g. BatchNorm blocks) is a row with the
        planner's message, not a crash."""
        for peer in EAGER_PEERS:
            row = next((r for r in self.rows if r.strategy == peer and r.setting == ""), None)
            if row is None or row.metrics is None:
                self.rows.append(Row(self.name, EAGER, f"= {peer}", None, None,
                                     error=f"not applicable: {peer} did not run"))
                continue
            # The target compares counted FLOPs, so the eager runtime plans for them (as target 1
            # reads the graph runtime's FLOP-objective rows); the modelled-time objective would
            # rather rerun one matmul than many pointwise ops.
            self.rows.append(self._eager_row(row.metrics.peak_bytes, f"= {peer}", "flop-count"))

    def _eager_row(self, budget: int, setting: str, cost_model: str = "flops") -> Row:
        from optimizer.checkpointing import apply_checkpointing
        from solvers.base import InfeasibleBudgetError

        seed = self.seed_bytes()
        model, params, buffers = self._fresh()
        start = time.perf_counter()
        try:
            plan = apply_checkpointing(model, self.inputs, budget=budget - seed,
                                       time_limit=self.args.time_limit, compare=False, cost_model=cost_model)
            prepare_s = time.perf_counter() - start  # capture + eager trace + solve + wrap
            metrics, _ = self._measure(model, params, buffers)
        except InfeasibleBudgetError as err:
            text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
            kind = "not applicable" if "no submodule's checkpoint saves memory" in text else "infeasible"
            return Row(self.name, EAGER, setting, None, None, error=f"{kind}: {text[:400]}",
                       budget_bytes=budget, seed_bytes=seed)
        except Exception as err:  # a failure of the eager runtime is reported, not hidden
            return Row(self.name, EAGER, setting, None, None, error="eager runtime failed: " + _one_line(err),
                       budget_bytes=budget, seed_bytes=seed)
        return Row(self.name, EAGER, setting, metrics, prepare_s, budget_bytes=budget, seed_bytes=seed,
                   predicted_peak_bytes=plan.predicted_peak_bytes, planned_extra_flops=plan.extra_flops,
                   store_all_peak_bytes=plan.store_all_peak_bytes,
                   note=f"{len(plan.regions)} regions; " + plan.message[:80])

    def _rewrite(self, plan):
        """The RematModule for ``plan`` on a fresh capture of a fresh copy of the model: a
        capture serves one module (AOTAutograd's compile step consumes the joint graph's
        metadata, and deep-copying a capture corrupts memory), and capture is deterministic, so
        the plan made on the first capture's graph names the same values."""
        from frontends.capture.step import capture
        from frontends.graph_runtime.remat_module import RematModule

        model = copy.deepcopy(self.model)
        return RematModule(model, capture(model, self.inputs), plan, self.inputs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer budgets, one repeat")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per strategy (median)")
    parser.add_argument("--time-limit", type=float, default=10.0, help="remat-opt solver limit (s)")
    parser.add_argument("--objectives", default="time,flop-count",
                        help="remat-opt's objectives, comma-separated: time (the flops cost model, "
                             "remat-opt's default), flop-count (FLOPs as FlopCounterMode counts them)")
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
    by_flag = {"time": TIME_OBJECTIVE, "flop-count": FLOP_OBJECTIVE}
    flags = [o.strip() for o in args.objectives.split(",") if o.strip()]
    if not flags or any(o not in by_flag for o in flags):
        parser.error(f"--objectives {args.objectives!r}: choose one or both of time, flop-count")
    args.objectives = [by_flag[o] for o in dict.fromkeys(flags)]
    args.compile_budgets, args.percentages = COMPILE_BUDGETS, PERCENTAGES
    if args.quick:
        args.repeats, args.time_limit = 1, min(args.time_limit, 3.0)
        args.compile_budgets, args.percentages = (1.0, 0.3), (60,)
    return args


def load_saved(path: str) -> tuple[list[Row], dict]:
    """The rows and run description of a ``--json`` file; a one-line exit for anything else.
    Files from before the FLOP objective read as they are (their report marks its targets n/a)."""
    try:
        with open(path) as fh:
            saved = json.load(fh)
        rows, run = [Row.from_json(r) for r in saved["rows"]], saved["run"]
        if not rows or rows[0].strategy != "plain" or rows[0].metrics is None:
            raise ValueError("no rows, or the first row is not a plain-autograd run")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"vs_pytorch.py: cannot read {path} ({type(err).__name__}: {err}): "
                         "give a file written by --json") from None
    return rows, run


def main(argv: list[str] | None = None) -> None:
    from vs_pytorch_plot import write_plot
    from vs_pytorch_report import write_report

    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.from_json:
        rows, run = load_saved(args.from_json)
    else:
        started = time.perf_counter()
        rows = []
        for name in args.models:
            model_start = time.perf_counter()
            model, inputs = load_model(name, getattr(torch, args.dtype), device)
            rows += ModelBench(name, args, model, inputs).run()
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
