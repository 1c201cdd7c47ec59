"""A model from its configuration alone, built on the meta device: no weights, no memory.

Users ask before they own the GPU or download the weights: "does Llama-3-8B train on one 80 GB
H100 at batch 4 x 4096 with AdamW, and at what recomputation cost?" A transformers config
(``config.json``, a folder holding one, or a hub name where the network allows) or a timm model
name is enough: the model is built under ``torch.device("meta")`` (every parameter a shape and a
dtype), wrapped so that its one positional input is the batch (the what-if's batch search scales
it), and captured from shapes like any ``--meta`` model file.

* causal language models: ``input_ids`` of ``batch x seq`` token ids, the loss of
  ``model(input_ids=..., labels=input_ids)`` (transformers shifts the labels), SDPA attention,
  ``use_cache=False`` as in training;
* timm image models: ``batch x 3 x H x W`` images at the model's default input size, the
  cross-entropy against class 0 (a loss of the right shape: memory does not depend on the labels).
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from torch import nn


class ConfigModelError(ValueError):
    """A configuration that cannot be built into a model; the message says what to give."""


class CausalLMStep(nn.Module):
    """A causal LM's training step as one positional input: ``input_ids`` -> the loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=input_ids).loss


class ClassifierStep(nn.Module):
    """An image classifier's training step as one positional input: images -> the loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.model(images)
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits, labels)


def hf_config_model(source: str, batch: int, seq: int | None = None,
                    dtype: torch.dtype | None = None) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The causal LM ``source`` configures, on meta, and ``batch x seq`` token ids (``seq``:
    default the config's ``max_position_embeddings``, at most 4,096)."""
    try:
        import transformers  # optional: only this path needs it
    except ImportError:
        raise ConfigModelError("--hf-config needs transformers: pip install transformers") from None
    transformers.logging.set_verbosity_error()
    config = _load_config(transformers, source)
    config.use_cache = False
    dtype = dtype or _config_dtype(config)
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                                   torch_dtype=dtype)
    except (ValueError, KeyError) as err:
        raise ConfigModelError(f"{source}: transformers builds no causal language model from this config "
                               f"({str(err).splitlines()[0]})") from None
    seq = seq or min(getattr(config, "max_position_embeddings", 2048) or 2048, 4096)
    _check_sizes(batch, seq)
    tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return CausalLMStep(model.train()), (tokens,)


def timm_model(name: str, batch: int, dtype: torch.dtype | None = None) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """timm's ``name`` on meta (no pretrained weights) and ``batch`` images at its default size."""
    try:
        import timm  # optional: only this path needs it
    except ImportError:
        raise ConfigModelError("--timm needs timm: pip install timm (it pairs with torch 2.14.1)") from None
    if name not in timm.list_models():
        raise ConfigModelError(f"timm has no model {name!r}: see timm.list_models()")
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    if dtype is not None:
        model = model.to(dtype)
    _check_sizes(batch, 1)
    channels, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
    images = torch.empty(batch, channels, height, width, dtype=dtype or torch.float32, device="meta")
    return ClassifierStep(model.train()), (images,)


def _load_config(transformers, source: str):
    path = os.path.join(source, "config.json") if os.path.isdir(source) else source
    if os.path.isfile(path):
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigModelError(f"{source}: not a readable config.json ({err})") from None
        model_type = data.pop("model_type", None)
        if model_type is None:
            raise ConfigModelError(f"{source}: the config names no model_type (llama, gpt2, mistral, ...)")
        try:
            return transformers.AutoConfig.for_model(model_type, **data)
        except ValueError as err:
            raise ConfigModelError(f"{source}: {str(err).splitlines()[0]}") from None
    if os.path.sep in source or source.endswith(".json"):
        raise ConfigModelError(f"config {source!r} not found: give a config.json, a folder holding one, or a "
                               "hub name")
    try:
        return transformers.AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise ConfigModelError(f"{source}: no local config.json of that name and the hub did not answer "
                               f"({str(err).splitlines()[0]}); give a config.json path") from None


def _config_dtype(config) -> torch.dtype:
    """The config's own dtype (``torch_dtype``/``dtype`` as written), else float32."""
    for key in ("dtype", "torch_dtype"):
        value = getattr(config, key, None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
            return getattr(torch, value)
    return torch.float32


def _check_sizes(batch: int, seq: int) -> None:
    if batch < 1 or seq < 1:
        raise ConfigModelError(f"batch and sequence length must be positive, got {batch} x {seq}")
