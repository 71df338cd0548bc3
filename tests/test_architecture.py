"""The layering of the package, read from its imports (ast, no import run).

ARCHITECTURE.md draws the data path: the face (cli, commands, api, watch)
over the launcher and the report, both over the analysis and the runtime,
all over the store. These tests keep the tree that way: no module imports
one above it, no two modules import each other through any path, the
store and what the boot loads stay standard library only, and each
on-disk name is spelt in store/ alone.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "perfrun"

#: Who may import whom: each part of the package, and the parts it may use
#: (its own modules always). A part is a package or a top-level module.
ALLOWED: dict[str, set[str]] = {
    "perfrun": set(),  # perfrun/__init__.py: the version
    # The one root of perfrun's errors (PerfrunError): imports nothing, and
    # every part may import it (EVERYWHERE).
    "errors": set(),
    "exitcodes": set(),
    # How a sentence is laid out in a width: standard library only, for
    # the launcher's notice before the script as for the report after it.
    "prose": set(),
    "store": {"perfrun"},
    "settings": {"store"},
    # The YAML config file and -o overrides, read into Settings changes.
    "config": {"store", "settings"},
    "scriptoptions": set(),
    # A launcher's command with perfrun in front, read: standard library.
    "launchcommand": set(),
    "analysis": {"store", "settings"},
    "runtime": {"perfrun", "store", "settings", "analysis"},
    "report": {"store", "settings", "analysis", "prose"},
    "launcher": {"store", "settings", "exitcodes", "runtime", "prose"},
    "combine": {"store", "exitcodes"},
    "api": {"store", "settings", "analysis", "report", "launcher"},
    "watch": {"store", "exitcodes", "analysis", "report", "launcher", "prose"},
    "commands": {"perfrun", "store", "settings", "exitcodes", "analysis", "report", "launcher",
                 "combine", "api", "prose"},
    "cli": {"perfrun", "settings", "config", "exitcodes", "scriptoptions", "launchcommand",
            "commands", "watch"},
    "__main__": {"cli"},
    "boot": {"runtime"},
}
#: What every part may import.
EVERYWHERE = {"errors"}
#: What the runtime may take from the analysis: a rank summarises its own
#: window's trace, and nothing else of the analysis runs inside it.
RUNTIME_ANALYSIS = {"perfrun.analysis.trace", "perfrun.analysis.tracefile",
                    "perfrun.analysis.intervals", "perfrun.analysis.modules"}
#: What the launcher may take from the runtime: the helpers that tie a
#: rank's life to perfrun's, and the memory cgroup's readings (its limit, its
#: out-of-memory kills) that both read.
LAUNCHER_RUNTIME = {"perfrun.runtime.lifeline", "perfrun.runtime.memory"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path, top_only: bool = False) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import in the file; `top_only`:
    those run at import time (not inside a function, not for type checking)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(node: ast.AST, nested: bool) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if not top_only:
                    yield from walk(child, True)
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                if not top_only:
                    yield from walk(child, nested)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    yield (full if full in MODULES else base), child.lineno
            else:
                yield from walk(child, nested)

    yield from walk(tree, False)


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "perfrun"


def _graph() -> dict[str, set[str]]:
    return {
        name: {m for m, _ in _imports(name, path) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }


def test_every_part_is_declared() -> None:
    assert {_part(m) for m in MODULES} <= set(ALLOWED)


def test_no_module_imports_a_part_above_its_own() -> None:
    wrong = []
    for name, path in MODULES.items():
        part = _part(name)
        for target, line in _imports(name, path):
            if not target.startswith("perfrun") or target not in MODULES:
                continue
            other = _part(target)
            if other == part and part != "perfrun":
                continue
            if other not in ALLOWED[part] | EVERYWHERE or (
                part == "runtime" and other == "analysis" and target not in RUNTIME_ANALYSIS
            ) or (part == "launcher" and other == "runtime" and target not in LAUNCHER_RUNTIME):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} -> {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_circles() -> None:
    """No two modules reach each other through imports, at import time or
    inside functions (a function-level import still ties the two)."""
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, "\n".join(circles)


def _loaded_by_boot() -> set[str]:
    """The perfrun modules a rank loads before the script imports torch."""
    graph = {name: {m for m, _ in _imports(name, path, top_only=True) if m in MODULES}
             for name, path in MODULES.items()}
    seen: set[str] = set()
    todo = ["perfrun.boot.sitecustomize", "perfrun.runtime.lite"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(graph[name])
        # A package's modules run its __init__ first.
        parent = name.rpartition(".")[0]
        if parent in MODULES:
            todo.append(parent)
    return seen


@pytest.mark.parametrize("name", sorted(
    {m for m in MODULES if _part(m) == "store"} | _loaded_by_boot()
))
def test_the_store_and_the_boot_import_only_the_standard_library(name: str) -> None:
    """The store is read by every command and written inside every rank, and
    the boot runs before the script: at import time they load nothing but
    the standard library (numpy, in the store's readers, inside the
    functions that read)."""
    outside = [
        f"{target} (line {line})"
        for target, line in _imports(name, MODULES[name], top_only=True)
        if not target.startswith("perfrun") and target != "__future__"
        and target.split(".")[0] not in sys.stdlib_module_names
    ]
    assert not outside, f"{name} imports {', '.join(outside)}"


#: Names in a log or run folder, which only the store may spell (the layout
#: holds them; the store's other modules may name them in messages): whole
#: names, and parts of names that no other string holds.
FOLDER_NAMES = {"run.json", "latest", "hang.txt", "report.html", "torchrun-status.json", "job-",
                "settings.json"}
NAME_PARTS = (".steps", ".pt.trace.json", ".nsys-rep", ".raw.json", "torchrun-status.",
              "stack.rank", "settings.node")


def _strings(path: Path) -> Iterator[tuple[str, int]]:
    """The string constants of a file, docstrings left out (they may say
    what a folder holds)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.value, node.lineno


def test_run_folder_names_are_spelt_in_the_store_alone() -> None:
    wrong = []
    for name, path in MODULES.items():
        if name.startswith("perfrun.store."):
            continue
        for text, line in _strings(path):
            if text in FOLDER_NAMES or any(part in text for part in NAME_PARTS):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert not wrong, "\n".join(wrong)


def test_every_format_a_command_offers_has_a_renderer() -> None:
    """settings.FORMATS says which command prints which format; the
    renderers' tables (report/__init__.py) must have each, and no other."""
    from perfrun import report
    from perfrun.settings import GATE_FORMATS, formats

    assert set(formats("report")) == set(report.FORMATS)
    assert set(formats("compare")) == set(report.COMPARISON_FORMATS)
    assert set(formats("analyze")) == set(report.ANALYSIS_FORMATS)
    # A run prints its report, and a gated run its comparison too.
    assert set(formats("run")) <= set(report.FORMATS) | set(GATE_FORMATS)
