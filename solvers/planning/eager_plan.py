"""Plan for the eager runtime: which module subtrees to wrap in ``torch.utils.checkpoint``, and
which of their ops a selective-checkpoint policy keeps.

Why a planner of its own: the graph runtime (`solvers.planning.planner`) may recompute any
value at any step, but a user who keeps their own ``nn.Module`` and lets
``torch.utils.checkpoint`` run the plan gets a narrower family of schedules. A *region* is a
module subtree whose forward ops are one contiguous segment. Executing a region with saved set S:
forward runs every op once, keeps S (cached by the policy), the values backward ops outside the
region read, and the region's inputs; the rest is freed by the end of the region. When the
region's backward starts (the first unpack of a tensor it saved), its forward runs again, once:
every op up to the last one whose output its backward reads, except the ops in S. Regions not
chosen keep everything, as plain autograd does.

Each candidate plan is written as an IR `Schedule` and checked with `simulate`: the simulator is
the oracle for its peak; the extra cost is what the eager runtime reruns (a superset of what the
schedule needs, see `RegionOption.recompute_groups`). The choice of regions and saved sets is a
multiple-choice knapsack over the module tree (saved bytes at the boundary are additive over
disjoint regions, so is recomputation), solved exactly on a Pareto front; the simulator then
confirms the cheapest selection that fits. The same front gives a lower bound valid for the whole
family: every plan whose boundary is over the budget is infeasible.

A split MLP (``split_mlp``, `frontends.eager_runtime.eager_split`) adds, below the MLP, one region per row
chunk with one option, `CHUNKED` (its own checkpoint), chosen for all chunks of the MLP at once.

Pure Python over the IR: no torch.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from solvers.base import InfeasibleBudgetError
from solvers.baselines import store_all_schedule
from solvers.ir.budget import resolve_budget
from solvers.ir.graph import Node, NodeKind, Phase, RematGraph
from solvers.ir.link import Link
from solvers.ir.plan import Plan
from solvers.ir.schedule import Schedule, Step, StepKind, free, offload
from solvers.ir.simulator import SimulationResult, simulate
from solvers.offload_placement import emit_copies, value_reads
from solvers.planning.planner import breakdown, module_summaries

OPTIONS = ("none", "matmuls", "every-matmul", "all")
"""Saved sets tried per region: nothing (plain checkpointing); the outputs of matmul-like ops
that backward reads; every matmul-like output, read by backward or not (what a hand-written
"save matmuls" SAC policy keeps: attention's score ``bmm`` is read only to recompute the softmax
after it, so keeping it turns that recomputation from a matmul into a pointwise op, for its
bytes); every value the runtime can keep."""

BEST_PER_BYTE = "best-per-byte-"
"""Prefix of the options that keep the k ops sparing the most rerun time per byte
(`RegionModel._rerun_time_per_byte_chain`): ``best-per-byte-3`` keeps the three best, whatever
their kind (attention's output first on a transformer layer: the most time per byte of all)."""

MAX_CHAIN = 24
"""Longest such chain per region: beyond it each op spares little and the front only grows."""

MATMUL_OPS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten.convolution.",
              "aten._scaled_dot_product", "aten._flash_attention", "aten._efficient_attention")

LOCAL_SEARCH_S = 10.0
"""Longest the local search after the front's first fitting selection runs (within the time
limit)."""

LEANEST_TRIES = 40
"""Selections simulated to name the smallest budget the family reaches when none fits."""

FRONT_SIZE = 400
"""Pareto points kept per module of the tree (thinned evenly by saved bytes beyond it)."""

CHUNKED = "chunk"
"""Option of a row chunk of a split MLP (``split_mlp``): its own checkpoint, keeping nothing.
Chosen for all chunks of one MLP together (`RegionModel.chunk_groups`: the runtime checkpoints
an MLP's chunks or not); not chosen, the chunks run one after the other with nothing freed, as
the unsplit MLP. A checkpointed region around the MLP reruns them inside its own checkpoint."""


OFFLOAD = "offload"
"""Option of a region whose saved tensors go to host memory and come back when its backward
starts (`frontends.eager_runtime.eager_offload`): forward runs once, nothing is recomputed, and
the copies cost link time; the copy back waits in full. Offered with a `Link` (``offload="auto"``)."""
OFFLOAD_PREFETCH = "offload-prefetch"
"""As `OFFLOAD`, but the values come back early: when the backward of the next offloaded region
(in forward order) starts, so that region's backward hides the copy, at the cost of holding both
regions' values then."""
OFFLOADS = (OFFLOAD, OFFLOAD_PREFETCH)


def chunk_group(path: str) -> str:
    """The MLP chunk group (``blocks.0.mlp.<chunks>``) of a `chunk_path`; its MLP is
    ``chunk_group(p).removesuffix(".<chunks>")``."""
    return path.rsplit(".<", 1)[0] + ".<chunks>"


def chunk_path(mlp: str, index: int) -> str:
    """The pseudo-module path of row chunk ``index`` of the split MLP ``mlp``: the frontend
    labels the chunk's forward and backward values with it (``blocks.0.mlp.<1>.0``), so the
    chunk is a region below the MLP and every region around it."""
    return f"{mlp}.<{index}>"


@dataclass(frozen=True)
class RegionCandidate:
    """A module the eager runtime can wrap, as the frontend found it."""

    path: str
    mappable: frozenset[str]
    """IR values whose op the runtime recognises in the eager op stream of this region (same
    overload, same call index), so its policy can keep them (MUST_SAVE)."""
    policy_s: float = 0.0
    """What running the region's forward once under a selective-checkpoint policy adds (its ops
    go through a Python dispatch mode); charged, forward plus rerun, to every option that keeps
    something (a region that keeps nothing runs plain ``checkpoint``, without the mode)."""
    checkpoint_s: float = 0.0
    """What one ``checkpoint`` call around the region adds beyond its ops (its hooks and frames);
    charged to every option that recomputes something."""
    rerun_scale: float = 1.0
    """The region's eager forward time over its ops' priced time: an eager rerun also runs the
    module's Python and records autograd's graph, which the ops, each timed alone, leave out."""
    measured_s: tuple[tuple[str, float, float], ...] = ()
    """(option, seconds, standard error): what its checkpoint with that saved set added to the
    region's forward and backward, timed alone on this device (`with_measured_options`): the
    option's price, in place of the rerun, call and policy terms above, where it is clearly off them."""
    counters_run_plain: bool = False
    """The region's only state updates are its BatchNorms' step counters: a saved set of nothing
    but them runs as plain ``checkpoint`` (the runtime freezes the norms by attribute on the
    rerun), so it pays no policy. Where the policy cannot name the counters (other in-place ops
    in the region), that is the region's only saved set."""
    arguments: tuple[str, ...] = ()
    """Graph values the module's call receives that its region does not read (`with_argument_holds`):
    its checkpoint holds them with its inputs, until its frame dies."""


@dataclass(frozen=True)
class RegionOption:
    """One region executed with one saved set, costed over the IR."""

    path: str
    option: str
    saved: tuple[str, ...]
    """Values the policy keeps (whole op groups)."""
    dropped: tuple[str, ...]
    """Values backward reads that forward frees and the region's backward recomputes."""
    recompute_groups: tuple[str, ...]
    """First value of every op group the eager runtime reruns (in forward order)."""
    saving_bytes: int
    """Bytes no longer held from forward into backward."""
    extra_cost: float
    extra_flops: float
    offloaded: tuple[str, ...] = ()
    """`OFFLOAD`: values that leave the device whatever else is chosen (only the region's backward
    reads them); a value several offloaded regions read leaves it too (`RegionModel._with_copies`)."""
    packed: tuple[str, ...] = ()
    """`OFFLOAD`: every value the region's saved-tensor hooks copy to host (``offloaded`` and those
    something outside the region keeps on the device); the first backward read of one starts the
    region's reloads."""


