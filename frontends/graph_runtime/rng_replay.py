"""Random ops that can be recomputed: save the generator's state, replay it on recomputation.

Without this pass a random op (dropout, ``rand_like``, ``bernoulli``) is run-once: the solver
must keep its output, so a model trained with dropout cannot reach the memory that
``torch.utils.checkpoint`` (which replays the RNG) reaches. `add_rng_states` inserts, right
before each forward random op of the joint graph, a node that copies the default generator's
state (`rng_state`: a dispatched op, so memory tracking sees the copy). The random op is tagged
with that node's name; the IR makes the state a run-once input of the op
(`solvers.ir.graph.Node.rng_state`), and the rewrite runs every *recomputation* through
`replay`, which sets the saved state, runs the op and puts the generator back.

Why this is exact: the state is copied immediately before the first run, and no other draw
can come between (the simulator keeps the first runs of random ops in their original order and
in forward), so a replay draws exactly the numbers the first run drew; replays restore the
generator afterwards, so the stream after the step is the one plain autograd leaves. On CPU the
state is the default generator's 5,056-byte tensor, counted as activation memory; on CUDA it is
the Philox seed and offset, a 16-byte host tensor that takes no device memory (counted as 0).

Random ops that read an explicit ``torch.Generator`` are left run-once (their state is not the
default generator's), as are backward random ops.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from frontends.torch_compat import FakeTensor, OpOverload, fake_like_mode, tree_flatten

RNG_STATE_META = "remat_rng_state"
"""fx meta key on a random op: the name of the node holding the state it replays."""

_CPU_STATE_BYTES = int(torch.get_rng_state().numel())


@torch.library.custom_op("remat_opt::rng_state", mutates_args=())
def rng_state(device: torch.device) -> torch.Tensor:
    """A copy of ``device``'s default generator state (a host uint8 tensor)."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device).clone()
    return torch.get_rng_state().clone()


@rng_state.register_fake
def _rng_state_fake(device: torch.device) -> torch.Tensor:
    size = _CPU_STATE_BYTES if device.type == "cpu" else 16
    return torch.empty(size, dtype=torch.uint8)


RNG_STATE_OP = torch.ops.remat_opt.rng_state.default


def replay(state: torch.Tensor, device: torch.device, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` as it ran when ``state`` was saved, then restore the generator."""
    if device.type == "cuda":
        now = torch.cuda.get_rng_state(device)
        torch.cuda.set_rng_state(state, device)
        try:
            return op(*args, **kwargs)
        finally:
            torch.cuda.set_rng_state(now, device)
    now = torch.get_rng_state()
    torch.set_rng_state(state)
    try:
        return op(*args, **kwargs)
    finally:
        torch.set_rng_state(now)


def state_device(state_node: fx.Node) -> torch.device:
    """The device whose generator ``state_node`` (an `rng_state` call) saved."""
    return torch.device(state_node.args[0])


def state_device_bytes(state_node: fx.Node) -> int:
    """Device bytes a saved state occupies: the CPU state is CPU memory, the CUDA one is host."""
    return _CPU_STATE_BYTES if state_device(state_node).type == "cpu" else 0


def is_random_op(node: fx.Node) -> bool:
    """Whether ``node`` draws random numbers: an op torch tags ``nondeterministic_seeded``, except
    an attention kernel called with ``dropout_p=0`` (SDPA's flash/efficient/cudnn kernels carry
    the tag for their dropout; without it they are deterministic and may be recomputed freely)."""
    if not (node.op == "call_function" and isinstance(node.target, OpOverload)
            and torch.Tag.nondeterministic_seeded in node.target.tags):
        return False
    arguments = node.target._schema.arguments
    names = [a.name for a in arguments]
    if "dropout_p" not in names:
        return True
    index = names.index("dropout_p")
    if "dropout_p" in node.kwargs:
        p = node.kwargs["dropout_p"]
    elif index < len(node.args):
        p = node.args[index]
    else:
        p = arguments[index].default_value
    return not (isinstance(p, (int, float)) and p == 0)


def _replay_device(node: fx.Node) -> torch.device | None:
    """The device whose default generator ``node`` draws from, or None when it cannot replay."""
    leaves = tree_flatten((node.args, node.kwargs))[0]
    if any(isinstance(a, torch.Generator) or (isinstance(a, fx.Node) and a.op == "get_attr")
           for a in leaves):
        return None  # an explicit generator: not the default one
    outputs = [t for t in tree_flatten(node.meta.get("val"))[0] if isinstance(t, torch.Tensor)]
    devices = {t.device for t in outputs}
    if len(devices) != 1:
        return None
    device = devices.pop()
    return device if device.type in ("cpu", "cuda") else None


def add_rng_states(gm: fx.GraphModule) -> int:
    """Insert a saved state before every forward random op that can replay; returns how many."""
    graph = gm.graph
    backward: set[fx.Node] = set()
    for node in graph.nodes:  # backward: everything that reads a tangent (directly or not)
        desc = type(node.meta.get("desc")).__name__
        if (node.op == "placeholder" and desc == "TangentAOTInput") or any(
                a in backward for a in node.all_input_nodes):
            backward.add(node)
    # The joint has one fake mode: its first FakeTensor's (a placeholder's), found at once.
    fake_mode = next((n.meta["val"].fake_mode for n in graph.nodes if isinstance(n.meta.get("val"), FakeTensor)),
                     None)
    added = 0
    for node in list(graph.nodes):
        if not is_random_op(node) or node in backward or node.meta.get("partitioner_tag") == "is_backward":
            continue
        device = _replay_device(node)
        if device is None:
            continue
        with graph.inserting_before(node):
            state = graph.create_node("call_function", RNG_STATE_OP, (device,), name=f"{node.name}_rng_state")
        state.meta = {key: node.meta[key] for key in ("stack_trace", "nn_module_stack", "seq_nr",
                                                       "partitioner_tag") if key in node.meta}
        state.meta["val"] = fake_like_mode(fake_mode, lambda: _rng_state_fake(device))
        node.meta[RNG_STATE_META] = state.name
        added += 1
    if added:
        gm.recompile()
    return added
