"""Every repository path, module and make target that README.md and docs/*.md name exists.

What counts as a mention (the rule the docs are written to):

- **Inline code** (single backticks) holding one word is a *path* when it ends with ``/`` or a
  known file extension, or when its first folder is a folder of this repository
  (``kustomize/overlays/single-node``, ``runtime/compiling.py``). It resolves from the repository
  root, from the doc's own folder, or as the tail of a repository path (``training/export.py``
  names ``trainer_image/bertpretrain/training/export.py``), always at whole path components. Not
  paths: absolute (container) paths such as ``/data`` or ``/etc/bertjob/job.yaml``; URLs;
  placeholders and globs (anything with ``<``, ``*``, ``{``, ``$``, ``...``); domain-qualified
  names (``nvidia.com/gpu``, ``kubeflow.org/v1``, ``bertjob.dev/job``); paths that leave the
  repository from its root (``../shared/...``); paths git ignores (``.cache/``, ``runs/...``: what
  make and a run write); and the names in ``NOT_IN_THIS_REPOSITORY``, files that a job writes or
  that other projects hold, which the docs name on purpose.
- A one-word inline code of a project package and a dotted name (``bertjob_api.plan.Paths``) is a
  *module*: its longest prefix must be a module or package of ours, and the rest a name that module
  defines or imports at its top level (and, one level down, a name bound in that class's body).
- In inline code of several words and in fenced code blocks: each word that starts with a top-level
  folder of the repository and a ``/`` is a path (``kubectl apply -k manifests/``); the word after
  ``python -m`` is a module when it is one of our packages' (``python -m venv`` is not checked);
  and the word after ``make`` (past any ``VAR=value``) is a target of the Makefile.

"Of this repository" means a file git tracks or would track (``git ls-files --cached --others
--exclude-standard``) that is on disk, or a folder holding one: an ignored file (``.venv/``,
``runs/``) is not one, as a fresh clone lacks it.
"""

from __future__ import annotations

import ast
import posixpath
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from bertjob_api.contract import GROUP

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# Each project package and the folder that holds it.
PACKAGES = {
    "bertjob_api": "api/bertjob_api",
    "bertjob": "operator/bertjob",
    "bertpretrain": "trainer_image/bertpretrain",
    "bertjob_testing": "testing/bertjob_testing",
}
# The endings that make a one-word inline code a file name.
EXTENSIONS = frozenset(
    {"py", "md", "yaml", "yml", "json", "jsonl", "sh", "j2", "tpl", "txt", "toml", "lua", "go", "cfg"}
    | {"ini", "pt", "npz", "hdf5", "gz", "tgz", "lock", "csv"}
)
# Names the docs use for files a job writes (in its checkpoint, shard or export folders) or
# files of other projects (NVIDIA's and Google's BERT scripts, Kubeflow's sources); none of them is,
# or should be, a file of this repository.
NOT_IN_THIS_REPOSITORY = frozenset(
    {
        # Written by a job.
        "bert_config.json",
        "config.json",
        "corpus_files.json",
        "dllogger.json",
        "documents/",
        "documents/corpus_files.json",
        "documents/manifest.json",
        "finetune.json",
        "job.yaml",
        "manifest.json",
        "metadata.json",
        "parameters.json",
        "phase1/",
        "phase2/",
        "tokenizer.json",
        "vocab.txt",
        "vocab/",
        "vocab/corpus_files.json",
        "vocab/parameters.json",
        "train.jsonl",
        # Made by the README's commands (a `kubectl cp` destination).
        "./bert-large-a100-hf",
        # Written by mpi-operator into the MPIJob's ConfigMap.
        "discover_hosts.sh",
        # Helm's folder for CRDs, named to say the chart does not use it.
        "crds/",
        # Other projects' files.
        "create_pretraining_data.py",
        "dllogger/logger.py",
        "envvar.go",
        "modeling.py",
        "pkg/constants/constants.go",
        "pkg/controller.v1/pytorch/elastic.go",
        "pkg/runtime/framework/plugins/jobset/builder.go",
        "pkg/runtime/framework/plugins/torch/torch.go",
        "plugins/mpi/mpi.go",
        "resolve.go",
        "run_classifier.py",
        "run_glue.py",
        "run_pretraining.py",
        "run_pretraining.sh",
        "run_squad.py",
    }
)
# Placeholders, globs, patterns, absolute (container) paths, options and bare extensions (`.xml.gz`).
NOT_A_PATH = re.compile(r"[<>*{}$|@=:?,()\[\]^'\"\\]|\.\.\.|^[/~-]|^\.[\w.]+$")
MODULE = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"`([^`]+)`")
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+(?:[A-Z_][A-Z0-9_]*=\S*\s+)*([A-Za-z][\w.-]*)")
PYTHON_MODULE = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)")


@dataclass(frozen=True)
class Mention:
    """One name a doc gives: ``kind`` is ``path``, ``module`` or ``target``; ``line`` is 1-based."""

    doc: Path
    line: int
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.kind} `{self.name}`"


