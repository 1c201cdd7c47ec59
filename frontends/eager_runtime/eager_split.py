"""Token-chunked MLPs in the eager runtime (``apply_checkpointing(..., split_mlp=m)``): which of
the user's modules run in row chunks, and how the planning graph sees the chunks.

Why: the graph runtime splits an MLP inside the captured graph (`frontends.split.mlp_split`); the eager
runtime runs the user's own modules, so the split falls inside one module call. Its forward is
replaced (`frontends.eager_runtime.eager_checkpoint.ChunkedForward`) by the module's own forward on m chunks of
the flattened token rows, each under a non-reentrant checkpoint that keeps nothing, the outputs
concatenated: the wide intermediate lives one chunk at a time in forward and in backward.

Which modules: those whose whole forward is the chain the graph runtime splits
(`frontends.split.mlp_split`): linear -> pointwise -> linear (SwiGLU's product of two branches too),
no dropout inside. Found on one eager forward of the model (its ops per module,
`mlp_modules`), then checked on the chunked capture with the data flow (`chunk_labels`): in each
chunk only matmuls with a weight and pointwise ops, no random op, nothing but copies outside the
chunks. Chunking anything else (a block with attention, an MLP with a dropout after its down
projection) would change the function; such modules are left whole and named, and
`EagerSplitError` (an `MlpSplitError`) is raised where none is left.

How the plan sees it: the step is captured with the chunked forward in place (chunks without
their own checkpoint, `unchecked_chunks`), and each chunk's forward and backward values are
labelled with a pseudo-module below the MLP (`solvers.planning.eager_plan.chunk_path`), which
the planner treats as a region that is always checkpointed unless a region around it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import torch

from frontends.eager_runtime.eager_checkpoint import SplitPolicy
from frontends.eager_runtime.eager_ops import EagerTrace
from frontends.split.mlp_split import MlpSplitError
from solvers.ir.graph import NodeKind, Phase, RematGraph
from solvers.planning.eager_plan import chunk_path, within


class EagerSplitError(MlpSplitError):
    """``split_mlp`` was asked of the eager runtime and no MLP module can run in row chunks
    (an `MlpSplitError`, so the CLI names ``--split-mlp``); nothing was applied."""


_MATMULS = frozenset({"aten.mm.default", "aten.addmm.default"})
_POINTWISE = frozenset({
    "aten.gelu.default", "aten.silu.default", "aten.relu.default", "aten.tanh.default",
    "aten.sigmoid.default", "aten.neg.default", "aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor",
    "aten.div.Tensor", "aten.mul.Scalar", "aten.add.Scalar", "aten.sub.Scalar", "aten.div.Scalar",
    "aten.pow.Tensor_Scalar", "aten._to_copy.default"})
"""Ops that treat every element alone (the joint graph's names of `frontends.split.mlp_split`'s)."""
_COPIES = frozenset({"aten.clone.default", "aten._unsafe_view.default", "aten.view.default",
                     "aten.reshape.default", "aten._to_copy.default"})


_EAGER_MATMULS = frozenset({"aten.addmm.default", "aten.mm.default"})
_EAGER_ROWWISE = _EAGER_MATMULS | _POINTWISE | frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.t.default",
    "aten.clone.default", "aten.alias.default"})
"""Dispatcher-level ops an MLP's eager forward runs (``nn.Linear`` on CPU: ``view``, ``t``,
``addmm``/``mm``; activations; the products and sums of SwiGLU)."""
_EAGER_DROPOUT = frozenset({"aten.empty_like.default", "aten.div_.Scalar"})
"""What eager CPU dropout runs next to ``bernoulli_`` (see `frontends.eager_runtime.eager_ops`)."""


def _is_random(op: str) -> bool:
    return any(word in op for word in ("bernoulli", "dropout", "aten.rand", "normal_", "uniform_"))


def mlp_modules(model: torch.nn.Module, trace: EagerTrace,
                chunks: int) -> tuple[tuple[SplitPolicy, ...], tuple[str, ...]]:
    """The outermost modules (called once per step) whose eager forward is only matmuls and
    pointwise ops, two matmuls at least: linear -> activation -> linear, SwiGLU too; and the
    MLP-shaped ones left whole, with why (dropout inside). ``trace``: one eager forward of the
    unsplit model (`frontends.eager_runtime.eager_ops.trace_eager`). The data flow (each matmul's other operand
    a weight, the chunks only concatenated) is checked on the chunked capture (`chunk_labels`).
    Raises `EagerSplitError` when no module qualifies."""
    per_module: dict[str, list[str]] = {}
    for op, stack in trace.ops:
        for path in stack:
            per_module.setdefault(path, []).append(op)
    found, skipped = [], []
    for path, module in model.named_modules():
        ops = per_module.get(path, ())
        if not path or trace.calls.get(path) != 1 or sum(op in _EAGER_MATMULS for op in ops) < 2:
            continue
        random = [op for op in ops if _is_random(op)]
        rest = [op for op in ops if not _is_random(op) and not (random and op in _EAGER_DROPOUT)]
        if any(op not in _EAGER_ROWWISE for op in rest):
            continue
        if random:
            skipped.append((path, f"{path} ({random[0]}: dropout inside, its chunks would draw other masks "
                                  "than the unsplit step)"))
        else:
            found.append(path)
    outermost = [p for p in found if not any(within(p, q) for q in found if q != p)]
    skipped = [why for path, why in skipped if not any(within(path, q) for q in outermost)]
    if not outermost:
        detail = f" ({'; '.join(skipped)})" if skipped else ""
        raise EagerSplitError(
            f"split_mlp={chunks}: no module of the model runs only linear -> activation -> linear, so the "
            f"eager runtime has no MLP to run in row chunks{detail}; leave split_mlp at 1, or use optimize(), "
            "which splits such chains in the captured graph wherever they are")
    return tuple(SplitPolicy(p, chunks) for p in outermost), tuple(skipped)


@dataclasses.dataclass(frozen=True)
class ChunkLabels:
    """The chunks of the split MLPs as the planner sees them."""

    modules: dict[str, str]
    """Value -> its pseudo-module (`chunk_path` + the module below the MLP)."""
    chunks: tuple[str, ...]
    """Every chunk's `chunk_path`."""
    refused: dict[str, str]
    """MLP path -> why its forward cannot run in row chunks (left whole)."""


