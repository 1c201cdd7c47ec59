"""``split="auto"`` under torch.compile: choose each graph's row split by planning every candidate.

The plan is made inside AOTAutograd's partition function, for the joint graph of the forward it
is handed, so a candidate cannot be planned by the real compile. Each one is split on a copy of
dynamo's graph and traced by AOTAutograd up to its partition function (`trace_joint`: the probe
stops there, nothing compiles), and `solvers.planning.split_search.search_splits` (the search
``optimize(split="auto")`` runs) plans its `RematGraph` at the graph's budget, a percentage
resolved against the unsplit candidate's store-all peak. The graph is then split the chosen way
and compiled as with an explicit ``split=k``; its partition function plans again, at the bytes
the search resolved. Costs one AOTAutograd trace and plan per candidate (at most 7).

``split=None`` (the default) compiles each graph unsplit; only where its partition finds no
whole-tensor plan (`InfeasibleBudgetError`) does `split_when_infeasible` run the same candidates
through `solvers.planning.split_search.fallback_split` (the finest split probed first) at the
bytes that plan was refused, and the graph is compiled again, split.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from frontends.capture.step import CaptureError
from frontends.compile.backend_settings import CompileSettings
from frontends.compile.compile_split import GraphSplits, copy_graph_module, split_compiled_graph
from frontends.compile.dynamo_joint import JointReader
from frontends.graph_runtime.rewrite import RewriteError
from frontends.split.row_split import RowSplitError
from frontends.torch_compat import dynamo_aot_autograd, functorch_config
from solvers.base import InfeasibleBudgetError
from solvers.ir.graph import RematGraph
from solvers.ir.plan import Plan
from solvers.planning.planner import plan_graph
from solvers.planning.split_search import SplitChoice, fallback_split, search_splits


@dataclass(frozen=True)
class JointCandidate:
    """One candidate: the `RematGraph` of the joint graph AOTAutograd traced from dynamo's graph
    split that way (what `search_splits` plans)."""

    graph: RematGraph
    graph_nodes: int


@dataclass(frozen=True)
class SplitChosen:
    """How the graph was split, and the budget in bytes the search resolved (None: unsplit and
    unplanned, as a graph without a backward)."""

    splits: GraphSplits
    budget_bytes: int | None


class _NoBackward(RowSplitError):
    """A candidate graph needs no backward: AOTAutograd partitions nothing, so nothing is planned."""


class _JointTraced(Exception):  # noqa: N818  (a control-flow signal, not an error)
    """Raised by the probing partition function to carry the joint graph out of AOTAutograd."""

    def __init__(self, candidate: JointCandidate | None) -> None:
        super().__init__("joint graph traced")
        self.candidate = candidate


def choose_split(gm: torch.fx.GraphModule, example_inputs: list, name: str, frame: str, budget: int | str,
                 settings: CompileSettings, split_done: dict[str, bool], reader: JointReader,
                 graph_name: str) -> SplitChosen:
    """Split ``gm`` (``name`` in messages, ``graph_name`` for its `RematGraph`, of dynamo
    ``frame``, with ``budget``: bytes or a percentage) the way whose plan is cheapest and fits.
    ``split_done`` says whether an earlier graph was split that way (a later graph without the
    chain may then stay unsplit)."""
    if not settings.percent and budget <= 0:  # the real compile's partition says why
        return SplitChosen(split_compiled_graph(gm, example_inputs, 1, 1, name) or GraphSplits(), None)
    capture, plan = _candidates(gm, example_inputs, name, frame, settings, reader, graph_name,
                                head_required=len(settings.heads) > 1 or not split_done["head"],
                                mlp_required=len(settings.mlps) > 1 or not split_done["mlp"])
    try:
        choice = search_splits(capture, plan, budget, settings.heads, settings.mlps, settings.request.allocator,
                               refused=RowSplitError)
    except _NoBackward:  # compiled unsplit, unplanned, as any graph without a backward
        return SplitChosen(split_compiled_graph(gm, example_inputs, 1, 1, name) or GraphSplits(), None)
    return _split_as_chosen(gm, example_inputs, name, choice)


def split_when_infeasible(gm: torch.fx.GraphModule, example_inputs: list, name: str, frame: str,
                          unsplit_error: InfeasibleBudgetError, settings: CompileSettings, reader: JointReader,
                          graph_name: str) -> SplitChosen:
    """``split=None``: ``gm`` compiled unsplit raised ``unsplit_error`` (no whole-tensor plan
    fits its budget), so split it the cheapest way that fits those bytes
    (`solvers.planning.split_search.fallback_split`; the plan's message says so). A split that
    cannot be made (no chain, symbolic sizes, a re-trace torch.export refuses) is not tried;
    raises `SplitInfeasibleError` when no split fits either."""
    capture, plan = _candidates(gm, example_inputs, name, frame, settings, reader, graph_name,
                                head_required=True, mlp_required=True, unsplittable=CaptureError)
    choice = fallback_split(capture, plan, None, unsplit_error, settings.request.allocator, refused=RowSplitError)
    return _split_as_chosen(gm, example_inputs, name, choice)


def _candidates(gm: torch.fx.GraphModule, example_inputs: list, name: str, frame: str, settings: CompileSettings,
                reader: JointReader, graph_name: str, *, head_required: bool, mlp_required: bool,
                unsplittable: type[Exception] | tuple[type[Exception], ...] = ()):
    """(capture, plan) of the split candidates of ``gm`` for `search_splits`: each split on a
    copy of ``gm`` and traced by AOTAutograd up to its partition function; ``unsplittable``:
    errors that also mean this split cannot be made (a `RowSplitError`)."""
    request = settings.request

    def capture(k: int, m: int) -> JointCandidate:
        candidate = copy_graph_module(gm)
        try:
            split_compiled_graph(candidate, example_inputs, k, m, name, auto=True, head_required=head_required,
                                 mlp_required=mlp_required)
        except unsplittable as err:
            raise RowSplitError(str(err)) from err
        traced = trace_joint(candidate, example_inputs, frame, reader, graph_name)
        if traced is None:
            raise _NoBackward(f"{name} computes no gradient: nothing to plan")
        return traced

    def plan(candidate: JointCandidate, budget_bytes: int) -> Plan:
        return plan_graph(candidate.graph, budget_bytes, request.solver, request.solver_options,
                          graph_nodes=candidate.graph_nodes, allocator=request.allocator,
                          **request.offload_settings)

    return capture, plan


def _split_as_chosen(gm: torch.fx.GraphModule, example_inputs: list, name: str,
                     choice: SplitChoice[JointCandidate]) -> SplitChosen:
    """Split ``gm`` itself as the search chose (its candidate was a copy)."""
    k, m = choice.chunks
    splits = split_compiled_graph(gm, example_inputs, k, m, name, head_required=False,
                                  mlp_required=False) or GraphSplits()
    return SplitChosen(dataclasses.replace(splits, chosen=choice.note), choice.plan.budget_bytes)


def trace_joint(gm: torch.fx.GraphModule, example_inputs: list, frame: str, reader: JointReader,
                graph_name: str) -> JointCandidate | None:
    """AOTAutograd's joint graph of ``gm`` as a `RematGraph`, read by a partition function
    that stops the compile (None: ``gm`` needs no backward, so AOTAutograd partitions nothing)."""
    aot_autograd = dynamo_aot_autograd()  # dynamo, imported only when torch.compile runs

    def partition(joint_module, joint_inputs, *, num_fwd_outputs: int,
                  static_lifetime_input_indices: list[int] | None = None, **_: Any):
        reader.prepare(joint_module)
        read = reader.read(joint_module, frame, num_fwd_outputs, static_lifetime_input_indices or [], graph_name)
        raise _JointTraced(JointCandidate(read.graph, len(joint_module.graph.nodes)))

    def inference(*_: Any) -> Any:
        raise _JointTraced(None)

    try:
        with functorch_config.patch(enable_autograd_cache=False):  # a cache hit would skip the probe
            aot_autograd(fw_compiler=inference, bw_compiler=inference, partition_fn=partition)(gm, example_inputs)
    except _JointTraced as traced:
        return traced.candidate
    raise RewriteError("AOTAutograd compiled a split candidate without calling the partition function: "
                       "this torch version is not supported with split='auto'")
