"""Split a language-model head and its loss into row chunks before the joint graph is built.

Why: every whole-tensor schedule of a language model holds the whole logits (tokens x vocab),
their log-softmax and their gradient at the loss's backward, so the LM head and loss set the
smallest feasible budget. Chunked linear + cross-entropy (Liger's fused linear cross-entropy,
Cut Cross-Entropy, Mini-Sequence Transformer) breaks that floor by hand; this pass does it on
the exported forward graph, so AOTAutograd derives the chunked backward and the solver sees k
smaller logits values it can keep or recompute chunk by chunk.

The chain: ``aten.linear`` (the head) -> ops that act on each row alone (views that only merge
leading dimensions, dtype casts, ``log_softmax``/``softmax`` over the last dimension, a scalar
scale, ``tanh``) -> ``cross_entropy_loss`` / ``nll_loss`` with reduction ``sum`` or ``mean``.
It becomes, per chunk of the flattened token rows, linear -> row ops -> the loss with reduction
``sum``, then the sum of the chunks; ``mean`` divides that by the count of non-ignored targets
(their summed class weights when the loss has ``weight``), which is how aten normalizes, with or
without label smoothing. Same function, same matmuls in chunks; only the summation order moves.

Outputs stay whole: a row value the model returns (its logits) is rebuilt by concatenating
the chunks, so the caller still gets every logit, at the price of one whole logits tensor (and,
at the concatenation, the chunks with it); the loss's log-softmax and its gradient are chunked
either way. A model that returns only its loss gains the most (see `RowSplit.whole_outputs`);
``outputs="loss"`` (`frontends.capture.output_selection`) drops the returned logits for a caller that
reads only the loss.

Refused with `RowSplitError`, never left unsplit silently: a head whose logits also feed an op
that mixes rows (a normalization over tokens, a reshape across rows, a second operand), a loss
with ``reduction='none'`` (its later reduction is not followed), or a split asked for where no
chain exists. The token-chunked MLP (linear -> activation -> linear) is `frontends.split.mlp_split`.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
from torch.fx.node import map_arg

from frontends.torch_compat import detect_fake_mode

aten = torch.ops.aten

SUM, MEAN = 2, 1
"""aten's reduction codes (``none`` is 0)."""

_LINEARS = {aten.linear.default}
_SAME_ROWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default,
              aten.contiguous.default, aten.clone.default, aten.alias.default}
"""Ops whose chunk is its input's chunk: the [rows, width] chunk already has their layout."""
_NORMALIZERS = {aten.log_softmax.int, aten.softmax.int}
_REPLAYED = {aten.to.dtype, aten._to_copy.default, aten.detach.default, aten.tanh.default,
             aten.mul.Tensor, aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar} | _NORMALIZERS
"""Row-wise ops run again on each chunk (other arguments must be constants)."""
_LOSSES = {aten.cross_entropy_loss.default, aten.nll_loss_nd.default, aten.nll_loss.default}
_IGNORED = {aten._assert_tensor_metadata.default}
"""Users of a row value that compute nothing (export's dtype asserts): dropped with it."""
_LOSS_DEFAULTS = (None, MEAN, -100, 0.0)
"""weight, reduction, ignore_index, label_smoothing (the last for cross_entropy_loss only)."""


class RowSplitError(ValueError):
    """A head-and-loss chain the split cannot chunk row by row (or no chain to split)."""


