"""A small GPT language-model step: the transformer graph the optimizer is built for.

Exercises: repeated identical blocks (pre-LayerNorm causal self-attention + MLP) for block
detection; attention written out as matmul + causal mask + softmax, so its quadratic
intermediates are ordinary graph nodes; dropout (random nodes that recomputation must replay with
the same mask); a registered mask buffer; and an ``lm_head`` weight tied to the token embedding,
so one parameter is used twice and receives the sum of two gradients.

Model-file convention (see README): ``get_model()`` returns the module, ``get_inputs()`` the
positional example inputs; ``model(*get_inputs())`` returns ``(loss, logits)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE = 256
SEQ_LEN = 32
D_MODEL = 64
N_HEADS = 4
N_LAYERS = 3
BATCH = 4


class CausalSelfAttention(nn.Module):
    """Multi-head attention with an explicit causal mask and dropout on the probabilities."""

    causal_mask: torch.Tensor

    def __init__(self, d_model: int, n_heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.register_buffer(
            "causal_mask", torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool)),
            persistent=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        head_dim = d_model // self.n_heads
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q = q.view(batch, seq, self.n_heads, head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.n_heads, head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.n_heads, head_dim).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        scores = scores.masked_fill(~self.causal_mask[:seq, :seq], float("-inf"))
        probs = self.attn_drop(F.softmax(scores, dim=-1))
        y = (probs @ v).transpose(1, 2).contiguous().view(batch, seq, d_model)
        return self.proj(y)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x)))."""

    def __init__(self, d_model: int, n_heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, seq_len, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.resid_drop(self.attn(self.ln1(x)))
        return x + self.resid_drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """Token + learned position embeddings, ``n_layers`` blocks, final LayerNorm, tied lm_head."""

    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        seq_len: int = SEQ_LEN,
        d_model: int = D_MODEL,
        n_heads: int = N_HEADS,
        n_layers: int = N_LAYERS,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, seq_len, dropout) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_init_weights)
        self.lm_head.weight = self.tok_emb.weight  # tied: one parameter, two uses

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return loss, logits


def _init_weights(module: nn.Module) -> None:
    """GPT-2 style init (N(0, 0.02), zero biases) so the tied head starts near uniform logits."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def get_model(dropout: float = 0.1) -> nn.Module:
    """The GPT with weights fixed by seed 0; ``dropout=0.0`` makes forward deterministic."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT(dropout=dropout)


def get_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, targets)``: int64 token ids ``[BATCH, SEQ_LEN]``; targets are idx shifted by one."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        tokens = torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN + 1))
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
