"""What the device allocator adds on top of tensor bytes, so a planned peak matches a measured one.

PyTorch's CUDA caching allocator hands out blocks in multiples of 512 bytes (a 4-byte scalar
loss takes 512), and ``torch.cuda.max_memory_allocated`` counts those blocks. Libraries also keep
workspaces in the same pool (cuBLAS allocates one per handle and stream on first use), and a
cached block may be handed out whole when the leftover is too small to split. `AllocatorModel`
rounds every value to the block size before simulation and adds a reserve and a margin to the
simulated peak, so the plan that fits ``budget`` fits it on the device. The CPU allocator
does not round what PyTorch reports as storage bytes: block 1. This module imports no torch.
"""

from __future__ import annotations

import dataclasses
import math

from solvers.ir.graph import Node, RematGraph

CUDA_BLOCK_BYTES = 512
"""Rounding of PyTorch's CUDA caching allocator (``kMinBlockSize`` in CUDACachingAllocator.cpp)."""


def round_block(nbytes: int, block: int = CUDA_BLOCK_BYTES) -> int:
    """``nbytes`` rounded up to a multiple of ``block``; 0 stays 0 (no allocation is made)."""
    if nbytes < 0:
        raise ValueError(f"bytes must be >= 0, got {nbytes}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    return -(-nbytes // block) * block


@dataclasses.dataclass(frozen=True, kw_only=True)
class AllocatorModel:
    """How one device's allocator turns tensor bytes into the peak its statistics report."""

    block_bytes: int = CUDA_BLOCK_BYTES
    """Every allocation is rounded up to a multiple of this (512 on CUDA, 1 on CPU)."""
    workspace_reserve_bytes: int = 0
    """Bytes held outside the graph's values for the whole step (cuBLAS/cuDNN workspaces)."""
    fragmentation_margin: float = 0.0
    """Fraction added to the simulated peak for blocks the allocator cannot split exactly."""

    def __post_init__(self) -> None:
        if self.block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {self.block_bytes}")
        if self.workspace_reserve_bytes < 0:
            raise ValueError(f"workspace_reserve_bytes must be >= 0, got {self.workspace_reserve_bytes}")
        if not 0.0 <= self.fragmentation_margin < 1.0:
            raise ValueError(f"fragmentation_margin must be in [0, 1), got {self.fragmentation_margin}")

    def apply(self, graph: RematGraph) -> RematGraph:
        """``graph`` with every value's bytes and temp bytes rounded to whole blocks.

        Unused outputs of one op are stored as one ``temp_bytes`` sum, so they are rounded
        together (each is really its own block: this may be low by block-1 bytes per extra one).
        """
        if self.block_bytes == 1:
            return graph
        nodes: list[Node] = [
            dataclasses.replace(
                node,
                bytes=round_block(node.bytes, self.block_bytes),
                temp_bytes=round_block(node.temp_bytes, self.block_bytes),
            )
            for node in graph.nodes
        ]
        return dataclasses.replace(graph, nodes=tuple(nodes))

    def describe(self) -> str:
        """One line for reports (``none`` for exact byte accounting)."""
        if self.block_bytes == 1 and not self.workspace_reserve_bytes and not self.fragmentation_margin:
            return "none"
        return (f"blocks of {self.block_bytes} B, reserve {self.workspace_reserve_bytes} B, "
                f"margin {100 * self.fragmentation_margin:g}%")

    def planned_peak(self, simulated_peak: int) -> int:
        """Peak to show and to compare with the budget: simulated peak + margin + reserve."""
        return math.ceil(simulated_peak * (1.0 + self.fragmentation_margin)) + self.workspace_reserve_bytes

    def solver_budget(self, budget_bytes: int) -> int:
        """The largest simulated peak whose `planned_peak` still fits ``budget_bytes``."""
        room = budget_bytes - self.workspace_reserve_bytes
        if room <= 0:
            return 0
        simulated = math.floor(room / (1.0 + self.fragmentation_margin))
        while simulated > 0 and self.planned_peak(simulated) > budget_bytes:  # float rounding
            simulated -= 1
        while self.planned_peak(simulated + 1) <= budget_bytes:  # rounding the other way
            simulated += 1
        return simulated


CPU_ALLOCATOR = AllocatorModel(block_bytes=1)
"""CPU: storage bytes are what the live-memory tracker counts; nothing to add."""

CUDA_ALLOCATOR = AllocatorModel(block_bytes=CUDA_BLOCK_BYTES)
"""CUDA, rounding only; set a reserve and margin with `dataclasses.replace` once measured."""


def allocator_for(device_type: str) -> AllocatorModel:
    """The default model for a torch device type ('cuda' or 'cpu'; others: no rounding)."""
    return CUDA_ALLOCATOR if device_type == "cuda" else CPU_ALLOCATOR
