"""Read a corpus as documents, each a list of sentences, for BERT's next-sentence task.

Two kinds of corpus:

``builtin:python-docs``
    English text shipped with the running interpreter, so that a job runs with no download:
    the docstrings of each standard-library module (module, classes and functions, in source
    order; found with :mod:`ast`, nothing is imported) as one document per module, then each
    topic of the language reference in ``pydoc_data.topics`` as one document per topic.
    Paragraphs that are code rather than prose (doctests, code examples, grammar, tables) are
    dropped. On CPython 3.11: about 490 documents, 22,000 sentences, 1.8 MB of text.

A path: a ``.txt`` file, or a directory searched recursively for ``.txt`` files (in sorted order)
    Blank lines separate documents, as in Google's BERT input format. Within a document:

    * if most lines end like a sentence (at least 80% end in ``. ! ? " ' )`` and the like), the
      file is taken to be in BERT's format, one sentence per line: each line is a sentence
      boundary (a line that holds several sentences is split further);
    * otherwise the file is taken to be wrapped prose: the lines of a block are joined and split
      into sentences.

    The format is decided per file from its first 1000 non-blank lines.

Sentences are found with BlingFire's ``text_to_sentences`` (a rule-based splitter that needs no
model). Documents without any sentence are skipped.
"""

from __future__ import annotations

import ast
import os
import re
import sysconfig
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from pathlib import Path

import blingfire

BUILTIN_PYTHON_DOCS = "builtin:python-docs"

# Tests, IDLE, the 2to3 fixers and demos hold little prose; the ~100 `encodings` modules share one
# generated docstring; pydoc_data is read as topics, not as source.
_SKIPPED_STDLIB_DIRS = frozenset(
    {
        "test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "encodings",
        "pydoc_data", "site-packages", "dist-packages", "__pycache__", "__phello__",
    }
)  # fmt: skip
_SENTENCE_END = re.compile(r"""[.!?:;]['"’”)\]]*$""")
_WORD = re.compile(r"""^[("'“‘]?[A-Za-z][A-Za-z'’-]*[.,;:!?"'”’)]*$""")
_RULE = re.compile(r"^\s*[-=*~^+#|]{3,}")
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_REST_ROLE = re.compile(r":[\w.]+(?::[\w.]+)?:`~?([^`]*)`")
_PROSE_WORD_SHARE = 0.6
_FORMAT_SAMPLE_LINES = 1000
_ONE_SENTENCE_PER_LINE_SHARE = 0.8


def documents(corpus: str) -> Iterator[list[str]]:
    """Yield the corpus's documents, each a non-empty list of sentences (``str``, stripped).

    ``corpus`` is ``builtin:python-docs`` or a path to a ``.txt`` file or a directory of them;
    see the module docstring for how each is read. The order is deterministic (sorted files).

    Raises:
        FileNotFoundError: the path does not exist, or a directory holds no ``.txt`` file.
        ValueError: a file is not UTF-8 text (the message names the file).
    """
    if corpus == BUILTIN_PYTHON_DOCS:
        yield from _python_docs()
        return
    path = Path(corpus)
    if path.is_dir():
        files = sorted(path.rglob("*.txt"))
        if not files:
            raise FileNotFoundError(f"corpus directory {path} holds no .txt file")
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"corpus {corpus!r}: no such file or directory")
    for file in files:
        yield from _text_file(file)


def split_sentences(text: str) -> list[str]:
    """Split one paragraph of prose into sentences with BlingFire; whitespace is collapsed."""
    text = " ".join(text.split())
    if not text:
        return []
    sentences = (s.strip() for s in blingfire.text_to_sentences(text).split("\n"))
    return [s for s in sentences if s]


def _text_file(path: Path) -> Iterator[list[str]]:
    try:
        with path.open(encoding="utf-8") as head:
            sample = list(islice((line.strip() for line in head if line.strip()), _FORMAT_SAMPLE_LINES))
        ended = sum(1 for line in sample if _SENTENCE_END.search(line))
        one_per_line = ended >= _ONE_SENTENCE_PER_LINE_SHARE * max(len(sample), 1)
        with path.open(encoding="utf-8") as text:
            yield from _blocks_to_documents(text, one_per_line)
    except UnicodeDecodeError as error:
        raise ValueError(
            f"corpus file {path} is not UTF-8 text: {error.reason} at byte {error.start}"
        ) from None


def _blocks_to_documents(lines: Iterable[str], one_per_line: bool) -> Iterator[list[str]]:
    block: list[str] = []
    for line in chain(lines, [""]):
        line = line.strip()
        if line:
            block.append(line)
            continue
        if block:
            if one_per_line:
                document = [s for block_line in block for s in split_sentences(block_line)]
            else:
                document = split_sentences(" ".join(block))
            if document:
                yield document
            block = []


def _python_docs() -> Iterator[list[str]]:
    for file in _stdlib_sources(Path(sysconfig.get_paths()["stdlib"])):
        try:
            tree = ast.parse(file.read_bytes(), filename=str(file))
        except (SyntaxError, ValueError):
            # A stdlib copy may hold files for other Python versions; they have no prose we need.
            continue
        document = _prose_sentences("\n\n".join(_docstrings(tree)))
        if document:
            yield document
    # Imported only here: pydoc_data.topics is a plain dict of text, with no side effects.
    from pydoc_data.topics import topics

    for name in sorted(topics):
        document = _prose_sentences(topics[name])
        if document:
            yield document


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
