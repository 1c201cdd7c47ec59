"""A torch.compile backend that plans every captured graph with remat-opt.

``torch.compile(model, backend=remat_backend(budget="60%"))``: dynamo hands each graph to
`RematBackend`, AOTAutograd traces its joint forward+backward graph, and our partition function
(the ``partition_fn`` contract: joint graph in, forward and backward GraphModules out) turns it
into a `RematGraph` (`frontends.capture.step.build_remat_graph`), plans it (`plan_graph`) and emits the
plan's forward and backward (`frontends.graph_runtime.rewrite.partition_by_schedule`). The graphs then go to
Inductor, where our partitioner is Inductor's ``custom_partitioner_fn`` (so Inductor's joint-graph
passes run first and we plan the graph it compiles), or to eager fx code (``compiler="eager"``).

Inductor fuses pointwise ops and reuses buffers, so the plan's peak (unfused aten ops) bounds the
compiled step from above; as Inductor compiles each half, the backend reads the buffer plan of
the code it generated (`frontends.compile.inductor_memory`) and records the compiled step's own peak in
``GraphPlan.compiled_peak`` (and in the graph's footprint, so `summary` uses it). With
``fit="inductor"`` the backend spends that gap: it re-plans each graph at larger planning budgets,
probing each candidate's compiled peak with a trial Inductor compile that stops at the buffer plan,
and keeps the cheapest plan whose compiled peak meets the budget (`frontends.compile.inductor_fit`).

The backend is in parts: `backend_settings` (what it plans with, checked once), `dynamo_joint`
(reading a joint graph), `joint_planning` (planning it, or fitting it to Inductor) and
`auto_split` (``split="auto"``); this module is the compile hook that ties them to dynamo,
AOTAutograd and Inductor, and keeps the plans. `optimizer.compile.remat_backend` makes one.

Graph breaks give several graphs per step; `solvers.planning.graph_budget` says how the step's budget is
shared and bounds the whole step's peak (`RematBackend.summary`). ``fullgraph=True`` refuses a
second graph, the exact mode. ``split=k`` / ``split_mlp=m`` chunk each graph's LM head + loss
and MLPs before AOTAutograd traces it (`frontends.compile.compile_split`); with both left at None a
graph whose partition finds no whole-tensor plan is split and compiled again
(`frontends.compile.auto_split.split_when_infeasible`). Every plan made is kept in
``backend.plans``. An error of remat-opt's
(a budget too small, a graph break under ``fullgraph``) reaches the caller as itself, not wrapped
in dynamo's ``BackendCompilerFailed`` (`frontends.compile.compile_errors`).

``offload="auto"`` plans keep / recompute / offload per saved value (`plan_graph`) and the
rewrite puts the copies into the forward and backward graphs (`frontends.graph_runtime.offload_ops`:
Python functions on side CUDA streams, host copies on the CPU); only the eager compiler runs them
(Inductor lowers OpOverloads only; see `backend_settings.OFFLOAD_NEEDS_EAGER`). The meter counts
the host copies apart from device bytes (`CompiledStepMeasurement.host_peak_bytes`).
"""

from __future__ import annotations

import dataclasses
import glob
import inspect
import os
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from frontends.capture.step import CapturedStep
from frontends.compile.auto_split import choose_split, split_when_infeasible
from frontends.compile.backend_settings import OFFLOAD_NEEDS_EAGER, CompileSettings
from frontends.compile.compile_errors import error_in_chain, own_error_to_raise, planning_errors
from frontends.compile.compile_split import GraphSplits, split_compiled_graph
from frontends.compile.compiled_memory import CompiledStepMeter
from frontends.compile.dynamo_joint import JointReader, graph_footprint
from frontends.compile.inductor_fit import InductorFit
from frontends.compile.inductor_memory import (
    CompiledPeak,
    WrapperMemoryPlan,
    predict_compiled_peak,
    recording_wrapper_plans,
)
from frontends.compile.joint_planning import plan_joint
from frontends.graph_runtime.remat_module import boxed
from frontends.measure.optimizer_memory import training_loop
from frontends.torch_compat import (
    CompileContext,
    dynamo_aot_autograd,
    functorch_config,
    inductor_compile_fx,
    inductor_compile_fx_inner,
    inductor_custom_partitioner_fn,
    inductor_get_hash_for_files,
)
from solvers.base import InfeasibleBudgetError
from solvers.ir.graph import RematGraph
from solvers.ir.plan import Plan
from solvers.planning.graph_budget import GraphFootprint, StepBudgetSummary, graph_budget, summarize
from solvers.planning.split_search import falls_back
from solvers.planning.training_loop import TrainingLoop

