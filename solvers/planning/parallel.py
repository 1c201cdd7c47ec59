"""Independent what-if work on every core: forked workers, results in the order asked.

A largest-batch search runs one search per strategy and a sweep one solve per (budget,
strategy); each is independent of the others and CPU-bound in Python, so threads do not help
and pickling the captured step for spawned workers would cost more than the work. Forked workers
inherit the parent's state (the captures, the fitted graphs, the closures) as it is when the pool
starts, and send back only their results. Where fork is not available (or one job is asked for)
the work runs here, one item after another, with the same results.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Sequence, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

_WORK: Callable | None = None
"""The function the forked workers run (set before the pool forks, so they inherit it)."""


def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def map_forked(work: Callable[[Item], Result], items: Sequence[Item], jobs: int = 1,
               here: Callable[[Item], bool] = lambda _: False) -> list[Result]:
    """``[work(item) for item in items]``, on up to ``jobs`` forked workers; an exception in a
    worker is raised here. Items should come longest first: the pool hands them out in order.

    Items for which ``here(item)`` holds run in this process, while the workers run the rest:
    work that runs torch's own CPU kernels must (their OpenMP threads do not survive a fork: a
    forked child that enters a parallel region waits forever)."""
    global _WORK
    if min(jobs, len(items)) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [work(item) for item in items]
    forked = [i for i, item in enumerate(items) if not here(item)]
    results: dict[int, Result] = {}
    _WORK = work
    try:
        with ProcessPoolExecutor(max(1, min(jobs - 1 if len(forked) < len(items) else jobs, len(forked))),
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {i: pool.submit(_run, i, items) for i in forked}
            for i, item in enumerate(items):  # this process's share, while the workers run
                if i not in futures:
                    results[i] = work(item)
            for i, future in futures.items():
                ok, value = future.result()
                if not ok:
                    raise value
                results[i] = value
    finally:
        _WORK = None
    return [results[i] for i in range(len(items))]


def _run(index: int, items: Sequence) -> tuple[bool, object]:
    """(True, result) or (False, the exception): an exception that cannot be pickled (one whose
    constructor takes other arguments) would break the pool, so it travels as a RuntimeError."""
    assert _WORK is not None, "map_forked's work is set before its workers fork"
    try:
        return True, _WORK(items[index])
    except Exception as err:  # re-raised in the parent, in item order
        try:
            pickle.loads(pickle.dumps(err))
            return False, err
        except Exception:
            return False, RuntimeError(f"{type(err).__name__}: {err}")