@dataclass(frozen=True)
class EagerSolution:
    """The planner's answer: chosen regions, the schedule the simulator checked, and why."""

    choices: tuple[RegionOption, ...]
    schedule: Schedule
    simulation: SimulationResult
    store_all: SimulationResult
    budget_bytes: int
    extra_cost: float
    extra_flops: float
    bound: float | None
    """Least extra cost any plan of this family can have under the budget (see module doc)."""
    status: str
    solve_time_s: float
    message: str
    graph: RematGraph | None = None
    """The graph ``schedule`` runs on: the planned one with the chosen regions' random ops replayable."""
    link: Link | None = None
    """The link the plan's copies were priced on (None: it offloads nothing)."""


def replayable_graph(graph: RematGraph, values: Iterable[str]) -> RematGraph:
    """``graph`` with the random ops among ``values`` recomputable: non-reentrant checkpoint
    stashes and replays the RNG state, so a region's dropout reruns bit for bit."""
    names = set(values)
    if not any(graph[n].random for n in names if n in graph):
        return graph
    nodes = tuple(dataclasses.replace(n, random=False, rng_state="") if n.name in names and n.random
                  else n for n in graph.nodes)
    return RematGraph(nodes, graph.forward_outputs, graph.user_outputs, graph.backward_outputs,
                      graph.cost_model, graph.name)


STATISTICS_OP = "eager.batch_norm_statistics"
"""Running statistics a batch norm updates in forward, as a value of their own: the eager
runtime reruns batch norm with its statistics frozen, so they are made once, in forward, and a
region may recompute the batch norm itself."""

HOLD = "eager_hold::"
REHOLD = "eager_rehold::"


def with_holds(graph: RematGraph, holds: Mapping[str, Sequence[str]]) -> RematGraph:
    """``graph`` with what eager Python frames hold: ``holds[path]`` are the values the module's
    forward still references (its locals) when it returns, so they live to its end.

    Two zero-byte nodes per module model it: ``eager_hold::path`` (run once, in forward, right
    after the module's last op) reads them; ``eager_rehold::path`` reads the ones a checkpoint
    recomputation reruns, and is read by the module's first backward op: a schedule computes it
    in forward when the module is not checkpointed, and at the end of its recomputation when it
    is (`RegionModel.schedule`), so the values live until the recomputation stops."""
    holds = {p: tuple(v for v in vs if v in graph) for p, vs in holds.items()}
    holds = {p: vs for p, vs in holds.items() if vs}
    if not holds:
        return graph
    forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
    order = {v: i for i, v in enumerate(forward)}
    after: dict[str, list[Node]] = {}
    reader_extra: dict[str, set[str]] = {}
    backward_groups = [m for m in graph.groups.values() if graph[m[0]].phase is Phase.BACKWARD]
    for path in sorted(holds, key=lambda p: -p.count(".")):
        values = [v for v in forward if within(graph[v].module, path)]
        if not values:
            continue
        inside = [v for v in values if any(
            graph[u].phase is Phase.BACKWARD and within(graph[u].module, path)
            for u in graph.users[v])]
        last = max((order[v] for v in inside), default=-1)
        held = tuple(sorted(holds[path], key=order.__getitem__))
        rehold = tuple(v for v in held if order[v] <= last)
        first_bw = next((m for m in backward_groups if within(graph[m[0]].module, path)), None)
        anchor = max(values, key=order.__getitem__)
        nodes = [Node(f"{HOLD}{path}", NodeKind.OP, Phase.FORWARD, 0, held, group=f"{HOLD}{path}",
                      mutates=True, module=path, op="eager.hold")]
        if rehold and first_bw is not None:
            nodes.append(Node(f"{REHOLD}{path}", NodeKind.OP, Phase.FORWARD, 0, rehold,
                              group=f"{REHOLD}{path}", module=path, op="eager.rehold"))
            for m in first_bw:
                reader_extra.setdefault(m, set()).add(f"{REHOLD}{path}")
        after.setdefault(anchor, []).extend(nodes)
    out: list[Node] = []
    for node in graph.nodes:
        if node.name in reader_extra:
            node = dataclasses.replace(node, inputs=(*node.inputs, *sorted(reader_extra[node.name])))
        out.append(node)
        out.extend(after.get(node.name, ()))
    return RematGraph(tuple(out), graph.forward_outputs, graph.user_outputs,
                      graph.backward_outputs, graph.cost_model, graph.name)


ARGUMENT = "eager_argument::"


def inputs_from_outside(graph: RematGraph, values: set[str]) -> frozenset[str]:
    """Forward op values not among ``values`` that ``values``' ops read."""
    return frozenset(i for v in values for i in graph[v].inputs
                     if i not in values and graph[i].is_op and graph[i].phase is Phase.FORWARD)


def region_inputs_of(graph: RematGraph, path: str) -> frozenset[str]:
    """Forward op values from outside module ``path`` that its forward ops read."""
    return inputs_from_outside(graph, {n.name for n in graph.ops
                                       if n.phase is Phase.FORWARD and within(n.module, path)})


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _common_module(paths: Iterable[str]) -> str:
    parts = [p.split(".") if p else [] for p in paths]
    common = []
    for names in zip(*parts):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    return ".".join(common)


def with_argument_holds(graph: RematGraph, arguments: Mapping[str, Sequence[tuple[str, object]]],
                        ) -> tuple[RematGraph, dict[str, tuple[str, ...]]]:
    """What a module's checkpoint holds as its arguments: non-reentrant ``checkpoint`` keeps the
    call's args and kwargs until its frame dies (`_frame_end`), and `RegionModel` holds a
    region's inputs that long. ``arguments[path]`` names the tensors the module's call received
    that the region's own reads do not cover:

    * ``("value", name)``: a graph value passed but not read inside (an unused mask);
    * ``("bytes", (key, nbytes))``: a tensor eager makes that the captured graph does not have
      (T5's zero position bias, which the capture folds away, passed to every later
      cross-attention layer: 32 KiB held by each such checkpoint, unseen before). One value of
      ``nbytes`` per ``key`` (one storage, however many modules receive it) is added, costing
      nothing and read by no op of the step: a zero-byte reader right after it, run once,
      frees it there (both are holds, `is_hold`: in no region's values). They go right before
      the first receiver's enclosing module below the receivers' common parent, labelled with
      that parent: outside every receiver, and no module's forward stops being contiguous.

    Returns the graph and, per module, the values its checkpoint holds beside its region's inputs
    (`RegionCandidate.arguments`). Not read by an op, they do not become inputs of the regions
    that share the receiver's first op (a layer's first norm)."""
    forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
    order = {v: i for i, v in enumerate(forward)}
    first_op: dict[str, str] = {}
    for v in forward:
        module = graph[v].module
        for path in arguments:
            if path not in first_op and within(module, path) and not is_hold(v):
                first_op[path] = v
    held: dict[str, list[str]] = {}
    receivers: dict[object, list[str]] = {}
    sizes: dict[object, int] = {}
    for path, items in arguments.items():
        if path not in first_op:
            continue
        for kind, what in items:
            if kind == "value" and what in order and order[what] < order[first_op[path]]:
                held.setdefault(path, []).append(what)
            elif kind == "bytes":
                key, nbytes = what
                receivers.setdefault(key, []).append(path)
                sizes[key] = nbytes
    before: dict[str, list[Node]] = {}
    for i, (key, paths) in enumerate(receivers.items()):
        paths.sort(key=lambda p: order[first_op[p]])
        label = _common_module(_parent(p) for p in paths)
        depth = label.count(".") + 1 if label else 0
        anchor_path = ".".join(paths[0].split(".")[:depth + 1])
        anchor = next(v for v in forward if within(graph[v].module, anchor_path))
        name = f"{ARGUMENT}{i}"
        before.setdefault(graph.group_of(anchor)[0], []).extend((
            Node(name, NodeKind.OP, Phase.FORWARD, sizes[key], (), group=name, module=label,
                 op="eager.argument"),
            # a zero-byte reader right after it: schedules free the value there, a free that a
            # checkpoint holding it moves to its frame's end (`_held_by_checkpoints`)
            Node(f"{name}.read", NodeKind.OP, Phase.FORWARD, 0, (name,), group=f"{name}.read",
                 mutates=True, module=label, op="eager.argument")))
        for p in paths:
            held.setdefault(p, []).append(name)
    holds = {p: tuple(dict.fromkeys(vs)) for p, vs in held.items()}
    if not before:
        return graph, holds
    out: list[Node] = []
    for node in graph.nodes:
        out.extend(before.get(node.name, ()))
        out.append(node)
    return RematGraph(tuple(out), graph.forward_outputs, graph.user_outputs,
                      graph.backward_outputs, graph.cost_model, graph.name), holds


