"""Split the LM head + loss and the MLPs of a graph that dynamo hands `remat_backend`.

Why here: the split passes (`frontends.split.row_split`, `frontends.split.mlp_split`) rewrite an aten-level
forward *before* AOTAutograd traces the joint graph, so that AOTAutograd derives the chunked
backward. Under ``torch.compile`` the backend receives dynamo's torch-level graph (``linear``,
``cross_entropy`` as Python functions) and hands it to AOTAutograd itself; the joint graph the
partitioner sees is already decomposed (``mm``, ``_log_softmax``) and differentiated, too late
to chunk. So the backend re-traces dynamo's graph with torch.export (non-strict: the same
pre-dispatch aten graph ``capture()`` splits, with ``aten.linear`` and ``cross_entropy_loss``
intact), applies the passes exactly as capture does, and puts the split body back into
dynamo's GraphModule (`_adopt`). Dynamo's GraphModule keeps its placeholders and metadata
(``_dynamo_source``, ``dynamo_compile_id``, ``_param_name_to_source``), which AOTAutograd reads
to tell parameters from inputs (torch's "Assumption on Dynamo Metadata": a graph changed after
dynamo must keep them), so the compiled step is the same step, chunked.

Refused, never left unsplit silently: a chain the passes refuse (`RowSplitError`, as capture
raises it), symbolic sizes (the chunks are sized from concrete token rows: compile with
``dynamic=False``), and a graph with no chain to split unless an earlier graph of the step was
split that way. Each graph dynamo hands over is split on its own, and a graph break can leave
the MLPs, or the loss, in one graph only (transformers' GPT-2 breaks inside its loss function,
so its MLPs are in the first graph and its loss in the second): a later graph without a chain is
compiled unsplit and says so (`GraphSplits.unsplit`), the first one raises.

``split="auto"`` (and ``split_mlp="auto"``) is chosen per graph by `frontends.compile.auto_split`
with `solvers.planning.split_search` (the search ``optimize(split="auto")`` runs): each
candidate is split on a copy of dynamo's graph (`copy_graph_module`), and a graph without the
chain is compiled unsplit, its plan's message saying why.
"""

from __future__ import annotations

import copy
import operator
import warnings
from dataclasses import dataclass

import torch
from torch.fx.node import map_arg

from frontends.capture.export_passes import drop_identity_dropouts
from frontends.capture.step import CaptureError
from frontends.split.mlp_split import MlpSplitError, MlpSplits, split_mlps
from frontends.split.row_split import RowSplit, RowSplitError, find_heads, split_rows
from frontends.torch_compat import pytree
from solvers.planning.split_search import split_choices

_BREAK_HINT = ("under torch.compile each graph dynamo hands the backend is split on its own, and a graph "
               "break before the chain, or between the head and its loss, leaves the first graph without "
               "one: remove the break (see optimizer.find_graph_breaks) or split with optimize()")


@dataclass(frozen=True)
class GraphSplits:
    """What was split in one graph the backend compiled."""

    row_splits: tuple[RowSplit, ...] = ()
    """Head-and-loss chains split into row chunks (``split=k``)."""
    mlp_splits: MlpSplits = MlpSplits(())
    """MLP chains split into row chunks (``split_mlp=m``)."""
    unsplit: tuple[str, ...] = ()
    """What was asked for and not found in this graph (an earlier graph was split that way)."""
    chosen: str = ""
    """``split="auto"``: the chunk counts chosen for this graph and what each candidate cost."""

    @property
    def chunks(self) -> tuple[int, int]:
        """(head chunks, MLP chunks) this graph runs in (1: unsplit)."""
        return (self.row_splits[0].chunks if self.row_splits else 1), self.mlp_splits.chunks

    def describe(self) -> str:
        return "; ".join(filter(None, (*(s.describe() for s in self.row_splits), self.mlp_splits.describe(),
                                       *self.unsplit, self.chosen)))


