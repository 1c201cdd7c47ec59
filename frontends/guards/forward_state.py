"""The Python state a forward may change outside its tensors: plain attributes of the model's
modules (and tensor attributes, by identity) and the module-level variables of the files that
define their ``forward``; snapshots, their differences as phrases, and the values to restore.
`frontends.guards.forward_guards` compares them around a capture; `optimizer.verify` after steps."""

from __future__ import annotations

import copy
from typing import Any

import torch

from frontends.guards.user_code import is_user_file

_TORCH_OWN_ATTRIBUTES = frozenset(torch.nn.Module().__dict__)
"""What ``nn.Module.__init__`` sets (hooks, parameters, ``training``): torch's bookkeeping."""
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes,
                torch.dtype, torch.device, torch.layout, torch.memory_format)
_MAX_ITEMS = 10_000


def _is_plain(value: Any, depth: int = 0) -> bool:
    """Numbers, strings, flags, dtypes and devices, and small containers of them."""
    if isinstance(value, _PLAIN_TYPES):
        return True
    if depth >= 4 or not isinstance(value, (tuple, list, set, frozenset, dict)) or len(value) > _MAX_ITEMS:
        return False
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return all(_is_plain(v, depth + 1) for v in items)


class TensorRef:
    """A tensor attribute, compared by identity (what torch.export restores, but only warns of)."""

    __slots__ = ("tensor",)
    __hash__ = None

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorRef) and other.tensor is self.tensor

    def __repr__(self) -> str:
        return "a tensor"


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, TensorRef) or isinstance(b, TensorRef):
        return a == b
    try:
        if a == b:
            return True
    except Exception:  # a value whose == raises counts as changed only if its text differs
        pass
    return type(a) is type(b) and repr(a) == repr(b)  # nan == nan


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def model_path(path: str) -> str:
    return f"model.{path}" if path else "model"


def attribute_snapshot(model: torch.nn.Module, tensors: bool) -> dict[tuple[str, str], Any]:
    found: dict[tuple[str, str], Any] = {}
    for path, module in model.named_modules():
        for name, value in module.__dict__.items():
            if name in _TORCH_OWN_ATTRIBUTES:
                continue
            if _is_plain(value):
                found[(path, name)] = copy.deepcopy(value)
            elif tensors and isinstance(value, torch.Tensor):
                found[(path, name)] = TensorRef(value)
    return found


def original_value(value: Any) -> Any:
    return value.tensor if isinstance(value, TensorRef) else copy.deepcopy(value)


def plain_attributes(model: torch.nn.Module) -> dict[tuple[str, str], Any]:
    """(module path, attribute) -> a copy of every plain value (`_is_plain`) the model's modules
    hold outside torch's own bookkeeping: what a forward may change in Python."""
    return attribute_snapshot(model, tensors=False)


def differing_attributes(a: dict[tuple[str, str], Any], b: dict[tuple[str, str], Any]
                         ) -> list[tuple[str, str | None, str | None]]:
    """(``model.path.attr``, value in ``a``, value in ``b``) shown short, None where absent, for
    each plain attribute that differs between two `plain_attributes` snapshots."""
    found = []
    for key in dict.fromkeys([*a, *b]):
        if key in a and key in b and same_value(a[key], b[key]):
            continue
        found.append((f"{model_path(key[0])}.{key[1]}", shown(a[key]) if key in a else None,
                      shown(b[key]) if key in b else None))
    return found


def attribute_differences(before: dict[tuple[str, str], Any], after: dict[tuple[str, str], Any]) -> list[str]:
    """One phrase per plain attribute that differs between two `plain_attributes` snapshots."""
    return [f"{name} was removed (was {old})" if new is None
            else f"{name} was set to {new}" if old is None
            else f"{name} changed {old} -> {new}"
            for name, old, new in differing_attributes(before, after)]


def forward_globals(model: torch.nn.Module) -> list[dict]:
    """The module-level variables (globals) of the user files that define the model's forwards."""
    found: dict[int, dict] = {}
    for module in model.modules():
        code = getattr(getattr(type(module), "forward", None), "__code__", None)
        if code is not None and is_user_file(code.co_filename):
            namespace = type(module).forward.__globals__
            found.setdefault(id(namespace), namespace)
    return list(found.values())


def plain_globals(namespace: dict) -> dict[str, Any]:
    return {name: copy.deepcopy(value) for name, value in namespace.items()
            if not name.startswith("__") and _is_plain(value)}
