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

Graph breaks give several graphs per step; `optimizer.planning.graph_budget` says how the step's budget is
shared and bounds the whole step's peak (`RematBackend.summary`). ``fullgraph=True`` refuses a
second graph, the exact mode. ``split=k`` / ``split_mlp=m`` chunk each graph's LM head + loss
and MLPs before AOTAutograd traces it (`frontends.compile.compile_split`). Every plan made is kept in
``backend.plans``. An error of remat-opt's
(a budget too small, a graph break under ``fullgraph``) reaches the caller as itself, not wrapped
in dynamo's ``BackendCompilerFailed`` (`frontends.compile.compile_errors`).
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import inspect
import os
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from frontends.capture.export_passes import untie_batch_norm_backward
from frontends.capture.step import CapturedStep, CaptureError, build_remat_graph
from frontends.capture.symbolic_sizes import SymbolSizes
from frontends.compile.compile_errors import own_error_to_raise, planning_errors
from frontends.compile.compile_split import (
    GraphSplits,
    backend_split_choices,
    copy_graph_module,
    split_compiled_graph,
)
from frontends.compile.compiled_memory import CompiledStepMeter
from frontends.compile.dynamo_joint import (
    forward_ops_first,
    graph_footprint,
    mark_parameters,
)
from frontends.compile.inductor_fit import FITS, InductorFit, fit_plan
from frontends.compile.inductor_memory import (
    CompiledPeak,
    WrapperMemoryPlan,
    predict_compiled_peak,
    probe_compiled_peak,
    recording_wrapper_plans,
)
from frontends.compile.torch_partitioner import DEFAULT_FRACTIONS, partition_schedule
from frontends.compile.torch_partitioner import STRATEGY_NAME as TORCH_MIN_CUT
from frontends.graph_runtime.remat_module import boxed
from frontends.graph_runtime.rewrite import RewriteError, partition_by_schedule
from frontends.measure.costs import CostModel, cost_model_from_name
from frontends.split.row_split import RowSplitError
from frontends.torch_compat import (
    CompileContext,
    TracingContext,
    dynamo_aot_autograd,
    dynamo_explain,
    functorch_config,
    fx_graph_cse,
    inductor_compile_fx,
    inductor_compile_fx_inner,
    inductor_custom_partitioner_fn,
    inductor_get_cpp_compiler,
    inductor_get_hash_for_files,
    unset_fake_temporarily,
)
from optimizer.ir.allocator import AllocatorModel
from optimizer.ir.budget import parse_bytes, resolve_budget
from optimizer.ir.graph import RematGraph
from optimizer.ir.plan import Plan
from optimizer.planning.graph_budget import (
    GraphFootprint,
    StepBudgetSummary,
    graph_budget,
    summarize,
)
from optimizer.planning.planner import plan_from_schedule, plan_graph, store_all_peak_bytes
from optimizer.planning.split_search import search_splits
from solvers import SOLVERS
from solvers.base import SolverOptions

COMPILERS = ("auto", "inductor", "eager")
_PLAN_KEY = "remat_opt_compile_id"
MIN_CUT_SEEDS = DEFAULT_FRACTIONS
"""``activation_memory_budget`` values (0 to 1 by 0.1) whose min-cut partitions seed
``fit="inductor"``: torch's partitioner prices fusible pointwise recomputation as free, which
the unfused solver cannot see; a seed is probed only when it costs less than the cheapest plan
known to compile within the budget. A seed is compiled as remat-opt's rewrite of its schedule;
when that does not fit and the seed is torch's partition unchanged, torch's own graphs are probed
next: torch may save a view (ViT's ``x[:, 0]``) where the rewrite saves its base, and Inductor
compiles that 240 B lower (the rewrite may instead be the cheaper: GPT at 0.1, +19.4% against
torch's +22.5% FLOPs, both at the same peak)."""
TORCH_GRAPHS = "(torch's graphs)"
"""Suffix of a seed plan's solver name when torch's own partition graphs are compiled."""


class GraphBreakError(RuntimeError):
    """``fullgraph=True`` and dynamo produced more than one graph for the step."""


