"""PyTorch's own ways to trade compute for memory, set up on a model for `vs_pytorch.py`.

* per-block checkpointing: ``torch.utils.checkpoint`` (non-reentrant) around each block;
* selective activation checkpointing (SAC): the same wrapper with a policy that saves the
  outputs of matmuls and convolutions and recomputes everything else;
* ``torch.compile`` with AOTAutograd's min-cut partitioner (no Inductor) at an
  ``activation_memory_budget``.

A ``TorchDispatchMode`` around a compiled module makes dynamo run the module eagerly (even when
its compiled code is cached), so the compiled graphs are measured from the inside: `GraphProbe`
is the fw/bw compiler, and while armed it runs each compiled graph under the project's storage
tracker (`frontends.measure.memory_tracker`), ``FlopCounterMode`` or a cost-model counter. It counts its calls, so a
measurement that did not go through the compiled graphs is detected instead of reported.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.fx.graph import _BoxedCodeGen
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from torch.utils.flop_counter import FlopCounterMode

from frontends.measure.memory_tracker import _StorageLedger, _StorageTrackingMode

aten = torch.ops.aten

BLOCKS: dict[str, tuple[str, ...]] = {
    "mlp": ("layers",),        # each Linear (its GELU is applied by MLP.forward, outside)
    "gpt": ("blocks",),        # each transformer Block
    "convnet": ("blocks",),    # each ResidualBlock
    "gpt2": ("h",),            # each GPT-2 Block
    "vit": ("blocks",),        # each EncoderBlock
    "resnet": ("blocks",),     # each BasicBlock
    "unet": ("down", "bottleneck", "up"),  # each encoder DoubleConv, the bottleneck, each Up
}
"""Per model: the attributes holding its blocks (a ModuleList/Sequential, or one module)."""

SAC_SAVED_OPS = frozenset({
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default, aten._convolution.default,
})
"""What the SAC policy saves; every other op inside a block is recomputed in backward."""


def _save_matmuls_and_convs(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAC_SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(nn.Module):
    """Runs ``block`` under non-reentrant ``torch.utils.checkpoint`` (optionally selective)."""

    def __init__(self, block: nn.Module, selective: bool) -> None:
        super().__init__()
        self.block = block
        self.selective = selective

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        if self.selective:
            context_fn = functools.partial(create_selective_checkpoint_contexts, _save_matmuls_and_convs)
            return checkpoint(self.block, *args, use_reentrant=False, context_fn=context_fn)
        return checkpoint(self.block, *args, use_reentrant=False)


def wrap_blocks(model: nn.Module, name: str, *, selective: bool) -> nn.Module:
    """Replace each block of ``model`` (see `BLOCKS`) by a `Checkpointed` wrapper, in place."""
    if name not in BLOCKS:
        raise ValueError(f"no block list known for model {name!r}: add it to BLOCKS")
    for attr in BLOCKS[name]:
        container = getattr(model, attr)
        if isinstance(container, (nn.ModuleList, nn.Sequential)):
            for index, block in enumerate(container):
                container[index] = Checkpointed(block, selective)
        else:
            setattr(model, attr, Checkpointed(container, selective))
    return model


class GraphProbe:
    """fw/bw compiler for AOTAutograd that runs the graphs as generated (boxed, so backward frees
    each saved value after its last use) and, when armed, measures them from the inside."""

    def __init__(self) -> None:
        self.graphs = {"forward": 0, "backward": 0}
        self.calls = {"forward": 0, "backward": 0}
        self._ledger: _StorageLedger | None = None
        self._counts: list | None = None
        self._counter_kind = None

    def compiler(self, kind: str):
        def compile_graph(gm: torch.fx.GraphModule, example_inputs) -> object:
            self.graphs[kind] += 1
            gm.graph.set_codegen(_BoxedCodeGen())
            gm.recompile()

            def run(args: list) -> object:
                return self._run(kind, gm, args)

            run._boxed_call = True  # type: ignore[attr-defined]
            return run
        return compile_graph

    def _run(self, kind: str, gm: torch.fx.GraphModule, args: list) -> object:
        self.calls[kind] += 1
        with contextlib.ExitStack() as stack:
            if self._ledger is not None:
                stack.enter_context(_StorageTrackingMode(self._ledger))
            counter = None
            if self._counts is not None:
                counter = stack.enter_context(self._counter_kind())
            out = gm.forward(args)
        if counter is not None:
            self._counts.append(counter.get_total_flops() if isinstance(counter, FlopCounterMode)
                                else counter.seconds)
        return out

    def tracked(self, make):
        """``make()`` with its storages on the armed ledger: for what a step allocates outside
        the compiled graphs (the loss's seed gradient, which autograd holds through backward)."""
        if self._ledger is None:
            return make()
        with _StorageTrackingMode(self._ledger):
            return make()

    @contextlib.contextmanager
    def tracking_memory(self) -> Iterator[_StorageLedger]:
        """Storages created by the compiled graphs inside the block; read ``peak_bytes`` after."""
        before = dict(self.calls)
        self._ledger = ledger = _StorageLedger()
        try:
            yield ledger
        finally:
            self._ledger = None
        ledger.settle()
        self._check_ran(before, "memory")

    @contextlib.contextmanager
    def counting(self, counter_kind) -> Iterator[list]:
        """Per compiled graph run inside the block: its FLOPs (``counter_kind`` is
        ``FlopCounterMode``) or its modelled seconds (`ModelledTime`); sum the yielded list."""
        before = dict(self.calls)
        counts: list = []
        self._counts = counts
        self._counter_kind = (lambda: FlopCounterMode(display=False)) if counter_kind is FlopCounterMode \
            else counter_kind
        try:
            yield counts
        finally:
            self._counts = None
        self._check_ran(before, counter_kind.__name__)

    def _check_ran(self, before: dict[str, int], what: str) -> None:
        if any(self.calls[k] == before[k] for k in self.calls):
            raise RuntimeError(f"the compiled graphs did not run while measuring {what}: "
                               "dynamo fell back to eager, the measurement would be wrong")


@dataclass(frozen=True)
class CompiledModel:
    module: nn.Module
    probe: GraphProbe


def compile_min_cut(model: nn.Module) -> CompiledModel:
    """``torch.compile`` with AOTAutograd and the min-cut partitioner, graphs run by `GraphProbe`.

    The partitioner reads ``torch._functorch.config.activation_memory_budget`` when the model is
    first called (that is when dynamo compiles): set it around the first call.
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    probe = GraphProbe()
    backend = aot_autograd(fw_compiler=probe.compiler("forward"), bw_compiler=probe.compiler("backward"),
                           partition_fn=min_cut_rematerialization_partition)
    return CompiledModel(torch.compile(model, backend=backend), probe)


def memory_budget(fraction: float):
    """Context in which the min-cut partitioner uses ``activation_memory_budget = fraction``."""
    return torch._functorch.config.patch(activation_memory_budget=fraction)
