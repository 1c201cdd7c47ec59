"""Split each transformer MLP into chunks of token rows before the joint graph is built.

Why: the MLP's intermediate (4x the model width, or two such branches in SwiGLU) is the largest
activation of a long-sequence block, and a whole-tensor schedule can only keep or recompute it
whole. Mini-Sequence Transformer (MsT) runs the MLP on mini-sequences by hand; this pass does it
on the exported forward, so AOTAutograd derives the chunked backward (the weight gradients
accumulate over the chunks) and the solver can recompute one chunk's intermediate at a time.

The chain: a linear (``aten.linear``, or transformers' ``Conv1D`` as exported: ``view -> addmm ->
view``), one or more, all reading the same input ``x`` (SwiGLU's gate and up projections) ->
pointwise ops on their outputs only (gelu, silu, relu, tanh, sigmoid, scalar arithmetic, and a
product or sum of two such branches as in ``silu(gate(x)) * up(x)``) -> a linear (the down
projection), every value with the token rows of ``x``. It becomes, per chunk of ``x``'s
flattened rows, the same linears and pointwise ops on the chunk, then the chunks' outputs
concatenated back into the down projection's whole output. Same function, same matmuls in
chunks: only the order in which weight-gradient terms are summed moves.

Skipped, and said so: a chain whose intermediate is read outside it (returned, or used twice), or
one with dropout inside (its chunks would draw other masks than the unsplit step: not the same
function). `MlpSplitError` (a `RowSplitError`) where a split is asked for and no MLP can be split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from frontends.split.row_split import (
    Emitter,
    RowSplitError,
    check_chunks,
    chunk_sizes,
    module_path,
    stable_topological_order,
)

aten = torch.ops.aten

_LINEAR = aten.linear.default
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_POINTWISE = {
    aten.gelu.default, aten.silu.default, aten.relu.default, aten.tanh.default, aten.sigmoid.default,
    aten.neg.default, aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor,
    aten.mul.Scalar, aten.add.Scalar, aten.sub.Scalar, aten.div.Scalar, aten.pow.Tensor_Scalar,
}
"""Ops that treat every element alone; their tensor operands must be in the chain (same rows)."""
_RANDOM = {aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default,
           aten.feature_alpha_dropout.default, aten.bernoulli.default, aten.bernoulli.p, aten.rand_like.default}


class MlpSplitError(RowSplitError):
    """An MLP split was asked for and no MLP could be split (a `RowSplitError`, so code that
    catches those catches it; its own type lets the CLI name ``--split-mlp``)."""


@dataclass(frozen=True)
class MlpSplit:
    """One MLP chain split into row chunks."""

    module: str
    """Module path of the MLP (the common prefix of its linears': ``blocks.0.mlp``; ``gate+up+down``
    when they share none)."""
    linears: tuple[str, ...]
    """fx names of its linears in the exported forward, the down projection last."""
    rows: int
    """Flattened token rows (batch x sequence)."""
    width: int
    """Features of the widest intermediate."""
    chunks: int
    intermediate_bytes: int
    """Bytes of the widest intermediate, whole."""
    chunk_bytes: int
    """Bytes of its largest chunk."""


@dataclass(frozen=True)
class MlpSplits:
    """What `split_mlps` did: the chains it split and the ones it skipped, with why."""

    splits: tuple[MlpSplit, ...]
    skipped: tuple[str, ...] = ()

    @property
    def chunks(self) -> int:
        return self.splits[0].chunks if self.splits else 1

    def describe(self) -> str:
        if not self.splits:
            return ""
        first = self.splits[0]
        names = ", ".join(s.module for s in self.splits[:3])
        more = f" and {len(self.splits) - 3} more" if len(self.splits) > 3 else ""
        text = (f"split {len(self.splits)} MLP{'s' if len(self.splits) > 1 else ''} ({names}{more}) into "
                f"{first.chunks} row chunks ({first.rows} x {first.width} intermediate: "
                f"{first.intermediate_bytes / 1e6:.1f} MB whole, {first.chunk_bytes / 1e6:.1f} MB per chunk)")
        return text + (f"; not split: {'; '.join(self.skipped)}" if self.skipped else "")


@dataclass(frozen=True)
class _Linear:
    """A linear layer of the exported forward: ``aten.linear(x, weight, bias)``, or ``Conv1D``'s
    ``view(addmm(bias, view(x, [rows, d]), weight), [*lead, out])``."""

    out: torch.fx.Node
    """Its output, with ``x``'s leading dimensions."""
    x: torch.fx.Node
    operands: tuple
    """``(weight, bias)`` as ``aten.linear`` takes them, or ``(bias, weight)`` for ``addmm``."""
    inner: tuple[torch.fx.Node, ...] = ()
    """``(addmm, the 2-D view of x)`` of the Conv1D form: erased with ``out``."""

    def on_rows(self, emit: Emitter, rows: torch.fx.Node) -> torch.fx.Node:
        """The same layer on ``rows`` (a [chunk, d] piece of ``x``)."""
        if not self.inner:
            return emit(_LINEAR, (rows, *self.operands), dict(self.out.kwargs), like=self.out)
        bias, weight = self.operands
        return emit(aten.addmm.default, (bias, rows, weight), like=self.inner[0])

    @property
    def nodes(self) -> tuple[torch.fx.Node, ...]:
        return (self.out, *self.inner)


