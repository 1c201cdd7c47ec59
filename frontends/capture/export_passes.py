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

A third makes the traced step slower than eager and costs memory: attention masks that eager
never builds. Libraries skip the mask when they see at run time that it is plain causal (or
all-visible) and call SDPA with ``is_causal=True`` and no mask instead; transformers' masking
code does not take that path while torch.export traces (it cannot know the next batch's padding),
so the graph builds a dense ``[batch, 1, q, kv]`` mask from ``arange`` and passes it as
``attn_mask``. That rules out FlashAttention's causal kernels on CUDA, and each recomputed
attention pays for the mask again. `attention_masks_as_eager` evaluates every mask that no
input reaches (it is a constant of the shapes) and, where it is exactly SDPA's own causal mask or
masks nothing, calls SDPA as eager does: with no mask, and where the keys and values were
repeated for grouped-query attention (``repeat_kv``) only because a mask was passed, with the
grouped heads and ``enable_gqa`` (the repeated copies were saved for backward: 3 MiB a layer
on a small Llama). A mask that an input reaches (a padding mask) stays.

One is fixed on the joint graph: `untie_batch_norm_backward` (see there).
"""

from __future__ import annotations

import torch

from frontends.torch_compat import OpOverload, tree_map, unset_fake_temporarily

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


_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_SDPA_OPTIONAL = ("attn_mask", "dropout_p", "is_causal")
"""SDPA's arguments after query, key and value, in schema order."""
_METADATA_CHECK = torch.ops.aten._assert_tensor_metadata.default
MAX_MASK_ELEMENTS = 1 << 28
"""A constant mask larger than this (a [8, 1, 4096, 4096] one has 2^27 elements) is not
evaluated: it stays in the graph, as captured."""


def attention_masks_as_eager(gm: torch.fx.GraphModule) -> int:
    """Call SDPA with ``is_causal=True`` and no mask (or with no mask) where the mask it is given
    is a constant of the shapes equal to SDPA's own causal mask (to one that masks nothing);
    returns how many calls changed. The mask's nodes go when nothing else reads them.

    Exact: a mask is rewritten only after its value, computed here from the graph, was compared
    element by element with ``ones(q, kv).tril()`` (or all-visible). A float mask counts as
    boolean where it holds only 0 and values at most half the dtype's lowest (``-inf`` or
    ``finfo.min``, which softmax turns into exact zeros as long as a row keeps a finite entry,
    and a causal row keeps its diagonal)."""
    verdicts: dict[torch.fx.Node, str | None] = {}
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        options = _sdpa_options(node)
        mask = options["attn_mask"]
        if not isinstance(mask, torch.fx.Node) or options["is_causal"]:
            continue
        if mask not in verdicts:
            verdicts[mask] = _mask_pattern(gm, mask)
        if verdicts[mask] is None:
            continue
        query, key, value = node.args[:3]
        grouped = _grouped_heads(query, key, value) if not node.kwargs.get("enable_gqa") else None
        if grouped is not None:  # as eager: no mask, so SDPA reads the grouped heads itself
            (key, value), repeats = grouped, [key, value]
        node.args = (query, key, value)
        node.kwargs = {**{k: v for k, v in node.kwargs.items() if k not in _SDPA_OPTIONAL},
                       "attn_mask": None, "dropout_p": options["dropout_p"],
                       "is_causal": verdicts[mask] == "causal", **({"enable_gqa": True} if grouped else {})}
        if grouped is not None:
            _erase_unread(gm, repeats)
        changed += 1
    if changed:
        _erase_unread(gm, [m for m, verdict in verdicts.items() if verdict is not None])
        gm.recompile()
    return changed


_REPEAT_STEPS = (torch.ops.aten.reshape.default, torch.ops.aten.expand.default, torch.ops.aten.unsqueeze.default)
MAX_GROUPED_HEAD_DIM = 256
"""transformers lets SDPA group heads itself only up to this head size (``use_gqa_in_sdpa``)."""


def _grouped_heads(query: torch.fx.Node, key: torch.fx.Node, value: torch.fx.Node):
    """``(key', value')`` when key and value are ``repeat_kv`` of key'/value' (unsqueeze at
    dim 2, expand, reshape: each head repeated in place, as ``repeat_interleave(dim=1)``) by the
    same factor, else None. transformers repeats them only because a mask was passed (SDPA's
    ``enable_gqa`` needs none on CUDA); run eagerly without the mask, it passes the grouped heads
    with ``enable_gqa=True``, and the repeated copies are never made or saved."""
    sources = [_repeated_from(t) for t in (key, value)]
    if any(s is None for s in sources) or sources[0][1] != sources[1][1]:
        return None
    (k, repeat), (v, _) = sources
    head_dims = {t.meta["val"].shape[-1] for t in (k, v)}
    if len(head_dims) != 1 or head_dims.pop() > MAX_GROUPED_HEAD_DIM:
        return None
    if query.meta["val"].shape[-3] != k.meta["val"].shape[-3] * repeat:
        return None
    return (k, v)


def _repeated_from(node: object) -> tuple[torch.fx.Node, int] | None:
    """(x, r) when ``node`` is ``x[:, :, None].expand(b, h, r, s, d).reshape(b, h * r, s, d)``."""
    chain = [node]
    for op in _REPEAT_STEPS:
        current = chain[-1]
        if not isinstance(current, torch.fx.Node) or current.target is not op:
            return None
        chain.append(current.args[0])
    reshape, expand, unsqueeze, source = chain
    if unsqueeze.args[1] != 2 or not isinstance(source, torch.fx.Node):
        return None
    x, out = source.meta.get("val"), reshape.meta.get("val")
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not isinstance(out, torch.Tensor):
        return None
    sizes = list(expand.args[1])
    b, h, s, d = x.shape
    if len(sizes) != 5 or not all(isinstance(n, int) for n in sizes) or sizes[:2] != [b, h] or sizes[3:] != [s, d]:
        return None
    if list(out.shape) != [b, h * sizes[2], s, d]:
        return None
    return source, sizes[2]


def _sdpa_options(node: torch.fx.Node) -> dict:
    defaults = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False}
    positional = dict(zip(_SDPA_OPTIONAL, node.args[3:6]))
    return {name: node.kwargs.get(name, positional.get(name, default)) for name, default in defaults.items()}


