"""Which aten ops eager PyTorch runs in each module, and how they line up with the captured graph.

Why: the eager runtime's selective-checkpoint policy sees dispatcher-level aten ops (what a
`TorchDispatchMode` sees below autograd) while the plan is made on the captured joint graph
(functionalized aten). Most ops are the same overloads in the same order, some are not (on CPU,
eager dropout is ``empty_like``, ``bernoulli_``, ``div_``, ``mul`` where the graph has one
``native_dropout``). A policy names an op by (overload, index of its call within the region),
exactly as `torch.utils.checkpoint` counts them; a graph value is *mappable* in a region when its
overload is called as often in eager as in the graph there, so the i-th call is the i-th value.
Unmappable values are simply recomputed (checkpoint keeps gradients right whatever the policy
says), and the planner knows it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import weakref
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.checkpoint import SAC_IGNORED_OPS

from frontends.capture.costed_capture import capture_with_costs
from frontends.capture.step import CapturedStep
from frontends.eager_runtime.eager_checkpoint import (
    EAGER_BATCH_NORMS,
    NOMINAL_CHECKPOINT_CALL_S,
    NOMINAL_POLICY_OP_S,
    RegionPolicy,
    checkpoint_call_seconds,
    counting_batch_norms,
    is_in_place,
    keeps_only_batch_norm_counters,
    policy_op_seconds,
)
from frontends.guards.forward_guards import ForwardGuard
from frontends.torch_compat import TorchDispatchMode, tree_leaves
from solvers.ir.graph import Phase, RematGraph
from solvers.planning.eager_plan import (
    STATISTICS_OP,
    RegionCandidate,
    RegionOption,
    region_inputs_of,
    with_autograd_node_holds,
    within,
)


def capture_for_eager(model: torch.nn.Module, args: tuple, kwargs: dict | None,
                      cost_model: str = "auto", grad_outputs: str = "losses",
                      python_side_effects: str | None = None) -> CapturedStep:
    """`frontends.capture.costed_capture.capture_with_costs`, without the graph runtime's RNG-state
    values: eager checkpoint replays the generator itself, so they have no eager counterpart."""
    return capture_with_costs(model, tuple(args), kwargs, cost_model, grad_outputs, python_side_effects,
                              replay_random=False)


@dataclass(frozen=True)
class EagerTrace:
    """Forward aten ops of one eager call of the model, with the module stack of each."""

    ops: tuple[tuple[str, tuple[str, ...]], ...]
    """(overload name, paths of the modules running it, outermost first)."""
    calls: dict[str, int]
    """Module path -> times its forward ran."""
    alive_at_return: dict[str, tuple[tuple[str, int], ...]] = dataclasses.field(default_factory=dict)
    """Module path -> (overload, call index within the module) of the outputs its forward still
    held when its last op ran (Python locals, its return value); autograd's saved tensors aside."""
    forward_s: dict[str, float] = dataclasses.field(default_factory=dict)
    """Module path -> seconds its forward takes with grad on (`region_timing.time_module_forwards`),
    measured when the graph is priced in measured time; empty otherwise."""
    mutated: frozenset[int] = frozenset()
    """Indices in ``ops`` of the ops whose output a later in-place op writes (``relu_`` after a
    convolution): a policy may not keep them (SAC refuses a cached tensor that was mutated)."""
    arguments: dict[str, tuple[tuple[int, int, int], ...]] = dataclasses.field(default_factory=dict)
    """Module path -> the tensors its call received (args and kwargs) that forward ops made (not
    parameters, buffers or the step's inputs), one per storage: (index in ``ops`` of the op that
    made it, which of the op's new storages, its bytes). A checkpoint of the module holds them."""

    def region_ops(self, path: str) -> list[str]:
        return [op for op, stack in self.ops if path in stack]

    @property
    def overloads(self) -> frozenset[str]:
        return frozenset(op for op, _ in self.ops)


