"""The import graph the layout promises, read from the sources with ``ast`` rather than trusted.

The rules are docs/design.md's ("What counts as an import"). Every import counts: at module level,
inside a function, and under ``if TYPE_CHECKING``; and importing ``a.b.c`` also imports the packages
``a`` and ``a.b`` (Python runs their ``__init__`` first) for a module outside them. The job API
(``bertjob_api``) imports no project package and none of kopf, kubernetes or torch; the operator
(``bertjob``) and the trainer (``bertpretrain``) import the API and never each other; inside the
trainer, the stages ``data``, ``model`` and ``runtime`` and the helpers in ``common`` import only
the API, ``bertpretrain.common`` and libraries (never the training loop, the entry points, nor each
other); inside ``data``, loading (``data.load``) imports nothing of preparation
(``data.prepare``), and what both read (``data.format``) imports neither; outside ``data``, only the
entry point, the pipeline and the builtin fine-tuning task (made from the corpus reader) import
preparation; a package's ``__init__`` imports none of its own modules (no facades), except the
API's ``bertjob_api.spec``, whose public names it gathers; and no two project modules import each
other in a cycle.
"""

from __future__ import annotations

import ast
import re
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
    # The tests' own harness (testing/): the test cluster, the API emulator, the jobs.
    "bertjob_testing": ROOT / "testing" / "bertjob_testing",
}
PROJECT = tuple(PACKAGES)
# The trainer's stages that must not reach up to the training loop or sideways to each other.
TRAINER_STAGES = ("data", "model", "runtime")
# Offline data preparation, and the only modules outside it that may import it.
PREPARATION = "bertpretrain.data.prepare"
PREPARATION_USERS = ("bertpretrain.run", "bertpretrain.pipeline", "bertpretrain.finetune.builtin")
# The test cluster's table of components: hack/build-cluster.sh runs it with the system's python3,
# so it imports the standard library alone.
CATALOG = "bertjob_testing.cluster.catalog"
# One module per kind of process of the test cluster, below what starts them.
CLUSTER_COMPONENTS = "bertjob_testing.cluster.components"
CLUSTER_STARTERS = ("bertjob_testing.cluster.controlplane", "bertjob_testing.cluster.controllers")
# The one package whose __init__ gathers its modules' names: the job API's public names (issue 28).
FACADES = ("bertjob_api.spec",)