def chunk_labels(graph: RematGraph, gm: torch.fx.GraphModule, splits: Iterable[SplitPolicy],
                 calls: Mapping[str, int]) -> ChunkLabels:
    """Find each split MLP's chunks in the step captured with `ChunkedForward` in place, and
    check that its forward is per-row (see the module doc). ``calls``: module path -> forward
    calls per step (`frontends.eager_runtime.eager_ops.EagerTrace.calls`)."""
    seq = {n.name: n.meta.get("seq_nr") for n in gm.graph.nodes}
    forward = [n for n in graph.ops if n.phase is Phase.FORWARD]
    labels: dict[str, str] = {}
    paths: list[str] = []
    refused: dict[str, str] = {}
    for split in splits:
        path = split.path
        mine = [n for n in forward if within(n.module, path)]
        names = {n.name for n in mine}
        cats = [n for n in mine if n.op == "aten.cat.default" and n.module == path]
        if calls.get(path) != 1 or len(cats) != 1:
            refused[path] = f"{path} (called {calls.get(path, 0)} times per step: not one chunked call)"
            continue
        outs = [i for i in graph[cats[0].name].inputs if i in names]
        owner: dict[str, list[int]] = {}
        for index, out in enumerate(outs):
            stack, seen = [out], set()
            while stack:
                v = stack.pop()
                if v in seen or v not in names:
                    continue
                seen.add(v)
                owner.setdefault(v, []).append(index)
                stack.extend(graph[v].inputs)
        why = ""
        for node in mine:
            alone = len(owner.get(node.name, ())) == 1
            if node.random:
                why = f"{path} ({node.op} inside: its chunks would draw other random values than the unsplit step)"
            elif node is cats[0] or (not alone and node.op in _COPIES):
                continue
            elif not alone:
                why = f"{path} (its forward runs {node.op} outside the row chunks)"
            elif node.op in _MATMULS:
                if not any(graph[i].kind is NodeKind.PARAMETER for i in node.inputs):
                    why = f"{path} ({node.op} of two activations: rows do not stay apart)"
            elif node.op not in _POINTWISE and node.op not in _COPIES:
                why = f"{path} (its forward runs {node.op}, not only linear -> pointwise -> linear)"
            if why:
                break
        if len(outs) < 2 and not why:
            why = f"{path} (its forward is not the row chunks' concatenation)"
        if why:
            refused[path] = why
            continue
        chunk_seqs: dict[object, int] = {}
        for node in mine:
            if node.name in owner:
                index = owner[node.name][0]
                labels[node.name] = chunk_path(path, index) + node.module[len(path):]
                if seq.get(node.group or node.name) is not None:
                    chunk_seqs[seq[node.group or node.name]] = index
        for node in graph.ops:
            if node.phase is Phase.BACKWARD and within(node.module, path):
                index = chunk_seqs.get(seq.get(node.group or node.name))
                if index is not None:
                    labels[node.name] = chunk_path(path, index) + node.module[len(path):]
        paths.extend(chunk_path(path, i) for i in range(len(outs)))
    return ChunkLabels(labels, tuple(paths), refused)


def with_modules(graph: RematGraph, modules: Mapping[str, str]) -> RematGraph:
    """``graph`` with the module labels ``modules`` gives (value -> module)."""
    if not modules:
        return graph
    nodes = tuple(dataclasses.replace(n, module=modules[n.name]) if n.name in modules else n
                  for n in graph.nodes)
    return RematGraph(nodes, graph.forward_outputs, graph.user_outputs, graph.backward_outputs,
                      graph.cost_model, graph.name)