def _mask_pattern(gm: torch.fx.GraphModule, mask: torch.fx.Node) -> str | None:
    """"causal" (SDPA's own top-left causal mask), "none" (masks nothing) or None (anything
    else, a mask an input reaches, or one this cannot evaluate)."""
    fake = mask.meta.get("val")
    if not isinstance(fake, torch.Tensor) or fake.dim() < 2:
        return None
    if not all(isinstance(size, int) for size in fake.shape) or fake.numel() > MAX_MASK_ELEMENTS:
        return None
    value = _constant_of_shapes(gm, mask)
    if value is None:
        return None
    if value.dtype == torch.bool:
        visible = value
    elif value.is_floating_point():
        hidden = value <= torch.finfo(value.dtype).min / 2
        if not ((value == 0) | hidden).all():
            return None  # a bias (ALiBi, relative positions), not a mask
        visible = value == 0
    else:
        return None
    if visible.all():
        return "none"
    q, kv = visible.shape[-2:]
    return "causal" if bool((visible == torch.ones(q, kv, dtype=torch.bool).tril()).all()) else None


def _constant_of_shapes(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor | None:
    """The value of ``node`` computed on the CPU, when it depends on no input, parameter or
    random op (a mask built from ``arange``); None otherwise. Device arguments become the CPU,
    so a meta or CUDA capture evaluates the same way and allocates nothing on the device."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    ancestors, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in ancestors:
            continue
        if n.op != "call_function" or not isinstance(n.target, OpOverload) \
                or torch.Tag.nondeterministic_seeded in n.target.tags:
            return None  # an input, a parameter, a constant of the module, a random or Python op
        ancestors.add(n)
        stack.extend(n.all_input_nodes)
    values: dict[torch.fx.Node, object] = {}

    def on_cpu(x):
        return torch.device("cpu") if isinstance(x, torch.device) else x

    try:
        with unset_fake_temporarily(), torch.no_grad():
            for n in sorted(ancestors, key=order.__getitem__):
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), values.__getitem__)
                values[n] = n.target(*tree_map(on_cpu, args), **tree_map(on_cpu, kwargs))
    except Exception:  # noqa: BLE001 - an op that needs more than shapes: leave the mask as traced
        return None
    value = values[node]
    return value if isinstance(value, torch.Tensor) else None


def _erase_unread(gm: torch.fx.GraphModule, roots: list[torch.fx.Node]) -> None:
    """Erase ``roots`` and their ancestors, last first, where nothing reads them any more
    (only pure ops reach here: `_constant_of_shapes` accepted them). torch.export's checks of a
    ``.to()``'s result (``_assert_tensor_metadata``) go with the value they check."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    pending = set(roots)
    while pending:
        n = max(pending, key=order.__getitem__)
        pending.discard(n)
        for check in [u for u in n.users if u.target is _METADATA_CHECK and not u.users]:
            gm.graph.erase_node(check)
        if n.users or n.op != "call_function":
            continue
        pending.update(n.all_input_nodes)
        gm.graph.erase_node(n)


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