NODE_HOLD = "eager_node::"


def with_autograd_node_holds(graph: RematGraph, autograd_node: Mapping[str, object]) -> RematGraph:
    """``graph`` with eager autograd's release points: the engine runs each backward formula
    (``MulBackward0``: both input gradients) as one Node, and frees what it read (its saved
    tensors, its incoming gradient) when the whole formula returns, not after the op that read
    it last, as the captured graph's ops would.

    ``autograd_node`` maps backward values to the id of the autograd Node that makes them (the
    captured ops' ``seq_nr``). One zero-byte op per Node, ``eager_node::<id>``, right after its
    last op, reads what the Node's ops read from outside it, so those values live to its end.
    Only consecutive ops count as one Node: the engine's gradient accumulation (``add`` into an
    input buffer) carries whatever ``seq_nr`` was current, not a Node of its own."""
    runs: list[tuple[object, list[str]]] = []  # consecutive backward ops of one Node
    for node in graph.ops:
        if node.phase is not Phase.BACKWARD:
            continue
        key = autograd_node.get(node.name)
        if runs and key is not None and runs[-1][0] == key:
            runs[-1][1].append(node.name)
        else:
            runs.append((key, [node.name]))
    members = {f"{key}.{i}": names for i, (key, names) in enumerate(runs)
               if key is not None and len(names) > 1}
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    last_reader: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for inp in node.inputs:
            last_reader[inp] = i
    after: dict[str, Node] = {}
    for key, names in members.items():
        inside = set(names)
        end = max(position[n] for n in names)
        reads = tuple(dict.fromkeys(
            i for n in names for i in graph[n].inputs
            if i not in inside and graph[i].is_op and last_reader[i] < end))
        if reads:
            last = graph.nodes[end].name
            after[last] = Node(f"{NODE_HOLD}{key}", NodeKind.OP, Phase.BACKWARD, 0, reads,
                               group=f"{NODE_HOLD}{key}", mutates=True, module=graph[last].module,
                               op="eager.node")
    if not after:
        return graph
    out: list[Node] = []
    for node in graph.nodes:
        out.append(node)
        if node.name in after:
            out.append(after[node.name])
    return RematGraph(tuple(out), graph.forward_outputs, graph.user_outputs,
                      graph.backward_outputs, graph.cost_model, graph.name)


def _held_by_checkpoints(schedule: Schedule, held_until: Mapping[str, tuple[str, bool]]) -> Schedule:
    """``schedule`` with each value a chosen region's checkpoint holds live until ``held_until[v]``
    = (backward op, whether after it): what the region's policy keeps (MUST_SAVE) until the
    recomputation takes it back (before the op that recomputation runs for), the region's inputs
    until the checkpoint's frame dies (after the region's last backward op that reads a tensor
    it saved). Eager holds them whether or not the recomputation or backward reads them (an input
    whose consumer's output is kept is not read again), so a free before that point moves there;
    a later free stays (freeing later is always valid)."""
    if not held_until:
        return schedule
    steps = list(schedule.steps)
    n_forward = len(schedule.forward)
    at = {s.node: i for i, s in enumerate(steps) if s.kind is StepKind.COMPUTE and i >= n_forward}
    moved: dict[int, list[Step]] = {}  # free steps to emit before step index
    drop: set[int] = set()
    for i, step in enumerate(steps):
        if step.kind is not StepKind.FREE or step.node not in held_until:
            continue
        node, after = held_until[step.node]
        if node not in at:
            continue
        target = at[node] + (1 if after else 0)
        if i < target:
            drop.add(i)
            moved.setdefault(target, []).append(step)
    if not drop:
        return schedule
    out: list[Step] = []
    for i, step in enumerate(steps):
        out.extend(moved.get(i, ()))
        if i not in drop:
            out.append(step)
    out.extend(moved.get(len(steps), ()))
    forward_len = n_forward - sum(i < n_forward for i in drop)
    return Schedule(tuple(out[:forward_len]), tuple(out[forward_len:]))


def is_hold(name: str) -> bool:
    return name.startswith((HOLD, REHOLD, NODE_HOLD, ARGUMENT))


def within(module: str, path: str) -> bool:
    return bool(path) and (module == path or module.startswith(path + "."))