def eager_op_name(graph: RematGraph, name: str, overloads: frozenset[str]) -> str:
    """The overload eager calls for graph value ``name``: its own, except for functionalized
    state updates: batch norm's functional form, and a buffer update (``num_batches_tracked +
    1``, captured as ``add``) that eager runs in place (``add_``)."""
    op = graph[name].op
    if op == "aten._native_batch_norm_legit_functional.default":
        return next((e for e in EAGER_BATCH_NORMS if e in overloads), op)
    if graph[name].mutates and name in graph.forward_outputs and name not in graph.user_outputs:
        base, _, overload = op.rpartition(".")
        if base.startswith("aten.") and not base.endswith("_") and f"{base}_.{overload}" in overloads:
            return f"{base}_.{overload}"
    return op


class _Recorder(TorchDispatchMode):
    """Records each op with its module stack, and when each of its output storages dies (the
    number of ops recorded by then; None while alive)."""

    def __init__(self, stack: list[str], out: list, deaths: list) -> None:
        super().__init__()
        self.stack, self.out, self.deaths = stack, out, deaths
        self.keep: list = []
        self.made: dict[int, tuple[weakref.ref, int, int]] = {}
        """id of a storage an op made -> (weak reference, index in ``out``, which new storage)."""
        self.mutated: set[int] = set()
        """Indices in ``out`` of ops whose output a later in-place op wrote."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func not in SAC_IGNORED_OPS:
            if is_in_place(str(func)) and args and isinstance(args[0], torch.Tensor):
                written = self.maker(args[0].untyped_storage())
                if written is not None:
                    self.mutated.add(written[0])
            self.out.append((str(func), tuple(self.stack)))
            inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor)}
            slots = []
            for t in tree_leaves(result):
                if isinstance(t, torch.Tensor) and t.device.type != "meta" \
                        and id(t.untyped_storage()) not in inputs:
                    slot = [None]
                    storage = t.untyped_storage()
                    self.keep.append(weakref.ref(storage, partial(self._died, slot)))
                    self.made[id(storage)] = (weakref.ref(storage), len(self.out) - 1, len(slots))
                    slots.append(slot)
            self.deaths.append(slots)
        return result

    def maker(self, storage: torch.UntypedStorage) -> tuple[int, int] | None:
        """(op index, which new storage) of the op that made ``storage``; None when no op did."""
        made = self.made.get(id(storage))
        return made[1:] if made is not None and made[0]() is storage else None

    def _died(self, slot: list, _ref: object) -> None:
        slot[0] = len(self.out)


def _not_kept(_tensor: torch.Tensor) -> None:
    return None


def _never_unpacked(_packed: None) -> torch.Tensor:
    raise RuntimeError("remat-opt's eager trace and timing run no backward")


def trace_eager(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> EagerTrace:
    """Run one forward (grad enabled, as training does) and record its ops per module.

    The model is left as found: RNG states are forked, buffers (BatchNorm statistics) restored."""
    paths = {id(m): p for p, m in model.named_modules()}
    stack: list[str] = []
    calls: Counter[str] = Counter()
    ops: list = []

    def pre(module, _args):
        path = paths.get(id(module))
        if path is not None:
            stack.append(path)
            calls[path] += 1

    def post(module, _args, _out):
        if paths.get(id(module)) is not None and stack:
            stack.pop()

    deaths: list[list] = []
    starts: list[int] = []
    alive: dict[str, tuple[tuple[str, int], ...]] = {}

    def pre_alive(module, _args):
        if paths.get(id(module)) is not None:
            starts.append(len(ops))

    def post_alive(module, _args, _out):
        path = paths.get(id(module))
        if path is None or not starts:
            return
        begin, end = starts.pop(), len(ops)
        counter: Counter[str] = Counter()
        held = []
        for (op, _stack), slots in zip(ops[begin:], deaths[begin:]):
            if any(slot[0] is None or slot[0] >= end for slot in slots):
                held.append((op, counter[op]))
            counter[op] += 1
        alive.setdefault(path, tuple(held))

    recorder = _Recorder(stack, ops, deaths)
    arguments: dict[str, tuple[tuple[int, int, int], ...]] = {}

    def received(module, call_args, call_kwargs):
        path = paths.get(id(module))
        if path is None or path in arguments:
            return
        got: dict[tuple[int, int], int] = {}
        for t in tree_leaves((call_args, call_kwargs)):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                made = recorder.maker(t.untyped_storage())
                if made is not None:
                    got[made] = t.untyped_storage().nbytes()
        arguments[path] = tuple((index, slot, nbytes) for (index, slot), nbytes in got.items())

    handles = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
               torch.nn.modules.module.register_module_forward_pre_hook(pre_alive),
               torch.nn.modules.module.register_module_forward_hook(post_alive),
               torch.nn.modules.module.register_module_forward_hook(post)]
    handles += [m.register_forward_pre_hook(received, with_kwargs=True) for m in model.modules()]
    try:
        with forwards_left_as_found(model, args, kwargs), recorder:
            out = model(*args, **(kwargs or {}))
        del out
    finally:
        for h in handles:
            h.remove()
    return EagerTrace(ops=tuple(ops), calls=dict(calls), alive_at_return=alive, mutated=frozenset(recorder.mutated),
                      arguments={p: a for p, a in arguments.items() if a})


@contextlib.contextmanager
def model_left_as_found(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> Iterator[None]:
    """Within: the model may run forwards and backwards; on exit it is as found: the RNG streams
    were forked, the buffers (BatchNorm statistics) are restored, and so is what a forward changes
    in Python (a step counter, module-level variables, hooks it registers:
    `ForwardGuard.restore`, as capture does)."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    python_state = ForwardGuard(model, tuple(args), dict(kwargs or {}))
    try:
        with torch.random.fork_rng(devices=step_cuda_devices(model, args)):
            yield
    finally:
        python_state.restore()
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])


