"""A small UNet segmentation step: an encoder-decoder whose skip connections are concatenated.

Exercises long-range skips: each encoder level's features are kept until the decoder level that
concatenates them (``torch.cat``) with the upsampled path, so the graph is far from a chain and
the values alive at any point span the whole network. Double 3x3 conv blocks with GroupNorm and
SiLU (as in diffusion UNets; no running statistics), max-pool down, transposed-conv up, a 1x1 conv
head and a per-pixel cross-entropy loss.

Model-file convention (see README): ``get_model()`` returns the module, ``get_inputs()`` the
positional example inputs; ``model(*get_inputs())`` returns the scalar loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 2
IMAGE_SIZE = 32
IN_CHANNELS = 3
NUM_CLASSES = 4
WIDTHS = (8, 16, 32)
GROUPS = 4


class DoubleConv(nn.Module):
    """(conv3x3 -> GroupNorm -> SiLU) twice."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.GroupNorm(GROUPS, out_channels),
            nn.SiLU(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1), nn.GroupNorm(GROUPS, out_channels),
            nn.SiLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Up(nn.Module):
    """Transposed conv doubles the resolution; concatenate the encoder's skip; DoubleConv."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, 2, stride=2)
        self.conv = DoubleConv(2 * out_channels, out_channels)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    """Encoder ``down`` (one DoubleConv per width, max-pool between), bottleneck, decoder ``up``."""

    def __init__(self, widths: tuple[int, ...] = WIDTHS, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        channels = (IN_CHANNELS, *widths)
        self.down = nn.ModuleList(DoubleConv(channels[i], channels[i + 1]) for i in range(len(widths)))
        self.bottleneck = DoubleConv(widths[-1], 2 * widths[-1])
        ups = (2 * widths[-1], *reversed(widths))
        self.up = nn.ModuleList(Up(ups[i], ups[i + 1]) for i in range(len(widths)))
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, images: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        skips = []
        x = images
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottleneck(x)
        for block, skip in zip(self.up, reversed(skips)):
            x = block(x, skip)
        return F.cross_entropy(self.head(x), masks)


def get_model() -> nn.Module:
    """The UNet with weights fixed by seed 0 (the caller's RNG state is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return UNet()


def get_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, masks)``: float32 ``[BATCH, 3, 32, 32]`` and int64 class ids ``[BATCH, 32, 32]``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        images = torch.randn(BATCH, IN_CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
        masks = torch.randint(0, NUM_CLASSES, (BATCH, IMAGE_SIZE, IMAGE_SIZE))
    return images, masks
