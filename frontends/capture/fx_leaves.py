"""``tree_flatten(tree)[0]`` for fx arguments and values, without pytree's generic walk.

Building the IR flattens every node's arguments and value several times; torch's Python pytree
builds a spec for each one (a `TreeSpec` per container, a namedtuple check per leaf), and on a
120,000-node graph (a 10,000-step loop) that walk cost more than the rest of `build_remat_graph`.
`flat_leaves` returns the same leaves in the same order: the containers fx arguments and values
are made of (plain tuples, lists and dicts, fx's immutable ones) are walked here, as pytree walks
them; every type pytree treats as a leaf is a leaf; anything else (a namedtuple, another
registered container) is handed to pytree itself.
"""

from __future__ import annotations

from typing import Any

from torch.fx.immutable_collections import immutable_dict, immutable_list

from frontends.torch_compat import pytree

_SEQUENCES = frozenset((tuple, list, immutable_list))
_MAPPINGS = frozenset((dict, immutable_dict))
_LEAF_TYPES: set[type] = set()
"""Types seen to be pytree leaves (not registered, not namedtuples): checked once per type."""


def flat_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` in `torch.utils._pytree.tree_flatten`'s order."""
    leaves: list[Any] = []
    _walk(tree, leaves)
    return leaves


def _walk(tree: Any, leaves: list[Any]) -> None:
    kind = type(tree)
    if kind in _SEQUENCES:
        for child in tree:
            _walk(child, leaves)
    elif kind in _MAPPINGS:  # pytree flattens a dict's values in insertion order
        for child in tree.values():
            _walk(child, leaves)
    elif kind in _LEAF_TYPES and kind not in pytree.SUPPORTED_NODES:
        leaves.append(tree)
    elif pytree.tree_is_leaf(tree):
        _LEAF_TYPES.add(kind)
        leaves.append(tree)
    else:
        leaves.extend(pytree.tree_flatten(tree)[0])