def _as_linear(node: object) -> _Linear | None:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    if node.target is _LINEAR:
        return _Linear(node, node.args[0], tuple(node.args[1:]))
    mm = node.args[0] if node.target in _VIEWS else None
    if not (isinstance(mm, torch.fx.Node) and mm.target is aten.addmm.default and not mm.kwargs
            and len(mm.users) == 1):
        return None
    flat = mm.args[1]
    if not (isinstance(flat, torch.fx.Node) and flat.op == "call_function" and flat.target in _VIEWS
            and len(flat.users) == 1 and isinstance(flat.args[0], torch.fx.Node)):
        return None
    x = flat.args[0]
    x_shape, out_shape = tuple(x.meta["val"].shape), tuple(node.meta["val"].shape)
    if (tuple(flat.meta["val"].shape) != (math.prod(x_shape[:-1]), x_shape[-1])
            or out_shape[:-1] != x_shape[:-1]):
        return None
    return _Linear(node, x, (mm.args[0], mm.args[2]), (mm, flat))


@dataclass(frozen=True)
class _Chain:
    inputs: tuple[_Linear, ...]
    """The linears reading ``x``, in graph order."""
    pointwise: tuple[torch.fx.Node, ...]
    """The ops between them and ``down``, in graph order."""
    down: _Linear


