"""Plan one joint graph for the compile backend: at its budget, or fitted to Inductor's buffers.

Without a fit, the graph is planned at its budget (`solvers.planning.planner.plan_graph`). With
``fit="inductor"``, plans at larger planning budgets are probed with a trial Inductor compile that
stops at the buffer plan, and the cheapest whose compiled peak meets the budget is kept
(`frontends.compile.inductor_fit`); torch's min-cut partitions seed the search (`MIN_CUT_SEEDS`).
The result says which forward and backward graphs to compile for the chosen plan.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from frontends.capture.step import CapturedStep
from frontends.compile.backend_settings import CompileSettings
from frontends.compile.inductor_fit import InductorFit, fit_plan
from frontends.compile.inductor_memory import probe_compiled_peak
from frontends.compile.torch_partitioner import DEFAULT_FRACTIONS, partition_schedule
from frontends.compile.torch_partitioner import STRATEGY_NAME as TORCH_MIN_CUT
from frontends.graph_runtime.rewrite import partition_by_schedule
from frontends.torch_compat import TracingContext, unset_fake_temporarily
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import resolve_budget
from solvers.ir.graph import RematGraph
from solvers.ir.plan import Plan
from solvers.planning.planner import plan_from_schedule, plan_graph, store_all_peak_bytes
from solvers.planning.training_loop import TrainingLoop

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

Partition = Callable[[Plan], tuple[torch.fx.GraphModule, torch.fx.GraphModule]]


@dataclass(frozen=True)
class JointPlan:
    """The plan kept for a joint graph, the fit that chose it (None without a fit), and
    ``partition``: the forward and backward graphs to compile for a plan."""

    plan: Plan
    fit: InductorFit | None
    partition: Partition


def plan_joint(settings: CompileSettings, captured: CapturedStep, graph: RematGraph, budget: int | str,
               num_fwd_outputs: int, static_inputs: list[int], joint_inputs,
               loop: TrainingLoop | None = None) -> JointPlan:
    """Plan ``graph`` (the joint graph of ``captured``) at ``budget`` as ``settings`` say;
    ``loop``: the optimizer and accumulation the budget also holds (`plan_graph`; not with a fit)."""
    joint_module = captured.joint.graph_module
    request = settings.request
    graph_nodes = len(joint_module.graph.nodes)

    def plan_at(planning_budget: int | str) -> Plan:
        return plan_graph(graph, planning_budget, request.solver, request.solver_options,
                          graph_nodes=graph_nodes, allocator=request.allocator, loop=loop,
                          **request.offload_settings)

    torch_graphs: list[tuple[Plan, tuple]] = []  # seeds that are torch's partitions unchanged

    def partition(plan: Plan):
        for seed, graphs in torch_graphs:  # compile torch's own graphs (copies: Inductor mutates them)
            if seed is plan:
                with unset_fake_temporarily():  # as AOTAutograd copies
                    return tuple(copy.deepcopy(g) for g in graphs)
        return partition_by_schedule(captured, plan.schedule)(
            joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs)

    if settings.fit is None:
        return JointPlan(plan_at(budget), None, partition)
    target = resolve_budget(budget, store_all_peak_bytes(graph, AllocatorModel(block_bytes=1)))

    def min_cut_seeds():
        for fraction in MIN_CUT_SEEDS:
            found = partition_schedule(captured, fraction, static_inputs, keep_graphs=True)
            if found.schedule is not None:
                seed = plan_from_schedule(graph, found.schedule, target, allocator=request.allocator,
                                          solver=f"{TORCH_MIN_CUT} {found.label}", status="seed",
                                          graph_nodes=graph_nodes)
                yield seed
                if found.graphs is not None:  # probed next when the rewrite does not fit
                    own = dataclasses.replace(seed, solver=f"{seed.solver} {TORCH_GRAPHS}")
                    torch_graphs.append((own, found.graphs))
                    yield own

    plan, fit = fit_plan(target, plan_at, lambda p: _probe(partition(p), graph, num_fwd_outputs, static_inputs),
                         iterations=settings.fit_iterations, tolerance=settings.fit_tolerance,
                         seeds=min_cut_seeds, variant_of=lambda p: any(own is p for own, _ in torch_graphs))
    return JointPlan(plan, fit, partition)


def _probe(pair, graph: RematGraph, num_fwd_outputs: int, static_inputs: list[int]) -> int | None:
    """The compiled peak of a candidate forward/backward pair (`probe_compiled_peak`)."""
    context = TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    peak = probe_compiled_peak(*pair, graph.resident_bytes, num_fwd_outputs=num_fwd_outputs,
                               mutated_inputs=getattr(metadata, "num_mutated_inp_runtime_indices", 0) or 0,
                               static_input_idxs=static_inputs)
    return peak.predicted_peak_bytes if peak is not None else None
