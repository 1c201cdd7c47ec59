"""Rewrite a schedule into forward and backward GraphModules.

A fresh joint graph is built from the captured one by walking the schedule: every compute
step copies its op (``node_copy``), the first copy keeps the op's name and later ones are named
``<name>_recomputed``, ``<name>_recomputed_1``, ...; consumers read the copy that is live at
that point. Views are re-derived from the current copy of the storage they alias, right where
they are read, so they hold no storage of their own. Every copy is tagged as forward-only or
backward-only, then torch's own ``_extract_fwd_bwd_modules`` splits the graph into the
forward (which returns the outputs and the values backward reads: the saved set) and the
backward. fx frees each value after its last read, which is exactly the simulator's model.
A recomputed random op runs through `frontends.graph_runtime.rng_replay.replay` with the generator state saved
before its first run, so it draws the same numbers. On the CPU, dropout's ops run through
`frontends.graph_runtime.cpu_kernels` (same values, faster than aten's CPU kernels).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx

from frontends.capture.step import CapturedStep
from frontends.graph_runtime.cpu_kernels import cpu_kernel
from frontends.graph_runtime.rng_replay import RNG_STATE_META, replay, state_device
from frontends.torch_compat import _extract_fwd_bwd_modules, is_sym_node
from solvers.ir.schedule import Schedule, StepKind

FORWARD_TAG, BACKWARD_TAG = "must_be_in_forward", "must_be_in_backward"


def _batch_norm_without_stats(args: tuple) -> tuple:
    """Train-mode batch norm recomputed in backward must not read the running stats: forward
    has already updated them (autograd's version check would fail). Its output and saved
    mean/rstd do not depend on them, so the recompute uses the stats-free overload."""
    inp, weight, bias, _mean, _var, training, momentum, eps = args
    return torch.ops.aten._native_batch_norm_legit.no_stats, (inp, weight, bias, training, momentum, eps)


_WITHOUT_STATS = {torch.ops.aten._native_batch_norm_legit_functional.default: _batch_norm_without_stats}


class RewriteError(RuntimeError):
    """The schedule could not be turned into graphs; names the fx node that failed."""


@dataclass(frozen=True)
class ScheduledJoint:
    """The rewritten joint graph and the forward values the backward reads."""

    module: fx.GraphModule
    saved: tuple[str, ...]
    recomputed_names: tuple[str, ...]


def build_scheduled_joint(captured: CapturedStep, schedule: Schedule) -> ScheduledJoint:
    """The joint graph with every op placed (and duplicated) where the schedule puts it."""
    builder = _JointBuilder(captured)
    for step in schedule.forward:
        if step.kind is StepKind.COMPUTE:
            builder.compute(step.node, FORWARD_TAG)
    fwd_outputs = [builder.read(n, FORWARD_TAG) for n in builder.outputs[: captured.num_fwd_outputs]]
    for step in schedule.backward:
        if step.kind is StepKind.COMPUTE:
            builder.compute(step.node, BACKWARD_TAG)
    bwd_outputs = [builder.read(n, BACKWARD_TAG) for n in builder.outputs[captured.num_fwd_outputs :]]
    return builder.finish(fwd_outputs + bwd_outputs)


def partition_by_schedule(captured: CapturedStep, schedule: Schedule):
    """A partition_fn for ``aot_compile_joint_with_descriptors`` that realizes ``schedule``."""

    def partition(joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
        if num_fwd_outputs != captured.num_fwd_outputs:
            raise RewriteError(
                f"the joint graph has {num_fwd_outputs} forward outputs, the capture "
                f"{captured.num_fwd_outputs}: capture and compile must use the same graph"
            )
        joint = build_scheduled_joint(captured, schedule)
        saved = [n for n in joint.module.graph.nodes if n.name in set(joint.saved)]
        fw, bw = _extract_fwd_bwd_modules(  # sizes (dynamic shapes) are saved as SymInts, apart
            joint.module, [n for n in saved if not is_sym_node(n)], [n for n in saved if is_sym_node(n)],
            num_fwd_outputs=num_fwd_outputs,
        )
        return fw, bw

    return partition


class _JointBuilder:
    def __init__(self, captured: CapturedStep):
        self.captured = captured
        self.old = captured.gm.graph
        self.by_name = {n.name: n for n in self.old.nodes}
        self.graph = fx.Graph()
        self.env: dict[str, fx.Node] = {}  # value or placeholder name -> live copy
        self.region_of: dict[fx.Node, str] = {}
        self.instance: dict[str, int] = {}  # value -> how many times computed so far
        self.view_memo: dict[tuple, fx.Node] = {}
        self.roots: dict[str, tuple[str, ...]] = {}
        self.recomputed: list[str] = []
        # Inputs and lifted constants (``get_attr``) exist before any step: every schedule
        # starts with them, and the split copies a constant into each graph that reads it.
        for op in ("placeholder", "get_attr"):
            for node in self.old.find_nodes(op=op, sort=True):
                self.env[node.name] = self.graph.node_copy(node)
        output = self.old.find_nodes(op="output")[0]
        self.output_node = output
        self.outputs = list(output.args[0])

    # ------------------------------------------------------------ reading values
    def read(self, node, tag: str):
        """The new-graph node that stands for old ``node`` at this point of ``tag``'s region."""
        if not isinstance(node, fx.Node):
            return node
        if node.op in ("placeholder", "get_attr"):
            return self.env[node.name]
        value = self.captured.value_of.get(node.name)
        if value == node.name and value in self.env:
            return self.env[value]
        if node.name in self.captured.graph.groups:
            raise RewriteError(f"multi-output op read as a whole: {node.format_node()}")
        if node.op == "call_function" and value != node.name:
            # An alias (view, detach, split's tuple, ...) or a non-tensor helper: re-derive it
            # from the copies of the storages it depends on that are live now, once per region.
            key = (node.name, tag, tuple((r, self.instance.get(r, 0)) for r in self._roots(node)))
            if key not in self.view_memo:
                self.view_memo[key] = self._copy(node, tag, node.name)
            return self.view_memo[key]
        raise RewriteError(f"the schedule reads {node.name!r} before computing it: {node.format_node()}")

    def _roots(self, node: fx.Node) -> tuple[str, ...]:
        """The values (storages) an alias or helper node is derived from, without compute."""
        if node.name not in self.roots:
            value = self.captured.value_of.get(node.name)
            if node.op in ("placeholder", "get_attr") or value == node.name:
                found: tuple[str, ...] = (value or node.name,)
            elif value is not None:
                found = (value,)
            else:
                found = tuple(sorted({r for arg in node.all_input_nodes for r in self._roots(arg)}))
            self.roots[node.name] = found
        return self.roots[node.name]

    def _copy(self, node: fx.Node, tag: str, name: str) -> fx.Node:
        """Copy ``node`` into ``tag``'s region, its arguments read where it now stands."""
        args = fx.map_arg(node.args, lambda arg: self.read(arg, tag))
        kwargs = fx.map_arg(node.kwargs, lambda arg: self.read(arg, tag))
        copy = self.graph.create_node(node.op, node.target, args, kwargs, name=name, type_expr=node.type)
        copy.meta = dict(node.meta)
        copy.meta["partitioner_tag"] = tag
        self.region_of[copy] = tag
        return copy

    # ---------------------------------------------------------------- computing
    def compute(self, value: str, tag: str) -> None:
        graph = self.captured.graph
        members = graph.group_of(value)
        if value != members[0]:
            return  # siblings come with the group's first value
        op = self.by_name[graph[value].group]
        count = self.instance.get(value, 0)
        suffix = "" if count == 0 else "_recomputed" + ("" if count == 1 else f"_{count - 1}")
        copy = self._copy(op, tag, op.name + suffix)
        copy.target = cpu_kernel(op)
        if tag == BACKWARD_TAG and op.target in _WITHOUT_STATS:
            copy.target, copy.args = _WITHOUT_STATS[op.target](copy.args)
        state = op.meta.get(RNG_STATE_META)
        if count and state:  # a recomputed random op draws what its first run drew
            copy.args = (self.read(self.by_name[state], tag), state_device(self.by_name[state]),
                         copy.target, *copy.args)
            copy.target = replay
        if suffix:
            self.recomputed.append(copy.name)
        pinned = set(graph.user_outputs)  # the caller holds the first instance: keep reading it
        if op.name == value:  # single-output op
            if not (value in pinned and count):
                self._set(value, copy)
            return
        n_outputs = 3 if tag == BACKWARD_TAG and op.target in _WITHOUT_STATS else len(copy.meta["val"])
        for user in op.users:
            if user.name in pinned and self.instance.get(user.name, 0):
                continue
            if user.target is operator.getitem and user.name in members and user.args[1] < n_outputs:
                item = self.graph.create_node(
                    "call_function", operator.getitem, (copy, user.args[1]), name=user.name + suffix
                )
                item.meta = dict(user.meta)
                item.meta["partitioner_tag"] = tag
                self.region_of[item] = tag
                self._set(user.name, item)

    def _set(self, value: str, node: fx.Node) -> None:
        self.env[value] = node
        self.instance[value] = self.instance.get(value, 0) + 1

    def finish(self, outputs: list) -> ScheduledJoint:
        out = self.graph.output(outputs)
        out.meta = dict(self.output_node.meta)
        module = fx.GraphModule(self.captured.gm, self.graph)
        module.graph.lint()
        saved: dict[str, None] = {}
        for node in module.graph.nodes:
            if self.region_of.get(node) != BACKWARD_TAG:
                continue
            for arg in node.all_input_nodes:
                if arg.op == "placeholder" and arg.name.startswith("tangents"):
                    continue
                if arg.op == "placeholder" or self.region_of.get(arg) == FORWARD_TAG:
                    saved[arg.name] = None
        for arg in out.args[0][self.captured.num_fwd_outputs :]:
            if isinstance(arg, fx.Node) and (arg.op == "placeholder" or self.region_of.get(arg) == FORWARD_TAG):
                if not arg.name.startswith("tangents"):
                    saved[arg.name] = None
        return ScheduledJoint(module=module, saved=tuple(saved), recomputed_names=tuple(self.recomputed))
