"""A small Vision-Transformer classifier step: patch embedding, then identical transformer blocks.

Exercises the transformer trade-off without a causal mask or a vocabulary: a strided convolution
cuts the image into patches (the patch embedding), a learned class token and position embedding
are added, and pre-LayerNorm blocks with full (bidirectional) self-attention, written out as
matmul + softmax so its quadratic intermediates are graph nodes, feed a linear head on the class
token. No dropout: the step is deterministic.

Model-file convention (see README): ``get_model()`` returns the module, ``get_inputs()`` the
positional example inputs; ``model(*get_inputs())`` returns ``(loss, logits)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 4
IMAGE_SIZE = 32
PATCH_SIZE = 4
CHANNELS = 3
D_MODEL = 64
N_HEADS = 4
N_LAYERS = 3
NUM_CLASSES = 10


class SelfAttention(nn.Module):
    """Multi-head self-attention over all tokens (no mask)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, d_model = x.shape
        head_dim = d_model // self.n_heads
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q, k, v = (t.view(batch, tokens, self.n_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        probs = F.softmax((q @ k.transpose(-2, -1)) / math.sqrt(head_dim), dim=-1)
        y = (probs @ v).transpose(1, 2).contiguous().view(batch, tokens, d_model)
        return self.proj(y)


class EncoderBlock(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x)) with a GELU MLP of width 4d."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Patch embedding (conv, stride = patch), class token, positions, ``n_layers`` blocks, head."""

    def __init__(self, image_size: int = IMAGE_SIZE, patch_size: int = PATCH_SIZE,
                 d_model: int = D_MODEL, n_heads: int = N_HEADS, n_layers: int = N_LAYERS,
                 num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        n_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(CHANNELS, d_model, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_embed = nn.Parameter(torch.randn(1, n_patches + 1, d_model) * 0.02)
        self.blocks = nn.ModuleList(EncoderBlock(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        patches = self.patch_embed(images).flatten(2).transpose(1, 2)  # [batch, patches, d]
        cls = self.cls_token.expand(images.shape[0], -1, -1)
        x = torch.cat([cls, patches], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x[:, 0]))
        return F.cross_entropy(logits, labels), logits


def get_model() -> nn.Module:
    """The ViT with weights fixed by seed 0 (the caller's RNG state is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ViT()


def get_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: float32 ``[BATCH, 3, 32, 32]`` and int64 ``[BATCH]``, seed 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        images = torch.randn(BATCH, CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
        labels = torch.randint(0, NUM_CLASSES, (BATCH,))
    return images, labels