class RegionModel:
    """What each candidate region can do on one graph (values, readers, options)."""

    def __init__(self, graph: RematGraph, candidates: Sequence[RegionCandidate],
                 chunked: Sequence[str] = (), link: Link | None = None) -> None:
        self.link = link
        """With a link, every region may also be offloaded (`OFFLOAD`)."""
        self.forward = [n.name for n in graph.ops if n.phase is Phase.FORWARD]
        self.order = {name: i for i, name in enumerate(self.forward)}
        # Ops that update state (a buffer written back, a mutation) must run once, but a
        # checkpoint's recomputation would run them again (BatchNorm's running statistics would
        # be updated twice). A region may hold them only when its policy can keep every one
        # (MUST_SAVE: the recomputation returns the kept outputs and does not rerun the op, so
        # the statistics are updated once); `run_once` values are in every saved set.
        updates = set(graph.forward_outputs) - set(graph.user_outputs)
        run_once = {m for n in graph.ops if n.phase is Phase.FORWARD and not is_hold(n.name)
                    and n.op != STATISTICS_OP
                    and (n.mutates or n.name in updates) for m in graph.group_of(n.name)}
        self.run_once = run_once
        regions: dict[str, tuple[str, ...]] = {}
        self.plain_only: set[str] = set()
        """Regions whose state updates the policy cannot keep but whose plain checkpoint reruns
        them harmlessly (`RegionCandidate.counters_run_plain`): only saved sets the policy would
        not name a value of (it would run and rerun the counters a second time) are offered."""
        for cand in candidates:
            values = tuple(v for v in self.forward if within(graph[v].module, cand.path))
            if not values or not self._contiguous(values):
                continue
            if not run_once.intersection(values) <= cand.mappable:
                if not cand.counters_run_plain:
                    continue
                self.plain_only.add(cand.path)
            regions[cand.path] = tuple(v for v in values if not is_hold(v))
        for path in chunked:  # row chunks of split MLPs (`chunk_path`): regions of their own
            values = tuple(v for v in self.forward if within(graph[v].module, path) and not is_hold(v))
            if not values or not self._contiguous(values) or run_once.intersection(values):
                raise ValueError(f"row chunk {path!r} of a split MLP is not one contiguous, rerunnable "
                                 "segment of the forward: it cannot be planned as its own checkpoint")
            regions[path] = values
        everything = {v for values in regions.values() for v in values}
        self.reholds = {p: f"{REHOLD}{p}" for p in regions if f"{REHOLD}{p}" in graph}
        self.graph = replayable_graph(graph, everything)
        self.regions = regions
        self.mappable = {c.path: c.mappable for c in candidates if c.path in regions}
        self.policy_s = {c.path: c.policy_s for c in candidates if c.path in regions}
        self.checkpoint_s = {c.path: c.checkpoint_s for c in candidates if c.path in regions}
        self.rerun_scale = {c.path: c.rerun_scale for c in candidates if c.path in regions}
        self.counters_run_plain = {c.path: c.counters_run_plain for c in candidates if c.path in regions}
        self.arguments = {c.path: c.arguments for c in candidates if c.path in regions}
        self.measured_s = {c.path: {o: (t, e) for o, t, e in c.measured_s} for c in candidates if c.path in regions}
        self._inputs: dict[str, frozenset[str]] = {}  # `region_inputs`, per region
        self._frame_ends: dict[str, str | None] = {}  # `_frame_end`, per region
        g = self.graph
        self.backward_readers: dict[str, list[Node]] = {v: [] for v in self.forward}
        for node in g.ops:
            if node.phase is Phase.BACKWARD:
                for inp in dict.fromkeys(node.inputs):
                    if inp in self.backward_readers:
                        self.backward_readers[inp].append(node)
        self.pinned = {n.name for n in g.nodes if not n.is_op}
        self.pinned |= set(g.forward_outputs) | set(g.user_outputs)
        for name in g.user_outputs:
            if g[name].is_op:
                self.pinned.update(g.group_of(name))
        groups: dict[str, list[RegionOption]] = {}
        for path in chunked:
            groups.setdefault(chunk_group(path), []).append(self._chunk_option(path))
        self.chunk_groups = {g: tuple(opts) for g, opts in groups.items()}
        """`chunk_group` of each split MLP -> its chunks' options: chosen all together or not at all."""
        self.options = {path: self._options(path) for path in regions if path not in chunked}
        choosable = {v for path, options in self.options.items() if options for v in regions[path]}
        choosable.update(v for path in chunked for v in regions[path])
        head: list[str] = []
        for node in g.ops:
            if node.phase is Phase.BACKWARD:
                if choosable.intersection(node.inputs):
                    break
                head.append(node.name)
        self.backward_head = frozenset(head)
        """Backward ops that run before any region that has an option reads one of its values, so
        before any recomputation: there every selection holds store-all's live bytes less its
        saving."""

    def complete(self, choices: Iterable[RegionOption]) -> tuple[RegionOption, ...]:
        """``choices`` with every chunk of an MLP one of whose chunks is chosen, without those a
        chosen region covers."""
        choices = tuple(choices)
        chosen = tuple(c for c in choices if c.option != CHUNKED)
        groups = {chunk_group(c.path) for c in choices if c.option == CHUNKED}
        return chosen + tuple(o for g in sorted(groups) for o in self.chunk_groups[g]
                              if not any(within(o.path, c.path) for c in chosen))

    def _chunk_option(self, path: str) -> RegionOption:
        """A row chunk under a checkpoint that keeps nothing. Its recomputation reruns every op
        up to the last one that saves a tensor for backward (one backward reads, or one it
        makes): checkpoint stops once every saved tensor is back, and an op saves its tensors
        after it ran (the down projection saves its input, so it reruns too)."""
        g = self.graph
        values = self.regions[path]
        saved = {v for v in values if self.backward_readers[v]}
        outside_read = {v for v in saved if any(not within(r.module, path) for r in self.backward_readers[v])}
        kept = outside_read | (self.pinned & set(values))
        dropped = tuple(v for v in values if v in saved and v not in kept)

        def saves(v: str) -> bool:
            return v in saved or any(any(g[u].phase is Phase.BACKWARD for u in g.users[i])
                                     for i in g[v].inputs if g[i].kind is not NodeKind.TANGENT)

        last = max((self.order[v] for v in values if saves(v)), default=-1)
        recompute = tuple(v for v in values if self.order[v] <= last and g.group_of(v)[0] == v)
        return RegionOption(
            path=path, option=CHUNKED, saved=(), dropped=dropped, recompute_groups=recompute,
            saving_bytes=sum(g[v].bytes for v in dropped),
            extra_cost=sum(g[v].cost for v in recompute), extra_flops=sum(g[v].flops for v in recompute))

    def rerun_readers(self, path: str) -> set[str]:
        """Values of the region that an op the region's recomputation reruns reads: keeping
        one spares rerunning its op (only worth it for matmuls)."""
        g = self.graph
        values = self.regions[path]
        inside_read = [self.order[v] for v in values
                       if any(within(r.module, path) for r in self.backward_readers[v])]
        last = max(inside_read, default=-1)
        return {i for v in values if self.order[v] <= last for i in g[v].inputs}

    def _contiguous(self, values: tuple[str, ...]) -> bool:
        first, last = self.order[values[0]], self.order[values[-1]]
        return last - first + 1 == len(values)

    def _options(self, path: str) -> list[RegionOption]:
        g = self.graph
        values = self.regions[path]
        mappable = self.mappable[path]
        inside_read = {v for v in values
                       if any(within(r.module, path) for r in self.backward_readers[v])}
        outside_read = {v for v in values
                        if any(not within(r.module, path) for r in self.backward_readers[v])}
        rerun_read = self.rerun_readers(path)
        result: list[RegionOption] = []
        seen: set[tuple[str, ...]] = set()

        measured = self.measured_s[path]
        misses: list[tuple[float, float]] = []  # (measured, modelled), where a measurement replaced the model

        def add(option: str, saved: set[str], reprice: bool = False) -> None:
            made = self._option(path, option, saved, inside_read, outside_read, seen)
            if made is None:
                return
            kept = set(made.saved)
            if path in self.plain_only and (kept & mappable or not kept <= self.run_once):
                return  # a policy would keep something and rerun the counters it cannot name
            seconds, error = measured.get(option, (made.extra_cost, 0.0))
            if abs(seconds - made.extra_cost) > MEASURED_SIGNIFICANCE * error:
                misses.append((seconds, made.extra_cost))
                made = dataclasses.replace(made, extra_cost=seconds)
            elif reprice and misses:
                made = dataclasses.replace(made, extra_cost=_as_measured_beside(made.extra_cost, misses))
            result.append(made)

        for option in OPTIONS:
            saved: set[str] = self.run_once & set(values)
            for v in values:
                if v not in mappable:
                    continue
                matmul = g[v].op.startswith(MATMUL_OPS)
                if option == "every-matmul" and matmul and v in rerun_read:
                    saved.update(g.group_of(v))
                if not self.backward_readers[v]:
                    continue
                if option == "all" or (option in ("matmuls", "every-matmul") and matmul) \
                        or (v in outside_read and v in inside_read):
                    saved.update(g.group_of(v))
            saved &= set(values)
            if not all(m in mappable for v in saved for m in g.group_of(v)):
                saved = {v for v in saved if all(m in mappable for m in g.group_of(v))}
            add(option, saved)
        base = (self.run_once & set(values)) | {v for v in values if v in outside_read and v in inside_read
                                                and all(m in mappable for m in g.group_of(v))}
        # Not timed: priced as the region's timed options measured against their model
        # (`_as_measured_beside`). With the region's `none` measured and the chain modelled
        # alone, keeping two tiny values would look cheaper than keeping nothing.
        for k, saved in enumerate(self._rerun_time_per_byte_chain(path, base, inside_read, outside_read), 1):
            add(f"{BEST_PER_BYTE}{k}", saved, reprice=True)
        if self.link is not None:
            result.extend(self._offload_options(path))
        return [o for o in result if o.saving_bytes > 0]

    def _rerun_time_per_byte_chain(self, path: str, base: set[str], inside_read: set[str],
                                   outside_read: set[str]) -> list[set[str]]:
        """Saved sets growing one op at a time, the op whose kept outputs spare the most rerun
        time per byte first (`BEST_PER_BYTE`). On a region's rerun both sides are additive over
        ops: keeping op o spares its rerun (its priced time, scaled as the rerun is) and holds
        its outputs not already held, so the chain is the greedy order of a knapsack over the
        region's ops, each prefix one option. Ops past the last value the region's backward
        reads are not rerun and ops the policy cannot name are left out."""
        g = self.graph
        values = self.regions[path]
        mappable = self.mappable[path]
        last = max((self.order[v] for v in inside_read), default=-1)
        held = base | outside_read | (self.pinned & set(values))
        ranked = []
        for v in values:
            group = g.group_of(v)
            if group[0] != v or self.order[v] > last or v in base or g[v].cost <= 0:
                continue
            if not all(m in mappable and m in values for m in group):
                continue
            added = sum(g[m].bytes for m in group if m not in held)
            ranked.append((-g[v].cost / max(added, 1), self.order[v], group))
        ranked.sort()
        chain, saved = [], set(base)
        for _, _, group in ranked[:MAX_CHAIN]:
            saved = saved | set(group)
            chain.append(saved)
        return chain

    def _option(self, path: str, option: str, saved: set[str], inside_read: set[str],
                outside_read: set[str], seen: set[tuple[str, ...]]) -> RegionOption | None:
        """The region executed with ``saved`` kept by its policy, costed; None when an op's
        outputs would be split and the policy cannot keep the whole op, or ``seen`` has the set."""
        g = self.graph
        values = self.regions[path]
        mappable = self.mappable[path]
        kept = saved | outside_read | (self.pinned & set(values))
        # An op whose outputs are split (one kept, one dropped) would run again next to its
        # kept output: the policy keeps the whole op when it can, else the option is left out
        # (the IR cannot hold two copies of a value; eager would).
        split = {g.group_of(v)[0] for v in values if v not in kept and self.backward_readers[v]
                 and any(m in kept for m in g.group_of(v))}
        if any(not all(m in mappable for m in g.group_of(v)) for v in split):
            return None
        saved = set(saved)
        for v in split:
            saved.update(g.group_of(v))
        kept |= saved
        dropped = tuple(v for v in values if v not in kept and self.backward_readers[v])
        key = tuple(sorted(saved))
        if key in seen:
            return None
        seen.add(key)
        last = max((self.order[v] for v in inside_read), default=-1)
        recompute: list[str] = []
        for v in values:
            if self.order[v] > last or v in saved:
                continue
            if g.group_of(v)[0] == v:
                recompute.append(v)
        cost = 0.0
        if dropped or saved:  # an eager rerun of its ops, and the checkpoint around them
            cost = self.rerun_scale[path] * sum(g[v].cost for v in recompute) + self.checkpoint_s[path]
        if saved and not (self.counters_run_plain[path] and saved <= self.run_once):
            # the policy's dispatch mode: the forward, and the ops rerun
            cost += self.policy_s[path] * (1 + len(recompute) / len(values))
        flops = sum(g[v].flops for v in recompute) if dropped or saved else 0.0
        # Kept values backward does not read are held longer than plain autograd holds them, and
        # so are the region's inputs (its checkpoint holds them until its frame dies).
        held_longer = sum(g[v].bytes for v in (*saved, *self.region_inputs(path))
                          if not self.backward_readers[v] and v not in self.pinned)
        return RegionOption(
            path=path, option=option, saved=tuple(sorted(saved, key=g.position)),
            dropped=dropped, recompute_groups=tuple(recompute) if (dropped or saved) else (),
            saving_bytes=sum(g[v].bytes for v in dropped) - held_longer,
            extra_cost=cost, extra_flops=flops)

    def _offload_options(self, path: str) -> list[RegionOption]:
        """The region under saved-tensor hooks that send what its autograd nodes save to host.
        What they save is what the region's backward ops read from forward (parameters and
        buffers stay). A value that only this region's backward reads leaves the device once
        forward no longer reads it; one that backward outside the region reads too, or that the
        caller holds, stays where it is (the runtime finds it alive and reads it there).

        Priced for the knapsack as the copy time the region's own compute would not hide (the
        copy back in full without prefetch); the simulator, which knows the streams, gives the
        plan's time. One option per way of bringing the values back (`OFFLOADS`)."""
        g, link = self.graph, self.link
        assert link is not None
        inside = [n for n in g.ops if n.phase is Phase.BACKWARD and within(n.module, path)]
        packed = tuple(dict.fromkeys(
            i for n in inside for i in n.inputs if g[i].bytes > 0 and (
                g[i].kind is NodeKind.INPUT or (g[i].is_op and g[i].phase is Phase.FORWARD and not is_hold(i)))))
        offloaded = tuple(v for v in packed if g[v].is_op and v not in self.pinned
                          and all(within(r.module, path) for r in self.backward_readers[v]))
        forward_s = sum(g[v].cost for v in self.regions[path])
        backward_s = sum(n.cost for n in inside)
        to_host = sum(link.offload_seconds(g[v].bytes) for v in offloaded)
        back = sum(link.reload_seconds(g[v].bytes) for v in offloaded)
        exposed = {OFFLOAD: back, OFFLOAD_PREFETCH: max(0.0, back - backward_s)}
        return [RegionOption(
            path=path, option=option, saved=(), dropped=(), recompute_groups=(),
            saving_bytes=sum(g[v].bytes for v in offloaded),
            extra_cost=max(0.0, to_host - forward_s) + exposed[option], extra_flops=0.0,
            offloaded=offloaded, packed=packed) for option in OFFLOADS]

    # ------------------------------------------------------------------ schedule
    def _frame_end(self, path: str) -> str | None:
        """The region's last backward op that reads a value the region's forward saved: once it
        has run, every tensor the checkpoint packed is released, and with them its frame.
        Found once per region (every simulated schedule asks)."""
        if path not in self._frame_ends:
            readers = [r.name for v in (*self.regions[path], *self.region_inputs(path))
                       for r in self.backward_readers.get(v, ()) if within(r.module, path)]
            self._frame_ends[path] = max(readers, key=self.graph.position, default=None)
        return self._frame_ends[path]

    def region_inputs(self, path: str) -> frozenset[str]:
        """Forward op values from outside the region that its ops read, and the arguments of its
        call they do not cover (`RegionCandidate.arguments`): the checkpoint holds them until its
        frame dies (`_frame_end`). Found once per region (every option and every simulated
        schedule asks)."""
        if path not in self._inputs:
            g = self.graph
            values = set(self.regions[path])
            self._inputs[path] = inputs_from_outside(g, values) | {
                a for a in self.arguments.get(path, ()) if a in g and a not in values}
        return self._inputs[path]

    def schedule(self, choices: Sequence[RegionOption]) -> Schedule:
        """Forward runs everything; each chosen region recomputes once, right before the first
        backward op of the region (or the first reader of a value it dropped)."""
        g = self.graph
        choices = self.complete(choices)
        # a checkpoint holds its region's inputs (its arguments) until its recomputation
        held = {v for c in choices if c.option not in OFFLOADS for v in self.region_inputs(c.path)}
        dropped_all = {v for c in choices for v in c.dropped if v not in held}
        live = {v for v in self.forward if v not in dropped_all and self.backward_readers[v]}
        live |= self.pinned
        backward_groups = [m for m in g.groups.values() if g[m[0]].phase is Phase.BACKWARD]
        triggers: dict[int, list[RegionOption]] = {}
        for choice in choices:
            if choice.option in OFFLOADS:  # nothing to recompute: its copies are placed below
                continue
            dropped = set(choice.dropped) - held
            for i, members in enumerate(backward_groups):
                first = g[members[0]]
                reads_forward = any(g[x].kind is not NodeKind.TANGENT and g[x].phase is Phase.FORWARD
                                    for x in first.inputs)
                if (within(first.module, choice.path) and reads_forward) or dropped & set(first.inputs):
                    triggers.setdefault(i, []).append(choice)
                    break
        chosen_reholds = {self.reholds[c.path] for c in choices if c.path in self.reholds and c.option not in OFFLOADS}
        backward: list[str] = []
        for i, members in enumerate(backward_groups):
            for choice in triggers.get(i, ()):
                backward.extend(v for v in choice.recompute_groups
                                if not any(m in live for m in g.group_of(v)))
                if choice.path in self.reholds:
                    backward.append(self.reholds[choice.path])
            backward.extend(members)
        forward = [v for v in self.forward if v not in chosen_reholds]
        schedule = Schedule.from_computes(g, forward, backward)
        # A checkpoint holds what its policy keeps until its recomputation takes it back, and its
        # inputs until the last of its saved tensors is released (its frame dies), whether or not
        # the recomputation or backward reads them.
        held_until: dict[str, tuple[str, bool]] = {}
        for i, chosen in triggers.items():
            for c in chosen:
                held_until.update((v, (backward_groups[i][0], False)) for v in c.saved)
                frame_end = self._frame_end(c.path)
                if frame_end is not None:
                    held_until.update((v, (frame_end, True)) for v in self.region_inputs(c.path))
        schedule = _held_by_checkpoints(schedule, held_until)
        offloads = [c for c in choices if c.option in OFFLOADS]
        return self._with_copies(schedule, offloads, held) if offloads else schedule

    def _with_copies(self, schedule: Schedule, offloads: Sequence[RegionOption], held: set[str]) -> Schedule:
        """``schedule`` with the offloaded regions' copies where the eager runtime makes them
        (`frontends.eager_runtime.eager_offload`). A value leaves the device when only offloaded
        regions' backward reads it (one region, or several: the runtime keeps one host copy per
        storage, like the rotary tables every decoder layer saves) and nothing else holds it: it
        goes to host after forward makes it and is freed after forward's last read. It comes back
        once, at the first of its regions' reload points: a region's first backward read of
        anything it saved, or, for a region chosen with prefetch (`OFFLOAD_PREFETCH`), the next
        offloaded region's in forward order when that one's backward starts first."""
        g = self.graph
        steps, n_forward = schedule.steps, len(schedule.forward)
        paths = [c.path for c in offloads]
        leaving = [v for v in dict.fromkeys(v for c in offloads for v in c.packed)
                   if g[v].is_op and v not in self.pinned and v not in held
                   and all(any(within(r.module, p) for p in paths) for r in self.backward_readers[v])]
        reads = value_reads(g, steps, n_forward, frozenset(leaving))
        after: dict[int, list[Step]] = {}
        for v in sorted(leaving, key=g.position):
            after.setdefault(reads.produced[v], []).append(offload(v))
            after.setdefault(reads.last_forward.get(v, reads.produced[v]), []).append(free(v))
        in_forward = [c for c in sorted(offloads, key=lambda c: self.order[self.regions[c.path][0]]) if c.packed]
        packed = {c.path: frozenset(c.packed) for c in in_forward}
        starts: dict[str, int] = {}  # the first backward step that reads what the region saved
        for index in range(n_forward, len(steps)):
            if len(starts) == len(in_forward):
                break
            step = steps[index]
            if step.kind is not StepKind.COMPUTE:
                continue
            node = g[step.node]
            for c in in_forward:
                if c.path not in starts and within(node.module, c.path) and not packed[c.path].isdisjoint(node.inputs):
                    starts[c.path] = index
        never = len(steps)
        back_at = {c.path: starts.get(c.path, never) for c in in_forward}
        for c, following in zip(in_forward, in_forward[1:]):
            if c.option == OFFLOAD_PREFETCH:
                back_at[c.path] = min(back_at[c.path], starts.get(following.path, never))
        first_back: dict[str, int] = {}
        for c in in_forward:
            for v in c.packed:
                first_back[v] = min(first_back.get(v, never), back_at[c.path])
        reloads: dict[int, list[str]] = {}
        for v in leaving:
            reloads.setdefault(first_back[v], []).append(v)
        return emit_copies(steps, n_forward, after, {}, reloads)

    def evaluate(self, choices: Sequence[RegionOption]) -> SimulationResult:
        link = self.link if any(c.option in OFFLOADS for c in choices) else None
        return simulate(self.graph, self.schedule(choices), link=link)