@dataclass(frozen=True)
class RowSplit:
    """One head-and-loss chain split into row chunks."""

    head: str
    """fx name of the head's ``aten.linear`` in the exported forward."""
    module: str
    """Module path of the head (``lm_head``); empty outside a submodule."""
    losses: tuple[str, ...]
    """fx names of the loss ops it feeds."""
    rows: int
    """Flattened leading dimensions of the logits (batch x sequence)."""
    width: int
    """The head's output features (the vocabulary)."""
    chunks: int
    logits_bytes: int
    """Bytes of the unsplit logits."""
    chunk_bytes: int
    """Bytes of the largest chunk's logits."""
    whole_outputs: tuple[str, ...] = ()
    """Row values the model returns, rebuilt whole by concatenating the chunks."""

    def describe(self) -> str:
        kept = ("; the returned logits stay whole: outputs='loss' (CLI --outputs loss) drops that "
                "copy when only the loss is read" if self.whole_outputs else "")
        return (f"split {self.module or self.head} + loss into {self.chunks} row chunks "
                f"({self.rows} x {self.width} logits: {_mb(self.logits_bytes)} whole, "
                f"{_mb(self.chunk_bytes)} per chunk{kept})")


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def split_rows(gm: torch.fx.GraphModule, chunks: int) -> tuple[RowSplit, ...]:
    """Rewrite every head-and-loss chain of ``gm`` into ``chunks`` row chunks; 1 changes nothing.

    Raises `RowSplitError` when ``chunks > 1`` and there is no chain, or a chain is not per-row.
    """
    if check_chunks(chunks) == 1:
        return ()
    heads = find_heads(gm)
    if not heads:
        raise RowSplitError(
            f"split_rows={chunks}: no linear -> cross_entropy / nll_loss chain in the model's forward "
            "to split; leave split_rows at 1 (or split=None)")
    splits = tuple(_split_head(gm, head, chunks) for head in heads)
    stable_topological_order(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return splits


def check_chunks(chunks: object, name: str = "split_rows") -> int:
    """``chunks`` if it is a positive integer; raises `RowSplitError` before a (slow) capture."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise RowSplitError(f"{name} must be a positive integer number of chunks, got {chunks!r}")
    return chunks


def find_heads(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Linears whose output reaches a loss op through row-wise ops: the chains to split."""
    heads = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _LINEARS:
            continue
        seen, stack = set(), [node]
        while stack:
            current = stack.pop()
            for user in current.users:
                if user in seen or user.op != "call_function":
                    continue
                seen.add(user)
                if user.target in _LOSSES and user.args[0] is current:
                    heads.append(node)
                    stack.clear()
                    break
                if user.target in _SAME_ROWS | _REPLAYED:
                    stack.append(user)
    return heads


@dataclass(frozen=True)
class _Chain:
    region: tuple[torch.fx.Node, ...]
    """The head and its row values, in graph order."""
    losses: tuple[torch.fx.Node, ...]
    outputs: tuple[torch.fx.Node, ...]
    """Row values the graph returns."""
    ignored: tuple[torch.fx.Node, ...]


def _refuse(head: torch.fx.Node, why: str) -> RowSplitError:
    return RowSplitError(f"cannot split the head {module_path(head) or head.name} into row chunks: {why}")


def _chain(head: torch.fx.Node, rows: int, width: int) -> _Chain:
    """Every use of the head's rows, checked to be per-row (`_refuse` says which one is not)."""
    region, losses, outputs, ignored = [head], [], [], []
    index = 0
    while index < len(region):
        value = region[index]
        index += 1
        for user in value.users:
            if user.op == "output":
                outputs.append(value)
            elif user.op != "call_function":
                raise _refuse(head, f"its logits feed {user.format_node()}")
            elif user.target in _IGNORED:
                ignored.append(user)
            elif user.target in _LOSSES:
                _check_loss(head, user, value, rows, width)
                losses.append(user)
            elif user.target in _SAME_ROWS | _REPLAYED:
                _check_row_op(head, user, value, rows, width)
                if user not in region:
                    region.append(user)
            else:
                raise _refuse(head, f"its logits feed {user.target}, which the split cannot chunk "
                                    "row by row (only views, casts, scalar scales, tanh, softmax over "
                                    "the last dimension and cross_entropy / nll_loss)")
    if not losses:
        raise _refuse(head, "no loss reads its logits")
    return _Chain(tuple(region), tuple(dict.fromkeys(losses)), tuple(dict.fromkeys(outputs)),
                  tuple(dict.fromkeys(ignored)))


def _check_row_op(head, op: torch.fx.Node, value: torch.fx.Node, rows: int, width: int) -> None:
    val = op.meta.get("val")
    shape = tuple(val.shape) if isinstance(val, torch.Tensor) else ()
    if not shape or shape[-1] != width or math.prod(shape[:-1]) != rows:
        raise _refuse(head, f"{op.target} reshapes the logits across rows (to {shape})")
    if op.args[0] is not value or any(isinstance(a, torch.fx.Node) for a in
                                      (*op.args[1:], *op.kwargs.values())):
        raise _refuse(head, f"{op.format_node()} combines the logits with another tensor")
    if op.target in _NORMALIZERS and op.args[1] % len(shape) != len(shape) - 1:
        raise _refuse(head, f"{op.target} over dim {op.args[1]} normalizes across tokens, not "
                            "within each row (the split needs a per-row reduction)")


def _loss_args(loss: torch.fx.Node) -> tuple:
    """(input, target, weight, reduction, ignore_index, label_smoothing) with aten's defaults."""
    names = ("weight", "reduction", "ignore_index", "label_smoothing")
    given = loss.args[2:]
    values = [given[i] if i < len(given) else loss.kwargs.get(name, _LOSS_DEFAULTS[i])
              for i, name in enumerate(names)]
    return (loss.args[0], loss.args[1], *values)


def _check_loss(head, loss: torch.fx.Node, value: torch.fx.Node, rows: int, width: int) -> None:
    inp, target, _, reduction, _, _ = _loss_args(loss)
    shape = tuple(value.meta["val"].shape)
    if inp is not value or shape != (rows, width):
        raise _refuse(head, f"{loss.target} reads the logits as {shape}, not as the input of "
                            f"[{rows}, {width}] rows (class dimension last)")
    if not isinstance(target, torch.fx.Node) or tuple(target.meta["val"].shape) != (rows,):
        raise _refuse(head, f"{loss.target}'s target is not one class index per row")
    if reduction not in (SUM, MEAN):
        raise _refuse(head, f"{loss.target} has reduction='none': the per-token losses' later "
                            "reduction is not followed; use reduction='sum' or 'mean'")


def chunk_sizes(rows: int, chunks: int) -> list[int]:
    """``rows`` in ``chunks`` near-equal parts, the larger first."""
    return [rows // chunks + (1 if i < rows % chunks else 0) for i in range(chunks)]


def module_path(node: torch.fx.Node) -> str:
    """The path of the innermost module ``node`` ran in (empty outside a submodule), without
    dynamo's ``L['self']`` root, so a graph from torch.compile names modules as capture does."""
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]).removeprefix("L['self']").removeprefix(".") if stack else ""


