"""Reads every module's imports (top-level and function-local) and checks them against the layer
order of docs/design.md "Layout": IR <- solvers <- planning <- frontends <- app.

Kept apart from the test so that the test can run the same checks on a temporary tree with a
deliberately wrong import and see them fail.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

LAYERS: tuple[tuple[str, ...], ...] = (
    ("solvers.ir",),
    ("solvers",),
    ("solvers.planning",),
    ("frontends",),
    ("optimizer",),
)
"""Module prefixes of each layer, bottom first; a module's layer is that of its longest prefix."""

PACKAGES = ("optimizer", "frontends", "solvers")
LOCAL_IMPORT_REASONS = ("# heavy:", "# optional:")
"""A function-local import must say on its line why it is not at the top: a heavy dependency
(torch, matplotlib) that a light caller must not pay for, or an optional one."""


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    local: bool
    """Inside a function (run when called, not when the module is imported)."""
    reason: str
    """The ``# heavy: ...`` / ``# optional: ...`` comment on the line, or ''."""


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    return None if best is None else best[0]


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path) -> dict[str, Path]:
    return {module_name(root, p): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(root: Path, path: Path, known: set[str]) -> list[Import]:
    """Every import in ``path``; ``from pkg import name`` counts as importing ``pkg.name`` when that
    is a module of the project."""
    importer = module_name(root, path)
    source = path.read_text()
    lines = source.splitlines()
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.Import):
                    names = [alias.name for alias in child.names]
                else:
                    base = _resolve(importer, path.name == "__init__.py", child)
                    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
                text = " ".join(lines[child.lineno - 1: child.end_lineno])
                reason = next((text[text.index(r):] for r in LOCAL_IMPORT_REASONS if r in text), "")
                for name in dict.fromkeys(names):
                    found.append(Import(importer, name, child.lineno, local, reason))
            visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def all_imports(root: Path) -> list[Import]:
    modules = project_modules(root)
    known = set(modules)
    return [imp for path in modules.values() for imp in imports_of(root, path, known)]


def upward_imports(root: Path) -> list[Import]:
    """Imports from a lower layer into a higher one (the edges the layer order forbids)."""
    bad = []
    for imp in all_imports(root):
        low, high = layer_of(imp.importer), layer_of(imp.imported)
        if low is not None and high is not None and high > low:
            bad.append(imp)
    return bad


def import_cycles(root: Path) -> list[list[str]]:
    """Cycles among the project's modules (every import, local ones included)."""
    graph = nx.DiGraph()
    for imp in all_imports(root):
        if imp.imported.split(".")[0] in PACKAGES and imp.imported != imp.importer:
            graph.add_edge(imp.importer, imp.imported)
    return [sorted(c) for c in nx.simple_cycles(graph)]


def unexplained_local_imports(root: Path) -> list[Import]:
    """Function-local imports without a ``# heavy:`` / ``# optional:`` reason on their line."""
    return [imp for imp in all_imports(root) if imp.local and not imp.reason]


MAX_MODULES_PER_FOLDER = 12
"""docs/design.md "Layout": a folder of ``frontends/`` holds at most this many modules (``__init__.py``
not counted); more means a job is hiding in it and wants a subpackage of its own."""


def crowded_folders(root: Path, package: str = "frontends",
                    limit: int = MAX_MODULES_PER_FOLDER) -> dict[str, int]:
    """Folders of ``package`` (itself included) holding more than ``limit`` modules: path -> count."""
    crowded = {}
    for folder in sorted({(root / package)} | {p.parent for p in (root / package).rglob("*.py")}):
        count = sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")
        if count > limit:
            crowded[folder.relative_to(root).as_posix()] = count
    return crowded