def timed_options(model: RegionModel, path: str) -> list[RegionOption]:
    """The options of a region whose price a measurement can replace (`with_measured_options`):
    the saved sets run under ``checkpoint`` (`OPTIONS`), not offloads or split chunks."""
    return [o for o in model.options.get(path, ()) if o.option in OPTIONS]


def with_measured_options(candidates: Sequence[RegionCandidate], measured: Mapping[tuple[str, str], float],
                          error: Mapping[tuple[str, str], float]) -> list[RegionCandidate]:
    """``candidates`` carrying what each of their options measured (``measured``: (path, option) ->
    seconds the region's checkpoint with that saved set added to its forward and backward, timed
    alone; ``error``: the standard error of each). The planner prices such an option as measured
    where the measurement is clearly off its model (`MEASURED_SIGNIFICANCE`), else as modelled.
    Never below zero."""
    out = []
    for cand in candidates:
        timed = tuple(sorted((option, max(seconds, 0.0), error.get((path, option), 0.0))
                             for (path, option), seconds in measured.items() if path == cand.path))
        out.append(dataclasses.replace(cand, measured_s=timed) if timed else cand)
    return out


def _as_measured_beside(modelled: float, misses: Sequence[tuple[float, float]]) -> float:
    """The price of an untimed option of a region whose timed options measured ``misses``
    ((measured, modelled) seconds each, off their model by more than the noise). Where the
    median option measured *above* its model, the excess is overhead the model misses (the
    checkpoint's call, the policy's dispatch mode: 1-3 ms on a resnet block modelled at
    0.2-0.5 ms): added. Where it measured *below*, the model overprices the rerun itself (tiny
    Llama's layer rerun: 38 ms measured, 47 ms modelled): scaled by the median ratio, so a
    cheaper rerun stays cheaper and never prices at zero while it reruns something (subtracting
    that layer's 9 ms priced a 4.5 ms rerun at 0)."""
    offset = statistics.median(seconds - model for seconds, model in misses)
    if offset >= 0:
        return modelled + offset
    return modelled * statistics.median(seconds / model for seconds, model in misses if model > 0)


