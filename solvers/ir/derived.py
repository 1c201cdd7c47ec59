"""Tables derived from a graph, built once per graph object instead of once per call.

A `RematGraph` and its nodes are frozen, so anything computed from the graph alone (name maps,
byte sizes, group tables, step objects) stays valid for the graph's life. The hot loops
(`Schedule.from_computes`, `simulate`, the saved-set solvers) run hundreds of times on one
graph and look their tables up here. Entries are keyed by the graph's identity (hashing a
graph would walk every node on every call) and dropped when the graph is garbage-collected,
so a table must never hold the graph itself (it would keep the graph alive forever).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

from solvers.ir.graph import RematGraph

T = TypeVar("T")

_TABLES: dict[tuple[int, Callable], tuple[weakref.ref, object]] = {}


def per_graph(graph: RematGraph, build: Callable[[RematGraph], T]) -> T:
    """``build(graph)``, computed on the first call for this graph object and reused after."""
    key = (id(graph), build)
    entry = _TABLES.get(key)
    if entry is not None and entry[0]() is graph:
        return entry[1]  # type: ignore[return-value]
    table = build(graph)

    def forget(ref: weakref.ref, key: tuple[int, Callable] = key) -> None:
        if _TABLES.get(key, (None,))[0] is ref:
            del _TABLES[key]

    _TABLES[key] = (weakref.ref(graph, forget), table)
    return table
