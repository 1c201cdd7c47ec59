"""The optional native solver libraries (HiGHS through highspy, CP-SAT through OR-Tools), loaded
once per process, with the reason when one cannot be.

Why one module: both wheels carry their own copy of HiGHS. highspy 1.15.x and ortools 9.15
export clashing HiGHS symbols, so whichever of the two is imported second fails with an
undefined symbol (``Highs::releaseMemory`` / ``setLocalOptionValue``); highspy 1.16.0 and
ortools 9.15.6755 load together in either order (`tests/solvers/test_solver_backends.py` checks both
orders in fresh processes). pyproject pins that pair. Should another pair meet at run time, the
library that fails to load is reported unavailable with a one-line warning naming the fix, and
the callers fall back: the MILP to PuLP's bundled CBC (`solvers.checkmate.milp_engines`), the
bound LP to "no bound" (`solvers.highs_lp`), ``auto`` to whichever exact engine did load.
Nothing raises ImportError from inside a solve.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import warnings
from dataclasses import dataclass
from types import ModuleType

TESTED_PAIR = "highspy 1.16.0 with ortools 9.15.6755"
"""The versions of the two libraries checked to load together, in either order."""


@dataclass(frozen=True)
class Backend:
    """One optional library as this process found it."""

    module: ModuleType | None
    """The imported module, or None when it is not installed or failed to load."""
    problem: str | None
    """Why ``module`` is None while the package is installed (a load failure), else None."""


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _load(module_name: str, distribution: str, other: str) -> Backend:
    if importlib.util.find_spec(distribution) is None:
        return Backend(None, None)
    try:
        return Backend(importlib.import_module(module_name), None)
    except ImportError as error:  # installed, but its native library does not load beside the other one
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        problem = (f"{distribution} {_version(distribution)} cannot be loaded in this process "
                   f"beside {other} {_version(other)} ({detail[-160:]}); install a compatible pair "
                   f"({TESTED_PAIR}: pip install 'highspy>=1.16' 'ortools>=9.15')")
        warnings.warn(f"remat-opt: {problem}", RuntimeWarning, stacklevel=3)
        return Backend(None, problem)


@functools.cache
def highspy_backend() -> Backend:
    """highspy (HiGHS), loaded at most once; a failed load warns once."""
    return _load("highspy", "highspy", "ortools")


@functools.cache
def cp_sat_backend() -> Backend:
    """OR-Tools' CP-SAT Python module, loaded at most once; a failed load warns once."""
    return _load("ortools.sat.python.cp_model", "ortools", "highspy")
