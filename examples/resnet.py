"""A ResNet-like classifier step: three stages of basic blocks with BatchNorm2d in train mode.

Shaped like a (narrow, shallow) ResNet-18: a conv+BN+ReLU stem, then stages of two basic blocks
(3x3 conv+BN+ReLU, 3x3 conv+BN, residual add, ReLU) at 16, 32 and 64 channels, the first block
of each later stage strided with a 1x1 conv+BN projection on the skip; global average pool and
a linear head. BatchNorm in train mode updates its running statistics in place during forward:
PyTorch's own min-cut partitioner is known to fail on such models below a memory budget of 1,
and recomputation must update the statistics exactly once.

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
STAGE_WIDTHS = (16, 32, 64)
BLOCKS_PER_STAGE = 2


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN + skip (1x1 conv+BN when the shape changes), then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.downsample(x))


class ResNet(nn.Module):
    """Stem, ``len(widths)`` stages of ``blocks_per_stage`` basic blocks, pool, linear head.

    ``self.blocks`` is one flat ``nn.Sequential`` of every basic block, so per-block
    checkpointing can wrap each of them.
    """

    def __init__(self, widths: tuple[int, ...] = STAGE_WIDTHS,
                 blocks_per_stage: int = BLOCKS_PER_STAGE, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        in_channels = widths[0]
        for stage, width in enumerate(widths):
            for index in range(blocks_per_stage):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(in_channels, width, stride))
                in_channels = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(images))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(features, 1), 1))
        return F.cross_entropy(logits, labels)


def get_model() -> nn.Module:
    """The ResNet in train mode with weights fixed by seed 0 (the caller's RNG is untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ResNet()


def get_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: float32 ``[BATCH, 3, 16, 16]`` and int64 ``[BATCH]``, seed 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        images = torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)
        labels = torch.randint(0, NUM_CLASSES, (BATCH,))
    return images, labels
