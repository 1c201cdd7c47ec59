"""HiGHS (highspy) and CP-SAT (OR-Tools) in one process, in either import order, and what the
solvers do when a clashing pair cannot load together (`solvers.backends`).

Each case runs in a fresh interpreter: which library loads first is decided once per process.
The clash is reproduced with a stand-in package that fails to import the way a clashing wheel
does (an ImportError naming an undefined symbol), placed first on ``sys.path``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SOLVE_ALL = """
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from graphs import chain
    from solvers.ir.simulator import simulate
    from solvers import get_solver
    from solvers.base import SolverOptions, SolverUnavailableError
    from solvers.checkmate.milp_engines import highs_available
    from solvers.highs_lp import LinearProgram
    graph = chain(6)
    budget = 60  # store-all 81, leanest 51: recomputation needed
    out = {"highs_available": highs_available()}
    for name in ("milp", "cpsat", "auto"):
        try:
            result = get_solver(name)(graph, budget, SolverOptions(time_limit_s=120))
            out[name] = [result.status.value, simulate(graph, result.schedule).peak_bytes <= budget,
                         result.message]
        except SolverUnavailableError as error:
            out[name] = ["unavailable", str(error)]
    lp = LinearProgram()
    x = lp.add_var(1.0, 0.0, 10.0)
    lp.add_row({x: 1.0}, lower=2.0)
    solution = lp.solve(time_limit_s=60)
    out["lp"] = [solution.status.value, solution.objective]
out["warnings"] = [str(w.message) for w in caught if "remat-opt" in str(w.message)]
print(json.dumps(out))
"""


def _run(prelude: str, tmp_path: Path, fake: str | None = None) -> dict:
    path = [str(ROOT), str(ROOT / "tests")]
    if fake is not None:  # a package of that name that fails to load, as a clashing wheel does
        package = tmp_path / fake
        package.mkdir()
        (package / "__init__.py").write_text(
            "raise ImportError('_core.so: undefined symbol: _ZN5Highs13releaseMemoryEv')\n")
        path.insert(0, str(tmp_path))
    code = f"import sys; sys.path[:0] = {path!r}\n{prelude}\n{textwrap.dedent(SOLVE_ALL)}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _all_solved(out: dict) -> None:
    for name in ("milp", "cpsat", "auto"):
        assert out[name][0] == "optimal" and out[name][1], (name, out[name])
    assert out["lp"] == ["optimal", 2.0]


@pytest.mark.parametrize("first", ["import ortools.sat.python.cp_model\nimport highspy",
                                   "import highspy\nimport ortools.sat.python.cp_model"],
                         ids=["ortools-then-highspy", "highspy-then-ortools"])
def test_the_installed_pair_loads_in_either_order(first, tmp_path):
    pytest.importorskip("highspy")
    pytest.importorskip("ortools")
    out = _run(first, tmp_path)
    _all_solved(out)
    assert out["highs_available"] is True
    assert out["warnings"] == []


def test_a_highspy_that_cannot_load_leaves_the_milp_on_cbc_with_one_warning(tmp_path):
    out = _run("", tmp_path, fake="highspy")
    assert out["highs_available"] is False
    for name in ("milp", "cpsat", "auto"):
        assert out[name][0] == "optimal" and out[name][1], (name, out[name])
    assert out["lp"] == ["HiGHS could not be loaded", None]  # the bound LP: no bound, no error
    assert len(out["warnings"]) == 1
    assert "highspy" in out["warnings"][0] and "pip install 'highspy>=1.16'" in out["warnings"][0]
    assert "\n" not in out["warnings"][0]


def test_an_ortools_that_cannot_load_leaves_auto_on_highs_and_names_the_clash(tmp_path):
    pytest.importorskip("highspy")
    out = _run("", tmp_path, fake="ortools")
    assert out["milp"][0] == "optimal" and out["auto"][0] == "optimal"
    assert out["cpsat"][0] == "unavailable" and "cannot be loaded" in out["cpsat"][1]
    assert out["lp"] == ["optimal", 2.0]
    assert len(out["warnings"]) == 1 and "ortools" in out["warnings"][0]
