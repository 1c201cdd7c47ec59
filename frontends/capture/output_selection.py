"""Drop the returned tensors a caller does not read (``outputs="loss"``) from the exported forward.

Why: a model that returns ``(loss, logits)`` makes the step keep a whole logits tensor for the
caller, even when the training loop reads only the loss; with the LM head split into row chunks
(`frontends.split.row_split`) that one returned copy is all that is left of the whole logits. With
``outputs="loss"`` every tensor output other than the floating scalars (the losses) is replaced
by None in the exported forward, before the split and AOTAutograd, so the ops only it needed are
gone and its memory stops counting.

What the caller gets back: the same structure with None in place of each dropped tensor: a tuple
``(loss, logits)`` becomes ``(loss, None)``, a dict keeps its keys, and a transformers
``ModelOutput`` comes back with only ``loss`` set (``out.logits is None``). Non-tensor outputs
are kept. ``"all"`` (default) changes nothing.
"""

from __future__ import annotations

import torch

OUTPUT_CHOICES = ("all", "loss")


class NoLossOutputError(ValueError):
    """``outputs="loss"`` on a model that returns no scalar floating-point loss."""


def check_outputs(outputs: object) -> str:
    """``outputs`` if it is one of `OUTPUT_CHOICES`; raises before a (slow) capture."""
    if outputs not in OUTPUT_CHOICES:
        raise ValueError(f"outputs must be one of {', '.join(map(repr, OUTPUT_CHOICES))}, got {outputs!r}: "
                         "'loss' returns the scalar losses only (None in place of the other tensors)")
    return outputs


def _val(node: object):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def is_loss(node: object) -> bool:
    """A floating-point scalar tensor output: what ``loss.backward()`` starts from."""
    val = _val(node)
    return isinstance(val, torch.Tensor) and val.dim() == 0 and val.is_floating_point()


def keep_only_losses(gm: torch.fx.GraphModule, outputs: str) -> tuple[int, ...]:
    """``outputs="loss"``: None in place of every non-loss tensor output of ``gm`` (and the ops
    only they needed erased); returns the flat positions dropped. ``"all"``: nothing changes.

    Raises `NoLossOutputError` when ``gm`` returns no floating scalar.
    """
    if check_outputs(outputs) == "all":
        return ()
    output = gm.graph.find_nodes(op="output")[0]
    flat = list(output.args[0])
    if not any(is_loss(o) for o in flat):
        shapes = ", ".join(str(tuple(_val(o).shape)) if isinstance(_val(o), torch.Tensor) else type(o).__name__
                           for o in flat)
        raise NoLossOutputError(f"outputs='loss': the model returns no scalar floating-point loss "
                                f"(its outputs: {shapes}); return the loss from forward or use outputs='all'")
    dropped = [i for i, o in enumerate(flat) if isinstance(_val(o), torch.Tensor) and not is_loss(o)]
    if not dropped:
        return ()
    unused = [flat[i] for i in dropped]
    for i in dropped:
        flat[i] = None
    output.args = (tuple(flat),)
    _erase_unused(gm.graph, unused)
    gm.recompile()
    return tuple(dropped)


def _erase_unused(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> None:
    """Erase ``nodes`` and then their inputs while nothing reads them (pure ops only: a buffer
    update or another in-place op stays)."""
    stack, erased = list(nodes), set()
    while stack:
        node = stack.pop()
        if node in erased or node.users or node.op != "call_function" or node.is_impure():
            continue
        inputs = node.all_input_nodes
        graph.erase_node(node)
        erased.add(node)
        stack.extend(inputs)
