"""A GPT-2-shaped language model at three sizes: the scale benchmark's subject.

Same architecture as OpenAI's GPT-2 (pre-LayerNorm blocks, fused qkv projection, tanh-GELU MLP
of width 4d, learned positions, dropout 0.1 on embeddings, attention probabilities and residuals,
``lm_head`` tied to the token embedding), with attention written out as matmul + causal mask +
softmax as in transformers' eager GPT-2, so its quadratic intermediates are graph nodes.

Presets (`PRESETS`): ``tiny`` (default: runs on a laptop CPU in the tests), ``small``
(GPT-2-small: 12 layers, d_model 768, 12 heads, seq 512, batch 8, vocab 50257) and ``xl``
(GPT-2-XL-sized: 48 layers, d_model 1600, 25 heads, seq 1024). The large presets are meant to be
planned from a meta-device model (``get_model("small", device="meta")``), which allocates nothing.

Model-file convention (see README): ``get_model()`` returns the module, ``get_inputs()`` the
positional example inputs; ``model(*get_inputs())`` returns ``(loss, logits)``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class GPT2Config:
    n_layers: int
    """Transformer blocks."""
    d_model: int
    n_heads: int
    seq_len: int
    """Context length (and the example inputs' sequence length)."""
    batch: int
    """Batch size of the example inputs."""
    vocab_size: int
    dropout: float = 0.1


PRESETS: dict[str, GPT2Config] = {
    "tiny": GPT2Config(n_layers=2, d_model=64, n_heads=4, seq_len=64, batch=2, vocab_size=512),
    "small": GPT2Config(n_layers=12, d_model=768, n_heads=12, seq_len=512, batch=8, vocab_size=50257),
    "xl": GPT2Config(n_layers=48, d_model=1600, n_heads=25, seq_len=1024, batch=1, vocab_size=50257),
}


class Attention(nn.Module):
    """Causal multi-head self-attention, GPT-2 eager style."""

    causal_mask: torch.Tensor

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.register_buffer(
            "causal_mask", torch.tril(torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool)),
            persistent=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        head_dim = d_model // self.n_heads
        q, k, v = self.c_attn(x).split(d_model, dim=2)
        q, k, v = (t.view(batch, seq, self.n_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        scores = scores.masked_fill(~self.causal_mask[:seq, :seq], torch.finfo(scores.dtype).min)
        probs = self.attn_dropout(F.softmax(scores, dim=-1))
        y = (probs @ v).transpose(1, 2).contiguous().view(batch, seq, d_model)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.resid_dropout(self.attn(self.ln_1(x)))
        return x + self.resid_dropout(self.mlp(self.ln_2(x)))


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(_init_weights)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return loss, logits


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)) and module.weight.device.type != "meta":
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None and module.bias.device.type != "meta":
        nn.init.zeros_(module.bias)


def get_config(preset: str = "tiny", **overrides) -> GPT2Config:
    """A preset, with fields overridden (``get_config("small", n_layers=48)``)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown GPT-2 preset {preset!r}: choose one of {', '.join(PRESETS)}")
    import dataclasses

    return dataclasses.replace(PRESETS[preset], **overrides)


def get_model(preset: str | GPT2Config = "tiny", *, device: str | torch.device | None = None,
              dropout: float | None = None) -> nn.Module:
    """The model with weights fixed by seed 0 (``device="meta"``: shapes only, nothing allocated;
    ``None``: the default device, so ``remat-opt --meta`` can build it on meta)."""
    cfg = get_config(preset) if isinstance(preset, str) else preset
    if dropout is not None:
        cfg = get_config(preset, dropout=dropout) if isinstance(preset, str) else \
            GPT2Config(**{**cfg.__dict__, "dropout": dropout})
    with torch.random.fork_rng(devices=[]), (torch.device(device) if device else contextlib.nullcontext()):
        torch.manual_seed(0)
        return GPT2(cfg)


def get_inputs(preset: str | GPT2Config = "tiny", *, device: str | torch.device = "cpu",
               batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, targets)``: int64 token ids ``[batch, seq_len]``; targets are idx shifted by one."""
    cfg = get_config(preset) if isinstance(preset, str) else preset
    batch = cfg.batch if batch is None else batch
    if torch.device(device).type == "meta":
        idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
        return idx, torch.zeros_like(idx)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1))
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