MEASURED_SIGNIFICANCE = 2.0
"""A measured option replaces its modelled price only when they differ by more than this many
standard errors of the measurement: on a noisy machine a large region's measurement (the
difference of two ~100 ms runs) can be further off than the model of its rerun, while a small
region's overhead (1-3 ms a resnet block, against a modelled 0.2-0.5 ms) stands far out of it."""


# ---------------------------------------------------------------------- the knapsack
Point = tuple[int, float, tuple[RegionOption, ...]]  # (saving bytes, extra cost, choices)


def _thin(points: list[Point], thinned: list[bool] | None = None) -> list[Point]:
    """Pareto front (more saving, less cost), thinned to FRONT_SIZE points (``thinned[0]`` is
    set when points were dropped: the front is then no longer exact)."""
    points.sort(key=lambda p: (-p[0], p[1]))
    front: list[Point] = []
    best_cost = float("inf")
    for p in points:
        if p[1] < best_cost:
            front.append(p)
            best_cost = p[1]
    front.reverse()  # increasing saving and cost
    if len(front) > FRONT_SIZE:
        if thinned is not None:
            thinned[0] = True
        step = len(front) / FRONT_SIZE
        front = [front[int(i * step)] for i in range(FRONT_SIZE)] + [front[-1]]
    return front


def _merge(a: list[Point], b: list[Point], thinned: list[bool]) -> list[Point]:
    return _thin([(x[0] + y[0], x[1] + y[1], x[2] + y[2]) for x in a for y in b], thinned)


def pareto_front(model: RegionModel, inside: dict[str, list[Point]] | None = None) -> tuple[list[Point], bool]:
    """Non-overlapping selections of (region, option), Pareto-optimal in (saving, cost), and
    whether the front is exact (no thinning was needed). ``inside``, when given, receives for
    each region the front of the selections strictly inside it (its descendants' options)."""
    thinned = [False]
    paths = sorted([*model.options, *model.chunk_groups], key=lambda p: (p.count("."), p))
    children: dict[str, list[str]] = {p: [] for p in paths}
    roots: list[str] = []
    for p in paths:
        parents = [q for q in paths if q != p and within(p, q)]
        if parents:
            children[max(parents, key=len)].append(p)
        else:
            roots.append(p)

    def front_of(path: str) -> list[Point]:
        if path in model.chunk_groups:  # a split MLP's chunks, checkpointed together or not
            group = model.chunk_groups[path]
            return [(0, 0.0, ()), (sum(o.saving_bytes for o in group), sum(o.extra_cost for o in group), group)]
        inner: list[Point] = [(0, 0.0, ())]
        for child in children[path]:
            inner = _merge(inner, front_of(child), thinned)
        if inside is not None:
            inside[path] = [p for p in inner if p[2]]
        own = [(o.saving_bytes, o.extra_cost, (o,)) for o in model.options[path]]
        return _thin(inner + own, thinned)

    total: list[Point] = [(0, 0.0, ())]
    for root in roots:
        total = _merge(total, front_of(root), thinned)
    return total, not thinned[0]


def front_of_peak_lowering(model: RegionModel, store_all_peak: int) -> list[Point]:
    """`pareto_front` without the options that, chosen alone, leave the step's peak where
    store-all has it. The front keeps selections by boundary saving and cost alone, and the peak
    is not monotone in either: a container checkpointed whole (all of a network's blocks as one
    ``nn.Sequential``) recomputes everything at once, so it lowers no peak, yet with measured
    prices (one checkpoint call instead of six) it can dominate every selection of its blocks
    (examples/resnet.py at 80%: nothing on the whole front fit, while the stem, two blocks and a
    projection do). Tried only when the whole front has nothing that fits: an option that
    lowers no peak alone may still help beside others."""
    lowering = copy.copy(model)
    lowering.options = {p: [o for o in options if model.evaluate((o,)).peak_bytes < store_all_peak]
                        for p, options in model.options.items()}
    return pareto_front(lowering)[0]