@contextlib.contextmanager
def forwards_left_as_found(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> Iterator[None]:
    """Within: training forwards (grad on) whose saved tensors are dropped as they are made (no
    backward runs, and no more memory is held than inference holds); on exit the model is as
    found (`model_left_as_found`), which with ``python_side_effects="ignore"`` the planning
    forwards would otherwise move."""
    with model_left_as_found(model, args, kwargs), torch.enable_grad(), \
            torch.autograd.graph.saved_tensors_hooks(_not_kept, _never_unpacked):
        yield


def step_cuda_devices(model: torch.nn.Module, args: tuple) -> list[int]:
    """CUDA devices the step may draw random numbers on (their generators are forked too)."""
    tensors = [*model.parameters(), *model.buffers(), *(a for a in tree_leaves(args) if isinstance(a, torch.Tensor))]
    return sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})


def eager_graph(graph: RematGraph, gm: torch.fx.GraphModule, on_cpu: bool) -> RematGraph:
    """The graph as eager autograd runs it: each backward formula frees what it read when it
    returns (`with_autograd_node_holds`, Nodes from the captured ops' ``seq_nr``); a batch norm's
    new running statistics are their own values (`split_batch_norm_statistics`); on CPU, eager
    dropout keeps a mask of the input's dtype (``bernoulli_`` into ``empty_like``), not the
    fused kernel's bool mask. Nothing runs in place by the graph runtime's rule
    (`solvers.ir.inplace`): eager autograd accumulates gradients by rules of its own, which the
    graph without ``reuses`` matches (predicted = measured on the examples)."""
    autograd_node = {n.name: n.meta["seq_nr"] for n in gm.graph.nodes if n.meta.get("seq_nr") is not None}
    if any(n.reuses for n in graph.ops):
        graph = RematGraph(tuple(dataclasses.replace(n, reuses=()) if n.reuses else n for n in graph.nodes),
                           graph.forward_outputs, graph.user_outputs, graph.backward_outputs,
                           graph.cost_model, graph.name)
    graph = split_batch_norm_statistics(with_autograd_node_holds(graph, autograd_node))
    if not on_cpu:
        return graph
    nodes = list(graph.nodes)
    changed = False
    for members in graph.groups.values():
        first = graph[members[0]]
        if first.op.startswith("aten.native_dropout") and len(members) == 2:
            mask = graph.position(members[1])
            if nodes[mask].bytes != first.bytes:
                nodes[mask] = dataclasses.replace(nodes[mask], bytes=first.bytes)
                changed = True
    if not changed:
        return graph
    return RematGraph(tuple(nodes), graph.forward_outputs, graph.user_outputs,
                      graph.backward_outputs, graph.cost_model, graph.name)