@cache
def repository_paths() -> frozenset[str]:
    """Every file of the repository and every folder holding one, relative to the root (POSIX)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    files = {name for name in listed.split("\0") if name and (ROOT / name).is_file()}
    folders = {str(parent.as_posix()) for name in files for parent in Path(name).parents}
    return frozenset(files | folders - {"."})


def _folders() -> frozenset[str]:
    return frozenset(path for path in repository_paths() if not (ROOT / path).is_file())


def _top_level() -> frozenset[str]:
    return frozenset(path for path in _folders() if "/" not in path)


def _folder_names() -> frozenset[str]:
    return frozenset(posixpath.basename(path) for path in _folders())


def _is_path(token: str) -> bool:
    """Whether a one-word inline code names a path, by the rule in this module's docstring."""
    if NOT_A_PATH.search(token) or "://" in token:
        return False
    first = token.split("/")[0]
    if "/" in token and "." in first and not first.startswith("."):
        return False  # a domain-qualified name: an API group, a label key, a resource
    name = posixpath.basename(token.rstrip("/"))
    if "." in name and name.rsplit(".", 1)[1] in EXTENSIONS:
        return True
    return "/" in token and (token.endswith("/") or first in _folder_names() or first in (".", ".."))


def _mentions_in_words(doc: Path, line: int, text: str) -> Iterator[Mention]:
    """The mentions in a command line or a several-word inline code."""
    for found in MAKE.finditer(text):
        yield Mention(doc, line, "target", found.group(1))
    for found in PYTHON_MODULE.finditer(text):
        if found.group(1).split(".")[0] in PACKAGES:
            yield Mention(doc, line, "module", found.group(1))
    for word in text.split():
        word = word.rstrip(".,;)")
        first = word.split("/")[0]
        if "/" in word and first in _top_level() and not NOT_A_PATH.search(word):
            yield Mention(doc, line, "path", word)


