"""Ops the graph runtime may run in place, and on which input (see `solvers.ir.inplace`).

A functional ``add`` writes a fresh buffer where eager autograd accumulates a gradient with
``add_``. The capture marks which inputs an ``add`` could write into (`reusable_inputs`: same
shape, dtype, strides and storage bytes as the output, the whole storage, and no other input on
that storage); whether it does is the schedule's business (`solvers.ir.inplace.donations`), and
`in_place_call` is the call the rewrite emits when it does. ``x.add_(y)`` computes ``x + y``
bit for bit, and ``y.add_(x)`` too (IEEE addition commutes), so only ``alpha`` pins the order.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

IN_PLACE = {aten.add.Tensor: aten.add_.Tensor}


def _is_whole_storage_like(arg_val: torch.Tensor, out: torch.Tensor, out_bytes: int) -> bool:
    if any(not isinstance(d, int) for d in (*arg_val.shape, *arg_val.stride(), *out.shape)):
        return False  # symbolic sizes: not worth a guard
    return (arg_val.shape == out.shape and arg_val.dtype == out.dtype and arg_val.device == out.device
            and arg_val.stride() == out.stride() and arg_val.storage_offset() == 0
            and arg_val.untyped_storage().nbytes() == out_bytes
            and arg_val.numel() * arg_val.element_size() == out_bytes)


def reusable_inputs(node: torch.fx.Node, value_of: dict[str, str], out_bytes: int) -> tuple[str, ...]:
    """The values (storages) whose buffer ``node``'s single output could take over."""
    if node.target not in IN_PLACE or len(node.args) < 2:
        return ()
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor):
        return ()
    first, second = node.args[0], node.args[1]
    positions = (0, 1) if node.kwargs.get("alpha", 1) == 1 else (0,)
    found: list[str] = []
    for k in positions:
        arg, other = (first, second) if k == 0 else (second, first)
        if not isinstance(arg, torch.fx.Node) or not isinstance(arg.meta.get("val"), torch.Tensor):
            continue
        value = value_of.get(arg.name)
        if value is None or (isinstance(other, torch.fx.Node) and value_of.get(other.name) == value):
            continue
        if _is_whole_storage_like(arg.meta["val"], out, out_bytes):
            found.append(value)
    return tuple(dict.fromkeys(found))


def in_place_call(node: torch.fx.Node, args: tuple, donated: str, value_of: dict[str, str]) -> tuple:
    """(target, args) that run ``node`` in place on the input holding value ``donated``; ``args``
    are the arguments as the caller placed them (same order as ``node.args``)."""
    k = next(k for k, a in enumerate(node.args[:2]) if isinstance(a, torch.fx.Node) and value_of.get(a.name) == donated)
    if k == 1:
        args = (args[1], args[0], *args[2:])
    return IN_PLACE[node.target], args