def _overlaps(option: RegionOption, choices: Sequence[RegionOption]) -> bool:
    return any(within(option.path, c.path) or within(c.path, option.path) for c in choices)


def _local_search(model: RegionModel, best: tuple[SimulationResult, Point], over: list[Point],
                  need: int, budget_bytes: int, deadline: float, inside: Mapping[str, list[Point]] | None = None,
                  ) -> tuple[tuple[SimulationResult, Point], int]:
    """Cheaper fitting selections near the incumbent: drop or downgrade one of its regions, or add
    one region to a cheaper selection that peaked over the budget while recomputing; where none
    fits, change the options of two of its regions at once (one keeps more, the other less: the
    memory one frees at a peak pays for what the other keeps), where one of the two may also be
    split into a selection inside it (``inside``: `pareto_front`'s fronts below each region; a
    layer's norm, attention and MLP checkpointed apiece rerun one at a time, which lowers the
    peak of its backward). Candidates are simulated cheapest first; stops at ``deadline`` or
    when nothing cheaper fits."""
    every = [o for options in model.options.values() for o in options]
    tried = 0
    while time.perf_counter() < deadline:
        sim, (saving, cost, choices) = best
        moves: dict[tuple[tuple[str, str], ...], Point] = {}

        def add(selection: tuple[RegionOption, ...]) -> None:
            selection = model.complete(selection)
            total = sum(o.extra_cost for o in selection)
            gained = sum(o.saving_bytes for o in selection)
            if total < cost - 1e-15 and gained >= need:
                key = tuple(sorted((o.path, o.option) for o in selection))
                moves.setdefault(key, (gained, total, selection))

        for i, choice in enumerate(choices):
            if choice.option == CHUNKED:
                continue
            rest = choices[:i] + choices[i + 1:]
            add(rest)
            for option in model.options.get(choice.path, ()):
                add((*rest, option))
        for group in model.chunk_groups.values():  # checkpoint an MLP's chunks, or stop to
            if group[0] in choices:
                add(tuple(c for c in choices if c not in group))
            elif not _overlaps(group[0], [c for c in choices if c.option != CHUNKED]):
                add((*choices, *group))
        for point in over:
            if point[1] >= cost:
                continue
            chosen = [c for c in point[2] if c.option != CHUNKED]
            for option in every:
                if not _overlaps(option, chosen):
                    add((*point[2], option))

        def first_fitting() -> tuple[SimulationResult, Point] | None:
            nonlocal tried
            for point in sorted(moves.values(), key=lambda p: p[1]):
                if time.perf_counter() >= deadline:
                    return None
                candidate = model.evaluate(point[2])
                tried += 1
                if candidate.peak_bytes <= budget_bytes:
                    return candidate, point
                over.append(point)
            return None

        found = first_fitting()
        if found is None:
            moves.clear()
            for i, j in itertools.permutations(range(len(choices)), 2):
                a, b = choices[i], choices[j]
                if time.perf_counter() >= deadline:  # (layers x front x options): can be large
                    break
                if CHUNKED in (a.option, b.option):
                    continue
                rest = tuple(c for k, c in enumerate(choices) if k not in (i, j))
                splits = [p[2] for p in (inside or {}).get(a.path, ())]
                own = [(x,) for x in model.options.get(a.path, ()) if x is not a] if i < j else []
                for xs in (*own, *splits):
                    for y in model.options.get(b.path, ()):
                        if y is not b:
                            add((*rest, *xs, y))
            found = first_fitting()
        if found is None:
            break
        best = found
    return best, tried


def uniform_selections(model: RegionModel) -> list[Point]:
    """Every region at one depth of the module tree with one saved-set option: the plans people
    write by hand (``checkpoint`` on every block; a "save matmuls" SAC policy on every block).
    The front keeps selections by boundary saving and cost alone, and the peak is not monotone
    in either, so these are tried too: the plan returned is never worse than the best of them."""
    points: list[Point] = []
    depths = sorted({p.count(".") for p in model.options})
    for depth in depths:
        paths = [p for p in model.options if p.count(".") == depth]
        for option in (*OPTIONS, *OFFLOADS):
            chosen = tuple(o for p in paths for o in model.options[p] if o.option == option)
            if chosen:
                points.append((sum(o.saving_bytes for o in chosen), sum(o.extra_cost for o in chosen), chosen))
    chunks = tuple(o for group in model.chunk_groups.values() for o in group)
    if chunks:  # each with every split MLP's chunks checkpointed too (those no region covers)
        points += [(0, 0.0, ())]
        for i in range(len(points)):
            with_chunks = model.complete((*points[i][2], *chunks))
            points.append((sum(o.saving_bytes for o in with_chunks), sum(o.extra_cost for o in with_chunks),
                           with_chunks))
    return points


def solve_eager(graph: RematGraph, candidates: Sequence[RegionCandidate], budget: int | str,
                time_limit_s: float = 60.0, chunked: Sequence[str] = (), link: Link | None = None,
                host_budget: int | None = None) -> EagerSolution:
    """The cheapest selection of regions and saved sets whose simulated peak fits ``budget``.
    ``chunked``: the row chunks of split MLPs (`chunk_path`), each under its own checkpoint
    unless a chosen region covers it (`RegionModel.complete`).

    With a ``link``, regions may also be offloaded (`OFFLOAD`), holding at most ``host_budget``
    pinned host bytes (None: no limit): the selection is searched again with that option, and the
    faster of the two (recomputation plus the copy time compute does not hide, as simulated) is
    returned. Its bound is then None: the knapsack prices copies by estimate, not by a bound.

    Raises `InfeasibleBudgetError` naming the leanest plan of the family when none fits."""
    if link is None:
        return _solve_regions(graph, candidates, budget, time_limit_s, chunked, None, None)
    start = time.perf_counter()
    try:
        recompute_only: EagerSolution | None = _solve_regions(graph, candidates, budget, time_limit_s / 2,
                                                              chunked, None, None)
    except InfeasibleBudgetError:
        recompute_only = None
    try:
        with_offload = _solve_regions(graph, candidates, budget, time_limit_s / 2, chunked, link, host_budget)
    except InfeasibleBudgetError:
        if recompute_only is None:
            raise
        return recompute_only
    offloads = any(c.option in OFFLOADS for c in with_offload.choices)
    if recompute_only is not None and (not offloads or recompute_only.extra_cost <= with_offload.extra_cost):
        return recompute_only
    beside = ("no recompute-only selection fits" if recompute_only is None else
              f"recompute-only: {recompute_only.extra_cost:.4g} s extra")
    return dataclasses.replace(with_offload, solve_time_s=time.perf_counter() - start,
                               message=f"{with_offload.message} ({beside})")


