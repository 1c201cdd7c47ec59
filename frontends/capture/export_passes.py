"""Edits of the traced graphs that make the captured step the step plain autograd runs.

Two things make a traced step heavier than the same step under plain autograd, and both are
fixed on the exported forward, before AOTAutograd traces the backward (it re-derives every
FakeTensor afterwards):

- Every output that requires grad gets a tangent. A model returning ``(loss, logits)`` is
  trained with ``loss.backward()``, so plain autograd never creates a gradient for ``logits``;
  the traced step would receive a materialized zero tangent the size of the logits and add it
  to the loss's gradient (one more logits-sized buffer each). With ``grad_outputs="losses"``
  the non-scalar outputs of such a model are detached before tracing; `GradientFreeOutput`
  then stops a gradient that reaches one of them at run time with a clear error, so a plan
  made for the loss alone can never silently drop a gradient.
- ``dropout(x, p=0)`` in training is the identity in eager PyTorch (it returns ``x``), but its
  decomposition copies ``x``. Removing it saves that copy and makes the captured graph the
  eager step's.

One is fixed on the joint graph: `untie_batch_norm_backward` (see there).
"""

from __future__ import annotations

import torch

GRAD_OUTPUT_POLICIES = ("losses", "all")

_DROPOUTS = {
    torch.ops.aten.dropout.default,
    torch.ops.aten.feature_dropout.default,
    torch.ops.aten.alpha_dropout.default,
    torch.ops.aten.feature_alpha_dropout.default,
}


def check_grad_outputs(policy: str) -> str:
    if policy not in GRAD_OUTPUT_POLICIES:
        raise ValueError(f"grad_outputs must be one of {', '.join(GRAD_OUTPUT_POLICIES)}, got {policy!r}: "
                         "'losses' plans backward from the scalar outputs, 'all' from every output")
    return policy


def drop_identity_dropouts(gm: torch.fx.GraphModule) -> int:
    """Replace dropouts with ``p == 0`` (or ``train=False``) by their input; returns how many."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _DROPOUTS:
            continue
        x, p, train = node.args[0], node.args[1], node.args[2]
        if isinstance(p, (int, float)) and (p == 0 or train is False):
            node.replace_all_uses_with(x)
            gm.graph.erase_node(node)
            dropped += 1
    if dropped:
        gm.recompile()
    return dropped


def untie_batch_norm_backward(gm: torch.fx.GraphModule) -> int:
    """Drop the running statistics from training-mode ``native_batch_norm_backward`` calls.

    The joint graph passes the *updated* running mean and variance (forward outputs that are
    copied into the buffers) to the backward op, which ignores them when ``train`` is true (it
    uses the saved batch statistics). Read there, they would be saved for backward, and when
    the batch norm is recomputed in backward its stats-free overload has no new statistics to
    offer, so the forward's copies would stay alive through backward without the plan knowing.
    Returns how many calls were untied."""
    untied = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.native_batch_norm_backward.default:
            continue
        args = list(node.args)
        if args[7] is True and (args[3] is not None or args[4] is not None):
            args[3] = args[4] = None
            node.args = tuple(args)
            untied += 1
    if untied:
        gm.recompile()
    return untied


def _is_loss(node: object) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 0 and val.is_floating_point()


def detach_gradient_free_outputs(gm: torch.fx.GraphModule, policy: str) -> tuple[int, ...]:
    """Detach the outputs backward does not start from; returns their flat output positions.

    ``losses``: when the model returns at least one floating scalar, every other floating
    output is gradient-free. ``all``, or a model without a scalar output: nothing changes.
    """
    check_grad_outputs(policy)
    output = gm.graph.find_nodes(op="output")[0]
    flat = list(output.args[0])
    if policy == "all" or not any(_is_loss(o) for o in flat):
        return ()
    detached = []
    for position, out in enumerate(flat):
        val = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not val.is_floating_point() or _is_loss(out):
            continue
        with gm.graph.inserting_before(output):
            flat[position] = gm.graph.call_function(torch.ops.aten.detach.default, (out,))
        flat[position].meta = dict(out.meta)
        detached.append(position)
    if detached:  # nothing changed: no recompile (seconds on a 1,000-step loop)
        output.args = (tuple(flat),)
        gm.recompile()
    return tuple(detached)


class GradientFreeOutput(torch.autograd.Function):
    """A view of an output planned without a gradient, hung below ``anchor`` (a loss) so it
    requires grad like the original did; a gradient that reaches it raises instead of being
    dropped. ``loss.backward()`` never visits it: it is not on the loss's path."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, anchor: torch.Tensor, position: int) -> torch.Tensor:
        ctx.position = position
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(
            f"a gradient reached output {ctx.position} of the remat module, but the step was "
            "planned for backward from its scalar (loss) outputs only: call optimize(..., "
            "grad_outputs='all') to plan backward through every output")


def guard_gradient_free(outputs: list, positions: tuple[int, ...]) -> list:
    """`GradientFreeOutput` around ``outputs[positions]``, anchored on the first output that
    requires grad (none: the outputs stay detached, and torch's own error names them)."""
    anchor = next((o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad), None)
    if anchor is None or not positions:
        return outputs
    guarded = list(outputs)
    for position in positions:
        guarded[position] = GradientFreeOutput.apply(outputs[position], anchor, position)
    return guarded
