"""The layers of docs/design.md "Layout" hold: IR <- solvers <- planning (the torch-free core, all in
`solvers/`) <- frontends <- the public API (`optimizer/`).

Each check runs on the real tree, and on a temporary copy of the tree's shape with one wrong
import added, to show that it can fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from import_layers import (
    MAX_MODULES_PER_FOLDER,
    all_imports,
    crowded_folders,
    import_cycles,
    layer_of,
    project_modules,
    unexplained_local_imports,
    upward_imports,
)

import optimizer

ROOT = Path(__file__).resolve().parent.parent


def _describe(imports) -> str:
    return "\n".join(f"{i.importer}:{i.line} imports {i.imported}" for i in imports)


def test_every_module_has_a_layer():
    modules = project_modules(ROOT)
    assert len(modules) > 60
    assert [m for m in modules if layer_of(m) is None] == []


def test_no_import_points_up_the_layers():
    assert upward_imports(ROOT) == [], _describe(upward_imports(ROOT))


def test_no_import_cycles_between_modules():
    assert import_cycles(ROOT) == []


def test_the_core_imports_no_floor_above_it_and_the_frontends_not_the_api():
    """docs/design.md "Layout": solvers/ imports neither frontends nor optimizer; frontends/ does
    not import optimizer; every entry point users call lives in optimizer/."""
    edges = [(i.importer.split(".")[0], i.imported.split(".")[0], i.importer, i.imported) for i in all_imports(ROOT)]
    assert [e for e in edges if e[0] == "solvers" and e[1] in ("frontends", "optimizer")] == []
    assert [e for e in edges if e[0] == "frontends" and e[1] == "optimizer"] == []
    for entry in ("optimize", "plan_only", "apply_checkpointing", "remat_backend", "find_graph_breaks"):
        assert optimizer._EXPORTS[entry].startswith("optimizer."), entry


def test_function_local_imports_say_why():
    assert unexplained_local_imports(ROOT) == [], _describe(unexplained_local_imports(ROOT))


def test_the_reader_sees_local_and_relative_imports():
    found = {(i.importer, i.imported, i.local) for i in all_imports(ROOT)}
    assert ("optimizer.cli", "optimizer.api", True) in found  # inside run()
    assert ("solvers.auto", "solvers.hierarchical", False) in found


def _fake_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for pkg in ("optimizer", "solvers/ir", "solvers/planning", "frontends", "solvers"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_an_upward_import_fails(tmp_path):
    root = _fake_tree(tmp_path, {
        "frontends/capture/step.py": "import torch\n",
        "solvers/ir/graph.py": "from frontends.capture.step import capture\n",  # IR -> frontends: wrong
        "solvers/greedy.py": "from solvers.ir import graph\n",  # solvers -> IR: right
    })
    bad = upward_imports(root)
    assert [(i.importer, i.imported) for i in bad] == [("solvers.ir.graph", "frontends.capture.step")]


def test_a_hidden_upward_import_fails_too(tmp_path):
    root = _fake_tree(tmp_path, {
        "solvers/planning/planner.py": "def plan():\n    from optimizer import api  # heavy: torch\n",
        "optimizer/api.py": "",
    })
    assert [(i.importer, i.imported, i.local) for i in upward_imports(root)] == [
        ("solvers.planning.planner", "optimizer.api", True)]


def test_a_cycle_and_an_unexplained_local_import_fail(tmp_path):
    root = _fake_tree(tmp_path, {
        "solvers/auto.py": "from solvers.hierarchical import solve\n",
        "solvers/hierarchical.py": "def solve():\n    from solvers.auto import solve_auto\n",
    })
    assert import_cycles(root) == [["solvers.auto", "solvers.hierarchical"]]
    assert [(i.importer, i.imported) for i in unexplained_local_imports(root)] == [
        ("solvers.hierarchical", "solvers.auto")]


def test_no_frontends_folder_holds_more_than_twelve_modules():
    assert crowded_folders(ROOT) == {}
    assert MAX_MODULES_PER_FOLDER == 12
    folders = {p.parent for p in (ROOT / "frontends").rglob("*.py")}
    assert len(folders) > 1  # the check sees the subpackages, not only frontends/ itself


def test_a_crowded_folder_fails(tmp_path):
    files = {f"frontends/capture/m{i}.py": "" for i in range(13)}
    files.update({f"frontends/split/m{i}.py": "" for i in range(12)})  # 12: allowed
    root = _fake_tree(tmp_path, files)
    (root / "frontends" / "capture" / "__init__.py").write_text("")  # not counted
    assert crowded_folders(root) == {"frontends/capture": 13}
    for i in range(13):
        (root / "frontends" / f"top{i}.py").write_text("")
    assert crowded_folders(root) == {"frontends": 13, "frontends/capture": 13}


TORCH_FREE_LAYERS = ("solvers.ir", "solvers", "solvers.planning")


@pytest.mark.parametrize("layer", TORCH_FREE_LAYERS)
def test_torch_free_layers_import_no_torch(layer):
    """Importing every module of the layer (in a fresh interpreter) loads no torch."""
    modules = sorted(m for m in project_modules(ROOT) if m == layer or m.startswith(layer + "."))
    assert modules
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
            + "print(len(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0", f"{layer} imports torch"
