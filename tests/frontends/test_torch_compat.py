"""torch's private APIs are used through one module, `frontends/torch_compat.py`, each name there
with a comment saying on which versions it was checked; and the untested-release line.

The scan runs on the package source (frontends/, optimizer/) and, to show that it can fail, on a
temporary file with a private use in each form it looks for.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torch

from frontends.torch_compat import TESTED_TORCH, untested_torch_message

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "frontends" / "torch_compat.py"
PACKAGE_DIRS = ("frontends", "optimizer")


def _is_private(dotted: str) -> bool:
    """``torch._x...``, ``torch.utils._pytree``, ``torch.fx._lazy_graph_module``: some part after
    ``torch`` starts with one underscore (dunders such as ``__version__`` are public). Op names
    under ``torch.ops`` (``torch.ops.aten._to_copy``) are operators, not Python APIs."""
    parts = dotted.split(".")
    if parts[0] != "torch" or parts[1:2] == ["ops"]:
        return False
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:])


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ['a', 'b', 'c'], or None when the chain does not start at a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def private_torch_uses(path: Path) -> list[str]:
    """'line: torch.private.name' for each import of a private torch module or name, and each
    attribute chain reaching one from a name bound to torch (``torch``, ``import torch.fx as fx``,
    ``from torch import utils``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # a chain's inner links
    bound: dict[str, str] = {}  # local name -> the torch path it stands for
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    if _is_private(alias.name):
                        found.append((node.lineno, alias.name))
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "torch" or node.module.startswith("torch."):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _is_private(full):
                        found.append((node.lineno, full))
                    bound[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:  # each chain once, at its longest
            parts = _dotted(node)
            if parts is None or parts[0] not in bound:
                continue
            full = ".".join([bound[parts[0]], *parts[1:]])
            if _is_private(full) and not _is_private(bound[parts[0]]):
                found.append((node.lineno, full))
    return [f"{line}: {name}" for line, name in sorted(set(found))]


def _package_files() -> list[Path]:
    return sorted(p for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py"))


def test_only_torch_compat_uses_private_torch_apis():
    files = _package_files()
    assert COMPAT in files and len(files) > 60
    found = {(str(p.relative_to(ROOT)), use.split(": ", 1)[1]) for p in files if p != COMPAT
             for use in private_torch_uses(p)}
    assert sorted(found) == [], "import these from frontends.torch_compat"


def test_the_scan_finds_each_form_of_private_use(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch\n"
        "import torch.fx as fx\n"
        "from torch import utils\n"
        "from torch._guards import detect_fake_mode\n"
        "from torch.utils._pytree import tree_flatten\n"
        "from torch.utils import _pytree\n"
        "def f(node):\n"
        "    import torch._dynamo  # heavy: dynamo\n"
        "    torch._dynamo.explain(node)\n"
        "    isinstance(node.target, torch._ops.OpOverload)\n"
        "    fx._lazy_graph_module._make_graph_module(node)\n"
        "    utils._pytree.tree_leaves(node)\n"
        "    return torch.__version__, torch.ops.aten._to_copy.default, torch.fx.Graph()\n"
    )
    assert private_torch_uses(bad) == [
        "4: torch._guards.detect_fake_mode",
        "5: torch.utils._pytree.tree_flatten",
        "6: torch.utils._pytree",
        "8: torch._dynamo",
        "9: torch._dynamo.explain",
        "10: torch._ops.OpOverload",
        "11: torch.fx._lazy_graph_module._make_graph_module",
        "12: torch.utils._pytree.tree_leaves",
    ]
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\nfrom frontends.torch_compat import OpOverload\nx = torch.fx.Graph()\n")
    assert private_torch_uses(clean) == []


def _exported_private_names(tree: ast.Module) -> list[str]:
    """Names torch_compat binds at its top level from a private torch module: by import, or by an
    assignment whose value reaches a private torch name (``OpOverload = torch._ops.OpOverload``)."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [a.asname or a.name for a in node.names if _is_private(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Assign):
            parts = _dotted(node.value)
            if parts and _is_private(".".join(parts)):
                names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def _private_functions(tree: ast.Module) -> list[str]:
    """Top-level functions of torch_compat that import a private torch name or read a private
    attribute (``torch._ops``, ``generator._cdata``)."""

    def private(use: ast.AST) -> bool:
        if isinstance(use, ast.ImportFrom):
            return any(_is_private(f"{use.module}.{a.name}") for a in use.names)
        return isinstance(use, ast.Attribute) and _is_private(f"torch.{use.attr}")

    return [node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and any(private(n) for n in ast.walk(node))]


def _comment_entries(source: str) -> list[str]:
    """The module's ``# name: what it guards; versions`` comments, each with its indented
    continuation lines (``#   ...``)."""
    entries: list[str] = []
    for line in source.splitlines():
        text = line.strip()
        if not text.startswith("#"):
            entries.append("")
        elif text.startswith("#   ") and entries and entries[-1]:
            entries[-1] += "\n" + text
        else:
            entries.append(text)
    return [e for e in entries if e]


def test_each_private_name_in_torch_compat_says_where_it_was_checked():
    source = COMPAT.read_text()
    tree = ast.parse(source)
    names = _exported_private_names(tree)
    assert {"detect_fake_mode", "FakeTensor", "OpOverload", "tree_flatten"} <= set(names)
    checked = "\n".join(entry for entry in _comment_entries(source) if "2.13" in entry)
    unchecked = [n for n in names if not re.search(rf"\b{re.escape(n)}\b", checked)]
    assert unchecked == [], "private names that no '# name: ... 2.13 ...' comment names"

    functions = _private_functions(tree)
    assert {"inductor_compile_fx", "dynamo_explain", "fx_boxed_codegen", "generator_key"} <= set(functions)
    undocumented = [f for f in functions if "2.13" not in (ast.get_docstring(
        next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == f)) or "")]
    assert undocumented == [], "adapter functions whose docstring names no checked versions"


def test_torch_compat_imports_neither_inductor_nor_dynamo_at_its_top():
    """Inductor and dynamo stay behind functions (``inductor_compile_fx()``, ...) that import them
    when called, on the path that needs them."""
    heavy = ("torch._inductor", "torch._dynamo")
    tops = [n for n in ast.parse(COMPAT.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    modules = [a.name for n in tops if isinstance(n, ast.Import) for a in n.names]
    modules += [f"{n.module}.{a.name}" for n in tops if isinstance(n, ast.ImportFrom) for a in n.names]
    assert [m for m in modules if m.startswith(heavy)] == []


def test_the_untested_release_line():
    message = untested_torch_message("2.12.0")
    assert message is not None and "\n" not in message
    assert "2.12.0" in message and all(release in message for release in TESTED_TORCH)
    assert untested_torch_message(torch.__version__) is None
