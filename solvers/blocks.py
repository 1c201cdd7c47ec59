"""Per-block checkpointing: what ``torch.utils.checkpoint`` users write by hand.

Wrap each repeated block (a transformer layer, a residual block) in a checkpoint: forward
keeps the block's input and output and drops its interior; backward recomputes the interior
once, when the block's backward starts. The blocks are found from the module paths the
capture records on forward values: the numbered children of a container (``blocks.0``,
``layers.3``) or of a family of numbered containers (ResNet's ``layer1.0`` .. ``layer4.1``)
whose values cover the most bytes of the forward graph.
``every=n`` checkpoints only every n-th block (the n-th, 2n-th, ...), storing the others.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass

from solvers.base import SolveResult, SolverOptions, heuristic_result
from solvers.ir.graph import RematGraph
from solvers.ir.simulator import simulate
from solvers.segments import forward_values, pinned_values, segment_schedule

_INDEX = re.compile(r"^\d+$")
_TRAILING_NUMBER = re.compile(r"\d+$")


@dataclass(frozen=True)
class Block:
    """One repeated module: its path and the forward values it produced."""

    path: str
    values: tuple[str, ...]


def _container_family(container: str) -> tuple[str, str]:
    """Containers that differ only in a trailing number (ResNet's layer1..layer4) are one
    family: (parent path, last name with its number replaced by '#')."""
    parent, _, last = container.rpartition(".")
    return parent, _TRAILING_NUMBER.sub("#", last)


def find_containers(graph: RematGraph) -> tuple[str, ...]:
    """The containers whose numbered children hold the most forward bytes (two at least).

    Containers of one family (`_container_family`) count together; ties go to the
    shallower family, so ``blocks`` wins over ``blocks.0.mlp``.
    """
    covered: dict[tuple[str, str], int] = defaultdict(int)
    children: dict[tuple[str, str], set[str]] = defaultdict(set)
    members: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name in forward_values(graph):
        parts = graph[name].module.split(".") if graph[name].module else []
        for i, part in enumerate(parts):
            if _INDEX.match(part):
                container = ".".join(parts[:i])
                family = _container_family(container)
                covered[family] += graph[name].bytes
                children[family].add(f"{container}.{part}")
                members[family].add(container)
    candidates = [f for f in covered if len(children[f]) >= 2]
    if not candidates:
        return ()
    best = max(candidates, key=lambda f: (covered[f], -f[0].count(".") - bool(f[0])))
    return tuple(sorted(members[best]))


def find_blocks(graph: RematGraph, container: str | None = None) -> tuple[Block, ...]:
    """The numbered children of ``container`` (found automatically when None), in graph order."""
    containers = (container,) if container is not None else find_containers(graph)
    found: dict[str, list[str]] = defaultdict(list)
    for name in forward_values(graph):
        module = graph[name].module
        for c in containers:
            prefix = f"{c}." if c else ""
            head = module[len(prefix):].split(".")[0] if module.startswith(prefix) else ""
            if _INDEX.match(head):
                found[f"{prefix}{head}"].append(name)
    order = sorted(found, key=lambda path: graph.position(found[path][0]))
    return tuple(Block(path, tuple(found[path])) for path in order)


def block_interior(graph: RematGraph, block: Block, pinned: set[str]) -> set[str]:
    """Values a checkpointed block drops: not pinned and not read by forward ops outside it."""
    inside = set(block.values)
    outputs = {
        inp for name in forward_values(graph) if name not in inside
        for inp in graph[name].inputs if inp in inside
    }
    return inside - outputs - pinned


def solve_blocks(
    graph: RematGraph, budget_bytes: int, options: SolverOptions, *,
    container: str | None = None, every: int = 1,
) -> SolveResult:
    """Checkpoint every ``every``-th repeated block of ``container`` (auto-detected when None)."""
    if every < 1:
        raise ValueError(f"every must be at least 1, got {every}")
    start = time.perf_counter()
    blocks = find_blocks(graph, container)
    pinned = pinned_values(graph)
    chosen = [b for i, b in enumerate(blocks) if (i + 1) % every == 0]
    segment_of: dict[str, int] = {name: -1 for name in forward_values(graph)}
    dropped: set[str] = set()
    for i, block in enumerate(chosen):
        interior = block_interior(graph, block, pinned)
        dropped |= interior
        for name in interior:
            segment_of[name] = i
    kept = {name for name in forward_values(graph) if name not in dropped}
    schedule = segment_schedule(graph, kept, segment_of)
    sim = simulate(graph, schedule)
    where = ", ".join(dict.fromkeys(b.path.rsplit(".", 1)[0] for b in blocks)) or \
        "no repeated blocks found"
    detail = f"{len(chosen)} of {len(blocks)} blocks checkpointed ({where})"
    return heuristic_result("blocks", budget_bytes, schedule, sim, start, detail)
