"""Capture one training step of an nn.Module as a joint forward+backward aten graph.

torch.export (non-strict) turns the module into a graph that keeps tied weights as one
tensor; AOTAutograd's ``aot_export_joint_with_descriptors`` then traces forward and backward
together, functionalized (buffer updates such as BatchNorm's running stats become extra
forward outputs), with a FakeTensor on every node. `build_remat_graph` turns that fx graph
into the framework-neutral `RematGraph`: one node per tensor storage, aliases folded into the
storage they view, multi-output ops split into siblings, costs from `frontends.measure.costs`.
Lifted constants (``get_attr`` nodes such as ``_tensor_constant0``, which export makes of
tensors created in forward) are resident values like parameters: every schedule has them from
the start, they are never freed, recomputed or differentiated.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import operator
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

try:
    import resource  # optional: POSIX only (the stack limit of `_deep_stack`)
except ImportError:
    resource = None

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from frontends.capture.export_passes import (
    attention_masks_as_eager,
    check_grad_outputs,
    detach_gradient_free_outputs,
    drop_identity_dropouts,
    untie_batch_norm_backward,
)
from frontends.capture.fakify import fakify_meta, has_meta_tensors
from frontends.capture.fx_leaves import flat_leaves
from frontends.capture.joint_stitch import StitchedLoop, joint_of_long_loop
from frontends.capture.output_selection import check_outputs, keep_only_losses
from frontends.capture.symbolic_sizes import SymbolSizes, UnplannableSize
from frontends.graph_runtime.in_place import reusable_inputs
from frontends.graph_runtime.rng_replay import (
    RNG_STATE_META,
    RNG_STATE_OP,
    add_rng_states,
    is_random_op,
    state_device_bytes,
)
from frontends.guards.custom_functions import refuse_custom_functions
from frontends.guards.forward_guards import forward_guards
from frontends.guards.hf_training import (
    cache_off_for_training,
    explain_library_construct,
    explain_unsupported_value,
)
from frontends.guards.sharding import check_no_sharded_submodules
from frontends.guards.user_code import is_user_file
from frontends.measure.calibration import calibrate
from frontends.measure.costs import FLOPS_MODEL, CostModel, op_bytes_moved, op_flops
from frontends.split.mlp_split import MlpSplits, split_mlps
from frontends.split.row_split import RowSplit, check_chunks
from frontends.split.row_split import split_rows as split_head_rows
from frontends.torch_compat import (
    _use_lazy_graph_module,
    aot_export_joint_with_descriptors,
)
from frontends.torch_compat import aot_descriptors as aot_desc
from solvers.ir.graph import Node, NodeKind, Phase, RematGraph


class CaptureError(RuntimeError):
    """The model could not be traced into a training graph; the message says why and where."""


class UnreplayableForwardError(CaptureError):
    """The forward does in Python what the captured graph cannot replay (a hook, a Python RNG
    draw, a changed attribute): see `frontends.guards.forward_guards`."""


@dataclass(frozen=True)
class CapturedStep:
    """A traced training step: the fx joint graph, its IR and what is needed to rebuild it."""

    joint: Any
    """torch's JointWithDescriptors: the joint graph module plus parameter/buffer specs."""
    graph: RematGraph
    value_of: dict[str, str]
    """fx node name -> the IR value (storage) it is or aliases; absent for non-tensors."""
    num_fwd_outputs: int
    param_names: tuple[str, ...]
    buffer_names: tuple[str, ...]
    cost_model: CostModel
    gradient_free_outputs: tuple[int, ...] = ()
    """Flat positions of the outputs planned without a gradient (see `frontends.capture.export_passes`)."""
    kwarg_overrides: tuple[tuple[str, Any], ...] = ()
    """Keyword values traced in place of the caller's (``use_cache=False``, see `frontends.guards.hf_training`)."""
    notes: tuple[str, ...] = ()
    """What capture changed about the step, for the plan's message (said once)."""
    row_splits: tuple[RowSplit, ...] = ()
    """Head-and-loss chains split into row chunks (``split_rows``, see `frontends.split.row_split`)."""
    mlp_splits: MlpSplits = MlpSplits(())
    """MLP chains split into row chunks (``split_mlp``, see `frontends.split.mlp_split`)."""
    stitched_loop: StitchedLoop | None = None
    """A long run of identical copies whose joint was written from short traces
    (`frontends.capture.joint_stitch`); None where the joint was traced whole."""

    @property
    def gm(self) -> torch.fx.GraphModule:
        return self.joint.graph_module


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Python's cyclic collector off while tracing: torch's tracers keep every traced node,
    fake tensor and proxy alive, so each automatic collection walks all of them and capture
    grows quadratically with the graph (measured on a 400-step loop: 107 s with it, 43 s
    without). Restored on exit; the cycles tracing made are collected by the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _deep_stack():
    """The main thread's stack may grow to the hard limit while tracing: AOTAutograd's joint
    trace recurses in C through the whole autograd graph, and a 10,000-step loop overflowed the
    usual 8 MiB soft limit (a segmentation fault, not an error). Linux grows the main thread's
    stack against the current soft limit, so raising it here is enough. Restored on exit."""
    limits = None
    if resource is not None:
        try:
            limits = resource.getrlimit(resource.RLIMIT_STACK)
            resource.setrlimit(resource.RLIMIT_STACK, (limits[1], limits[1]))
        except (ValueError, OSError):  # not allowed here: trace within the limit there is
            limits = None
    try:
        yield
    finally:
        if limits is not None:
            resource.setrlimit(resource.RLIMIT_STACK, limits)