def check_backend_chunks(chunks: object, name: str) -> int:
    """``chunks`` if a positive int; a ValueError before anything compiles."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"{name} must be None, 'auto' or a positive integer number of row chunks, "
                         f"got {chunks!r}")
    return chunks


def backend_split_choices(split: object, split_mlp: object) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(head counts, MLP counts) to plan, read as ``optimize`` reads them (`split_choices`)."""
    return split_choices(split, split_mlp, check_backend_chunks)


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of dynamo's ``gm`` to split and trace as one ``auto`` candidate: its own graph
    (node metadata shallow-copied), and dynamo's placeholder attributes and module metadata,
    which AOTAutograd reads to tell parameters from inputs."""
    copied = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    for ours, theirs in zip(gm.graph.find_nodes(op="placeholder"), copied.graph.find_nodes(op="placeholder")):
        for attr, value in vars(ours).items():  # dynamo's own attributes (``_dynamo_source``)
            if attr not in vars(theirs):
                setattr(theirs, attr, value)
    copied.meta = dict(gm.meta)
    if hasattr(gm, "_param_name_to_source"):
        copied._param_name_to_source = gm._param_name_to_source
    return copied


def split_compiled_graph(gm: torch.fx.GraphModule, example_inputs: list, rows: int, mlp: int,
                         graph_name: str = "the graph", *, head_required: bool = True,
                         mlp_required: bool = True, auto: bool = False) -> GraphSplits | None:
    """Rewrite dynamo's ``gm`` in place so it runs its head + loss in ``rows`` and its MLPs in
    ``mlp`` row chunks; None (``gm`` untouched) when both are 1. ``head_required`` /
    ``mlp_required``: a graph without such a chain is an error (True until an earlier graph of
    the step was split that way); else it stays unsplit and `GraphSplits.unsplit` says so.

    ``auto``: a candidate of ``split="auto"``, whose refusal the plan's message quotes (no
    advice on the explicit split).

    Raises `RowSplitError` (`MlpSplitError` for the MLPs) where a split cannot be made, and
    `frontends.capture.step.CaptureError` where torch.export cannot re-trace dynamo's graph.
    """
    if rows == 1 and mlp == 1:
        return None
    _refuse_symbolic_sizes(gm, example_inputs, graph_name)
    forward = _export(gm, example_inputs, graph_name)
    drop_identity_dropouts(forward)  # as capture(): a p=0 dropout inside an MLP is no random op
    unsplit = []
    try:
        mlps = split_mlps(forward, mlp)
    except MlpSplitError as err:
        if mlp_required:
            raise MlpSplitError(f"{graph_name}: {err}" + ("" if auto else f" ({_BREAK_HINT})")) from None
        mlps = MlpSplits(())
        unsplit.append(f"MLPs of {graph_name} not split, earlier graphs' were ({err})")
    heads: tuple[RowSplit, ...] = ()
    if rows > 1 and not find_heads(forward):
        if head_required and auto:
            raise RowSplitError(f"{graph_name} has no linear -> cross_entropy / nll_loss chain to split")
        if head_required:
            raise RowSplitError(f"split={rows}: {graph_name} has no linear -> cross_entropy / nll_loss chain "
                                f"to split ({_BREAK_HINT}); leave split at None")
        unsplit.append(f"{graph_name} has no LM head + loss to split (an earlier graph's was)")
    else:
        heads = split_rows(forward, rows)
    if heads or mlps.splits:
        _adopt(gm, forward)
    return GraphSplits(heads, mlps, tuple(unsplit))


def _refuse_symbolic_sizes(gm: torch.fx.GraphModule, example_inputs: list, graph_name: str) -> None:
    """The chunks are sized from concrete token rows; a graph dynamo compiled with symbolic
    sizes (``dynamic=True``, or automatic dynamic shapes at a frame's second size) has none."""
    values = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
    symbolic = any(not isinstance(x, torch.Tensor) for x in example_inputs) or any(
        isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor)
                                        and any(isinstance(d, torch.SymInt) for d in v.shape))
        for v in values)
    if symbolic:
        raise RowSplitError(f"{graph_name} has symbolic sizes, and a split sizes its chunks from concrete "
                            "token rows: compile with torch.compile(..., dynamic=False) (each new size "
                            "is then compiled, split and planned on its own)")


def _export(gm: torch.fx.GraphModule, example_inputs: list, graph_name: str) -> torch.fx.GraphModule:
    """Dynamo's graph as torch.export's aten-level forward (the graph capture() splits)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.export.export(gm, tuple(example_inputs), strict=False).module()
        except Exception as err:  # re-raised as one line: export's own text names the op
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CaptureError(f"a split under torch.compile re-traces {graph_name} with torch.export, "
                               f"which failed ({type(err).__name__}: {first}); compile without split, "
                               "or split with optimize()") from err


def _adopt(gm: torch.fx.GraphModule, forward: torch.fx.GraphModule) -> None:
    """Replace ``gm``'s body by ``forward``'s, keeping ``gm``'s placeholder nodes (dynamo's
    metadata lives on them) and returning the structure ``gm`` returned."""
    ours, theirs = gm.graph.find_nodes(op="placeholder"), forward.graph.find_nodes(op="placeholder")
    if len(ours) != len(theirs):
        raise CaptureError(f"torch.export re-traced dynamo's graph with {len(theirs)} inputs, not "
                           f"{len(ours)}: compile without split, or split with optimize()")
    graph = gm.graph
    for node in reversed(list(graph.nodes)):
        if node.op != "placeholder":
            graph.erase_node(node)
    env: dict[torch.fx.Node, torch.fx.Node] = dict(zip(theirs, ours))
    constants = 0
    for node in forward.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "call_module" and not node.users:  # export's input-guard check (_guards_fn)
            continue
        if node.op == "output":
            out_spec = forward.graph._codegen.pytree_info.out_spec
            flat = map_arg(node.args[0], env.__getitem__)
            graph.output(pytree.tree_unflatten(list(flat), out_spec) if out_spec is not None else flat)
            continue
        if node.op == "get_attr":  # a constant export lifted: the split body reads it from gm
            name = f"_remat_split_constant{constants}"
            constants += 1
            setattr(gm, name, operator.attrgetter(str(node.target))(forward))
            env[node] = graph.get_attr(name)
            env[node].meta = dict(node.meta)
            continue
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.lint()
    gm.recompile()