def split_mlps(gm: torch.fx.GraphModule, chunks: int) -> MlpSplits:
    """Rewrite every MLP chain of ``gm`` into ``chunks`` row chunks; 1 changes nothing.

    Raises `RowSplitError` when ``chunks > 1`` and no chain could be split (the message says why).
    """
    if check_chunks(chunks, "split_mlp") == 1:
        return MlpSplits(())
    splits, skipped = [], []
    for node in list(gm.graph.nodes):
        down = None if getattr(node, "_erased", False) else _as_linear(node)
        if down is None:
            continue
        chain, why = _find_chain(down, chunks)
        if why:
            skipped.append(why)
        if chain is not None:
            splits.append(_split(gm, chain, chunks))
    if not splits:
        detail = f" ({'; '.join(skipped)})" if skipped else ""
        raise MlpSplitError(f"split_mlp={chunks}: no linear -> activation -> linear chain in the model's "
                            f"forward could be split into row chunks{detail}; leave split_mlp at 1")
    stable_topological_order(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return MlpSplits(tuple(splits), tuple(skipped))


def _find_chain(down: _Linear, chunks: int) -> tuple[_Chain | None, str]:
    """The MLP chain ending at ``down`` (None when it is not one), and why a chain is skipped."""
    first = down.x
    if not isinstance(first, torch.fx.Node) or first.op != "call_function" or _as_linear(first) is not None:
        return None, ""  # linear -> linear is no MLP
    region, inputs, stack, random = set(), {}, [first], None
    while stack:
        node = stack.pop()
        if node in region or node in inputs:
            continue
        linear = _as_linear(node)
        if linear is not None:
            inputs[node] = linear
            continue
        if node.op == "call_function" and node.target in _RANDOM:
            random = node
        elif node.op != "call_function" or node.target not in _POINTWISE:
            return None, ""  # not pointwise (attention, a norm, a residual): no MLP
        region.add(node)
        stack.extend(node.all_input_nodes)
    name = _name(down, sorted(inputs.values(), key=lambda lin: lin.out.name))
    xs = {lin.x for lin in inputs.values()}
    if not inputs or len(xs) != 1:
        return None, ""
    (x,) = xs
    lead = tuple(x.meta["val"].shape[:-1])
    if random is not None:
        return None, (f"{name} ({random.target} inside: its chunks would draw other random values than "
                      "the unsplit step)")
    if any(tuple(n.meta["val"].shape[:-1]) != lead for n in (*inputs, *region, down.out)):
        return None, f"{name} (an op changes its token rows)"
    if math.prod(lead) < chunks or not lead:
        return None, f"{name} ({math.prod(lead)} token rows cannot make {chunks} chunks)"
    readers = region | set(inputs) | set(down.nodes)
    for node in region | set(inputs):
        if any(user not in readers for user in node.users):
            return None, f"{name} (its intermediate {node.name} is also read outside the MLP)"
    order = {n: i for i, n in enumerate(down.out.graph.nodes)}
    return _Chain(tuple(sorted(inputs.values(), key=lambda lin: order[lin.out])),
                  tuple(sorted(region, key=order.get)), down), ""


def _name(down: _Linear, inputs) -> str:
    """The MLP's module path, or its linears' (``gate+up+down``) when they share no parent."""
    outs = [lin.out for lin in (*inputs, down)]
    return _common_module(*outs) or "+".join(module_path(n) or n.name for n in outs)


def _common_module(*nodes: torch.fx.Node) -> str:
    paths = [module_path(n).split(".") for n in nodes if module_path(n)]
    if not paths:
        return ""
    common = []
    for parts in zip(*paths):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def _split(gm: torch.fx.GraphModule, chain: _Chain, chunks: int) -> MlpSplit:
    """Emit the chain once per row chunk of ``x`` (one chunk after the other), concatenate the
    down projections' chunks into its whole output, rewire its uses, drop the original."""
    graph, down = gm.graph, chain.down
    x = chain.inputs[0].x
    x_val = x.meta["val"]
    rows = math.prod(x_val.shape[:-1])
    sizes = chunk_sizes(rows, chunks)
    emit, name = Emitter(gm, down.out), _name(down, chain.inputs)
    with graph.inserting_before(graph.find_nodes(op="output")[0]):
        x_chunks = emit.split(emit(aten.reshape.default, (x, [rows, x_val.shape[-1]]), like=chain.inputs[0].out),
                              sizes)
        outs = []
        for x_i in x_chunks:
            chunk_of = {lin.out: lin.on_rows(emit, x_i) for lin in chain.inputs}
            for node in chain.pointwise:
                args = torch.fx.node.map_arg(node.args, lambda n: chunk_of.get(n, n))
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: chunk_of.get(n, n))
                chunk_of[node] = emit(node.target, args, kwargs, like=node)
            outs.append(down.on_rows(emit, chunk_of[down.x]))
        whole = emit(aten.view.default, (emit(aten.cat.default, (outs, 0), like=down.out),
                                         list(down.out.meta["val"].shape)), like=down.out)
    down.out.replace_all_uses_with(whole)
    for node in (*down.nodes, *reversed(chain.pointwise), *(n for lin in reversed(chain.inputs) for n in lin.nodes)):
        graph.erase_node(node)
    widest = max((*(lin.out for lin in chain.inputs), *chain.pointwise), key=lambda n: n.meta["val"].shape[-1])
    width, item = widest.meta["val"].shape[-1], widest.meta["val"].element_size()
    return MlpSplit(name, tuple(lin.out.name for lin in (*chain.inputs, down)),
                    rows, width, chunks, rows * width * item, max(sizes) * width * item)
