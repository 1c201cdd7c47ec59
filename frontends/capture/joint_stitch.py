"""Write the joint graph of a long loop from the joints of three short copies of it.

`frontends.capture.repeated_body` cuts a forward's run of identical copies down to a few. AOTAutograd
traces the joints of the forward with ``a``, ``a + 1`` and ``a + 2`` copies (seconds), and this
module writes the joint with ``n`` copies from the first one: it inserts ``n - a`` copies of one
forward period and of one backward period. Where each goes, and which node each inserted node
reads, is *learned and checked*, not assumed:

- The forward section of the ``a``-copy joint (the nodes before the first one that reads a
  tangent) holds a run of identical periods of ``LF`` nodes, the backward section one of ``LB``
  nodes, where ``LF`` and ``LB`` are what one more copy adds to each section (read off the
  three traces). Backward nodes match when they read the same offset of a forward period.
- A candidate recipe picks one forward period and one backward period to repeat (`StitchRecipe`).
  An inserted node reads the previous inserted copy where its template read the period before
  it; an inserted backward node reads the forward copy one step further back per insertion
  (the backward runs in reverse); nodes after an insertion point keep reading "the same
  distance back" inside their run and the same node elsewhere (`_Layout.outer`).
- A recipe is accepted only if stitching one copy into the ``a``-copy joint gives the
  ``a + 1``-copy joint AOTAutograd traced, and two copies the ``a + 2``-copy one, node for node:
  same op, same arguments, same value layout, same storage sharing, same autograd sequence
  numbers (up to the constant the global counter adds). Anything else raises `NotRepeated` and
  capture traces the whole loop as before.

Why two checks are taken to carry over to n (an argument, not a proof): the tracer records each
copy's ops in the order the Python loop and the autograd engine run them, and both depend only
on the graph's structure, which is the same from one copy to the next; the recipe is the one
rule that turns ``a`` into ``a + 1`` and ``a + 1`` into ``a + 2``, and every position it computes
is affine in the copy number, so it is applied ``n - a`` times the same way. The tests and
`benchmarks/loop_capture.py` compare the result with whole traces (40 to 1,000 steps).

The inserted nodes get fresh FakeTensors in the joint's fake mode (views of the node whose
storage their template shared), so `frontends.capture.step.build_remat_graph` sees one storage per
copy, as in a full trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from frontends.capture.fx_leaves import flat_leaves
from frontends.capture.repeated_body import (
    KEEP_BACK,
    NotRepeated,
    collapse_run,
    find_repeated_run,
    longest_true_stretch,
    node_codes,
    target_name,
)
from frontends.torch_compat import (
    FakeTensor,
    _make_graph_module,
    aot_export_joint_with_descriptors,
    no_dispatch,
)
from frontends.torch_compat import aot_descriptors as aot_desc

KEEP_FRONT = 3
"""Copies before the cut in the shortest forward traced (it keeps `KEEP_BACK` after it)."""

MIN_COVER = 0.75
"""Least share of the forward the run must cover: each short trace traces the rest whole, so
three of them cost more than one whole trace where the rest is a large part (two loops, say)."""


@dataclass(frozen=True)
class StitchedLoop:
    """A loop whose joint was written from short traces: ``traced`` of its ``count`` copies
    were traced, each ``period`` nodes of the forward graph."""

    count: int
    traced: int
    period: int

    def describe(self) -> str:
        return (f"a run of {self.count:,} identical copies ({self.period} forward nodes each) was "
                f"traced as {self.traced}, {self.traced + 1} and {self.traced + 2} copies and written out")


def joint_of_long_loop(forward: torch.fx.GraphModule, args: tuple, kwargs: dict):
    """(AOTAutograd's joint of ``forward``, `StitchedLoop`) written from three short traces, or
    None where ``forward`` has no long run or the stitch is not checked exact (the caller then
    traces it whole). Each short trace closes its own contexts (AOTAutograd enters its fake
    mode, among others, into the stack it is given) before the next starts, so nothing of them
    is active in a whole trace after a fallback."""
    run = find_repeated_run(forward.graph)
    if run is None or run.count * run.period < MIN_COVER * len(forward.graph.nodes):
        return None
    traced = KEEP_FRONT + KEEP_BACK
    try:
        shorts = [collapse_run(forward, run, KEEP_FRONT + k) for k in range(3)]
    except NotRepeated:
        return None
    joints = []
    for short in shorts:
        with contextlib.ExitStack() as own:
            try:
                joints.append(aot_export_joint_with_descriptors(own, short, tuple(args), kwargs,
                                                                _record_nn_module_stack=True))
            except Exception:  # noqa: BLE001 - the whole trace runs instead and reports its own error
                return None
    try:
        recipe = learn_stitch([joint.graph_module for joint in joints])
    except NotRepeated:
        return None
    joint = joints[0]
    joint.graph_module = stitch(joint.graph_module, recipe, run.count - traced, joint.fake_mode)
    return joint, StitchedLoop(run.count, traced, run.period)


@dataclass(frozen=True)
class StitchRecipe:
    """Runs found in the short joint and the periods to repeat (positions in its node list)."""

    forward_start: int
    forward_period: int
    forward_count: int
    backward_start: int
    backward_period: int
    backward_count: int
    insert_forward: int
    """Inserted forward copies go here; the period just before is their template."""
    insert_backward: int
    """Inserted backward copies go here; the period just before is their template."""
    sequence_moves: tuple[bool, ...]
    """Per node of the short joint: its autograd sequence number grows with each inserted copy."""


def learn_stitch(joints: list[torch.fx.GraphModule]) -> StitchRecipe:
    """The recipe that turns ``joints[0]`` into ``joints[1]`` and ``joints[2]`` (one and two
    more copies); `NotRepeated` when none does."""
    short, longer, longest = (list(gm.graph.nodes) for gm in joints)
    bounds = [_first_backward(nodes) for nodes in (short, longer, longest)]
    forward_period = bounds[1] - bounds[0]
    backward_period = (len(longer) - bounds[1]) - (len(short) - bounds[0])
    if forward_period <= 0 or backward_period <= 0 or bounds[2] - bounds[1] != forward_period or \
            (len(longest) - bounds[2]) - (len(longer) - bounds[1]) != backward_period:
        raise NotRepeated("one more copy does not add the same nodes each time")
    fwd_start, fwd_count = _forward_run(joints[0], bounds[0], forward_period)
    bwd_start, bwd_count = _backward_run(joints[0], bounds[0], backward_period,
                                         (fwd_start, forward_period, fwd_count))
    targets = [canonical_form(joints[1]), canonical_form(joints[2])]
    fake_mode = fake_mode_of(joints[0])
    for i_fwd in range(2, fwd_count + 1):
        for i_bwd in range(2, bwd_count + 1):
            recipe = StitchRecipe(fwd_start, forward_period, fwd_count, bwd_start, backward_period,
                                  bwd_count, fwd_start + i_fwd * forward_period,
                                  bwd_start + i_bwd * backward_period, ())
            try:
                recipe = _with_sequence_moves(recipe, short, longer)
                if all(canonical_form(stitch(joints[0], recipe, extra, fake_mode)) == target
                       for extra, target in ((1, targets[0]), (2, targets[1]))):
                    return recipe
            except NotRepeated:
                continue
    raise NotRepeated("no choice of repeated periods reproduces the traced joints")


def _with_sequence_moves(recipe: StitchRecipe, short: list[torch.fx.Node],
                         longer: list[torch.fx.Node]) -> StitchRecipe:
    """The recipe with, for each node of the short joint, whether its autograd sequence number
    grows by one copy's step per inserted copy, read off the joint with one copy more: nodes
    after the forward insertion point grow, and so do backward nodes that carry their numbers
    (a delayed gradient of the copy just inserted does not: it carries the inserted copy's)."""
    step = _forward_step(short, recipe)
    layout = _Layout(recipe, 1)
    least_short, least_longer = _least_sequence(short), _least_sequence(longer)
    moves = []
    for p, node in enumerate(short):
        seq, there = node.meta.get("seq_nr"), longer[layout.moved(p)].meta.get("seq_nr")
        if seq is None or there is None:
            moves.append(False)
            continue
        grown = (there - least_longer) - (seq - least_short)
        if grown not in (0, step):
            raise NotRepeated(f"{node.name}'s sequence number grows by {grown} with one more copy")
        moves.append(grown == step and step != 0)
    return dataclasses.replace(recipe, sequence_moves=tuple(moves))


def _least_sequence(nodes: list[torch.fx.Node]) -> int:
    return min((n.meta["seq_nr"] for n in nodes if n.meta.get("seq_nr") is not None), default=0)


def _first_backward(nodes: list[torch.fx.Node]) -> int:
    tangents = {n for n in nodes if n.op == "placeholder" and
                (isinstance(n.meta.get("desc"), aot_desc.TangentAOTInput) or n.name.startswith("tangents"))}
    for i, node in enumerate(nodes):
        if node.op == "call_function" and any(a in tangents for a in node.all_input_nodes):
            return i
    raise NotRepeated("the joint has no backward")


def _forward_run(gm: torch.fx.GraphModule, boundary: int, period: int) -> tuple[int, int]:
    return _periodic_run(np.asarray(node_codes(gm.graph), dtype=np.int64)[:boundary], period, "forward")


def _backward_run(gm: torch.fx.GraphModule, boundary: int, period: int,
                  forward: tuple[int, int, int]) -> tuple[int, int]:
    fwd_start, fwd_period, fwd_count = forward
    fwd_end = fwd_start + fwd_period * fwd_count

    def ref_text(i: int, j: int, arg: torch.fx.Node) -> str:
        if arg.op in ("placeholder", "get_attr"):
            return f"@{arg.name}"
        if fwd_start <= j < fwd_end:  # the same offset of some forward copy
            return f"F{(j - fwd_start) % fwd_period}"
        if j < boundary:
            return f"#{j}"
        return f"-{i - j}"

    start, count = _periodic_run(np.asarray(node_codes(gm.graph, ref_text), dtype=np.int64)[boundary:],
                                 period, "backward")
    return boundary + start, count


def _periodic_run(codes: np.ndarray, period: int, section: str) -> tuple[int, int]:
    """(start, copies) of the longest stretch of ``codes`` repeating every ``period``."""
    start, length = longest_true_stretch(codes[:-period] == codes[period:])
    count = (length + period) // period
    if count < 3:
        raise NotRepeated(f"the {section} of the short joint has no run of three periods")
    return start, count


def fake_mode_of(gm: torch.fx.GraphModule):
    """The FakeTensorMode of the joint's values (the inserted copies get theirs from it)."""
    for node in gm.graph.nodes:
        for leaf in flat_leaves(node.meta.get("val")):
            if isinstance(leaf, FakeTensor):
                return leaf.fake_mode
    raise NotRepeated("the joint carries no fake values")


def canonical_form(gm: torch.fx.GraphModule) -> list[tuple]:
    """Each node as what the stitch must reproduce: op, target, arguments (as positions), value
    layout with the first node holding each storage, sequence number (from the graph's least)."""
    nodes = list(gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    least = _least_sequence(nodes)
    owner = _storage_owners(nodes)
    form = []
    for i, node in enumerate(nodes):
        args = repr(torch.fx.node.map_arg((node.args, node.kwargs), lambda a: f"#{position[a]}"))
        leaves = []
        for k, leaf in enumerate(flat_leaves(node.meta.get("val"))):
            if isinstance(leaf, torch.Tensor):
                leaves.append((tuple(leaf.shape), leaf.stride(), leaf.storage_offset(), leaf.dtype,
                               str(leaf.device), leaf.untyped_storage().nbytes(), owner[(i, k)]))
            else:
                leaves.append(repr(leaf))
        seq = node.meta.get("seq_nr")
        desc = repr(node.meta.get("desc")) if node.op in ("placeholder", "output") else ""
        form.append((node.op, target_name(node), args, tuple(leaves),
                     None if seq is None else seq - least, desc))
    return form


class _Layout:
    """Where each node of the short joint lands when ``extra`` copies are inserted."""

    def __init__(self, recipe: StitchRecipe, extra: int):
        self.r = recipe
        self.fwd_end = recipe.forward_start + recipe.forward_period * recipe.forward_count
        self.bwd_end = recipe.backward_start + recipe.backward_period * recipe.backward_count
        self.fwd_shift = extra * recipe.forward_period
        self.both_shift = extra * (recipe.forward_period + recipe.backward_period)

    def in_forward_run(self, q: int) -> bool:
        return self.r.forward_start <= q < self.fwd_end

    def in_backward_run(self, q: int) -> bool:
        return self.r.backward_start <= q < self.bwd_end

    def region(self, q: int) -> int:
        return 0 if q < self.r.insert_forward else 1 if q < self.r.insert_backward else 2

    def moved(self, p: int) -> int:
        """New position of a node that is not inserted."""
        return (p, p + self.fwd_shift, p + self.both_shift)[self.region(p)]

    def outer(self, p: int, q: int) -> int:
        """New position of what node p (not inserted) reads at q: inside its own run, across an
        insertion point, the same distance back; anywhere else, the same node."""
        region_p, region_q = self.region(p), self.region(q)
        if region_q == 0:
            return q + self.fwd_shift if region_p == 1 and self.in_forward_run(q) else q
        if region_q == 1:
            return q + self.both_shift if region_p == 2 and self.in_backward_run(q) else q + self.fwd_shift
        return q + self.both_shift

    def forward_copy(self, t: int, p0: int, q: int) -> int:
        """What inserted forward copy t (1-based) of template node p0 reads at q."""
        here = self.r.insert_forward + (t - 1) * self.r.forward_period + p0 - (
            self.r.insert_forward - self.r.forward_period)
        return here - (p0 - q) if self.in_forward_run(q) else q

    def backward_copy(self, t: int, p0: int, q: int) -> int:
        """What inserted backward copy t of template node p0 reads at q: t forward copies
        further back than its template."""
        if self.in_backward_run(q):
            here = self.r.insert_backward + self.fwd_shift + (t - 1) * self.r.backward_period + p0 - (
                self.r.insert_backward - self.r.backward_period)
            return here - (p0 - q)
        base = self.outer(p0, q)
        return base - t * self.r.forward_period if self.in_forward_run(q) else base


def stitch(gm: torch.fx.GraphModule, recipe: StitchRecipe, extra: int, fake_mode) -> torch.fx.GraphModule:
    """``gm`` with ``extra`` more copies of the recipe's forward and backward periods.

    Nodes are made in their new order, so node i of the result is ``made[i]``. Where an inserted
    node reads, and whose storage it views, is affine in its copy number t (see `_Layout`), so
    each template node is worked out once (`_Template`) and each copy only adds t times a step:
    at 10,000 steps the stitch writes 100,000 nodes."""
    nodes = list(gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    layout = _Layout(recipe, extra)
    seq_step = _forward_step(nodes, recipe)
    owner = _storage_owners(nodes)
    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    made: list[torch.fx.Node] = []

    def seq_of(p: int) -> int | None:
        seq = nodes[p].meta.get("seq_nr")
        return seq if seq is None or not recipe.sequence_moves[p] else seq + extra * seq_step

    def copy_outer(p: int) -> None:
        node = nodes[p]
        if layout.moved(p) != len(made):
            raise NotRepeated(f"{node.name} would land at {layout.moved(p)}, not {len(made)}")
        reads = {q: layout.outer(p, q) for q in (position[a] for a in node.all_input_nodes)}
        if any(r >= len(made) for r in reads.values()):
            raise NotRepeated(f"{node.name} would read a node made after it")
        copied = graph.node_copy(node, lambda arg: made[reads[position[arg]]])
        if node.meta.get("seq_nr") is not None:
            copied.meta["seq_nr"] = seq_of(p)
        if _views_moved_storage(nodes, p, owner, layout):  # a view of an inserted copy's value
            plan = _value_plan(nodes, p, owner, lambda q: (layout.outer(p, q), 0))
            copied.meta["val"] = _make_value(node.meta.get("val"), plan, made, 1, fake_mode)
        made.append(copied)

    def insert_copies(template: range, where, seq_base) -> None:
        plans = [_Template.of(nodes, p0, position, owner, where, extra, seq_base(p0), len(template))
                 for p0 in template]
        for t in range(1, extra + 1):
            for plan in plans:
                made.append(plan.make(graph, made, t, fake_mode))

    for p in range(recipe.insert_forward):
        copy_outer(p)
    insert_copies(range(recipe.insert_forward - recipe.forward_period, recipe.insert_forward),
                  layout.forward_copy, lambda p0: nodes[p0].meta.get("seq_nr"))
    for p in range(recipe.insert_forward, recipe.insert_backward):
        copy_outer(p)
    insert_copies(range(recipe.insert_backward - recipe.backward_period, recipe.insert_backward),
                  layout.backward_copy, seq_of)
    for p in range(recipe.insert_backward, len(nodes)):
        copy_outer(p)
    stitched = _make_graph_module(gm, graph)
    stitched.meta.update(gm.meta)
    return stitched


@dataclass(frozen=True)
class _Template:
    """One template node, worked out for all its copies: copy t lands at ``at + (t-1) at_step``
    and reads ``made[c + (t-1) s]`` for each (c, s) in ``reads``."""

    node: torch.fx.Node
    name: str
    at: int
    at_step: int
    reads: tuple[tuple[int, int], ...]
    value: tuple[tuple, ...]
    """How copy t's value is built (`_value_plan`)."""
    seq: int | None
    seq_step: int | None

    @classmethod
    def of(cls, nodes, p0, position, owner, where, extra, seq_base, period) -> _Template:
        node = nodes[p0]

        def affine(q: int) -> tuple[int, int]:
            first = where(1, p0, q)
            return first, where(2, p0, q) - first

        at, at_step = affine(p0)
        reads: list[tuple[int, int]] = []
        torch.fx.node.map_arg((node.args, node.kwargs), lambda a: reads.append(affine(position[a])))
        last = extra - 1
        for c, s in reads:  # affine in t: before the node at the first and the last copy is always
            if c >= at or c + last * s >= at + last * at_step:
                raise NotRepeated(f"a copy of {node.name} would read a node made after it")
        value = _value_plan(nodes, p0, owner, affine)
        step = _step(nodes, p0, period)
        return cls(node, _base_name(node.name), at, at_step, tuple(reads), value,
                   seq_base if step is not None else None, step)

    def make(self, graph: torch.fx.Graph, made: list[torch.fx.Node], t: int, fake_mode) -> torch.fx.Node:
        if self.at + (t - 1) * self.at_step != len(made):
            raise NotRepeated(f"a copy of {self.node.name} would land out of order")
        node = self.node
        args = iter([made[c + (t - 1) * s] for c, s in self.reads])
        new_args, new_kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda _: next(args))
        copy = graph.create_node(node.op, node.target, new_args, new_kwargs, name=self.name)
        copy.meta = dict(node.meta)
        copy.meta["val"] = _make_value(node.meta.get("val"), self.value, made, t, fake_mode)
        if self.seq_step is not None:
            copy.meta["seq_nr"] = self.seq + t * self.seq_step
        return copy


def _base_name(name: str) -> str:
    stem, _, suffix = name.rpartition("_")
    return stem if stem and suffix.isdigit() else name


def _step(nodes: list[torch.fx.Node], p0: int, period: int) -> int | None:
    """How much the sequence number grows from one period to the next at this offset."""
    seq, before = nodes[p0].meta.get("seq_nr"), nodes[p0 - period].meta.get("seq_nr")
    if (seq is None) != (before is None):
        raise NotRepeated(f"{nodes[p0].name} has a sequence number its previous period lacks")
    return None if seq is None else seq - before


def _forward_step(nodes: list[torch.fx.Node], recipe: StitchRecipe) -> int:
    """How much the sequence numbers grow from one forward copy to the next (0: none carry one)."""
    template = range(recipe.insert_forward - recipe.forward_period, recipe.insert_forward)
    steps = {_step(nodes, p0, recipe.forward_period) for p0 in template} - {None}
    if len(steps) > 1:
        raise NotRepeated("the forward copies' sequence numbers do not grow evenly")
    return steps.pop() if steps else 0


def _views_moved_storage(nodes: list[torch.fx.Node], p: int, owner, layout: _Layout) -> bool:
    """Whether node p (not inserted) views a storage that now belongs to another node: it reads
    across an insertion point, so the node it viewed is now an inserted copy."""
    return any(q != p and layout.outer(p, q) != layout.moved(q)
               for k in range(len(flat_leaves(nodes[p].meta.get("val"))))
               for q, _ in [owner.get((p, k), (p, k))])


def _storage_owners(nodes: list[torch.fx.Node]) -> dict[tuple[int, int], tuple[int, int]]:
    """For each tensor leaf (node position, leaf index): the first leaf that holds its storage."""
    first: dict[StorageWeakRef, tuple[int, int]] = {}
    owner = {}
    for i, node in enumerate(nodes):
        for k, leaf in enumerate(flat_leaves(node.meta.get("val"))):
            if isinstance(leaf, torch.Tensor):
                owner[(i, k)] = first.setdefault(StorageWeakRef(leaf.untyped_storage()), (i, k))
    return owner


def _value_plan(nodes: list[torch.fx.Node], p0: int, owner, locate) -> tuple[tuple, ...]:
    """How to build a copy of node p0's value, per leaf: ("keep", x) for a non-tensor, ("fresh",
    leaf) for a storage of its own, ("own", k, leaf, same) for a view of its own leaf k, ("of", (c,
    s), k, leaf, same) for a view of leaf k of the node at ``made[c + (t-1) s]`` (``locate(q)``
    gives (c, s) for the node at q). ``same``: the template held that very tensor (a getitem of a
    multi-output op), not a view of it."""
    node = nodes[p0]
    val = node.meta.get("val")
    leaves = flat_leaves(val)
    if leaves and not isinstance(val, torch.Tensor) and not (
            isinstance(val, (tuple, list)) and len(val) == len(leaves)):
        raise NotRepeated(f"{node.name}'s value is nested ({type(val).__name__})")
    plan: list[tuple] = []
    for k, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            plan.append(("keep", leaf))
            continue
        q, k2 = owner[(p0, k)]
        same = leaf is flat_leaves(nodes[q].meta.get("val"))[k2]
        if (q, k2) == (p0, k):
            plan.append(("fresh", leaf))
        elif q == p0:
            plan.append(("own", k2, leaf, same))
        else:
            plan.append(("of", locate(q), k2, leaf, same))
    return tuple(plan)


def _make_value(val, plan: tuple[tuple, ...], made: list[torch.fx.Node], t: int, fake_mode):
    """Copy t of ``val`` built by ``plan`` (`_value_plan`): fresh FakeTensors, or views of the
    nodes whose storage the template viewed."""
    fresh: list = []
    for leaf in plan:
        kind = leaf[0]
        if kind == "keep":
            fresh.append(leaf[1])
            continue
        if kind == "fresh":
            fresh.append(_new_storage(leaf[1], fake_mode))
            continue
        if kind == "own":
            _, k2, template, same = leaf
            base = fresh[k2]
        else:
            _, (c, s), k2, template, same = leaf
            base = flat_leaves(made[c + (t - 1) * s].meta["val"])[k2]
        fresh.append(base if same else _view(base, template, fake_mode))
    if isinstance(val, torch.Tensor):
        return fresh[0]
    return type(val)(fresh) if fresh else val


def _new_storage(leaf: torch.Tensor, fake_mode) -> torch.Tensor:
    """A FakeTensor with ``leaf``'s layout on a storage of ``leaf``'s size, nobody else's."""
    nbytes = leaf.untyped_storage().nbytes()
    with no_dispatch():
        meta = torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype, device="meta")
        if leaf.storage_offset() != 0 or meta.untyped_storage().nbytes() != nbytes:
            meta = torch.empty(nbytes // leaf.element_size(), dtype=leaf.dtype, device="meta").as_strided(
                leaf.shape, leaf.stride(), leaf.storage_offset())
    return FakeTensor(fake_mode, meta, leaf.device)


def _view(base: torch.Tensor, leaf: torch.Tensor, fake_mode) -> torch.Tensor:
    """A FakeTensor with ``leaf``'s layout on ``base``'s storage.

    Both are built on meta tensors with torch dispatch off, as FakeTensorMode builds its own
    outputs: going through the mode's dispatch for each of 100,000 inserted nodes took longer
    than the rest of the stitch."""
    with no_dispatch():
        meta = torch.as_strided(base, leaf.shape, leaf.stride(), leaf.storage_offset())
    return FakeTensor(fake_mode, meta, leaf.device)
