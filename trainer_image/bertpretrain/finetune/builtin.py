"""Built-in fine-tuning tasks, made from the demo's own corpus so that the demo needs no download.

``python-docs-modules``: single-sentence classification, "which standard-library module's
documentation does this sentence come from". The sentences are those of ``builtin:python-docs``
(:func:`bertpretrain.data.prepare.corpus.pydocs.python_docs`), so the task depends on the running
interpreter's standard library, as the pretraining corpus does; on one interpreter it is the same
bytes for a given seed, whatever the process's hash seed.

Classes are the modules (not the language-reference topics) with the most usable sentences. A
sentence is usable when it has 6 to 60 words, appears in no other module's documentation, and
names neither its module nor the module's last dotted component (case-insensitive, as a
substring): otherwise the task is string matching and says nothing about what pretraining taught.
Private modules (a dotted part starting with ``_``, such as ``_pydecimal``) are not classes: they
implement public modules whose names they do not share, so the name filter would miss those names.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from pathlib import Path

from bertjob_api.files import write_atomically
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS, python_docs
from bertpretrain.data.prepare.corpus.splitting import sentences

BUILTIN_TASKS = ("python-docs-modules",)

_MIN_WORDS = 6
_MAX_WORDS = 60
_HEADER = "sentence\tlabel\n"
_ORIGIN_PREFIX = f"{BUILTIN_PYTHON_DOCS}: "


def builtin_files(out_dir: Path) -> tuple[Path, Path]:
    """Where :func:`write_builtin_task` writes a task: ``out_dir/train.tsv`` and
    ``out_dir/validation.tsv``."""
    return out_dir / "train.tsv", out_dir / "validation.tsv"


def write_builtin_task(
    name: str,
    out_dir: Path,
    seed: int,
    classes: int = 8,
    per_class: int = 250,
    validation_fraction: float = 0.2,
) -> tuple[Path, Path]:
    """Write a built-in task as ``out_dir/train.tsv`` and ``out_dir/validation.tsv``; return both paths.

    The files are in GLUE's single-sentence TSV layout (SST-2's): a header ``sentence\\tlabel``,
    then one row per sentence, UTF-8, ``\\n`` line ends, no quoting (a sentence may hold ``"``);
    whitespace runs in a sentence, tabs and line breaks included, are one space. The label is the
    module's dotted name (``typing``, ``logging.handlers``).

    Per class, at most ``per_class`` sentences are taken (those with the smallest seeded hash),
    and ``round(validation_fraction * n)`` of the class's ``n`` go to validation, at least one and
    at most ``n - 1``, so both files hold every class. Which sentence goes where depends only on
    the seed and the sentences (BLAKE2b keyed by the seed; never :func:`hash`), not on reading order.
    Rows are ordered by another seeded hash, so classes are interleaved.

    Each file is written under a temporary name in ``out_dir`` (created if missing) and renamed,
    so a reader never sees half a file; a file already holding the same bytes is left untouched.
    Reading the corpus parses the standard library with :mod:`ast`: about 3 s.

    Raises:
        ValueError: ``name`` is not in :data:`BUILTIN_TASKS` (the message names the field
            ``spec.finetune[].builtin``); ``classes`` < 2, ``per_class`` < 2, or
            ``validation_fraction`` outside (0, 1); fewer than ``classes`` modules with at least
            two usable sentences.
    """
    if name not in BUILTIN_TASKS:
        raise ValueError(
            f"spec.finetune[].builtin: unknown built-in task {name!r}; known: {', '.join(BUILTIN_TASKS)}"
        )
    if classes < 2:
        raise ValueError(f"classes must be at least 2, got {classes}")
    if per_class < 2:
        raise ValueError(f"per_class must be at least 2 (one train and one validation row), got {per_class}")
    if not 0 < validation_fraction < 1:
        raise ValueError(
            f"validation_fraction must be between 0 and 1 (exclusive), got {validation_fraction}"
        )

    usable = _usable_sentences()
    eligible = [module for module, found in usable.items() if len(found) >= 2]
    if len(eligible) < classes:
        raise ValueError(
            f"{name}: {classes} classes asked for, but only {len(eligible)} modules have usable sentences"
        )
    chosen = sorted(eligible, key=lambda module: (-len(usable[module]), module))[:classes]

    key = hashlib.blake2b(str(seed).encode(), digest_size=32).digest()
    train: list[tuple[str, str]] = []
    validation: list[tuple[str, str]] = []
    for module in chosen:
        picked = sorted(usable[module], key=lambda s: (_keyed_hash(key, b"select", s), s))[:per_class]
        n_validation = min(max(math.floor(validation_fraction * len(picked) + 0.5), 1), len(picked) - 1)
        by_split_hash = sorted(picked, key=lambda s: (_keyed_hash(key, b"split", s), s))
        validation.extend((s, module) for s in by_split_hash[:n_validation])
        train.extend((s, module) for s in by_split_hash[n_validation:])

    paths = builtin_files(Path(out_dir))
    for path, rows in zip(paths, (train, validation), strict=True):
        _write_if_changed(path, _tsv(rows, key))
    return paths


def _usable_sentences() -> dict[str, list[str]]:
    """Each public standard-library module's usable sentences (see the module docstring), deduplicated.

    Duplicates are found on the case-folded text; one that appears in two modules (private ones
    included) is dropped from both, as no label would be right.
    """
    by_module: dict[str, dict[str, str]] = {}
    modules_of: defaultdict[str, set[str]] = defaultdict(set)
    for document in python_docs():
        module = _module_name(document.origin)
        if module is None:
            continue
        found = by_module.setdefault(module, {})
        for sentence in sentences(document):
            text = " ".join(sentence.split())
            folded = text.casefold()
            modules_of[folded].add(module)
            found.setdefault(folded, text)
    if not by_module:
        # Origins are how modules are told from topics; an empty task would hide a change there.
        raise RuntimeError(
            f"{BUILTIN_PYTHON_DOCS} yielded no module documents: has its origin format changed?"
        )

    usable: dict[str, list[str]] = {}
    for module, found in by_module.items():
        if any(part.startswith("_") for part in module.split(".")):
            continue
        names = {module.casefold(), module.rsplit(".", 1)[-1].casefold()}
        usable[module] = [
            text
            for folded, text in found.items()
            if len(modules_of[folded]) == 1
            and _MIN_WORDS <= len(text.split()) <= _MAX_WORDS
            and not any(n in folded for n in names)
        ]
    return usable


def _module_name(origin: str) -> str | None:
    """The dotted module name of a module document's origin (``builtin:python-docs: json/__init__.py``
    gives ``json``), or None for a language-reference topic (``builtin:python-docs: topic 'with'``)."""
    if not origin.startswith(_ORIGIN_PREFIX) or not origin.endswith(".py"):
        return None
    parts = origin.removeprefix(_ORIGIN_PREFIX).removesuffix(".py").split("/")
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _keyed_hash(key: bytes, purpose: bytes, text: str) -> bytes:
    """BLAKE2b of ``text`` keyed by the seed; ``purpose`` makes selection, split and order independent."""
    return hashlib.blake2b(text.encode(), key=key, person=purpose, digest_size=8).digest()


def _tsv(rows: list[tuple[str, str]], key: bytes) -> bytes:
    """The TSV bytes of ``(sentence, label)`` rows, ordered by a seeded hash to interleave classes."""
    ordered = sorted(rows, key=lambda row: (_keyed_hash(key, b"order", f"{row[1]}\t{row[0]}"), row))
    return (_HEADER + "".join(f"{sentence}\t{label}\n" for sentence, label in ordered)).encode()


def _write_if_changed(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` (:func:`bertjob_api.files.write_atomically`: a
    temporary, synced, then renamed; its directory made if missing), unless it is there already."""
    try:
        if path.read_bytes() == content:
            return
    except FileNotFoundError:
        pass
    write_atomically(path, lambda file: file.write(content), len(content))