@dataclass(frozen=True)
class _JointCandidate:
    """One ``split="auto"`` candidate: the `RematGraph` of the joint graph AOTAutograd traced
    from dynamo's graph split that way (what `search_splits` plans)."""

    graph: RematGraph
    graph_nodes: int


class _NoBackward(RowSplitError):
    """A ``split="auto"`` graph needs no backward: AOTAutograd partitions nothing, so nothing is planned."""


class _JointTraced(Exception):  # noqa: N818  (a control-flow signal, not an error)
    """Raised by the probing partition function to carry the joint graph out of AOTAutograd."""

    def __init__(self, candidate: _JointCandidate | None) -> None:
        super().__init__("joint graph traced")
        self.candidate = candidate


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

    @property
    def graph_budget_bytes(self) -> int:
        """This graph's budget in bytes (a percentage resolved; not the fit's planning budget)."""
        return self.fit.budget_bytes if self.fit else self.plan.budget_bytes

    @property
    def predicted_peak_bytes(self) -> int:
        """The peak of this graph's step as compiled: Inductor-aware when Inductor compiled it."""
        return self.compiled_peak.predicted_peak_bytes if self.compiled_peak else self.plan.predicted_peak_bytes


def inductor_available() -> bool:
    """Inductor's CPU code needs a C++ compiler; CUDA code needs Triton."""
    try:
        inductor_get_cpp_compiler()()  # Inductor, imported only on its path
        return True
    except (ImportError, RuntimeError, OSError):  # no compiler, or an Inductor that cannot load
        return False