def split_batch_norm_statistics(graph: RematGraph) -> RematGraph:
    """``_native_batch_norm_legit_functional`` returns (out, mean, rstd, new running mean, new
    running var); the eager runtime reruns batch norm with its statistics frozen
    (`eager_checkpoint._FrozenStatistics`), so a rerun makes the first three again and leaves
    the statistics as forward made them: the last two become a group of their own,
    `STATISTICS_OP`, computed once in forward and free of cost."""
    nodes = list(graph.nodes)
    changed = False
    for members in graph.groups.values():
        first = graph[members[0]]
        if first.op == "aten._native_batch_norm_legit_functional.default" and len(members) == 5:
            for name in members[3:]:
                i = graph.position(name)
                nodes[i] = dataclasses.replace(nodes[i], group=f"{members[3]}::statistics",
                                               op=STATISTICS_OP, cost=0.0, flops=0.0)
            changed = True
    if not changed:
        return graph
    return RematGraph(tuple(nodes), graph.forward_outputs, graph.user_outputs,
                      graph.backward_outputs, graph.cost_model, graph.name)


def region_keys(graph: RematGraph, path: str, overloads: frozenset[str] = frozenset()) -> dict[str, tuple[str, int]]:
    """First value of each forward op group in the region -> (the overload eager calls for it,
    index among its calls); ``overloads``: those the eager trace saw (`eager_op_name`)."""
    counter: Counter[str] = Counter()
    keys: dict[str, tuple[str, int]] = {}
    for members in graph.groups.values():
        first = graph[members[0]]
        if first.phase is Phase.FORWARD and within(first.module, path):
            op = eager_op_name(graph, members[0], overloads)
            keys[members[0]] = (op, counter[op])
            counter[op] += 1
    return keys


def region_policy(choice: RegionOption, graph: RematGraph, trace: EagerTrace,
                  mappable: frozenset[str]) -> RegionPolicy:
    """The runtime's policy for one planned region: the calls (overload, index) of the values
    ``choice`` keeps that the policy can name (``mappable``), and the calls the region made."""
    keys = region_keys(graph, choice.path, trace.overloads)
    save: dict[str, list[int]] = {}
    for name in choice.saved:
        if name in keys and name in mappable:
            op, index = keys[name]
            save.setdefault(op, []).append(index)
    return RegionPolicy(
        path=choice.path, option=choice.option,
        save=tuple((op, tuple(sorted(idx))) for op, idx in sorted(save.items())),
        expected_ops=tuple(sorted(Counter(trace.region_ops(choice.path)).items())),
        saving_bytes=choice.saving_bytes, extra_flops=choice.extra_flops)


RERUN_SCALE_RANGE = (0.5, 4.0)
"""Bounds on a region's measured eager forward over its ops' priced time (`RegionCandidate.rerun_scale`):
a module of a few microseconds can time far off its ops by noise alone."""


def prices_measured_time(graph: RematGraph) -> bool:
    """Whether the graph's costs are seconds measured on this machine (``device``, ``profile``):
    the eager runtime's own overheads are then measured here too."""
    return graph.cost_model.startswith("device") or graph.cost_model == "profile"