def mentions(doc: Path) -> Iterator[Mention]:
    """Every path, module and make target that ``doc`` names, by the rule in this module's docstring."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    prose: list[str] = []
    fenced = False
    for number, text in enumerate(lines, start=1):
        if FENCE.match(text):
            fenced = not fenced
            prose.append("")
        elif fenced:
            yield from _mentions_in_words(doc, number, text)
            prose.append("")
        else:
            prose.append(text)
    joined = "\n".join(prose)
    for found in INLINE.finditer(joined):
        line = joined.count("\n", 0, found.start()) + 1
        span = found.group(1).strip()
        if re.search(r"\s", span):
            yield from _mentions_in_words(doc, line, span)
        elif MODULE.match(span) and span != GROUP:
            yield Mention(doc, line, "module", span)
        elif _is_path(span):
            yield Mention(doc, line, "path", span)


def path_exists(doc: Path, name: str) -> bool:
    """Whether ``name`` (a path ``doc`` gives) names a repository path, from the root, from the
    doc's folder or as the tail of one, by the rule in this module's docstring."""
    folder_only = name.endswith("/")
    wanted = posixpath.normpath(name.rstrip("/"))
    paths = repository_paths()

    def fits(path: str) -> bool:
        return path in paths and not (folder_only and (ROOT / path).is_file())

    beside = posixpath.normpath(posixpath.join(doc.parent.relative_to(ROOT).as_posix(), wanted))
    if fits(wanted) or fits(beside):
        return True
    tail = "/" + wanted
    return not wanted.startswith("../") and any(path.endswith(tail) and fits(path) for path in paths)


def outside(name: str) -> bool:
    """Whether ``name`` is no path of the repository by its form: it leaves the repository from the
    root (``../shared/...``), or git ignores it (``.cache/``, ``runs/``: what make and a run write)."""
    wanted = posixpath.normpath(name.rstrip("/"))
    if wanted == ".." or wanted.startswith("../"):
        return True
    return subprocess.run(["git", "check-ignore", "-q", wanted], cwd=ROOT, check=False).returncode == 0


def _module_file(dotted: str) -> Path | None:
    package, *rest = dotted.split(".")
    base = ROOT / PACKAGES[package] / Path(*rest)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _bound_names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module or class body binds at its top level (definitions, assignments, imports)."""
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def module_exists(dotted: str) -> bool:
    """Whether ``dotted`` names one of our modules, or a name it defines (at most a class's member)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        source = _module_file(".".join(parts[:cut]))
        if source is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        if len(rest) > 2:
            return False
        body = ast.parse(source.read_text(encoding="utf-8")).body
        bound = _bound_names(body).get(rest[0])
        if bound is None:
            return False
        if len(rest) == 1:
            return True
        return isinstance(bound, ast.ClassDef) and rest[1] in _bound_names(bound.body)
    return False


@cache
def make_targets() -> frozenset[str]:
    """The targets the Makefile defines (rules and ``.PHONY``), variables and patterns left out."""
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        rule = re.match(r"^([^\s#=:][^=:]*?)\s*::?(?!=)", line)
        if rule:
            targets.update(name for name in rule.group(1).split() if "$" not in name and "%" not in name)
        phony = re.match(r"^\.PHONY\s*:(.*)", line)
        if phony:
            targets.update(phony.group(1).split())
    return frozenset(targets)


def broken(mention: Mention) -> bool:
    """Whether ``mention`` names nothing of this repository (the allowed outside names aside)."""
    if mention.kind == "target":
        return mention.name not in make_targets()
    if mention.kind == "module":
        return not module_exists(mention.name)
    if mention.name in NOT_IN_THIS_REPOSITORY or path_exists(mention.doc, mention.name):
        return False
    return not outside(mention.name)


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.relative_to(ROOT).as_posix())
def test_every_path_module_and_make_target_a_doc_names_exists(doc: Path) -> None:
    found = list(mentions(doc))
    assert found, f"{doc.name}: no mention found; the extraction is broken"
    missing = [str(mention) for mention in found if broken(mention)]
    assert not missing, "names of nothing in this repository:\n" + "\n".join(missing)


def test_the_outside_names_are_not_repository_files() -> None:
    # An entry that became a repository file would hide a stale mention of it.
    inside = sorted(name for name in NOT_IN_THIS_REPOSITORY if name.rstrip("/") in repository_paths())
    assert not inside, f"NOT_IN_THIS_REPOSITORY lists files of this repository: {inside}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see `trainer_image/bertpretrain/run.py`", [("path", "trainer_image/bertpretrain/run.py")]),
        ("mounted at `/data` and `/etc/bertjob/job.yaml`", []),
        ("`nvidia.com/gpu`, `kubeflow.org/v1`, `bertjob.dev/job`, `batch/v1`", []),
        ("`<checkpoint.path>/hf`, `operator/bertjob/templates/*.j2`, `tests/...`", []),
        ("`https://example.com/a.yaml` and `.json`", []),
        ("the `bertjob_api.plan.Paths` class, `bertjob.dev`", [("module", "bertjob_api.plan.Paths")]),
        (
            "`kubectl apply -k manifests/` then `make generate`",
            [("path", "manifests/"), ("target", "generate")],
        ),
        (
            "`python -m bertjob_api.reference docs/reference.md`",
            [("module", "bertjob_api.reference"), ("path", "docs/reference.md")],
        ),
        (
            "```sh\nIMAGE_TARGETS=x make images   # hack/build-images.sh\n```",
            [("target", "images"), ("path", "hack/build-images.sh")],
        ),
        ("## Export (`training/export.py`)", [("path", "training/export.py")]),
        ("`python -m venv .venv` and `python -m torch.distributed.run`", []),
    ],
)
def test_the_rule_picks_these_mentions(tmp_path: Path, text: str, expected: list[tuple[str, str]]) -> None:
    doc = ROOT / "docs" / "example.md"
    found = _mentions_of_text(doc, text, tmp_path)
    assert [(mention.kind, mention.name) for mention in found] == expected


@pytest.mark.parametrize(
    ("kind", "name", "exists"),
    [
        ("path", "training/export.py", True),
        ("path", "export.py", True),
        ("path", "reference.md", True),  # beside docs/*.md
        ("path", "../README.md", True),
        ("path", "examples/", True),
        ("path", "Makefile/", False),  # a file, named as a folder
        ("path", "port.py", False),  # not a whole component of export.py
        ("path", "data/prepare.py", False),
        ("path", "../shared/notes/facts.md", True),  # outside the repository
        ("module", "bertjob_api.plan", True),
        ("module", "bertjob_api.plan.Paths", True),
        ("module", "bertjob_api.contract.GROUP", True),
        ("module", "bertjob_api.plan.Nothing", False),
        ("module", "bertpretrain.data.sharding", False),
        ("target", "generate", True),
        ("target", "release-everything", False),
    ],
)
def test_these_names_resolve_or_not(kind: str, name: str, exists: bool) -> None:
    assert broken(Mention(ROOT / "docs" / "example.md", 1, kind, name)) is not exists


def _mentions_of_text(doc: Path, text: str, tmp_path: Path) -> list[Mention]:
    # mentions() reads a file; give it this text under the doc's name, in a scratch folder.
    scratch = tmp_path / doc.name
    scratch.write_text(text, encoding="utf-8")
    return [Mention(doc, mention.line, mention.kind, mention.name) for mention in mentions(scratch)]


def test_the_paths_the_chart_notes_name_exist() -> None:
    # NOTES.txt is plain text: its command lines are read as a fenced block's.
    notes = ROOT / "charts" / "bertjob" / "templates" / "NOTES.txt"
    found = [
        mention
        for number, text in enumerate(notes.read_text(encoding="utf-8").splitlines(), start=1)
        for mention in _mentions_in_words(notes, number, text)
    ]
    assert any(mention.name.startswith("examples/") for mention in found), "NOTES.txt names no example"
    missing = [str(mention) for mention in found if broken(mention)]
    assert not missing, "names of nothing in this repository:\n" + "\n".join(missing)