_PLAN_KEY = "remat_opt_compile_id"


class GraphBreakError(RuntimeError):
    """``fullgraph=True`` and dynamo produced more than one graph for the step."""


@dataclass(frozen=True)
class GraphPlan:
    """The plan made for one graph the backend received, in the order received."""

    index: int
    compile_id: str
    """Dynamo's compile id ('frame/recompile'): a recompile of a frame replaces its plan."""
    budget_bytes: int | str
    """What this graph was planned for (bytes after the split, or the percentage)."""
    plan: Plan
    footprint: GraphFootprint
    graph: RematGraph = dataclasses.field(repr=False, compare=False)
    forward_graph: torch.fx.GraphModule = dataclasses.field(repr=False, compare=False)
    backward_graph: torch.fx.GraphModule = dataclasses.field(repr=False, compare=False)
    compiled_peak: CompiledPeak | None = None
    """Inductor: the step's peak predicted from the buffer plans of the compiled forward and
    backward (fusion and buffer reuse included); ``footprint.peak_bytes`` is this then. None
    with the eager compiler (its peak is ``plan.predicted_peak_bytes``) and until both halves
    are compiled."""
    inductor_forward: WrapperMemoryPlan | None = dataclasses.field(default=None, repr=False, compare=False)
    fit: InductorFit | None = None
    """``fit="inductor"``: the planning budgets tried, their compiled peaks and costs, and
    which plan was kept (``plan.budget_bytes`` is then its planning budget)."""
    splits: GraphSplits | None = None
    """``split`` / ``split_mlp``: the chains split in this graph before AOTAutograd traced it."""
    held_bytes: int = 0
    """What the training loop holds beside this graph (optimizer state, accumulated gradients):
    in the plan's peak already, added to Inductor's compiled peak, which counts the graph only."""

    @property
    def graph_budget_bytes(self) -> int:
        """This graph's budget in bytes (a percentage resolved; not the fit's planning budget)."""
        return self.fit.budget_bytes if self.fit else self.plan.budget_bytes

    @property
    def predicted_peak_bytes(self) -> int:
        """The peak of this graph's step as compiled: Inductor-aware when Inductor compiled it."""
        if self.compiled_peak is None:
            return self.plan.predicted_peak_bytes
        return max(self.compiled_peak.predicted_peak_bytes + self.held_bytes,
                   self.plan.breakdown.optimizer_step_peak_bytes)