def _solve_regions(graph: RematGraph, candidates: Sequence[RegionCandidate], budget: int | str,
                   time_limit_s: float, chunked: Sequence[str], link: Link | None,
                   host_budget: int | None) -> EagerSolution:
    """`solve_eager` in one family: with ``link``, the offload option is offered too."""
    start = time.perf_counter()
    model = RegionModel(graph, candidates, chunked, link)
    g = model.graph
    store_all = simulate(g, store_all_schedule(g))
    budget_bytes = resolve_budget(budget, store_all.peak_bytes)
    inside: dict[str, list[Point]] = {}
    front, exact = pareto_front(model, inside)
    tangents = sum(g[t].bytes for t in g.tangents)
    # Every plan of the family holds at least (store-all's boundary - its saving) when backward
    # starts, tangents included: a selection saving less than ``need`` cannot fit, so the
    # cheapest one saving enough is a lower bound (exact while the front was not thinned).
    need = store_all.boundary_bytes + tangents - budget_bytes
    tried = 0
    best: tuple[SimulationResult, Point] | None = None
    leanest: tuple[int, Point, SimulationResult] | None = None
    over: list[Point] = []  # cheaper selections that peaked over the budget while recomputing

    host_refused = [False]  # a selection met the device budget but held more than host_budget on host

    def lean(point: Point, sim: SimulationResult) -> bool:
        """Track the leanest selection within the host budget; whether ``sim`` is within it."""
        nonlocal leanest
        if host_budget is not None and sim.host_peak_bytes > host_budget:
            host_refused[0] |= sim.peak_bytes <= budget_bytes
            return False
        if leanest is None or sim.peak_bytes < leanest[0]:
            leanest = (sim.peak_bytes, point, sim)
        return True

    def fits(point: Point) -> bool:
        """Simulate ``point``; keep it as the incumbent when it fits, else learn from where it
        peaked: at the head of backward (`RegionModel.backward_head`: the loss's gradient, say),
        before any region's backward, every selection holds store-all's live bytes less its
        saving, with the same temporaries, so ``point`` shows the saving all selections need
        there (the boundary alone does not count the head's temporaries)."""
        nonlocal tried, best, need
        sim = model.evaluate(point[2])
        tried += 1
        if sim.peak_bytes > budget_bytes and link is None and (
                sim.peak_step == -1 or (sim.peak_phase is Phase.BACKWARD and sim.peak_node in model.backward_head)):
            need = max(need, point[0] + sim.peak_bytes - budget_bytes)
        if lean(point, sim) and sim.peak_bytes <= budget_bytes:
            best = (sim, point)
        return best is not None and best[1] is point

    def first_fit(points: list[Point], deadline: float) -> None:
        """Simulate the points that save enough, cheapest first, until one fits or ``deadline``;
        those that peak over the budget go to ``over`` for the local search."""
        for point in sorted(points, key=lambda p: p[1]):
            if point[0] < need:
                continue
            if fits(point):
                return
            over.append(point)
            if time.perf_counter() > deadline:
                return

    first_fit(front, start + time_limit_s)
    for point in sorted(uniform_selections(model), key=lambda p: p[1]):
        if (best is not None and point[1] >= best[1][1]) or fits(point):
            break
    if best is None:  # the front without options that lower no peak: they can hide the ones that do
        first_fit(front_of_peak_lowering(model, store_all.peak_bytes),
                  min(start + time_limit_s, time.perf_counter() + LOCAL_SEARCH_S))
    bound_candidates = [p[1] for p in front if p[0] >= need]  # ``need`` as learned by now
    bound = min(bound_candidates) if bound_candidates and exact and link is None else None
    if best is not None and (bound is None or best[1][1] > bound + 1e-15):  # not proven optimal
        deadline = start + min(time_limit_s, LOCAL_SEARCH_S + (time.perf_counter() - start))
        best, more = _local_search(model, best, over, need, budget_bytes, deadline, inside)
        tried += more
    if best is None:
        # The leanest plan found: the selections that save the most, simulated (a few dozen).
        for point in sorted(front, key=lambda p: -p[0])[:LEANEST_TRIES]:
            lean(point, model.evaluate(point[2]))
        smallest = leanest[0] if leanest else store_all.peak_bytes
        why = (" (eager runtime: no submodule's checkpoint saves memory here: modules that update "
               "state, such as BatchNorm in training, are not checkpointed, nor ops outside "
               "submodules; optimize() can plan them)" if not any(model.options.values()) and not model.chunk_groups
               else f" (eager runtime: the leanest {'checkpointing or offloading' if link else 'checkpointing'} plan "
               "found; optimize() can go lower)")
        if host_refused[0]:
            why += (f" (within the host budget of {host_budget:,} bytes: the offloading plans that fit the device "
                    "budget hold more on host)")
        raise InfeasibleBudgetError(budget_bytes, smallest, why, exact=False, lower_bound_bytes=None)
    sim, point = best
    choices = tuple(sorted(model.complete(point[2]), key=lambda o: model.order[model.regions[o.path][0]]))
    gap_note = ""
    status = "optimal" if bound is not None and point[1] <= bound + 1e-15 else "feasible"
    if status == "optimal":
        gap_note = " (optimal among checkpointed regions with saved sets " + "/".join(OPTIONS) + ")"
    else:
        gap_note = (f"; {tried} selections simulated, the cheaper ones peaked over the budget "
                    "while recomputing; the bound counts only the boundary")
    offloads = sum(c.option in OFFLOADS for c in choices)
    extra_cost = point[1]
    if offloads:  # the copies as simulated (streams, prefetch), not the knapsack's estimate
        extra_cost = sum(c.extra_cost for c in choices if c.option not in OFFLOADS) + sim.stall_time_s
        gap_note = (f"; {offloads} offloaded ({sum(g[v].bytes for v in sim.offloaded) / 2**20:.1f} MiB to host "
                    f"and back, {1e3 * sim.stall_time_s:.3g} ms of copies not hidden)")
    return EagerSolution(
        choices=choices, schedule=model.schedule(choices), simulation=sim, store_all=store_all,
        budget_bytes=budget_bytes, extra_cost=extra_cost,
        extra_flops=sum(o.extra_flops for o in choices), bound=bound, status=status,
        solve_time_s=time.perf_counter() - start, graph=g, link=link if offloads else None,
        message=f"eager runtime: {sum(c.option not in (CHUNKED, *OFFLOADS) for c in choices)} regions checkpointed"
                + (f", {sum(c.option == CHUNKED for c in choices)} MLP row chunks under their own checkpoint"
                   if model.chunk_groups else "") + gap_note)


def solution_plan(solution: EagerSolution, graph: RematGraph, graph_nodes: int = 0) -> Plan:
    """The IR `Plan` of an eager solution (same fields as the graph runtime's plans)."""
    sim = solution.simulation
    objective = graph.base_cost + solution.extra_cost
    bound = None if solution.bound is None else graph.base_cost + solution.bound
    gap = None if bound is None else (objective - bound) / objective if objective else 0.0
    return Plan(
        status=solution.status, solver="eager-regions", cost_model=graph.cost_model,
        budget_bytes=solution.budget_bytes, predicted_peak_bytes=sim.peak_bytes,
        store_all_peak_bytes=solution.store_all.peak_bytes, extra_flops=solution.extra_flops,
        extra_time_s=solution.extra_cost, step_flops=graph.base_flops,
        step_time_s=graph.base_cost, objective=objective, bound=bound, gap=gap,
        solve_time_s=solution.solve_time_s, breakdown=breakdown(graph, solution.budget_bytes),
        graph_nodes=graph_nodes or len(graph.nodes), graph_values=len(graph.ops),
        saved=sim.saved, recomputed=sim.recomputed,
        modules=module_summaries(graph, sim, solution.store_all), message=solution.message,
        schedule=solution.schedule,
        offloaded=tuple((name, graph[name].bytes) for name in sim.offloaded),
        transfer_time_s=sim.transfer_time_s, stall_time_s=sim.stall_time_s,
        host_peak_bytes=sim.host_peak_bytes,
        link=solution.link.describe() if solution.link is not None else "")


def fixed_choice_solution(graph: RematGraph, candidates: Sequence[RegionCandidate],
                          paths: Sequence[str], option: str = "none",
                          chunked: Sequence[str] = ()) -> EagerSolution | None:
    """Every path in ``paths`` checkpointed with ``option`` (per-block checkpointing with
    ``"none"``): the baseline a hand-written ``checkpoint`` per block gives."""
    start = time.perf_counter()
    model = RegionModel(graph, candidates, chunked)
    choices = []
    for path in paths:
        options = {o.option: o for o in model.options.get(path, [])}
        if option in options:
            choices.append(options[option])
        elif options:
            choices.append(min(options.values(), key=lambda o: -o.saving_bytes))
    if not choices:
        return None
    choices = list(model.complete(choices))
    store_all = simulate(model.graph, store_all_schedule(model.graph))
    sim = model.evaluate(choices)
    return EagerSolution(
        choices=tuple(choices), schedule=model.schedule(choices), simulation=sim,
        store_all=store_all, budget_bytes=sim.peak_bytes,
        extra_cost=sum(o.extra_cost for o in choices),
        extra_flops=sum(o.extra_flops for o in choices), bound=None, status="heuristic",
        solve_time_s=time.perf_counter() - start, message=f"{len(choices)} regions, {option}",
        graph=model.graph)
