"""A small ResNet-like classifier step: convolutions, BatchNorm2d in train mode, residual adds.

Exercises branching graphs (each residual block forks and joins), a strided block with a 1x1
projection shortcut, and BatchNorm's in-place update of its running statistics during forward --
the mutation that makes PyTorch's own min-cut partitioner fail on ResNets, and that a rewrite
must neither duplicate nor drop when it recomputes.

Model-file convention (see README): ``get_model()`` returns the module, ``get_inputs()`` the
positional example inputs; ``model(*get_inputs())`` returns the scalar loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 8
IMAGE_SIZE = 16
NUM_CLASSES = 10


class ResidualBlock(nn.Module):
    """Two 3x3 conv+BN layers and a skip; a 1x1 conv+BN projects the skip when shapes change."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ConvNet(nn.Module):
    """Stem (16 channels), three residual blocks (16 -> 32 channels, one strided), pool, linear."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.blocks = nn.Sequential(
            ResidualBlock(16, 16), ResidualBlock(16, 32, stride=2), ResidualBlock(32, 32)
        )
        self.fc = nn.Linear(32, num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(images))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(features, 1), 1))
        return F.cross_entropy(logits, labels)


def get_model() -> nn.Module:
    """The ConvNet in train mode with weights fixed by seed 0 (the caller's RNG is untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ConvNet()


def get_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: float32 ``[BATCH, 3, 16, 16]`` and int64 ``[BATCH]``, seed 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        images = torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)
        labels = torch.randint(0, NUM_CLASSES, (BATCH,))
    return images, labels