def _split_head(gm: torch.fx.GraphModule, head: torch.fx.Node, chunks: int) -> RowSplit:
    """Emit the chunked chain (one chunk's linear, row ops and losses after the other, so each
    chunk's logits can die before the next is made), rewire the uses, drop the original."""
    graph = gm.graph
    x, weight, bias = (list(head.args) + [None])[:3]
    logits = head.meta["val"]
    width, rows = logits.shape[-1], math.prod(logits.shape[:-1])
    if logits.dim() < 2 or rows < chunks:
        raise _refuse(head, f"{rows} row(s) cannot make {chunks} chunks")
    chain = _chain(head, rows, width)
    sizes = chunk_sizes(rows, chunks)
    emit = Emitter(gm, head)
    with graph.inserting_before(graph.find_nodes(op="output")[0]):
        x_chunks = emit.split(emit(aten.reshape.default, (x, [rows, x.meta["val"].shape[-1]])), sizes)
        targets = {loss: emit.split(_loss_args(loss)[1], sizes) for loss in chain.losses}
        chunk_of: dict[torch.fx.Node, list[torch.fx.Node]] = {value: [] for value in chain.region}
        sums: dict[torch.fx.Node, torch.fx.Node] = {}
        for i, x_i in enumerate(x_chunks):
            chunk_of[head].append(emit(aten.linear.default, (x_i, weight, bias)))
            for value in chain.region[1:]:
                parent = chunk_of[value.args[0]][i]
                if value.target in _SAME_ROWS:
                    chunk_of[value].append(parent)
                    continue
                args = (-1, *value.args[2:]) if value.target in _NORMALIZERS else value.args[1:]
                chunk_of[value].append(emit(value.target, (parent, *args), dict(value.kwargs), like=value))
            for loss in chain.losses:
                part = _summed_loss(emit, loss, chunk_of[loss.args[0]][i], targets[loss][i])
                sums[loss] = part if loss not in sums else emit(aten.add.Tensor, (sums[loss], part), like=loss)
        totals = {loss: _normalized(emit, loss, total) for loss, total in sums.items()}
        wholes = {value: emit(aten.view.default, (emit(aten.cat.default, (chunk_of[value], 0)),
                                                  list(value.meta["val"].shape)), like=value)
                  for value in chain.outputs}
    for loss, total in totals.items():
        loss.replace_all_uses_with(total)
    output = graph.find_nodes(op="output")[0]
    for value, whole in wholes.items():
        output.replace_input_with(value, whole)
    for node in (*chain.ignored, *chain.losses, *reversed(chain.region)):
        graph.erase_node(node)
    item = logits.element_size()
    return RowSplit(head.name, module_path(head), tuple(loss.name for loss in chain.losses), rows, width,
                    chunks, rows * width * item, max(sizes) * width * item,
                    tuple(v.name for v in chain.outputs))


