"""The parameters and buffers a rewritten step reads, found by name and kept between calls.

Why kept: finding them walks the module tree, 60-140 us a call on the step-time benchmark's
models (one thread, CPU), where checking the last walk's result takes a few microseconds per
module. Why checked at every call: what the user replaced since (a submodule, ``model.fc.weight
= nn.Parameter(...)``, ``load_state_dict(..., assign=True)``, ``fully_shard`` changing a
module's class) must be read afresh, as the walk read it. The last walk holds while every
parent still has the same children under the same names and no others, every module keeps its
class, and every tensor is still what its owner holds under its name; then the walk would find
the same tensors and the same modules. Otherwise the tree is walked again.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

TABLES = {"parameter": "_parameters", "buffer": "_buffers"}


@dataclass(frozen=True)
class TreeWalk:
    """One walk of the module tree and the tensors it found, with what makes it still hold. It
    keeps weak references only: a module or tensor the user replaced is freed as it would be
    without the remat module (a ``load_state_dict(..., assign=True)`` does not keep the old
    parameters alive until the next call)."""

    modules: tuple[weakref.ref, ...]
    """Every module reached, the root first."""
    classes: tuple[type, ...]
    """Each module's class, as walked."""
    child_counts: tuple[int, ...]
    """How many children (None ones included) each module registers."""
    edges: tuple[tuple[int, str, int], ...]
    """(parent, name, child) for every registered child, as indices into ``modules``; -1 for None."""
    owned: tuple[tuple[int, str, str, weakref.ref], ...]
    """(owner, its table ``_parameters`` or ``_buffers``, name in it, the tensor found) per tensor."""

    def tensors_if_holds(self, root: torch.nn.Module) -> list[torch.Tensor] | None:
        """The tensors found, if walking ``root`` again would find these modules and tensors;
        else None."""
        modules = [ref() for ref in self.modules]
        if modules[0] is not root or None in modules:
            return None
        if not all(type(m) is cls and len(m._modules) == count
                   for m, cls, count in zip(modules, self.classes, self.child_counts)):
            return None
        if not all(modules[parent]._modules.get(name) is (modules[child] if child >= 0 else None)
                   for parent, name, child in self.edges):
            return None
        tensors = [ref() for *_, ref in self.owned]
        if any(t is None for t in tensors):
            return None
        if not all(getattr(modules[owner], table).get(name) is tensor
                   for (owner, table, name, _), tensor in zip(self.owned, tensors)):
            return None
        return tensors


def walk(root: torch.nn.Module, names: Iterable[tuple[str, str]],
         check_modules: Callable[[list[tuple[str, torch.nn.Module]]], None] | None = None,
         ) -> tuple[list[torch.Tensor], TreeWalk]:
    """The tensors named ``names`` ((kind, dotted name), kind "parameter" or "buffer"), each from
    its owner's table, and the walk that found them. Raises KeyError naming one that is gone.
    ``check_modules`` sees every (path, module) reached, as ``named_modules(remove_duplicate=False)``
    lists them."""
    paths: list[tuple[str, torch.nn.Module]] = []
    index: dict[int, int] = {}  # id(module) -> its place in `modules`
    modules: list[torch.nn.Module] = []
    edges: list[tuple[int, str, int]] = []

    def place(module: torch.nn.Module) -> int:
        if id(module) not in index:
            index[id(module)] = len(modules)
            modules.append(module)
        return index[id(module)]

    def visit(prefix: str, module: torch.nn.Module) -> None:  # preorder, as named_modules
        paths.append((prefix, module))
        parent = place(module)
        for name, child in module._modules.items():
            edges.append((parent, name, -1 if child is None else place(child)))
            if child is not None:
                visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", root)
    if check_modules is not None:
        check_modules(paths)
    by_path = dict(paths)
    tensors, owned = [], []
    for kind, name in names:
        owner, _, attribute = name.rpartition(".")
        tensor = getattr(by_path[owner], TABLES[kind]).get(attribute) if owner in by_path else None
        if tensor is None:
            raise KeyError(f"{kind} {name!r}")
        tensors.append(tensor)
        owned.append((index[id(by_path[owner])], TABLES[kind], attribute, weakref.ref(tensor)))
    return tensors, TreeWalk(tuple(weakref.ref(m) for m in modules), tuple(type(m) for m in modules),
                             tuple(len(m._modules) for m in modules), tuple(edges), tuple(owned))