@_deep_stack()
@_cyclic_gc_paused()
def capture(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict | None = None,
    cost_model: CostModel = FLOPS_MODEL,
    grad_outputs: str = "losses",
    python_side_effects: str | None = None,
    replay_random: bool = True,
    split_rows: int = 1,
    outputs: str = "all",
    split_mlp: int = 1,
    stitch_loops: bool = True,
) -> CapturedStep:
    """Trace ``model(*args, **kwargs)`` and its backward into a `CapturedStep`.

    ``grad_outputs="losses"`` (default): a model that returns a scalar loss next to other
    outputs is planned for ``loss.backward()``, the others get no gradient (a gradient that
    reaches them at run time raises); ``"all"``: backward may start from every output.
    ``python_side_effects``: ``"error"`` (default) raises `UnreplayableForwardError` when the
    forward does in Python what the graph cannot replay, ``"ignore"`` plans with the values of
    capture time (see `frontends.guards.forward_guards`). ``replay_random`` (default) lets the plan
    recompute random ops such as dropout by replaying their generator state (see
    `frontends.graph_runtime.rng_replay`); False keeps every random output, as before. ``split_rows=k > 1``
    runs each LM head and its loss in k chunks of token rows (`frontends.split.row_split`; raises
    `frontends.split.row_split.RowSplitError` where there is no such chain or it is not per-row).
    ``outputs="loss"`` returns the scalar losses only, None in place of the other tensors
    (`frontends.capture.output_selection`); ``"all"`` (default) returns everything. ``split_mlp=k > 1``
    runs each MLP (linear -> pointwise -> linear) in k chunks of token rows (`frontends.split.mlp_split`).
    ``stitch_loops`` (default) writes the joint of a long run of identical copies from three
    short traces where that is checked exact (`frontends.capture.joint_stitch`); False traces it whole.
    """
    kwargs = dict(kwargs or {})
    check_grad_outputs(grad_outputs)
    check_chunks(split_rows)
    check_chunks(split_mlp, "split_mlp")
    check_outputs(outputs)
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"expected an nn.Module, got {type(model).__name__}")
    check_no_sharded_submodules(model)  # fully_shard inside: the captured graph skips its hooks
    with cache_off_for_training(model, kwargs) as cache_off, forward_guards(  # both restore on exit
            model, tuple(args), cache_off.kwargs, python_side_effects, UnreplayableForwardError) as guard, \
            refuse_custom_functions(UnreplayableForwardError):  # their backward would be lost
        joint, gradient_free, splits, mlps, loop = _trace(model, tuple(args), cache_off.kwargs, grad_outputs,
                                                          split_rows, outputs, split_mlp, stitch_loops)
        guard.check_graph(joint.graph_module)
    untie_batch_norm_backward(joint.graph_module)
    if replay_random:
        add_rng_states(joint.graph_module)
    graph, value_of, num_fwd_outputs = build_remat_graph(joint.graph_module, cost_model, type(model).__name__)
    return CapturedStep(
        joint=joint,
        graph=graph,
        value_of=value_of,
        num_fwd_outputs=num_fwd_outputs,
        param_names=tuple(joint.params_spec),
        buffer_names=tuple(joint.buffers_spec),
        cost_model=cost_model,
        gradient_free_outputs=gradient_free,
        kwarg_overrides=tuple(cache_off.kwarg_overrides.items()),
        notes=cache_off.notes + tuple(s.describe() for s in splits) + tuple(filter(None, [mlps.describe()])),
        row_splits=splits,
        mlp_splits=mlps,
        stitched_loop=loop,
    )