def candidates(graph: RematGraph, trace: EagerTrace, root: torch.nn.Module) -> list[RegionCandidate]:
    """Every submodule called once per step, with the graph values its policy can keep and what
    rerunning it costs beyond its ops. In measured time: `policy_op_seconds` per eager op call
    under a policy, `checkpoint_call_seconds` per checkpoint, and the rerun scaled by the
    module's timed eager forward over its ops' priced time (``trace.forward_s``, one median per
    module class, op sequence and priced time); on a GPU's roofline the nominal figures of this
    host and no scale; priced in FLOPs, nothing."""
    region_ops: dict[str, list[str]] = defaultdict(list)
    calls_so_far: dict[str, Counter[str]] = defaultdict(Counter)
    written: dict[str, set[tuple[str, int]]] = defaultdict(set)  # (overload, call index) mutated later
    for index, (op, stack) in enumerate(trace.ops):
        for path in stack:
            if index in trace.mutated:
                written[path].add((op, calls_so_far[path][op]))
            calls_so_far[path][op] += 1
            region_ops[path].append(op)
    found: list[RegionCandidate] = []
    ratios: dict[tuple, list[tuple[int, float]]] = {}
    measured = prices_measured_time(graph)
    if measured:
        per_op, per_call = policy_op_seconds(), checkpoint_call_seconds()  # the host's own overhead
    elif graph.cost_model.startswith("roofline:"):
        per_op, per_call = NOMINAL_POLICY_OP_S, NOMINAL_CHECKPOINT_CALL_S  # a host like this drives the GPU
    else:
        per_op, per_call = 0.0, 0.0  # FLOPs on a nominal device: no Python to price
    for path, module in root.named_modules():
        if not path or trace.calls.get(path) != 1:
            continue
        keys = region_keys(graph, path, trace.overloads)
        if not keys:
            continue
        eager = Counter(region_ops.get(path, ()))
        graph_counts = Counter(op for op, _ in keys.values())
        mappable = {m for first, (op, index) in keys.items() if eager[op] == graph_counts[op]
                    and (op, index) not in written[path] for m in graph.group_of(first)}
        # A kept in-place state update turns off SAC's mutation check for the region
        # (`eager_checkpoint._policy_contexts`): only safe when it is the region's only kind of
        # in-place call; else its state updates are not mappable and the region is no candidate.
        state_updates = {op for first, (op, _) in keys.items() if is_in_place(op)}
        if any(is_in_place(op) and op not in state_updates for op in eager):
            mappable -= {m for first, (op, _) in keys.items() if op in state_updates
                         for m in graph.group_of(first)}
        counters = tuple((op, tuple(range(n))) for op, n in sorted(eager.items()) if is_in_place(op))
        # A region whose only state updates are one step counter per BatchNorm runs plain
        # checkpoint with the norms frozen on the rerun whatever else it does in place (timm's and
        # torchvision's ResNet blocks: ``relu_``, ``out += identity``), keeping nothing: its
        # counters need not be named (`frontends.eager_runtime.eager_checkpoint.CheckpointedForward`).
        norms = len(counting_batch_norms(module))
        counters_only_updates = norms > 0 and norms == sum(n for op, n in eager.items() if op in EAGER_BATCH_NORMS) \
            == sum(is_in_place(op) for op, _ in keys.values())
        found.append(RegionCandidate(path, frozenset(mappable), policy_s=len(region_ops.get(path, ())) * per_op,
                                     checkpoint_s=per_call, counters_run_plain=counters_only_updates or
                                     keeps_only_batch_norm_counters(module, counters, tuple(sorted(eager.items())))))
        ops_s = sum(graph[first].cost for first in keys)
        if measured and path in trace.forward_s and ops_s > 0:
            kind = (type(module).__qualname__, tuple(region_ops.get(path, ())), f"{ops_s:.6g}")
            ratios.setdefault(kind, []).append((len(found) - 1, trace.forward_s[path] / ops_s))
    # Modules of one class running the same ops at the same priced time (a model's repeated
    # layers) share the median of their ratios: one timed forward each is noisy, and the planner
    # would otherwise prefer whichever layer happened to time faster.
    low, high = RERUN_SCALE_RANGE
    for members in ratios.values():
        scale = min(max(statistics.median(r for _, r in members), low), high)
        for index, _ in members:
            found[index] = dataclasses.replace(found[index], rerun_scale=scale)
    return found