class RematBackend:
    """The dynamo backend; see `remat_backend` for the arguments."""

    def __init__(self, settings: CompileSettings):
        self.settings = settings
        self.request = settings.request
        self.reader = JointReader(settings.request.cost_model)
        self._graph_splits: GraphSplits | None = None
        """What `_compile` split in the graph being compiled (its `_partition` records it)."""
        self._auto_budget: int | None = None
        """``auto``: the graph's budget in bytes its search resolved (a percentage is of the unsplit graph)."""
        self._split_done = {"head": False, "mlp": False}
        """Whether an earlier graph was split that way: a later graph without the chain may stay unsplit."""
        self.plans: list[GraphPlan] = []
        self.graphs_received = 0
        self.meter = CompiledStepMeter()
        """Measures the compiled forward/backward's live bytes (eager compiler; see the module)."""
        self._frames: list[int] = []
        self._parameters: dict[int, torch.Tensor] = {}
        """The parameters the graphs read, as dynamo hands them over (an optimizer description's)."""
        self._loops: dict[tuple[int, ...], TrainingLoop] = {}
        self.__name__ = f"remat_backend_{settings.compiler}"

    @property
    def compiler(self) -> str:
        return self.settings.compiler

    @property
    def budget(self) -> int | str:
        """The step's budget in bytes, or the percentage as written."""
        budget = self.request.budget
        return str(budget) if budget.is_percentage else budget.size_bytes

    # -------------------------------------------------------------- dynamo entry
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        self.graphs_received += 1
        try:
            return self._compile(gm, example_inputs)
        except Exception as err:  # a bad budget reads as itself, not as a compiler crash
            own = own_error_to_raise(err, inspect.currentframe())
            if own is None:
                raise
            raise own from None

    def _compile(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        compile_id = CompileContext.current_compile_id()
        name = f"graph {compile_id}" if compile_id is not None else "the graph"
        self._auto_budget = None
        for value in example_inputs:  # what an optimizer description's state is counted over
            if isinstance(value, torch.nn.Parameter) and value.requires_grad:
                self._parameters.setdefault(id(value), value)
        with planning_errors():  # a split refused reaches the caller as itself
            if len(self.settings.heads) > 1 or len(self.settings.mlps) > 1:
                self._graph_splits = self._choose_split(gm, example_inputs, name, compile_id)
            else:
                self._graph_splits = split_compiled_graph(
                    gm, example_inputs, self.settings.heads[0], self.settings.mlps[0], name,
                    head_required=not self._split_done["head"], mlp_required=not self._split_done["mlp"])
        if not falls_back(self.request.split, self.request.split_mlp):
            return self._compile_as_split(gm, example_inputs)
        try:
            return self._compile_as_split(gm, example_inputs)
        except Exception as err:
            unsplit_error = error_in_chain(err, lambda e: isinstance(e, InfeasibleBudgetError))
            if unsplit_error is None:
                raise
        # split=None and no whole-tensor plan fits this graph: split it, and compile again.
        frame = str(compile_id.frame_id) if compile_id is not None else str(len(self._frames))
        with planning_errors():
            chosen = split_when_infeasible(gm, example_inputs, name, frame, unsplit_error, self.settings,
                                           self.reader, f"graph{len(self.plans)}")
        self._graph_splits, self._auto_budget = chosen.splits, chosen.budget_bytes
        return self._compile_as_split(gm, example_inputs)

    def _compile_as_split(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        """Compile ``gm`` as `_compile` split it (its partition function plans it)."""
        if self._graph_splits is not None:
            self._split_done["head"] |= bool(self._graph_splits.row_splits)
            self._split_done["mlp"] |= bool(self._graph_splits.mlp_splits.splits)
        if self.compiler == "inductor":
            compile_fx = inductor_compile_fx()  # Inductor, imported only on its path
            # No cache: a cached graph would skip planning (no plan in `plans`, no budget split).
            with functorch_config.patch(enable_autograd_cache=False):
                return compile_fx(gm, example_inputs, inner_compile=self._inductor_inner, config_patches={
                    "custom_partitioner_fn": RematPartitioner(self), "fx_graph_cache": False})
        aot_autograd = dynamo_aot_autograd()  # dynamo, imported only when torch.compile runs
        return aot_autograd(fw_compiler=self._eager("forward"), bw_compiler=self._eager("backward"),
                            partition_fn=self.partition)(gm, example_inputs)

    def _inductor_inner(self, gm: torch.fx.GraphModule, example_inputs, *args: Any, **kwargs: Any):
        """Inductor's ``compile_fx_inner`` for the planned forward or backward, recording the
        buffer plan of the wrapper it generates; once both halves are in, the plan gets its
        Inductor-aware peak (`frontends.compile.inductor_memory`)."""
        compile_fx_inner = inductor_compile_fx_inner()  # Inductor, imported only on its path
        recorded: list[WrapperMemoryPlan] = []
        with recording_wrapper_plans(recorded):
            compiled = compile_fx_inner(gm, example_inputs, *args, **kwargs)
        if recorded:
            self._attach_wrapper_plan(gm, recorded[-1])
        return compiled

    def _attach_wrapper_plan(self, gm: torch.fx.GraphModule, wrapper_plan: WrapperMemoryPlan) -> None:
        compile_id = gm.meta.get(_PLAN_KEY)
        index = next((i for i, p in enumerate(self.plans) if p.compile_id == compile_id), None)
        if index is None:  # not a graph this backend partitioned (nothing to predict)
            return
        planned = self.plans[index]
        if not wrapper_plan.is_backward:
            self.plans[index] = dataclasses.replace(planned, inductor_forward=wrapper_plan)
        elif planned.inductor_forward is not None:
            try:
                compiled = predict_compiled_peak(planned.inductor_forward, wrapper_plan,
                                                 planned.graph.resident_bytes)
            except ValueError:  # halves that do not pair up: keep the plan's own peak
                return
            planned = dataclasses.replace(planned, compiled_peak=compiled)
            footprint = dataclasses.replace(planned.footprint, peak_bytes=planned.predicted_peak_bytes)
            self.plans[index] = dataclasses.replace(planned, footprint=footprint)
            fit = planned.fit
            if fit is not None and compiled.predicted_peak_bytes > fit.budget_bytes:
                warnings.warn(f"graph {index}: Inductor compiled the fitted plan to a {compiled.predicted_peak_bytes}-"
                              f"byte peak, above its {fit.budget_bytes}-byte budget (the fit's probe predicted "
                              f"{fit.compiled_peak_bytes}): this torch's Inductor differs from the probe; use "
                              "fit=None", RuntimeWarning, stacklevel=2)
            elif fit is None and planned.predicted_peak_bytes > planned.plan.budget_bytes:
                warnings.warn(f"graph {index}: Inductor compiled the plan to a {planned.predicted_peak_bytes}-byte "
                              f"peak, above its {planned.plan.budget_bytes}-byte budget (extern kernels' workspace "
                              "or layout copies the unfused plan does not hold): pass fit='inductor', which "
                              "keeps only plans whose compiled peak fits", RuntimeWarning, stacklevel=2)

    def _eager(self, role: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs) -> Any:
            self.meter.keep_host_copies_apart(gm)
            return self.meter.wrap(boxed(gm), role)
        return compiler

    # ---------------------------------------------------------------- partition
    def partition(self, joint_module: torch.fx.GraphModule, joint_inputs, *, num_fwd_outputs: int,
                  static_lifetime_input_indices: list[int] | None = None, **_: Any):
        """The ``partition_fn``: plan ``joint_module`` and split it as the plan says."""
        with planning_errors():
            return self._partition(joint_module, joint_inputs, num_fwd_outputs,
                                   static_lifetime_input_indices or [])

    def _partition(self, joint_module: torch.fx.GraphModule, joint_inputs, num_fwd_outputs: int,
                   static_lifetime_input_indices: list[int]):
        self.reader.prepare(joint_module)
        compile_id = self._note_frame()
        frame = compile_id.split("/")[0]
        read = self.reader.read(joint_module, frame, num_fwd_outputs, static_lifetime_input_indices,
                                f"graph{len(self.plans)}")
        self.reader.frame_shapes[frame] = read.shapes  # what a recompile must cover
        self.plans = [p for p in self.plans if p.compile_id.split("/")[0] != frame]  # a recompile
        budget = self._graph_budget()
        if self._auto_budget is not None:  # split="auto" resolved a percentage against the unsplit graph
            budget = self._auto_budget
        if not self.settings.percent and budget <= 0:
            raise ValueError(f"the graphs before this one already hold {self.budget - budget} bytes of a "
                             f"{self.budget}-byte step budget: raise the budget or remove graph breaks")
        captured = CapturedStep(joint=types.SimpleNamespace(graph_module=joint_module), graph=read.graph,
                                value_of=read.value_of, num_fwd_outputs=read.num_fwd_outputs, param_names=(),
                                buffer_names=(), cost_model=read.graph.cost_model)
        loop = self.training_loop()
        planned = plan_joint(self.settings, captured, read.graph, budget, num_fwd_outputs,
                             static_lifetime_input_indices, joint_inputs, loop)
        plan, splits = planned.plan, self._graph_splits
        if splits is not None:  # said in the plan, as optimize() says what capture split
            plan = dataclasses.replace(plan, message="; ".join(filter(None, (plan.message, splits.describe()))))
        fw, bw = planned.partition(plan)
        fw.meta[_PLAN_KEY] = bw.meta[_PLAN_KEY] = compile_id  # Inductor's compile finds the plan by it
        self.plans.append(GraphPlan(
            index=len(self.plans), compile_id=compile_id,
            budget_bytes=budget, plan=plan, graph=read.graph,
            footprint=graph_footprint(read.graph, plan, joint_module, read.value_of, static_lifetime_input_indices),
            forward_graph=fw, backward_graph=bw, fit=planned.fit, splits=splits,
            held_bytes=loop.held_bytes(read.graph) if loop is not None else 0))
        return fw, bw

    def training_loop(self) -> TrainingLoop | None:
        """The loop the budget holds beside each graph (`solvers.planning.training_loop`), None
        without ``optimizer`` or ``grad_accumulation``. An optimizer instance counts the state of
        every parameter it trains; a description, of the parameters the graphs compiled so far
        read (a graph break before some of them: earlier graphs count less; pass the instance)."""
        request = self.request
        if request.optimizer is None and request.grad_accumulation == 1:
            return None
        parameters = (list(self._parameters.values()) if not isinstance(request.optimizer, torch.optim.Optimizer)
                      else [p for group in request.optimizer.param_groups for p in group["params"]])
        key = tuple(id(p) for p in parameters)
        if key not in self._loops:
            self._loops[key] = training_loop(parameters, request.optimizer, request.grad_accumulation)
        return self._loops[key]

    def _graph_budget(self, frame: str | None = None) -> int | str:
        """This graph's budget: the percentage, or what the step's bytes leave it after the
        graphs before it (`graph_budget`; ``frame``: leave out a recompiled frame's old plan)."""
        if self.settings.percent:
            return self.budget
        return graph_budget(self.budget, [p.footprint for p in self.plans if p.compile_id.split("/")[0] != frame])

    def _choose_split(self, gm: torch.fx.GraphModule, example_inputs: list, name: str,
                      compile_id) -> GraphSplits:
        """``split="auto"`` / ``split_mlp="auto"`` for one graph (`frontends.compile.auto_split`)."""
        frame = str(compile_id.frame_id) if compile_id is not None else str(len(self._frames))
        chosen = choose_split(gm, example_inputs, name, frame, self._graph_budget(frame), self.settings,
                              self._split_done, self.reader, f"graph{len(self.plans)}")
        self._auto_budget = chosen.budget_bytes
        return chosen.splits

    def _note_frame(self) -> str:
        """Dynamo's compile id ('frame/recompile') of the graph being planned; a new frame in
        the same step is a graph break, which ``fullgraph=True`` refuses."""
        compile_id = CompileContext.current_compile_id()
        frame = compile_id.frame_id if compile_id is not None else len(self._frames)
        if frame not in self._frames:
            self._frames.append(frame)
        if self.settings.fullgraph and len(self._frames) > 1:
            raise GraphBreakError(
                f"fullgraph=True but dynamo split the step into {len(self._frames)} graphs: find the "
                "breaks with optimizer.find_graph_breaks(model, *inputs)")
        return f"{frame}/{compile_id.frame_compile_id}" if compile_id is not None else f"{frame}/0"

    def partitioner(self) -> RematPartitioner:
        """This backend's planning as Inductor's partitioner, for the default backend:
        ``torch._inductor.config.custom_partitioner_fn = backend.partitioner()``. Refused with a
        split: the partitioner receives the joint graph, traced from the unsplit forward."""
        if self.settings.heads != (1,) or self.settings.mlps != (1,):
            raise ValueError("split and split_mlp rewrite the forward before AOTAutograd traces it, which "
                             "only the backend itself sees: use torch.compile(model, backend=backend)")
        if self.request.offload is not False:
            raise ValueError(OFFLOAD_NEEDS_EAGER)
        return RematPartitioner(self)

    # ------------------------------------------------------------------ reports
    def summary(self) -> StepBudgetSummary:
        """How the step's budget was shared by the graphs planned so far (see graph_budget), the
        compiled peak against it (Inductor's buffer plans), the recomputation the plans spend
        and what the Inductor fit tried."""
        fits = [p.fit for p in self.plans if p.fit is not None]
        return summarize(None if self.settings.percent else self.budget,
                         [p.graph_budget_bytes for p in self.plans],
                         [p.footprint for p in self.plans],
                         compiled=bool(self.plans) and all(p.compiled_peak is not None for p in self.plans),
                         extra_flops=sum(p.plan.extra_flops for p in self.plans),
                         extra_time_s=sum(p.plan.extra_time_s for p in self.plans),
                         fit_iterations=[len(p.fit.iterations) if p.fit else 0 for p in self.plans],
                         fit_probes=sum(f.probes for f in fits),
                         fit_seconds=sum(f.seconds for f in fits),
                         graph_strategies=[p.plan.solver for p in self.plans])

    @property
    def graph_breaks(self) -> int:
        """Distinct dynamo frames compiled, minus one (0: the step is one graph)."""
        return max(0, len(self._frames) - 1)


def _partitioner_base():
    try:
        return inductor_custom_partitioner_fn()  # Inductor, imported only on its path
    except ImportError:  # older torch: Inductor takes no custom partitioner
        return object


class RematPartitioner(_partitioner_base()):
    """Inductor's ``custom_partitioner_fn``: Inductor runs its joint-graph passes, then calls
    this with the joint graph; the backend plans it and records the plan."""

    def __init__(self, backend: RematBackend):
        self.backend = backend

    def __call__(self, gm, joint_inputs, **kwargs):
        kwargs.pop("compiler", None)
        return self.backend.partition(gm, joint_inputs, **kwargs)

    def uuid(self):
        """Inductor's cache key for this partitioner: the planning code and every setting a plan
        depends on, including what earlier graphs hold (the budget split)."""
        get_hash_for_files = inductor_get_hash_for_files()  # Inductor, imported only on its path
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # frontends/compile/
        files = sorted(path for package in ("frontends", "optimizer", "solvers")  # all of it: no list to go stale
                       for path in glob.glob(os.path.join(root, package, "**", "*.py"), recursive=True))
        b = self.backend
        settings = (b.settings, tuple(p.footprint for p in b.plans))
        return get_hash_for_files(tuple(files)).hex() + repr(settings)
