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
`frontends.graph_runtime.cpu_kernels` (same values, faster than aten's CPU kernels). A compute the
schedule follows with the free of an input it may reuse runs in place (``add_``; see
`solvers.ir.inplace`, which the simulator reads too).
An ``offload(v)`` step starts v's copy to host; the ``free(v)`` after it is where the device copy
is read for the last time (after the copy is done) and the host copy becomes v, which is what
forward saves when backward reloads it; ``reload(v)`` copies it back and the first reader waits
(`frontends.graph_runtime.offload_ops`: side CUDA streams with events, plain host copies on the CPU).
Every other free is left to fx.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx

from frontends.capture.step import CapturedStep
from frontends.graph_runtime.cpu_kernels import cpu_kernel
from frontends.graph_runtime.in_place import in_place_call
from frontends.graph_runtime.offload_ops import offload_done, offload_to_host, reload_done, reload_to_device
from frontends.graph_runtime.rng_replay import RNG_STATE_META, replay, state_device
from frontends.torch_compat import FakeTensor, _extract_fwd_bwd_modules, fake_like_mode, is_sym_node
from solvers.ir.inplace import donations
from solvers.ir.schedule import Schedule, Step, StepKind

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
    offloaded: tuple[str, ...] = ()
    """Values copied to host by an ``offload`` step and released on the device by its ``free``."""


def build_scheduled_joint(captured: CapturedStep, schedule: Schedule) -> ScheduledJoint:
    """The joint graph with every op placed (and duplicated) where the schedule puts it."""
    builder = _JointBuilder(captured)
    donated = donations(captured.graph, schedule)
    for index, step in enumerate(schedule.forward):
        builder.step(step, FORWARD_TAG, f"forward step {index}", donated.get(index))
    fwd_outputs = [builder.read(n, FORWARD_TAG) for n in builder.outputs[: captured.num_fwd_outputs]]
    offset = len(schedule.forward)
    for index, step in enumerate(schedule.backward):
        builder.step(step, BACKWARD_TAG, f"backward step {index}", donated.get(offset + index))
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
        self.version: dict[str, int] = {}  # value -> how many copies made so far (computed or reloaded)
        self.offloading: dict[str, fx.Node] = {}  # value -> its copy to host, until the free that ends it
        self.host_copy: dict[str, fx.Node] = {}  # value -> its host copy, freed on device, not yet reloaded
        self.awaiting: dict[str, fx.Node] = {}  # reloaded value -> its copy, not yet waited for
        self.offloaded: dict[str, None] = {}
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
            if value in self.awaiting:  # the first reader of a reloaded value waits for its copy
                self.env[value] = self._call(reload_done, (self.awaiting.pop(value),), value + "_reloaded",
                                             self.env[value].meta, tag)
            return self.env[value]
        if value in self.host_copy:
            raise RewriteError(f"the schedule reads {value!r} while it is offloaded to host: reload({value}) "
                               f"before this read: {node.format_node()}")
        if node.name in self.captured.graph.groups:
            raise RewriteError(f"multi-output op read as a whole: {node.format_node()}")
        if node.op == "call_function" and value != node.name:
            # An alias (view, detach, split's tuple, ...) or a non-tensor helper: re-derive it
            # from the copies of the storages it depends on that are live now, once per region.
            key = (node.name, tag, tuple((r, self.version.get(r, 0)) for r in self._roots(node)))
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
    def compute(self, value: str, tag: str, donated: str | None = None) -> None:
        graph = self.captured.graph
        members = graph.group_of(value)
        if value != members[0]:
            return  # siblings come with the group's first value
        op = self.by_name[graph[value].group]
        count = self.instance.get(value, 0)
        suffix = "" if count == 0 else "_recomputed" + ("" if count == 1 else f"_{count - 1}")
        state = op.meta.get(RNG_STATE_META)
        # read before the copy is made: a reloaded state's first read inserts its wait here
        saved_state = self.read(self.by_name[state], tag) if count and state else None
        copy = self._copy(op, tag, op.name + suffix)
        copy.target = cpu_kernel(op)
        if donated is not None:  # the schedule frees that input right here: write into it
            copy.target, copy.args = in_place_call(op, copy.args, donated, self.captured.value_of)
        if tag == BACKWARD_TAG and op.target in _WITHOUT_STATS:
            copy.target, copy.args = _WITHOUT_STATS[op.target](copy.args)
        if saved_state is not None:  # a recomputed random op draws what its first run drew
            copy.args = (saved_state, state_device(self.by_name[state]), copy.target, *copy.args)
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
        self.version[value] = self.version.get(value, 0) + 1

    # ----------------------------------------------------- offloading (see offload_ops)
    def step(self, step: Step, tag: str, where: str, donated: str | None = None) -> None:
        """Place one schedule step: a compute (in place on ``donated``, `solvers.ir.inplace`), an
        offload or reload, or a free (which only matters after an offload: fx frees every other
        value after its last read)."""
        if step.kind is StepKind.COMPUTE:
            self.compute(step.node, tag, donated)
        elif step.kind is StepKind.OFFLOAD:
            self.offload(step.node, tag, f"{where} ({step})")
        elif step.kind is StepKind.RELOAD:
            self.reload(step.node, tag, f"{where} ({step})")
        elif step.node in self.offloading:
            self._commit_offload(step.node, tag)

    def _call(self, target, args: tuple, name: str, meta: dict, tag: str) -> fx.Node:
        node = self.graph.create_node("call_function", target, args, name=name)
        node.meta = dict(meta)
        node.meta["partitioner_tag"] = tag
        self.region_of[node] = tag
        return node

    def _offloadable(self, value: str, where: str) -> fx.Node:
        node = self.by_name.get(value)
        if node is None or self.captured.value_of.get(value) != value:
            raise RewriteError(f"{where}: {value!r} is not a value of the captured graph")
        if node.op in ("placeholder", "get_attr"):
            raise RewriteError(f"{where}: {value!r} is an input, parameter or constant, held for the "
                               "whole step: only values the step computes can be offloaded")
        if value in self.captured.graph.user_outputs:
            raise RewriteError(f"{where}: {value!r} is returned to the caller, who holds it: "
                               "offloading it would free nothing")
        return node

    def offload(self, value: str, tag: str, where: str) -> None:
        """Start the value's copy to host; the device copy stays readable until its free."""
        node = self._offloadable(value, where)
        if value in self.offloading or value in self.host_copy:
            raise RewriteError(f"{where}: {value!r} is offloaded twice: free it after the first offload "
                               "and reload it before the next")
        if value not in self.env:
            raise RewriteError(f"{where}: {value!r} is not live: compute or reload it before offloading it")
        device_copy = self.read(node, tag)
        meta = {**node.meta, "val": _host_like(node.meta.get("val"))}
        self.offloading[value] = self._call(offload_to_host, (device_copy,), value + "_offload", meta, tag)

    def _commit_offload(self, value: str, tag: str) -> None:
        """The free after an offload: the device copy is read for the last time once the copy to
        host is done, and the host copy is the value from here on (until a reload)."""
        start = self.offloading.pop(value)
        device_copy = self.env.pop(value)  # a read after this free, without a reload, is an error
        self.version[value] = self.version.get(value, 0) + 1  # and so is a view of it derived before
        self.host_copy[value] = self._call(offload_done, (start, device_copy), value + "_offloaded", start.meta, tag)
        self.offloaded[value] = None

    def reload(self, value: str, tag: str, where: str) -> None:
        """Allocate the value on its device again and start the copy back; its first reader waits."""
        node = self._offloadable(value, where)
        if value in self.offloading:
            raise RewriteError(f"{where}: {value!r} is reloaded before its offload is finished: "
                               f"add free({value}) after offload({value}) and before the reload")
        if value not in self.host_copy:
            said = "since its last reload" if value in self.offloaded else "ever"
            raise RewriteError(f"{where}: {value!r} has not been offloaded {said}: a reload needs "
                               f"offload({value}) and free({value}) before it")
        if value in self.env:
            raise RewriteError(f"{where}: {value!r} is live on the device: reload it only after the free "
                               "that follows its offload")
        val = node.meta.get("val")
        device = val.device if isinstance(val, torch.Tensor) else torch.device("cpu")
        copy = self._call(reload_to_device, (self.host_copy.pop(value), device), value + "_reload", node.meta, tag)
        self.env[value] = copy
        self.version[value] = self.version.get(value, 0) + 1
        self.awaiting[value] = copy

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
        return ScheduledJoint(module=module, saved=tuple(saved), recomputed_names=tuple(self.recomputed),
                              offloaded=tuple(self.offloaded))


def _host_like(val):
    """The meta value of a host copy of ``val``: same dtype, sizes and strides, on the CPU, in
    the joint's fake mode (AOTAutograd wants a FakeTensor for every saved value)."""
    if not isinstance(val, torch.Tensor):
        return val
    mode = val.fake_mode if isinstance(val, FakeTensor) else None
    return fake_like_mode(mode, lambda: torch.empty_strided(val.size(), val.stride(), dtype=val.dtype, device="cpu"))