class RematBackend:
    """The dynamo backend; see `remat_backend` for the arguments."""

    def __init__(self, budget: int | str, *, solver: str = "auto", time_limit: float = 60.0,
                 compiler: str = "auto", cost_model: str = "flops", fullgraph: bool = False,
                 threads: int = 1, allocator: AllocatorModel | None = None,
                 milp_engine: str = "auto", fit: str | None = None, fit_iterations: int = 4,
                 fit_tolerance: float = 0.02, split: int | str | None = None,
                 split_mlp: int | str | None = None):
        self._heads, self._mlps = backend_split_choices(split, split_mlp)
        """Chunk counts to plan for the head and the MLPs (several: ``auto``, see `_choose_split`)."""
        self._graph_splits: GraphSplits | None = None
        """What `_compile` split in the graph being compiled (its `_partition` records it)."""
        self._auto_budget: int | None = None
        """``auto``: the graph's budget in bytes its search resolved (a percentage is of the unsplit graph)."""
        self._split_done = {"head": False, "mlp": False}
        """Whether an earlier graph was split that way: a later graph without the chain may stay unsplit."""
        self.percent = isinstance(budget, str) and budget.strip().endswith("%")
        if self.percent:
            resolve_budget(budget, 1)  # a malformed budget fails here, not in the middle of a compile
        self.budget = budget if self.percent else parse_bytes(budget)
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}: choose one of {', '.join(SOLVERS)}")
        if compiler not in COMPILERS:
            raise ValueError(f"unknown compiler {compiler!r}: choose one of {', '.join(COMPILERS)}")
        if cost_model.strip().lower() == "profile":
            raise ValueError("cost_model='profile' needs the real model: use 'flops' or "
                             "'roofline:<device>' with torch.compile")
        cost_model_from_name(cost_model)
        if compiler == "auto":
            compiler = "inductor" if inductor_available() else "eager"
        if fit is not None:
            if fit not in FITS:
                raise ValueError(f"unknown fit {fit!r}: choose one of {', '.join(FITS)} or None")
            if compiler != "inductor":
                raise ValueError("fit='inductor' fits the plan to Inductor's buffer plan: it needs "
                                 "compiler='inductor' (and a C++ compiler for Inductor)")
            if allocator is not None:
                raise ValueError("fit='inductor' counts Inductor's buffers without an allocator model: "
                                 "pass allocator=None, or fit=None to plan with the allocator")
            if fit_iterations < 1:
                raise ValueError(f"fit_iterations must be at least 1, got {fit_iterations}")
            if not 0 <= fit_tolerance < 1:
                raise ValueError(f"fit_tolerance must be in [0, 1), got {fit_tolerance}")
        self.fit = fit
        self.fit_iterations = fit_iterations
        self.fit_tolerance = fit_tolerance
        self.compiler = compiler
        self.solver = solver
        self.options = SolverOptions(time_limit_s=time_limit, threads=threads, milp_engine=milp_engine)
        self.cost_model_name = cost_model
        self.fullgraph = fullgraph
        self.allocator = allocator
        self.plans: list[GraphPlan] = []
        self.graphs_received = 0
        self.meter = CompiledStepMeter()
        """Measures the compiled forward/backward's live bytes (eager compiler; see the module)."""
        self._frames: list[int] = []
        self._frame_shapes: dict[str, list[tuple[int, ...]]] = {}
        """Dynamo frame -> the input shapes its last graph was planned at (see `_at_least`)."""
        self.__name__ = f"remat_backend_{compiler}"

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
        with planning_errors():  # a split refused reaches the caller as itself
            if len(self._heads) > 1 or len(self._mlps) > 1:
                self._graph_splits = self._choose_split(gm, example_inputs, name, compile_id)
            else:
                self._graph_splits = split_compiled_graph(
                    gm, example_inputs, self._heads[0], self._mlps[0], name,
                    head_required=not self._split_done["head"], mlp_required=not self._split_done["mlp"])
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
            footprint = dataclasses.replace(planned.footprint, peak_bytes=compiled.predicted_peak_bytes)
            self.plans[index] = dataclasses.replace(planned, compiled_peak=compiled, footprint=footprint)
            fit = planned.fit
            if fit is not None and compiled.predicted_peak_bytes > fit.budget_bytes:
                warnings.warn(f"graph {index}: Inductor compiled the fitted plan to a {compiled.predicted_peak_bytes}-"
                              f"byte peak, above its {fit.budget_bytes}-byte budget (the fit's probe predicted "
                              f"{fit.compiled_peak_bytes}): this torch's Inductor differs from the probe; use "
                              "fit=None", RuntimeWarning, stacklevel=2)
            elif fit is None and compiled.predicted_peak_bytes > planned.plan.budget_bytes:
                warnings.warn(f"graph {index}: Inductor compiled the plan to a {compiled.predicted_peak_bytes}-byte "
                              f"peak, above its {planned.plan.budget_bytes}-byte budget (extern kernels' workspace "
                              "or layout copies the unfused plan does not hold): pass fit='inductor', which "
                              "keeps only plans whose compiled peak fits", RuntimeWarning, stacklevel=2)

    def _eager(self, role: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs) -> Any:
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
        cost_model = self._cost_model(joint_module)
        self._prepare_joint(joint_module)
        compile_id = self._note_frame()
        frame = compile_id.split("/")[0]
        graph, value_of, n_fwd, shapes = self._remat_graph(joint_module, cost_model, frame, num_fwd_outputs,
                                                           static_lifetime_input_indices)
        self._frame_shapes[frame] = shapes  # what a recompile must cover
        self.plans = [p for p in self.plans if p.compile_id.split("/")[0] != frame]  # a recompile
        budget = self._graph_budget()
        if self._auto_budget is not None:  # split="auto" resolved a percentage against the unsplit graph
            budget = self._auto_budget
        if not self.percent and budget <= 0:
            raise ValueError(f"the graphs before this one already hold {self.budget - budget} bytes of a "
                             f"{self.budget}-byte step budget: raise the budget or remove graph breaks")
        captured = CapturedStep(joint=types.SimpleNamespace(graph_module=joint_module), graph=graph,
                                value_of=value_of, num_fwd_outputs=n_fwd, param_names=(),
                                buffer_names=(), cost_model=cost_model)

        def plan_at(planning_budget: int | str) -> Plan:
            return plan_graph(graph, planning_budget, self.solver, self.options,
                              graph_nodes=len(joint_module.graph.nodes), allocator=self.allocator)

        torch_graphs: list[tuple[Plan, tuple]] = []  # seeds that are torch's partitions unchanged

        def split(plan: Plan):
            for seed, graphs in torch_graphs:  # compile torch's own graphs (copies: Inductor mutates them)
                if seed is plan:
                    with unset_fake_temporarily():  # as AOTAutograd copies
                        return tuple(copy.deepcopy(g) for g in graphs)
            return partition_by_schedule(captured, plan.schedule)(
                joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs)

        fit = None
        if self.fit is None:
            plan = plan_at(budget)
        else:
            target = resolve_budget(budget, store_all_peak_bytes(graph, AllocatorModel(block_bytes=1)))

            def min_cut_seeds():
                for fraction in MIN_CUT_SEEDS:
                    partition = partition_schedule(captured, fraction, static_lifetime_input_indices, keep_graphs=True)
                    if partition.schedule is not None:
                        seed = plan_from_schedule(graph, partition.schedule, target, allocator=self.allocator,
                                                  solver=f"{TORCH_MIN_CUT} {partition.label}", status="seed",
                                                  graph_nodes=len(joint_module.graph.nodes))
                        yield seed
                        if partition.graphs is not None:  # probed next when the rewrite does not fit
                            own = dataclasses.replace(seed, solver=f"{seed.solver} {TORCH_GRAPHS}")
                            torch_graphs.append((own, partition.graphs))
                            yield own

            plan, fit = fit_plan(target, plan_at, lambda p: self._probe(split(p), graph, num_fwd_outputs,
                                                                        static_lifetime_input_indices),
                                 iterations=self.fit_iterations, tolerance=self.fit_tolerance,
                                 seeds=min_cut_seeds,
                                 variant_of=lambda p: any(own is p for own, _ in torch_graphs))
        splits = self._graph_splits
        if splits is not None:  # said in the plan, as optimize() says what capture split
            plan = dataclasses.replace(plan, message="; ".join(filter(None, (plan.message, splits.describe()))))
        fw, bw = split(plan)
        fw.meta[_PLAN_KEY] = bw.meta[_PLAN_KEY] = compile_id  # Inductor's compile finds the plan by it
        self.plans.append(GraphPlan(
            index=len(self.plans), compile_id=compile_id,
            budget_bytes=budget, plan=plan, graph=graph,
            footprint=graph_footprint(graph, plan, joint_module, value_of, static_lifetime_input_indices or []),
            forward_graph=fw, backward_graph=bw, fit=fit, splits=splits))
        return fw, bw

    @staticmethod
    def _prepare_joint(joint_module: torch.fx.GraphModule) -> None:
        """What the joint graph gets before it is read: CSE, as torch's partitioners do first
        (one graph to plan and to seed from), and batch norm's backward untied, as capture() does."""
        if functorch_config.cse:
            joint_module.graph = fx_graph_cse(joint_module.graph)
            joint_module.recompile()
        untie_batch_norm_backward(joint_module)

    def _remat_graph(self, joint_module: torch.fx.GraphModule, cost_model: CostModel, frame: str,
                     num_fwd_outputs: int, static: list[int]):
        """The joint graph as a `RematGraph` to plan: (graph, value_of, forward outputs, the input
        shapes it was sized at)."""
        inputs = _tensor_inputs(joint_module)
        sizes = SymbolSizes(_at_least(inputs, self._frame_shapes.get(frame)))
        try:
            graph, value_of, n_fwd = build_remat_graph(joint_module, cost_model, f"graph{len(self.plans)}", sizes)
        except CaptureError as err:
            raise CaptureError(f"{err} (with torch.compile: pass dynamic=False)") from None
        if n_fwd != num_fwd_outputs:
            raise RewriteError(f"the joint graph's output descriptors name {n_fwd} forward outputs, "
                               f"AOTAutograd {num_fwd_outputs}: this torch version is not supported")
        graph = forward_ops_first(mark_parameters(graph, joint_module, static or []))
        return graph, value_of, n_fwd, [sizes.shape(t) for t in inputs]

    def _graph_budget(self, frame: str | None = None) -> int | str:
        """This graph's budget: the percentage, or what the step's bytes leave it after the
        graphs before it (`graph_budget`; ``frame``: leave out a recompiled frame's old plan)."""
        if self.percent:
            return self.budget
        return graph_budget(self.budget, [p.footprint for p in self.plans if p.compile_id.split("/")[0] != frame])

    # ------------------------------------------------------------ split="auto"
    def _choose_split(self, gm: torch.fx.GraphModule, example_inputs: list, name: str,
                      compile_id) -> GraphSplits:
        """``split="auto"`` / ``split_mlp="auto"`` for one graph: plan every candidate with the
        search ``optimize(split="auto")`` runs (`optimizer.planning.split_search`) and split
        ``gm`` the way whose plan is cheapest and fits.

        The plan is made inside AOTAutograd's partition function, for the joint graph of the
        forward it is handed, so a candidate cannot be planned by the real compile. Each one is
        split on a copy of ``gm`` and traced by AOTAutograd up to its partition function
        (`_trace_joint`: the probe stops there, nothing compiles), and `search_splits` plans its
        `RematGraph` at the graph's budget (a percentage resolved against the unsplit
        candidate's store-all peak, as optimize() does). ``gm`` is then split the chosen way and
        compiled as with an explicit ``split=k``; its partition function plans again, at the
        bytes the search resolved (the same joint graph with the eager compiler; with Inductor the
        joint graph after its joint-graph passes, and ``fit="inductor"`` then fits the chosen k).
        Costs one AOTAutograd trace and plan per candidate (at most 7) before the real compile.
        """
        frame = str(compile_id.frame_id) if compile_id is not None else str(len(self._frames))
        budget = self._graph_budget(frame)
        if not self.percent and budget <= 0:  # the real compile's partition says why
            return split_compiled_graph(gm, example_inputs, 1, 1, name) or GraphSplits()

        def capture(k: int, m: int) -> _JointCandidate:
            candidate = copy_graph_module(gm)
            split_compiled_graph(candidate, example_inputs, k, m, name, auto=True,
                                 head_required=len(self._heads) > 1 or not self._split_done["head"],
                                 mlp_required=len(self._mlps) > 1 or not self._split_done["mlp"])
            traced = self._trace_joint(candidate, example_inputs, frame)
            if traced is None:
                raise _NoBackward(f"{name} computes no gradient: nothing to plan")
            return traced

        def plan(candidate: _JointCandidate, budget_bytes: int) -> Plan:
            return plan_graph(candidate.graph, budget_bytes, self.solver, self.options,
                              graph_nodes=candidate.graph_nodes, allocator=self.allocator)

        try:
            choice = search_splits(capture, plan, budget, self._heads, self._mlps, self.allocator,
                                   refused=RowSplitError)
        except _NoBackward:  # compiled unsplit, unplanned, as any graph without a backward
            return split_compiled_graph(gm, example_inputs, 1, 1, name) or GraphSplits()
        k, m = choice.chunks
        splits = split_compiled_graph(gm, example_inputs, k, m, name, head_required=False,
                                      mlp_required=False) or GraphSplits()
        self._auto_budget = choice.plan.budget_bytes
        return dataclasses.replace(splits, chosen=choice.note)

    def _trace_joint(self, gm: torch.fx.GraphModule, example_inputs: list, frame: str) -> _JointCandidate | None:
        """AOTAutograd's joint graph of ``gm`` as a `RematGraph`, read by a partition function
        that stops the compile (None: ``gm`` needs no backward, so AOTAutograd partitions nothing)."""
        aot_autograd = dynamo_aot_autograd()  # dynamo, imported only when torch.compile runs

        def partition(joint_module, joint_inputs, *, num_fwd_outputs: int,
                      static_lifetime_input_indices: list[int] | None = None, **_: Any):
            cost_model = self._cost_model(joint_module)
            self._prepare_joint(joint_module)
            graph = self._remat_graph(joint_module, cost_model, frame, num_fwd_outputs,
                                      static_lifetime_input_indices or [])[0]
            raise _JointTraced(_JointCandidate(graph, len(joint_module.graph.nodes)))

        def inference(*_: Any) -> Any:
            raise _JointTraced(None)

        try:
            with functorch_config.patch(enable_autograd_cache=False):  # a cache hit would skip the probe
                aot_autograd(fw_compiler=inference, bw_compiler=inference, partition_fn=partition)(gm, example_inputs)
        except _JointTraced as traced:
            return traced.candidate
        raise RewriteError("AOTAutograd compiled a split candidate without calling the partition function: "
                           "this torch version is not supported with split='auto'")

    @staticmethod
    def _probe(pair, graph: RematGraph, num_fwd_outputs: int, static_inputs: list[int]) -> int | None:
        """The compiled peak of a candidate forward/backward pair (`probe_compiled_peak`)."""
        context = TracingContext.try_get()
        metadata = getattr(context, "fw_metadata", None)
        peak = probe_compiled_peak(*pair, graph.resident_bytes, num_fwd_outputs=num_fwd_outputs,
                                   mutated_inputs=getattr(metadata, "num_mutated_inp_runtime_indices", 0) or 0,
                                   static_input_idxs=static_inputs)
        return peak.predicted_peak_bytes if peak is not None else None

    def _note_frame(self) -> str:
        """Dynamo's compile id ('frame/recompile') of the graph being planned; a new frame in
        the same step is a graph break, which ``fullgraph=True`` refuses."""
        compile_id = CompileContext.current_compile_id()
        frame = compile_id.frame_id if compile_id is not None else len(self._frames)
        if frame not in self._frames:
            self._frames.append(frame)
        if self.fullgraph and len(self._frames) > 1:
            raise GraphBreakError(
                f"fullgraph=True but dynamo split the step into {len(self._frames)} graphs: find the "
                "breaks with optimizer.find_graph_breaks(model, *inputs)")
        return f"{frame}/{compile_id.frame_compile_id}" if compile_id is not None else f"{frame}/0"

    def partitioner(self) -> RematPartitioner:
        """This backend's planning as Inductor's partitioner, for the default backend:
        ``torch._inductor.config.custom_partitioner_fn = backend.partitioner()``. Refused with a
        split: the partitioner receives the joint graph, traced from the unsplit forward."""
        if self._heads != (1,) or self._mlps != (1,):
            raise ValueError("split and split_mlp rewrite the forward before AOTAutograd traces it, which "
                             "only the backend itself sees: use torch.compile(model, backend=backend)")
        return RematPartitioner(self)

    def _cost_model(self, gm: torch.fx.GraphModule) -> CostModel:
        dtypes = [n.meta["val"].dtype for n in gm.graph.find_nodes(op="placeholder")
                  if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point()]
        dtype = max(set(dtypes), key=dtypes.count) if dtypes else torch.float32
        return cost_model_from_name(self.cost_model_name, dtype=dtype)

    # ------------------------------------------------------------------ reports
    def summary(self) -> StepBudgetSummary:
        """How the step's budget was shared by the graphs planned so far (see graph_budget), the
        compiled peak against it (Inductor's buffer plans), the recomputation the plans spend
        and what the Inductor fit tried."""
        fits = [p.fit for p in self.plans if p.fit is not None]
        return summarize(None if self.percent else self.budget,
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


@dataclass(frozen=True)
class GraphBreakReport:
    """Where dynamo splits a step, found by dynamo's own ``explain`` (nothing is planned)."""

    graphs: int
    graph_breaks: int
    reasons: tuple[str, ...]
    """Each break's reason and the user line that caused it."""


def find_graph_breaks(model: torch.nn.Module, *args: Any, **kwargs: Any) -> GraphBreakReport:
    """Run ``torch._dynamo.explain`` on ``model(*args, **kwargs)`` and summarise the breaks."""
    explained = dynamo_explain()(model)(*args, **kwargs)
    reasons = []
    for reason in explained.break_reasons:
        frames = [f for f in reason.user_stack or [] if "site-packages" not in f.filename]
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        reasons.append(f"{str(reason.reason).strip().splitlines()[0]}{where}")
    return GraphBreakReport(graphs=explained.graph_count, graph_breaks=explained.graph_break_count,
                            reasons=tuple(reasons))


def _tensor_inputs(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The joint graph's tensor placeholders' values, in order (sizes are separate placeholders)."""
    return [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")
            if isinstance(n.meta.get("val"), torch.Tensor)]


def _at_least(inputs: list[torch.Tensor], planned: list[tuple[int, ...]] | None) -> dict:
    """Sizes a recompile with symbolic dimensions must be planned for: dynamo recompiles a frame
    with symbols at the *second* size it sees, so each symbol is planned at no less than what
    the frame's earlier graph was planned at in that place (the first, often larger, size)."""
    if not planned or len(planned) != len(inputs):
        return {}
    at_least: dict = {}
    for t, shape in zip(inputs, planned):
        if len(shape) != t.dim():
            return {}
        for dim, size in zip(t.shape, shape):
            if isinstance(dim, torch.SymInt) and len(dim.node.expr.free_symbols) == 1 and dim.node.expr.is_symbol:
                at_least[dim.node.expr] = max(size, at_least.get(dim.node.expr, 0))
    return at_least


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
        settings = (b.budget, b.solver, b.options, b.cost_model_name, b.allocator,
                    b.fit, b.fit_iterations, b.fit_tolerance, tuple(p.footprint for p in b.plans))
        return get_hash_for_files(tuple(files)).hex() + repr(settings)


def remat_backend(budget: int | str, *, solver: str = "auto", time_limit: float = 60.0,
                  compiler: str = "auto", cost_model: str = "flops", fullgraph: bool = False,
                  threads: int = 1, allocator: AllocatorModel | None = None,
                  milp_engine: str = "auto", fit: str | None = None, fit_iterations: int = 4,
                  fit_tolerance: float = 0.02, split: int | str | None = None,
                  split_mlp: int | str | None = None) -> RematBackend:
    """A backend for ``torch.compile(model, backend=remat_backend(budget="60%"))``.

    ``budget``: bytes of the whole training step as in `optimizer.optimize` (parameters,
    gradients, inputs, activations), or a percentage, which applies to each graph's own
    plain-autograd peak. ``compiler``: ``inductor`` (the default when a C++ compiler is
    present), ``eager`` (fx code; what `backend.meter` measures) or ``auto``. ``fullgraph``:
    refuse graph breaks (the exact mode). ``fit="inductor"``: re-plan each graph (at most
    ``fit_iterations`` plans, each probed by a trial Inductor compile that stops at the buffer
    plan) until its compiled peak is within ``fit_tolerance`` under its budget, keeping the
    cheapest plan that fits (`frontends.compile.inductor_fit`). ``backend.plans`` lists the plans made;
    ``backend.summary()`` says how the budget was split across graph breaks, the compiled peak,
    the budget left unused, the recomputation bought and the fit iterations. ``split=k`` /
    ``split_mlp=m``: run each graph's LM head + loss / MLPs in k / m chunks of token rows, split
    on the graph dynamo hands over before AOTAutograd traces it (`frontends.compile.compile_split`;
    ``backend.plans[i].splits`` says what was split); a chain the split refuses, or a graph with
    no such chain before any graph was split that way, raises `frontends.split.row_split.RowSplitError`.
    ``split="auto"`` (``split_mlp="auto"``): each graph plans k = 1, 2, 4, 8 (then m = 2, 4, 8)
    and is split the way whose plan is cheapest and fits, as ``optimize(split="auto")`` chooses;
    a graph with no chain is compiled unsplit, and the plan's message names the choice.
    """
    return RematBackend(budget, solver=solver, time_limit=time_limit, compiler=compiler,
                        cost_model=cost_model, fullgraph=fullgraph, threads=threads,
                        allocator=allocator, milp_engine=milp_engine, fit=fit,
                        fit_iterations=fit_iterations, fit_tolerance=fit_tolerance, split=split,
                        split_mlp=split_mlp)