def _trace(model: torch.nn.Module, args: tuple, kwargs: dict, grad_outputs: str, split_rows: int = 1,
           outputs: str = "all", split_mlp: int = 1, stitch_loops: bool = True):
    """torch.export, the forward passes of `frontends.capture.export_passes` (and the row split of
    `frontends.split.row_split`), then AOTAutograd's joint.

    The joint is traced with torch's lazy graph modules (`torch.fx._lazy_graph_module`, as
    torch.compile does): AOTAutograd generates and compiles the joint's Python code twice (when
    make_fx builds the module and after its dead-code pass), and nothing here runs that code, so
    a lazy module writes it only when something reads ``.code`` or calls the module. Same graph,
    same metadata; on a 1,000-step loop that took about 8% off capture (10,000 steps: two
    120,000-line ``forward``s). torch.export's own modules stay eager (export reads their
    ``_out_spec``, which a lazy module does not fill)."""
    if has_meta_tensors(model, tuple(args), kwargs):  # plan without allocating: see fakify
        try:
            model, args, kwargs = fakify_meta(model, tuple(args), kwargs)
        except ValueError as err:
            raise CaptureError(str(err)) from None
    with warnings.catch_warnings(), _quiet_torch_logs():
        warnings.simplefilter("ignore")
        try:
            exported = torch.export.export(model, tuple(args), kwargs, strict=False)
        except UnreplayableForwardError:  # already one line that names the construct
            raise
        except Exception as err:  # re-raised with the user's line, not torch's internals
            raise CaptureError(_explain_trace_failure(err)) from err
        forward = exported.module()
        drop_identity_dropouts(forward)
        attention_masks_as_eager(forward)
        keep_only_losses(forward, outputs)  # before the split: a dropped logits tensor needs no concatenation
        mlps = split_mlps(forward, split_mlp)
        splits = split_head_rows(forward, split_rows)  # before detaching: it reads the loss outputs
        gradient_free = detach_gradient_free_outputs(forward, grad_outputs)
        with contextlib.ExitStack() as stack, _use_lazy_graph_module(True):  # see _trace's note
            stitched = joint_of_long_loop(forward, tuple(args), kwargs) if stitch_loops else None
            if stitched is not None:
                joint, loop = stitched
                return joint, gradient_free, splits, mlps, loop
            try:
                joint = aot_export_joint_with_descriptors(
                    stack, forward, tuple(args), kwargs, _record_nn_module_stack=True
                )
            except Exception as err:
                raise CaptureError(_explain_trace_failure(err)) from err
    return joint, gradient_free, splits, mlps, None