@dataclass(frozen=True)
class Import:
    """One import statement's target in one module.

    ``target`` is the dotted module imported (``from x import y`` gives ``x.y`` when ``y`` is a
    submodule of ``x``, else ``x``); ``line`` is its line number; ``top_level`` says whether it
    runs when the module is imported (not inside a function, nor under ``if TYPE_CHECKING``): the
    rules count both, ``top_level`` only says where to look.
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
    is_package = MODULES[module].name == "__init__.py"
    if is_package and module not in FACADES and target != module and _within(target, module):
        return f"{module}/__init__ imports its own module {target}: a package facade (see FACADES)"
    package = module.split(".")[0]
    if package != "bertjob_testing" and _within(target, "bertjob_testing"):
        return "the product never imports the tests' harness (bertjob_testing is not installed with it)"
    if module == CATALOG and target.split(".")[0] not in sys.stdlib_module_names:
        return f"{CATALOG} imports the standard library alone (hack/build-cluster.sh runs it without a venv)"
    if _within(module, CLUSTER_COMPONENTS) and _within(target, *CLUSTER_STARTERS):
        return f"a component module imports nothing that starts components ({', '.join(CLUSTER_STARTERS)})"
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
    if _within(target, PREPARATION) and not _within(module, PREPARATION, *PREPARATION_USERS):
        return (
            f"only {', '.join(PREPARATION_USERS)} and data preparation itself import {PREPARATION} "
            "(the training loop reads shards through bertpretrain.data.load and bertpretrain.data.format)"
        )
    if _within(module, "bertpretrain.data.format") and _within(target, "bertpretrain.data.load", PREPARATION):
        return "bertpretrain.data.format imports neither bertpretrain.data.load nor bertpretrain.data.prepare"
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


def _edges(imports: list[Import]) -> dict[str, set[str]]:
    """The module graph as Python runs it: each import's module, and each package above it that the
    importer is not inside (importing ``a.b.c`` from outside ``a.b`` runs ``a.b``'s ``__init__``
    first; from inside, that package is already being imported)."""
    edges: dict[str, set[str]] = {}
    for found in imports:
        target = _owner(found.target) if _within(found.target, *PROJECT) else None
        if target is None or target == found.module:
            continue
        parts = target.split(".")
        for package in (".".join(parts[:end]) for end in range(1, len(parts))):
            if package in MODULES and not _within(found.module, package):
                edges.setdefault(found.module, set()).add(package)
        edges.setdefault(found.module, set()).add(target)
    return edges


def test_no_import_cycle_among_project_modules() -> None:
    """Imports of every kind (module level, in functions, type-only) form no cycle: one in a
    function or under TYPE_CHECKING works today only because of where it sits, and a move or a
    change of annotations turns it into an ImportError."""
    cycle = _cycle(_edges(IMPORTS))
    assert cycle is None, "import cycle among project modules: " + " -> ".join(cycle or [])


def test_the_rules_catch_what_they_forbid() -> None:
    """A guard for the guard: a type-only import against the layers, a cycle through a function's
    import and a package facade are each caught."""
    loop_to_preparation = Import("bertpretrain.training.phase", "bertpretrain.data.prepare.stage", 1, False)
    assert _violation(loop_to_preparation)
    facade = Import("bertpretrain.runtime.parallel", "bertpretrain.runtime.parallel.ddp", 1, True)
    assert _violation(facade)
    back = [
        Import("bertpretrain.runtime.parallel.ddp", "bertpretrain.runtime.world", 1, True),
        Import("bertpretrain.runtime.world", "bertpretrain.runtime.parallel.ddp", 9, False),
    ]
    assert _cycle(_edges(back))
    assert _violation(Import("bertjob.render", "bertjob_testing.jobs", 1, True))
    assert _violation(Import(CATALOG, "yaml", 1, True))
    assert _violation(Import(f"{CLUSTER_COMPONENTS}.etcd", "bertjob_testing.cluster.controlplane", 1, False))
    # Importing a submodule from outside its package runs the package's __init__.
    assert "bertpretrain.runtime.parallel" in _edges(back)["bertpretrain.runtime.world"]


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


# The kwok tiers (issue 45): pods there are kwok's fakes, or there are none; each test module says,
# in a paragraph of its docstring that begins WHY_KWOK, why it is not on the real node (tests/node/).
KWOK_TIERS = (ROOT / "tests" / "cluster", ROOT / "tests" / "controllers")
WHY_KWOK = "Why kwok:"


def _kwok_modules() -> list[Path]:
    """Every test module of the kwok tiers."""
    return sorted(path for folder in KWOK_TIERS for path in folder.glob("test_*.py"))


def _says_why_kwok(path: Path) -> bool:
    """Whether ``path``'s module docstring has a paragraph that begins with :data:`WHY_KWOK`."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path))) or ""
    return any(paragraph.startswith(WHY_KWOK) for paragraph in re.split(r"\n\s*\n", docstring))


def test_every_kwok_tier_module_says_why_it_is_not_on_the_real_node() -> None:
    """Each test module of tests/cluster and tests/controllers says why it runs on kwok's fake
    nodes and pods, or on no pod at all, rather than on the real node: accelerators this machine
    lacks, nodes lost on demand, scale, exit codes on demand, or no pod needed."""
    modules = _kwok_modules()
    assert len(modules) > 10, f"the scan found only {modules}"  # a guard for the guard
    missing = [path.relative_to(ROOT).as_posix() for path in modules if not _says_why_kwok(path)]
    assert not missing, f"no '{WHY_KWOK}' paragraph in the module docstring of:\n" + "\n".join(missing)
