"""The import graph the layout promises, read from the sources with ``ast`` rather than trusted.

The job API (``bertjob_api``) imports no project package and none of kopf, kubernetes or torch;
the operator (``bertjob``) and the trainer (``bertpretrain``) import the API and never each other;
inside the trainer, the stages ``data``, ``model`` and ``runtime`` and the helpers in ``common``
import only the API, ``bertpretrain.common`` and libraries (never the training loop, the entry
points, nor each other); and no two project modules import each other in a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each project package and the folder that holds it.
PACKAGES = {
    "bertjob_api": ROOT / "api" / "bertjob_api",
    "bertjob": ROOT / "operator" / "bertjob",
    "bertpretrain": ROOT / "trainer_image" / "bertpretrain",
}
PROJECT = tuple(PACKAGES)
# The trainer's stages that must not reach up to the training loop or sideways to each other.
TRAINER_STAGES = ("data", "model", "runtime")


@dataclass(frozen=True)
class Import:
    """One import statement's target in one module.

    ``target`` is the dotted module imported (``from x import y`` gives ``x.y`` when ``y`` is a
    submodule of ``x``, else ``x``); ``line`` is its line number; ``top_level`` says whether it
    runs when the module is imported (not inside a function, nor under ``if TYPE_CHECKING``).
    """

    module: str
    target: str
    line: int
    top_level: bool

    def __str__(self) -> str:
        return f"{self.module} imports {self.target} (line {self.line})"


def _module_files() -> dict[str, Path]:
    """Every project module's dotted name and its source file (a package is its ``__init__.py``)."""
    modules: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = _module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, top_level: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import under ``node``, with whether it runs at import time of the module."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, top_level
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or (
            isinstance(child, ast.If) and _is_type_checking(child.test)
        ):
            yield from _walk(child, False)
        else:
            yield from _walk(child, top_level)


def _imports(module: str, path: Path) -> list[Import]:
    """The modules that ``module`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node, top_level in _walk(ast.parse(path.read_text(), str(path)), True):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                # A relative import counts from the module's package (its own name, for a package).
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names
            ]
        # `from x import a, b` of two names is one import of x.
        found.extend(Import(module, target, node.lineno, top_level) for target in dict.fromkeys(targets))
    return found


IMPORTS = [found for module, path in MODULES.items() for found in _imports(module, path)]


def _within(target: str, *prefixes: str) -> bool:
    return any(target == prefix or target.startswith(prefix + ".") for prefix in prefixes)


def _trainer_part(module: str) -> str | None:
    """``data``, ``model``, ``runtime``, ``common``, ``training``, ``run``... for a trainer module."""
    parts = module.split(".")
    return parts[1] if parts[0] == "bertpretrain" and len(parts) > 1 else None


def _violation(found: Import) -> str | None:
    """The rule ``found`` breaks, or None."""
    module, target = found.module, found.target
    package = module.split(".")[0]
    if package == "bertjob_api":
        if _within(target, "bertjob", "bertpretrain"):
            return "the job API imports no project package (only the operator and trainer import it)"
        if _within(target, "kopf", "kubernetes", "torch"):
            return "the job API imports neither kopf, the kubernetes client nor torch"
        return None
    if package == "bertjob" and _within(target, "bertpretrain"):
        return "the operator never imports the trainer"
    if package == "bertpretrain" and _within(target, "bertjob"):
        return "the trainer never imports the operator"
    part = _trainer_part(module)
    if part in TRAINER_STAGES or part == "common":
        allowed = (
            ("bertpretrain.common",) if part == "common" else ("bertpretrain.common", f"bertpretrain.{part}")
        )
        if _within(target, "bertpretrain") and not _within(target, *allowed):
            if part == "common":
                return "bertpretrain.common imports only the job API and libraries"
            return (
                f"bertpretrain.{part} imports only the job API, bertpretrain.common and libraries "
                "(not training, run, launch, nor the other stages)"
            )
    return None


def test_the_scan_finds_the_packages_and_their_imports() -> None:
    """A guard for the guard: an empty scan would pass every rule."""
    for package in PROJECT:
        assert any(_within(module, package) for module in MODULES), package
    for stage in (*TRAINER_STAGES, "common", "training"):
        assert f"bertpretrain.{stage}" in MODULES, stage
    assert any(
        _within(found.target, "bertjob_api") for found in IMPORTS if found.module.startswith("bertjob.")
    )
    # `from bertjob_api import contract` resolves to the submodule.
    assert "bertjob_api.contract" in {found.target for found in IMPORTS}


def test_imports_follow_the_layers() -> None:
    """Every import, at module level or inside a function, keeps to the rules above."""
    broken = [f"{found}: {rule}" for found in IMPORTS if (rule := _violation(found))]
    assert not broken, "imports against the layout:\n" + "\n".join(broken)


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle in the directed graph ``edges``, as its modules in order (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(edges.get(node, ())):
            if state.get(successor) == 1:
                return [*path[path.index(successor) :], successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _owner(target: str) -> str | None:
    """The project module that an import target names (a name imported from a module is that module)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def test_no_import_cycle_among_project_modules() -> None:
    """Module-level imports (the ones that run on import) form no cycle.

    A package's ``__init__`` importing its own submodules is left out: the submodule does not run
    its package's import again, so that pair is not a cycle at run time.
    """
    edges: dict[str, set[str]] = {}
    for found in IMPORTS:
        target = _owner(found.target) if _within(found.target, *PROJECT) else None
        if not found.top_level or target is None or target == found.module:
            continue
        if MODULES[found.module].name == "__init__.py" and target.startswith(found.module + "."):
            continue
        edges.setdefault(found.module, set()).add(target)
    cycle = _cycle(edges)
    assert cycle is None, "import cycle among project modules: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}}) is None


@pytest.mark.timeout(120)
def test_the_api_package_imports_without_operator_or_trainer_libraries() -> None:
    """Importing every API module loads none of kopf, kubernetes, torch, nor the other packages."""
    api = sorted(module for module in MODULES if _within(module, "bertjob_api"))
    forbidden = ("kopf", "kubernetes", "torch", "bertjob", "bertpretrain")
    code = (
        "import importlib, sys\n"
        f"for name in {api!r}:\n"
        "    importlib.import_module(name)\n"
        f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({forbidden!r}))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", sorted(_module_files()))
def test_every_module_says_first_what_it_is_for(module: str) -> None:
    source = _module_files()[module].read_text(encoding="utf-8")
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring, f"{module} has no module docstring saying what it is for"
    assert len(docstring.splitlines()[0]) > 20, f"{module}: its docstring's first line is not a sentence"
