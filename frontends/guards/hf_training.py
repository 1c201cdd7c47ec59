"""A training step of a generative model captures no generation cache.

transformers' generative configs default to ``use_cache=True``: a training forward then builds
a ``DynamicCache`` (``EncoderDecoderCache`` for T5 and BART), fills it with every layer's keys
and values and returns it in the ``ModelOutput``. A training step has no use for it: Hugging
Face's own gradient checkpointing switches the cache off in training (``use_cache=False``, with
a warning), and so does capture, for the duration of the trace only:

- every ``config`` found on the model's modules that has ``use_cache=True`` is set to False
  while the step is traced and restored afterwards, so the caller's model is unchanged for
  evaluation and generation (the remat module runs the original model in ``eval()``);
- an explicit ``use_cache=True`` keyword argument is traced as False, and the remat module
  passes False in its place at every training call (`CacheOff.kwarg_overrides`).

Nothing here imports transformers: a config is anything with a boolean ``use_cache``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

USE_CACHE_NOTE = ("use_cache=False in the training step (as Hugging Face's gradient checkpointing "
                  "does; the model's config is unchanged)")


@dataclass
class CacheOff:
    """What `cache_off_for_training` changed for the trace."""

    kwargs: dict
    """The keyword arguments to trace with."""
    kwarg_overrides: dict = field(default_factory=dict)
    """Keyword values the remat module passes instead of the caller's at each training call."""
    notes: tuple[str, ...] = ()
    """Said once in the plan's message."""


@contextlib.contextmanager
def cache_off_for_training(model: torch.nn.Module, kwargs: dict) -> Iterator[CacheOff]:
    """Within the block: no config of ``model`` asks for a generation cache (see module doc)."""
    configs: dict[int, object] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "use_cache", None) is True:
            configs.setdefault(id(config), config)
    overrides = {"use_cache": False} if kwargs.get("use_cache") is True else {}
    changed = CacheOff(kwargs={**kwargs, **overrides}, kwarg_overrides=overrides,
                       notes=(USE_CACHE_NOTE,) if configs or overrides else ())
    restored = []
    try:
        for config in configs.values():
            config.use_cache = False
            restored.append(config)
        yield changed
    finally:
        for config in restored:
            config.use_cache = True


def explain_unsupported_value(message: str) -> str | None:
    """One line for export's refusal of a non-pytree input or output ("Found <class ...> in
    output", "Unsupported input type <class ...>"), or None for other errors."""
    found = _CLASS.search(message)
    if found is None or not ("in output" in message or "input type" in message):
        return None
    qualified = found.group(1)
    name = qualified.rsplit(".", 1)[-1]
    where = "outputs hold" if "in output" in message else "inputs hold"
    if qualified.startswith("transformers") and name.endswith("Cache"):
        return (f"the model's {where} a transformers {name} (the generation cache), which a "
                "training step cannot carry: pass no past_key_values and use_cache=False "
                "(capture turns the config's use_cache off by itself)")
    return (f"the model's {where} a {name}, which is neither a tensor nor a registered pytree: "
            f"pass and return tensors (or containers of them), or register {name} with "
            "torch.utils._pytree.register_pytree_node")


def explain_library_construct(message: str, frames: list) -> str | None:
    """One line for a transformers construct that a static-shape plan cannot hold, from the
    failure's message and its traceback frames (``traceback.FrameSummary``), or None."""
    data_dependent = "data-dependent" in message or "GuardOnDataDependent" in message
    library = [f for f in frames if "/transformers/" in f.filename]
    if not (data_dependent and library):
        return None
    last = library[-1]
    where = f'File "{last.filename}", line {last.lineno}: {(last.line or "").strip()}'
    if any("/integrations/moe.py" in f.filename for f in library) or "expert" in (last.line or ""):
        return (f"the eager experts implementation routes tokens with data-dependent shapes ({where}), "
                "which a static-shape plan cannot hold: build the model with "
                "experts_implementation=\"grouped_mm\" (the default) or \"batched_mm\"")
    return None


_CLASS = re.compile(r"<class '([\w.]+)'>")
