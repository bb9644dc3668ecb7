"""The ``builtin:python-docs`` corpus: English prose shipped with the running interpreter.

The docstrings of each standard-library module (module, classes and functions, in source order;
found with :mod:`ast`, nothing is imported) as one document per module, then each topic of the
language reference in ``pydoc_data.topics`` as one document per topic. Paragraphs that are code
rather than prose (doctests, code examples, grammar, tables) are dropped. The documents hold their
sentences one per line, already split.
"""

from __future__ import annotations

import ast
import os
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from bertpretrain.data.prepare.corpus.raw import RawDocument
from bertpretrain.data.prepare.corpus.splitting import split_sentences

BUILTIN_PYTHON_DOCS = "builtin:python-docs"
# The version of this reader's output: bump it by hand whenever python_docs() yields other documents
# for the same Python (see readers.READER_VERSIONS, which the cache keys hold beside it).
VERSION = 1

# Tests, IDLE, the 2to3 fixers and demos hold little prose; the ~100 `encodings` modules share one
# generated docstring; pydoc_data is read as topics, not as source.
_SKIPPED_STDLIB_DIRS = frozenset(
    {
        "test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "encodings",
        "pydoc_data", "site-packages", "dist-packages", "__pycache__", "__phello__",
    }
)  # fmt: skip
_WORD = re.compile(r"""^[("'“‘]?[A-Za-z][A-Za-z'’-]*[.,;:!?"'”’)]*$""")
_RULE = re.compile(r"^\s*[-=*~^+#|]{3,}")
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_REST_ROLE = re.compile(r":[\w.]+(?::[\w.]+)?:`~?([^`]*)`")
_PROSE_WORD_SHARE = 0.6


def python_docs() -> Iterator[RawDocument]:
    """The documents of ``builtin:python-docs``, in a fixed order (stdlib modules by path, then topics)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for file in _stdlib_sources(stdlib):
        try:
            tree = ast.parse(file.read_bytes(), filename=str(file))
        except (SyntaxError, ValueError):
            # A stdlib copy may hold files for other Python versions; they have no prose we need.
            continue
        document = _prose_sentences("\n\n".join(_docstrings(tree)))
        if document:
            origin = f"{BUILTIN_PYTHON_DOCS}: {file.relative_to(stdlib).as_posix()}"
            yield RawDocument("\n".join(document), "lines", origin)
    # Imported only here: pydoc_data.topics is a plain dict of text, with no side effects.
    from pydoc_data.topics import topics

    for name in sorted(topics):
        document = _prose_sentences(topics[name])
        if document:
            yield RawDocument("\n".join(document), "lines", f"{BUILTIN_PYTHON_DOCS}: topic {name!r}")


def _stdlib_sources(stdlib: Path) -> Iterator[Path]:
    """The standard library's ``.py`` files in sorted order, without the skipped directories."""
    for directory, subdirectories, files in os.walk(stdlib):
        # Pruned in place so that os.walk neither enters skipped directories nor varies its order.
        subdirectories[:] = sorted(
            d for d in subdirectories if d not in _SKIPPED_STDLIB_DIRS and not d.startswith("config-")
        )
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory, name)


def _docstrings(node: ast.AST) -> Iterator[str]:
    """Docstrings of a module and its classes and functions, depth first in source order.

    Only statement bodies are searched: expressions hold no docstrings, and skipping them
    makes this several times faster than a walk over every node.
    """
    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        docstring = ast.get_docstring(node)
        if docstring:
            yield docstring
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()):
            if isinstance(child, ast.AST):
                yield from _docstrings(child)


def _prose_sentences(text: str) -> list[str]:
    """The sentences of the prose paragraphs of reStructuredText-like documentation."""
    sentences = []
    for paragraph in _paragraphs(text):
        if _is_prose(paragraph):
            sentences.extend(split_sentences(_REST_ROLE.sub(r"\1", " ".join(paragraph)).replace("``", "")))
    return sentences


def _paragraphs(text: str) -> Iterator[list[str]]:
    """Blank-line separated blocks; a list item starts a block of its own, without its bullet."""
    paragraph: list[str] = []
    for line in text.splitlines():
        if _RULE.match(line) and not _BULLET.match(line):
            # A heading underline or table border ends the block; a table's rows fail _is_prose.
            line = ""
        bullet = _BULLET.match(line)
        if (not line.strip() or bullet) and paragraph:
            yield paragraph
            paragraph = []
        if line.strip():
            paragraph.append(line[bullet.end() :] if bullet else line.strip())
    if paragraph:
        yield paragraph


def _is_prose(paragraph: list[str]) -> bool:
    """Whether a block reads as English rather than code, a doctest, grammar or a table.

    Code and tables are mostly symbols and identifiers: at least 60% of the whitespace-separated
    items of prose are plain words, against about a third in code.
    """
    if any(line.startswith((">>>", "...", "$ ")) or "::=" in line for line in paragraph):
        return False
    items = [item for line in paragraph for item in line.split()]
    words = sum(1 for item in items if _WORD.match(item))
    return words >= _PROSE_WORD_SHARE * len(items)
