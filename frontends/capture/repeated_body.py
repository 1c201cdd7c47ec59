"""Find the longest run of identical repetitions in a forward graph, and cut it short.

A time-stepping loop (an unrolled RNN, an ODE integrator, a weight-shared block applied n times)
traces into n copies of the same ops on the same parameters. AOTAutograd's joint trace of such
a graph costs about 70% of capture and grows with n (10,000 steps: minutes), while every copy
traces to the same nodes. `frontends.capture.joint_stitch` traces the joint of a few copies and writes
the other copies itself; this module finds the copies and builds the short forwards it traces.

Two nodes *match* when they run the same op on the same constants with the same value metadata
(shape, stride, dtype, device) and read the same placeholders and parameters, and every other
node they read lies the same number of positions back. A run of ``count`` repetitions of
``period`` nodes is a stretch where node i matches node i + period throughout: then each copy
reads the one before it exactly as the previous copy read its own predecessor, so removing whole
copies from the middle of the run and pointing the next copy at the last one kept gives the same
program with fewer steps (`collapse_run`). Nodes after the run may read only its last
`KEEP_BACK` copies (counted from the end, so the short graph reads the same copy); anything
else (a suffix that reads step 1, say) is not a loop this module cuts, and `collapse_run` raises
`NotRepeated`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from frontends.capture.fx_leaves import flat_leaves
from frontends.torch_compat import _make_graph_module

MIN_REPEATS = 16
"""Fewer copies trace fast enough whole; below this the graph is traced as it is."""

MAX_PERIOD = 4096
"""Longest repeated body looked for, in fx nodes."""

KEEP_BACK = 3
"""Copies kept at the end of the run in every short forward (what the suffix may read)."""


class NotRepeated(ValueError):
    """The graph is not a run of identical copies in the sense `collapse_run` needs."""


@dataclass(frozen=True)
class RepeatedRun:
    """``count`` copies of ``period`` nodes, from position ``start`` of the graph's node list."""

    start: int
    period: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.period * self.count


def find_repeated_run(graph: torch.fx.Graph, min_repeats: int = MIN_REPEATS) -> RepeatedRun | None:
    """The run that covers the most nodes (the shortest period among equals), or None when no
    run has ``min_repeats`` copies."""
    codes = np.asarray(node_codes(graph), dtype=np.int64)
    n = len(codes)
    best: RepeatedRun | None = None
    for period in range(1, min(MAX_PERIOD, n // max(min_repeats, 2)) + 1):
        same = codes[:-period] == codes[period:]
        if not same.any():
            continue
        start, length = longest_true_stretch(same)
        count = (length + period) // period
        if count < min_repeats:
            continue
        if best is None or count * period > best.count * best.period:
            best = RepeatedRun(start, period, count)
    return best


def node_codes(graph: torch.fx.Graph, ref_text=None) -> list[int]:
    """One integer per node, equal for two nodes exactly when they match (see the module note).

    ``ref_text(i, j, arg)`` writes node i's reference to node j; by default a placeholder or
    parameter by name, any other node by its distance back."""
    index: dict[torch.fx.Node, int] = {}
    interned: dict[str, int] = {}
    codes = []
    for i, node in enumerate(graph.nodes):
        index[node] = i

        def ref(arg: torch.fx.Node, i: int = i) -> str:
            if ref_text is not None:
                return ref_text(i, index[arg], arg)
            if arg.op in ("placeholder", "get_attr"):
                return f"@{arg.name}"
            return f"-{i - index[arg]}"

        text = "|".join((node.op, target_name(node), repr(torch.fx.node.map_arg((node.args, node.kwargs), ref)),
                         value_key(node.meta.get("val"))))
        if node.op in ("placeholder", "get_attr", "output"):
            text += "|" + node.name  # never part of a run
        codes.append(interned.setdefault(text, len(interned)))
    return codes


def value_key(val: object) -> str:
    """What of a node's value two matching nodes share: layout of every tensor, other leaves."""
    parts = []
    for leaf in flat_leaves(val):
        if isinstance(leaf, torch.Tensor):
            parts.append(f"{tuple(leaf.shape)}/{leaf.stride()}/{leaf.storage_offset()}/{leaf.dtype}/"
                         f"{leaf.device}/{leaf.untyped_storage().nbytes()}")
        else:
            parts.append(repr(leaf))
    return ";".join(parts)


def target_name(node: torch.fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else f"{getattr(target, '__module__', '')}.{target}"


def longest_true_stretch(flags: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest stretch of True in ``flags``; (0, 0) when there is none."""
    padded = np.concatenate(([0], flags.astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(padded))
    if len(edges) == 0:
        return 0, 0
    starts, ends = edges[0::2], edges[1::2]
    best = int(np.argmax(ends - starts))
    return int(starts[best]), int(ends[best] - starts[best])


def collapse_run(gm: torch.fx.GraphModule, run: RepeatedRun, keep_front: int,
                 keep_back: int = KEEP_BACK) -> torch.fx.GraphModule:
    """``gm`` with the run cut to its first ``keep_front`` and last ``keep_back`` copies.

    The copy after the cut reads the last copy kept where it read the one just before it; nodes
    after the run read the same copy counted from the end. Same parameters, buffers and calling
    convention as ``gm`` (its pytree code generator is shared)."""
    if keep_front < 1 or keep_back < 1 or keep_front + keep_back > run.count:
        raise NotRepeated(f"cannot keep {keep_front} + {keep_back} of {run.count} copies")
    nodes = list(gm.graph.nodes)
    removed = (run.count - keep_front - keep_back) * run.period
    cut_start = run.start + keep_front * run.period
    cut_end = cut_start + removed  # where the last keep_back copies start
    position = {node: i for i, node in enumerate(nodes)}
    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    new: dict[int, torch.fx.Node] = {}

    def ref_for(p: int):
        def ref(arg: torch.fx.Node) -> torch.fx.Node:
            q = position[arg]
            if p < cut_end or q < run.start or q >= cut_end:
                return new[q]
            if q < cut_start:
                raise NotRepeated(f"{nodes[p].name} reads {arg.name}, a copy before the cut, from after it")
            if q - removed < run.start:  # inside the cut: the same distance back from the copy after it
                raise NotRepeated(f"{nodes[p].name} reads {arg.name}, {p - q} nodes back across the run")
            return new[q - removed]
        return ref

    for p, node in enumerate(nodes):
        if cut_start <= p < cut_end:
            continue
        if p >= run.end and any(run.start <= position[a] < cut_end for a in node.all_input_nodes):
            raise NotRepeated(f"{node.name} (after the run) reads a copy other than the last {keep_back}")
        new[p] = graph.node_copy(node, ref_for(p))
    short = _make_graph_module(gm, graph)
    _check_same_state(gm, short)
    return short


def _check_same_state(full: torch.nn.Module, short: torch.nn.Module) -> None:
    """The short module lifts the same parameters and buffers, in the same order (the joint's
    placeholders), or it is not a shorter copy of the same step."""
    if [n for n, _ in full.named_parameters()] != [n for n, _ in short.named_parameters()] or \
            [n for n, _ in full.named_buffers()] != [n for n, _ in short.named_buffers()]:
        raise NotRepeated("the shortened forward does not hold the same parameters and buffers")