@contextlib.contextmanager
def _quiet_torch_logs():
    """Tracing failures are reported once, as a CaptureError; torch's own logging of them
    (graph dumps, guard warnings) would bury that line."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))  # export prints partial graphs
    loggers = [logging.getLogger(name) for name in logging.root.manager.loggerDict
               if name == "torch" or name.startswith("torch.")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with stack:
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _explain_trace_failure(err: Exception) -> str:
    """One line: what failed, and the user's source line (from the traceback or torch's text)."""
    text = str(err).strip().splitlines()
    first = text[0] if text else type(err).__name__
    known = explain_unsupported_value(first) or explain_library_construct(
        str(err), traceback.extract_tb(err.__traceback__))
    if known is not None:
        return known
    return (f"could not trace the model ({type(err).__name__}: {first}){_user_location(err)}; "
            "remove data-dependent Python control flow or run that part outside the module")


def _user_location(err: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if is_user_file(f.filename)]
    if frames:
        return f' at File "{frames[-1].filename}", line {frames[-1].lineno}'
    for line in reversed(str(err).splitlines()):
        stripped = line.strip()
        if stripped.startswith("File ") and is_user_file(stripped.split('"')[1] if '"' in stripped else ""):
            return f" at {stripped}"
    return ""


RECOMPUTABLE_READERS_OF_MUTATED = {torch.ops.aten._native_batch_norm_legit_functional.default}
"""Ops that read a buffer the step updates but can be recomputed without it (see rewrite)."""


def _mutated_placeholders(gm: torch.fx.GraphModule) -> set[str]:
    """Names of the buffers (placeholders) the forward updates, from the output descriptors."""
    output_node = gm.graph.find_nodes(op="output")[0]
    targets = {
        desc.mutated_input for desc in output_node.meta.get("desc") or []
        if isinstance(desc, aot_desc.InputMutationAOTOutput)
    }
    return {n.name for n in gm.graph.find_nodes(op="placeholder") if n.meta.get("desc") in targets}


def _placeholder_kind(node: torch.fx.Node) -> NodeKind | None:
    desc = node.meta.get("desc")
    if isinstance(desc, (aot_desc.ParamAOTInput, aot_desc.BufferAOTInput)):
        return NodeKind.PARAMETER
    if isinstance(desc, aot_desc.TangentAOTInput):
        return NodeKind.TANGENT
    return NodeKind.INPUT


def _constant_value(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads (a lifted constant such as ``_tensor_constant0``,
    made by ``torch.tensor(...)`` in forward); None for non-tensors (``_opaque_obj0``, a
    ``torch.Generator``; submodules of higher-order ops), which hold no activation memory."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val
    try:
        attr = operator.attrgetter(str(node.target))(gm)
    except AttributeError:
        return None
    return attr if isinstance(attr, torch.Tensor) else None


def _storage_nbytes(t: torch.Tensor, sizes: SymbolSizes | None = None) -> int:
    return (sizes or SymbolSizes()).storage_bytes(t)


def _op_output_nbytes(node: torch.fx.Node, val: torch.Tensor, sizes: SymbolSizes) -> int:
    """Storage bytes the real kernel allocates for ``val``, where it differs from the fake.

    CPU ``mse_loss`` with a reduction returns its scalar inside the full elementwise buffer
    (measured: a [64, 256] float32 input gives a 0-d loss whose storage holds 65,536 bytes).
    """
    if (node.target is torch.ops.aten.mse_loss.default and val.device.type == "cpu"
            and val.dim() == 0 and isinstance(node.args[0], torch.fx.Node)):
        inp = node.args[0].meta["val"]
        return max(_storage_nbytes(val, sizes), sizes.numel(inp) * val.element_size())
    return _storage_nbytes(val, sizes)


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return str(path).replace("L['self'].", "").replace("L__self___", "")


def _is_backward(node: torch.fx.Node, backward_nodes: set[str]) -> bool:
    tag = node.meta.get("partitioner_tag")
    if tag in ("is_backward", "is_forward"):
        return tag == "is_backward"
    return node.name in backward_nodes


def build_remat_graph(
    gm: torch.fx.GraphModule, cost_model: CostModel = FLOPS_MODEL, name: str = "graph",
    sizes: SymbolSizes | None = None,
) -> tuple[RematGraph, dict[str, str], int]:
    """The IR of a joint graph: values, their storage bytes, phases, costs and flags. A graph
    with symbolic sizes (torch.compile's dynamic shapes) is measured at ``sizes`` (default: each
    symbol's hint); a data-dependent size with no hint raises `CaptureError`.

    Returns (graph, value_of: fx node name -> the value holding its storage, the number of
    forward outputs). In graph order: placeholders and lifted constants become resident values
    or tangents; each op's outputs with a storage of their own become values (`_op_values`), in
    the phase `_Phases` gives them; aliases map to the value they share a storage with."""
    sizes = sizes or SymbolSizes()
    if cost_model.calibrate:
        cost_model = calibrate(gm, cost_model, sizes)
    claims = _StorageClaims(sizes)
    nodes: list[Node] = []
    phases = _Phases(gm)
    mutated = _mutated_placeholders(gm)
    constants: list[Node] = []  # lifted constants: resident values, placed after the placeholders
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if claims.claim(node):
                kind = _placeholder_kind(node)
                phase = Phase.BACKWARD if kind is NodeKind.TANGENT else Phase.FORWARD
                nodes.append(Node(node.name, kind, phase, _storage_nbytes(node.meta["val"], sizes),
                                  op="placeholder"))
                if kind is NodeKind.TANGENT:
                    phases.backward_nodes.add(node.name)
            continue
        if node.op == "get_attr":
            constant = _constant_value(gm, node)
            if constant is not None and claims.claim(node, constant):
                constants.append(Node(node.name, NodeKind.PARAMETER, Phase.FORWARD,
                                      _storage_nbytes(constant, sizes), op="get_attr"))
            continue
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        reads = [a for a in flat_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)]
        phase, module = phases.of(node, reads)
        outputs = phases.getitems.get(node.name, []) if isinstance(node.meta.get("val"), (tuple, list)) else [node]
        fresh = [o for o in outputs if claims.claim(o)]
        if fresh:  # else an alias (view, detach, ...) or an op without tensor output
            nodes.extend(_op_values(node, fresh, reads, phase, module, claims, mutated, cost_model, sizes))
    forward_outputs, user_outputs, backward_outputs, num_fwd_outputs = _graph_outputs(gm, claims.value_of)
    first_op = next((i for i, n in enumerate(nodes) if n.is_op), len(nodes))
    graph = RematGraph(
        tuple(nodes[:first_op] + constants + nodes[first_op:]),
        forward_outputs=forward_outputs,
        user_outputs=user_outputs,
        backward_outputs=backward_outputs,
        cost_model=cost_model.name,
        name=name,
    )
    return graph, claims.value_of, num_fwd_outputs


class _StorageClaims:
    """One value per tensor storage: the first fx node with a storage names its value; later
    nodes on the same storage (views, aliases) map to it (``value_of``)."""

    def __init__(self, sizes: SymbolSizes):
        self.sizes = sizes
        self.root_of_storage: dict[StorageWeakRef, str] = {}
        self.value_of: dict[str, str] = {}

    def claim(self, fx_node: torch.fx.Node, val: Any = None) -> bool:
        """Map fx_node to its storage's value; True when it is a new storage."""
        val = fx_node.meta.get("val") if val is None else val
        if not isinstance(val, torch.Tensor):
            return False
        try:
            self.sizes.shape(val)
        except UnplannableSize:
            where = fx_node.meta.get("stack_trace", "").strip().splitlines()[-2:]
            raise CaptureError(
                f"data-dependent shape {tuple(val.shape)} at {fx_node.format_node()} "
                f"({' '.join(w.strip() for w in where)}): remat-opt cannot plan a size no call gave; "
                "move that computation outside the module"
            ) from None
        key = StorageWeakRef(val.untyped_storage())
        if key in self.root_of_storage:
            self.value_of[fx_node.name] = self.root_of_storage[key]
            return False
        self.root_of_storage[key] = fx_node.name
        self.value_of[fx_node.name] = fx_node.name
        return True

    def is_claimed(self, tensor: torch.Tensor) -> bool:
        return StorageWeakRef(tensor.untyped_storage()) in self.root_of_storage

    def inputs_of(self, reads: list[torch.fx.Node]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.value_of[a.name] for a in reads if a.name in self.value_of))


