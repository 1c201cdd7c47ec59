"""Four 4096-wide Linear + GELU layers and an MSE loss: the offload what-if's subject.

Wide matmuls give each saved activation (``rows x 4096`` floats, 64 MiB at 4096 rows) enough
compute around it to hide its copy over PCIe, so on a GPU offloading it can beat recomputing it
(benchmarks/RESULTS.md, "What-if sweeps with offload"). Meant for ``--meta``: at full size a CPU
step takes seconds, so plan it from shapes::

    remat-opt examples/wide_mlp.py --meta --device h200 --offload --sweep 84%,90% --budget 84%
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


class WideMLP(nn.Module):
    def __init__(self, width: int = 4096, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return F.mse_loss(x, target)


def get_model(width: int = 4096, depth: int = 4, *, device: str | torch.device | None = None) -> nn.Module:
    """Weights fixed by seed 0 (``device="meta"``: shapes only; None: the default device, so
    ``remat-opt --meta`` can build it on meta)."""
    with torch.random.fork_rng(devices=[]), (torch.device(device) if device else contextlib.nullcontext()):
        torch.manual_seed(0)
        return WideMLP(width, depth)


def get_inputs(rows: int = 4096, width: int = 4096, *, device: str | torch.device | None = None):
    """``(x, target)``, ``rows x width`` each."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return torch.randn(rows, width, device=device), torch.randn(rows, width, device=device)
