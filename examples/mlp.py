"""A plain MLP regression step: the simplest chain graph (Linear + GELU, six layers deep).

Exercises the chain solvers (revolve, heterogeneous chain DP) on a graph with no branches, and
gives every other solver a case where the optimal schedule is easy to check by hand.

Model-file convention (see README): ``get_model()`` returns the module, ``get_inputs()`` the
positional example inputs; ``model(*get_inputs())`` returns the scalar loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 512
WIDTH = 256
DEPTH = 6


class MLP(nn.Module):
    """``DEPTH`` Linear+GELU layers of width ``WIDTH``, then a Linear head; returns the MSE loss."""

    def __init__(self, width: int = WIDTH, depth: int = DEPTH) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return F.mse_loss(self.head(x), target)


def get_model() -> nn.Module:
    """The MLP with weights fixed by seed 0 (the caller's RNG state is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return MLP()


def get_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, target)``, both float32 ``[BATCH, WIDTH]``, fixed by seed 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        x = torch.randn(BATCH, WIDTH)
        target = torch.randn(BATCH, WIDTH)
    return x, target