class _Phases:
    """Each op's phase and module, in graph order: an op that reads a backward value (or that
    AOTAutograd tags backward) is backward, and so are its readers; a backward op takes the module
    of the forward op with its autograd sequence number: the first forward op carrying it, the one
    that made the autograd node, whatever its module. Ops that make no node carry the last one's
    number: the ``detach`` of an output returned beside the loss (``lm_head``'s logits, BART's
    encoder state) follows the loss op, and labelling ``nll_loss_backward`` with its module put
    a top-level op in the last encoder layer's backward. A backward op whose number no forward op
    carries (an in-place ``SiLU``'s: its ``clone`` and ``silu`` carry the next) takes the module
    of the first forward value it reads; unlabelled, the saved clone seemed read outside the
    module, so a checkpoint of it seemed to keep it (timm's MobileViT predicted 18% high)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.backward_nodes: set[str] = set()
        self.module_of_seq: dict[int, str] = {}
        self.forward_module: dict[str, str] = {}
        self.getitems: dict[str, list[torch.fx.Node]] = {}
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is operator.getitem:
                self.getitems.setdefault(node.args[0].name, []).append(node)

    def of(self, node: torch.fx.Node, reads: list[torch.fx.Node]) -> tuple[Phase, str]:
        backward_nodes = self.backward_nodes
        if any(a.name in backward_nodes for a in reads):
            backward_nodes.add(node.name)
            backward_nodes.update(g.name for g in self.getitems.get(node.name, []))
        phase = Phase.BACKWARD if _is_backward(node, backward_nodes) else Phase.FORWARD
        if phase is Phase.BACKWARD:  # its readers run in backward too (tagged or not)
            backward_nodes.add(node.name)
            backward_nodes.update(g.name for g in self.getitems.get(node.name, []))
        seq = node.meta.get("seq_nr")
        module = _module_path(node)
        if phase is Phase.FORWARD:
            self.forward_module[node.name] = module
            if seq is not None:
                self.module_of_seq.setdefault(seq, module)
        if phase is Phase.BACKWARD and seq is not None:
            module = self.module_of_seq.get(seq)
            if module is None:
                module = next((self.forward_module[a.name] for a in reads if a.name in self.forward_module), "")
        return phase, module


def _op_values(node: torch.fx.Node, fresh: list[torch.fx.Node], reads: list[torch.fx.Node], phase: Phase,
               module: str, claims: _StorageClaims, mutated: set[str], cost_model: CostModel,
               sizes: SymbolSizes) -> list[Node]:
    """The values of one op (its outputs with a new storage, ``fresh``; siblings of one group):
    the op's cost, FLOPs and unused outputs (temp bytes) on the first, its flags on each."""
    target = node.target
    schema = getattr(target, "_schema", None)
    random = is_random_op(node) or target is RNG_STATE_OP
    mutates = bool(schema is not None and schema.is_mutable) or (node.is_impure(impure_random=False) and not random)
    if target not in RECOMPUTABLE_READERS_OF_MUTATED and any(
        claims.value_of.get(a.name) in mutated for a in reads
    ):
        mutates = True  # would read the buffer after forward updated it
    flops = op_flops(node, sizes)
    seconds = cost_model.op_seconds(node, flops, op_bytes_moved(node, sizes))
    used = {id(o.meta["val"]) for o in fresh}
    unused = [t for t in flat_leaves(node.meta.get("val"))
              if isinstance(t, torch.Tensor) and id(t) not in used and not claims.is_claimed(t)]
    temp = sum(_storage_nbytes(t, sizes) for t in unused)
    ins = claims.inputs_of(reads)
    replays = claims.value_of.get(node.meta.get(RNG_STATE_META, ""), "")  # see frontends.graph_runtime.rng_replay
    if replays:
        ins = (*ins, replays)
    reuses: tuple[str, ...] = ()
    if len(fresh) == 1 and fresh[0] is node and not (random or mutates):
        reuses = reusable_inputs(node, claims.value_of, _op_output_nbytes(node, node.meta["val"], sizes))
    return [Node(
        name=out.name, kind=NodeKind.OP, phase=phase,
        bytes=(state_device_bytes(node) if target is RNG_STATE_OP
               else _op_output_nbytes(node, out.meta["val"], sizes)),
        inputs=ins, group=node.name, rng_state=replays,
        cost=seconds if k == 0 else 0.0, flops=flops if k == 0 else 0.0,
        temp_bytes=temp if k == 0 else 0, random=random, mutates=mutates,
        module=module, op=str(target), reuses=reuses,
    ) for k, out in enumerate(fresh)]


def _graph_outputs(gm: torch.fx.GraphModule, value_of: dict[str, str]):
    """(forward outputs, user outputs, backward outputs, number of forward outputs), read off the
    joint graph's output descriptors: gradients are backward outputs, plain outputs the user's."""
    output_node = gm.graph.find_nodes(op="output")[0]
    descs = output_node.meta.get("desc") or [None] * len(output_node.args[0])
    forward_outputs: list[str] = []
    user_outputs: list[str] = []
    backward_outputs: list[str] = []
    num_fwd_outputs = 0
    for out, desc in zip(output_node.args[0], descs):
        is_grad = isinstance(desc, aot_desc.GradAOTOutput)
        if not is_grad and desc is not None:
            num_fwd_outputs += 1
        if not isinstance(out, torch.fx.Node) or out.name not in value_of:
            continue
        value = value_of[out.name]
        if is_grad:
            backward_outputs.append(value)
        else:
            forward_outputs.append(value)
            if isinstance(desc, aot_desc.PlainAOTOutput):
                user_outputs.append(value)
    return (tuple(dict.fromkeys(forward_outputs)), tuple(dict.fromkeys(user_outputs)),
            tuple(dict.fromkeys(backward_outputs)), num_fwd_outputs)
