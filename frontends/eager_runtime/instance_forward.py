"""The instance ``forward`` remat-opt sets on a user's module, and the error a plan that does not
fit the model raises: shared by the checkpoint, split and offload wrappers of the eager runtime
(`frontends.eager_runtime.eager_checkpoint`, `frontends.eager_runtime.eager_offload`)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, TypeVar

import torch


class CheckpointPlanError(ValueError):
    """A saved plan that does not fit this model (or is not a plan); nothing was applied."""


class InstanceForward:
    """An instance ``forward`` set on a module by remat-opt (a plain object, so ``deepcopy`` and
    pickling of the model keep working: it refers to its module, not to a closure)."""

    def __init__(self, module: torch.nn.Module, previous: Any) -> None:
        self.module = module
        self.previous = previous
        """The instance ``forward`` the module had before (None: its class's)."""

    def _original(self) -> Any:
        return self.previous if self.previous is not None else type(self.module).forward.__get__(self.module)

    @property
    def __signature__(self) -> inspect.Signature:
        """The wrapped forward's signature (Trainer and others inspect ``model.forward``)."""
        return inspect.signature(self._original())


W = TypeVar("W", bound=InstanceForward)


def wrappers_of(model: torch.nn.Module, kind: type[W]) -> Iterator[tuple[str, W]]:
    """(module path, wrapper) for every ``kind`` wrapper on ``model``'s modules, outermost first
    down each module's chain of instance ``forward``s."""
    for path, module in model.named_modules():
        wrapper = module.__dict__.get("forward")
        while isinstance(wrapper, InstanceForward):
            if isinstance(wrapper, kind):
                yield path, wrapper
            wrapper = wrapper.previous
