"""README.md and every docs/*.md page run as written: each page's fenced code blocks are executed.

Rules (one page at a time, its blocks in document order):

- A ```python block runs. A page's python blocks share one namespace, as a reader pasting them in
  order would have, and run in one fresh interpreter per page (``sys.executable``, this checkout
  first on ``PYTHONPATH``).
- A ```bash, ```sh or ```console block runs each line that starts with ``remat-opt `` (a leading
  ``$ `` prompt is dropped, ``\\`` continues a line, ``#`` starts a comment) as
  ``[sys.executable, "-m", "optimizer.cli", *args]``, with a timeout. Setup lines are skipped
  by rule: those starting with ``make``, ``pip``, ``python3 -m venv``, ``. `` (a space after the dot), ``source``,
  ``bash .ci/run`` or ``git``. Any other line in such a block fails the test (a new kind of
  command needs a rule here, not silence).
- A block right after a line ``<!-- no-run: REASON -->`` is not run; every such marker must give
  a reason.
- Output and illustration blocks (```text, or no language) are not run.

Everything runs in a scratch folder where ``examples`` and ``benchmarks`` link to this
repository's, so a page's relative paths work and whatever a block writes (``report.html``,
``plan.json``) lands there, not in the repository.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 60
"""One screen: the pitch, the two commands, one example, where to read on, the layout."""
PYTHON_TIMEOUT_S = 300
CLI_TIMEOUT_S = 120

RUN_LANGS = {"python", "bash", "sh", "console"}
SETUP_PREFIXES = ("make", "pip", "python3 -m venv", ". ", "source ", "bash .ci/run", "git")
NO_RUN = re.compile(r"^<!--\s*no-run:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    no_run: str | None  # the marker's reason ("" when the marker gives none), None: no marker


def extract_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the no-run marker right above each."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang, start = match.group(1), match.group(2).lower(), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path.name}:{start + 1}: code block never closed")
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = NO_RUN.match(lines[j].strip()) if j >= 0 else None
        blocks.append(Block(path.name, start + 1, lang, "\n".join(body) + "\n",
                            marker.group(1).strip() if marker else None))
        i += 1
    return blocks


def shell_commands(block: Block) -> list[tuple[str, list[str] | None]]:
    """``(line, argv)`` per command line of a shell block; argv None for a skipped setup line."""
    commands, pending = [], ""
    for raw in block.code.splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        if pending:
            line = pending + " " + line
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("remat-opt "):
            commands.append((line, shlex.split(line, comments=True)[1:]))
        elif line.startswith(SETUP_PREFIXES):
            commands.append((line, None))
        else:
            raise ValueError(f"{block.page}:{block.line}: no rule for the command {line!r}")
    return commands


_PY_RUNNER = """
import json, sys, traceback
blocks = json.load(sys.stdin)
namespace = {"__name__": "__docs__"}
for block in blocks:
    try:
        exec(compile(block["code"], f"{block['page']}:{block['line']}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"DOCS BLOCK FAILED: {block['page']}:{block['line']}")
        sys.exit(1)
"""


def _scratch_dir() -> tempfile.TemporaryDirectory:
    scratch = tempfile.TemporaryDirectory(prefix="remat-opt-docs-")
    for name in ("examples", "benchmarks"):
        os.symlink(ROOT / name, Path(scratch.name) / name)
    return scratch


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_page(path: Path) -> list[str]:
    """Run a page's blocks; one line per failure (empty: every runnable block passed)."""
    failures: list[str] = []
    blocks = extract_blocks(path)
    for block in blocks:
        if block.no_run == "":
            failures.append(f"{block.page}:{block.line}: no-run marker without a reason")
    runnable = [b for b in blocks if b.no_run is None and b.lang in RUN_LANGS]
    with _scratch_dir() as cwd:
        python = [b for b in runnable if b.lang == "python"]
        if python:
            payload = json.dumps([{"page": b.page, "line": b.line, "code": b.code} for b in python])
            try:
                done = subprocess.run([sys.executable, "-c", _PY_RUNNER], input=payload, cwd=cwd,
                                      env=_env(), capture_output=True, text=True,
                                      timeout=PYTHON_TIMEOUT_S)
                if done.returncode:
                    failures.append(f"{path.name}: python blocks failed (exit {done.returncode})\n"
                                    f"{done.stdout[-3000:]}{done.stderr[-6000:]}")
            except subprocess.TimeoutExpired:
                failures.append(f"{path.name}: python blocks ran past {PYTHON_TIMEOUT_S} s")
        for block in runnable:
            if block.lang == "python":
                continue
            try:
                commands = shell_commands(block)
            except ValueError as exc:
                failures.append(str(exc))
                continue
            for line, argv in commands:
                if argv is None:
                    continue
                try:
                    done = subprocess.run([sys.executable, "-m", "optimizer.cli", *argv],
                                          cwd=cwd, env=_env(), capture_output=True, text=True,
                                          timeout=CLI_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    failures.append(f"{block.page}:{block.line}: {line!r} ran past "
                                    f"{CLI_TIMEOUT_S} s")
                    continue
                if done.returncode:
                    failures.append(f"{block.page}:{block.line}: {line!r} exited "
                                    f"{done.returncode}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return failures


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_page_blocks_run(path: Path) -> None:
    before = _repo_status()
    start = time.perf_counter()
    failures = run_page(path)
    assert not failures, "\n".join(failures)
    assert _repo_status() == before, "a block left files in the repository"
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")


def _repo_status() -> str:
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else ""


def test_readme_is_short_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "no docs/*.md pages"
    missing = [p.name for p in pages if f"](docs/{p.name}" not in readme]
    assert not missing, f"README.md links no docs page {missing}"


def test_relative_links_resolve() -> None:
    """Every relative link of every page points at a file of the repository."""
    broken = []
    for path in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.name} -> {target}")
    assert not broken, broken


def test_a_broken_block_fails(tmp_path: Path) -> None:
    """The runner reports a failing python block, a failing CLI line and a marker without a reason."""
    page = tmp_path / "broken.md"
    page.write_text(
        "# broken\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'docs drifted'\n```\n\n"
        "```bash\nmake demo\nremat-opt examples/no_such_model.py --budget 70%\n```\n\n"
        "<!-- no-run: -->\n```python\nraise SystemExit(3)\n```\n\n"
        "<!-- no-run: never runs -->\n```python\nraise SystemExit(4)\n```\n\n"
        "```text\nnot code\n```\n"
    )
    blocks = extract_blocks(page)
    assert [(b.lang, b.no_run) for b in blocks] == [
        ("python", None), ("python", None), ("bash", None), ("python", ""),
        ("python", "never runs"), ("text", None)]
    failures = run_page(page)
    assert len(failures) == 3, failures
    assert "no-run marker without a reason" in failures[0]
    assert "broken.md:7" in failures[1] and "docs drifted" in failures[1]
    assert "no_such_model.py" in failures[2] and "exited 3" in failures[2]


def test_unknown_shell_command_fails(tmp_path: Path) -> None:
    page = tmp_path / "odd.md"
    page.write_text("```bash\nrm -rf build\n```\n\n```bash\n./run_it.sh\n```\n")
    failures = run_page(page)
    assert len(failures) == 2 and all("no rule for the command" in f for f in failures)