def _summed_loss(emit: Emitter, loss: torch.fx.Node, chunk: torch.fx.Node,
                 target: torch.fx.Node) -> torch.fx.Node:
    """The loss of one chunk with reduction ``sum`` (ignored targets add nothing)."""
    _, _, weight, _, ignore_index, smoothing = _loss_args(loss)
    extra = (smoothing,) if loss.target is aten.cross_entropy_loss.default else ()
    return emit(loss.target, (chunk, target, weight, SUM, ignore_index, *extra), like=loss)


def _normalized(emit: Emitter, loss: torch.fx.Node, total: torch.fx.Node) -> torch.fx.Node:
    """``sum``: the total; ``mean``: divided by what aten divides by, the count of non-ignored
    targets or, with class weights, their summed weights (which get no gradient in aten)."""
    _, target, weight, reduction, ignore_index, _ = _loss_args(loss)
    if reduction == SUM:
        return total
    counted = emit(aten.ne.Scalar, (target, ignore_index))
    if weight is None:
        denominator = emit(aten.sum.default, (counted,))
    else:
        safe = emit(aten.where.ScalarOther, (counted, target, 0))
        picked = emit(aten.index_select.default, (emit(aten.detach.default, (weight,)), 0, safe))
        denominator = emit(aten.sum.default, (emit(aten.mul.Tensor, (picked, counted)),))
    return emit(aten.div.Tensor, (total, denominator), like=loss)


class Emitter:
    """Adds call_function nodes with their FakeTensor ``val`` (later passes read it) and the
    module stack of the node they replace (``like``, else ``head``: reports name the module)."""

    def __init__(self, gm: torch.fx.GraphModule, head: torch.fx.Node) -> None:
        self.gm, self.head = gm, head
        self.fake_mode = detect_fake_mode([n.meta["val"] for n in gm.graph.nodes
                                           if isinstance(n.meta.get("val"), torch.Tensor)])
        if self.fake_mode is None:
            raise RowSplitError("the exported graph carries no FakeTensor values to split with")

    def _val(self, node: torch.fx.Node):
        val = node.meta.get("val")
        if val is None and node.op == "get_attr":  # parameters of the unlifted module
            val = self.fake_mode.from_tensor(operator.attrgetter(str(node.target))(self.gm))
            node.meta["val"] = val
        return val

    def __call__(self, target, args: tuple, kwargs: dict | None = None,
                 like: torch.fx.Node | None = None) -> torch.fx.Node:
        kwargs = kwargs or {}
        node = self.gm.graph.call_function(target, args, kwargs)
        source = like if like is not None else self.head
        for key in ("nn_module_stack", "stack_trace", "source_fn_stack"):
            if key in source.meta:
                node.meta[key] = source.meta[key]
        with self.fake_mode:
            node.meta["val"] = target(*map_arg(args, self._val), **map_arg(kwargs, self._val))
        return node

    def split(self, value: torch.fx.Node, sizes: list[int]) -> list[torch.fx.Node]:
        parts = self(aten.split_with_sizes.default, (value, sizes))
        items = []
        for i in range(len(sizes)):
            item = self.gm.graph.call_function(operator.getitem, (parts, i))
            item.meta.update({k: v for k, v in parts.meta.items() if k != "val"})
            item.meta["val"] = parts.meta["val"][i]
            items.append(item)
        return items


def stable_topological_order(graph: torch.fx.Graph) -> None:
    """Move each node after its inputs, keeping the existing order otherwise: the chunks, emitted
    before the output, move up to their first consumer (a loss read in forward)."""
    order: list[torch.fx.Node] = []
    placed: set[torch.fx.Node] = set()
    for root in list(graph.nodes):
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in placed:
                continue
            if expanded:
                placed.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((i, False) for i in reversed(node.all_input_nodes) if i not in placed)
    for before, node in zip(order, order[1:]):
        if before.next is not node:
            before.append(node)