def mapping_summary(graph: RematGraph, trace: EagerTrace, path: str) -> tuple[int, int]:
    """(graph op groups in the region, how many of them line up with eager calls)."""
    keys = region_keys(graph, path, trace.overloads)
    eager = Counter(trace.region_ops(path))
    graph_counts = Counter(op for op, _ in keys.values())
    return len(keys), sum(1 for op, _ in keys.values() if eager[op] == graph_counts[op])


def held_arguments(graph: RematGraph, trace: EagerTrace,
                   found: list[RegionCandidate]) -> dict[str, tuple[tuple[str, object], ...]]:
    """Module path -> the tensors its checkpoint would hold as arguments that its region's reads
    do not cover, for `solvers.planning.eager_plan.with_argument_holds`. An argument is the graph
    value its op makes when that overload runs as often in eager as in the graph's forward (the
    i-th call is the i-th value); else one of the region's inputs of its size; else bytes the graph
    does not have (T5's zero position bias, folded away by the capture). A storage written in
    place after it was made (a norm's output under ``ReLU(inplace=True)``) is matched by size."""
    overloads = trace.overloads
    eager_calls: dict[str, list[int]] = defaultdict(list)  # overload -> its op indices in trace.ops
    for index, (op, _stack) in enumerate(trace.ops):
        eager_calls[op].append(index)
    graph_calls: dict[str, list[str]] = defaultdict(list)  # overload -> first values of its groups
    for members in graph.groups.values():
        if graph[members[0]].phase is Phase.FORWARD:
            graph_calls[eager_op_name(graph, members[0], overloads)].append(members[0])
    value_of: dict[tuple[int, int], str] = {}
    for op, indices in eager_calls.items():
        if len(indices) == len(graph_calls.get(op, ())):
            for index, first in zip(indices, graph_calls[op]):
                for slot, member in enumerate(graph.group_of(first)):
                    value_of[(index, slot)] = member
    out: dict[str, tuple[tuple[str, object], ...]] = {}
    for cand in found:
        inputs = region_inputs_of(graph, cand.path)
        unclaimed = sorted(inputs, key=graph.position)
        held: list[tuple[str, object]] = []
        for index, slot, nbytes in trace.arguments.get(cand.path, ()):
            # written in place after its op made it (``relu_``): the argument is what the last
            # write made, one of the region's inputs by size, not the op's own value
            value = value_of.get((index, slot)) if index not in trace.mutated else None
            if value is not None and value in graph:
                if value in unclaimed:
                    unclaimed.remove(value)
                else:
                    held.append(("value", value))
                continue
            same = next((v for v in unclaimed if graph[v].bytes == nbytes), None)
            if same is not None:
                unclaimed.remove(same)
            else:
                held.append(("bytes", ((index, slot), nbytes)))
        if held:
            out[cand.path] = tuple(held)
    return out


def held_values(graph: RematGraph, trace: EagerTrace, found: list[RegionCandidate]) -> dict[str, tuple[str, ...]]:
    """Module path -> the graph values its forward still holds when it returns (mappable ones),
    for `solvers.planning.eager_plan.with_holds`."""
    holds: dict[str, tuple[str, ...]] = {}
    for cand in found:
        keys = {key: name for name, key in region_keys(graph, cand.path, trace.overloads).items()}
        held = []
        for key in trace.alive_at_return.get(cand.path, ()):
            name = keys.get(key)
            if name is not None and name in cand.mappable:
                held.extend(graph.group_of(name))
        if held:
            holds[cand.path] = tuple(dict.fromkeys(held))
    return holds
