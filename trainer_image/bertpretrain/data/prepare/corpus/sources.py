"""Read a corpus's sources as raw documents: each source's files through their format's reader,
sources chained with their weights, and the corpus's identity (to tell whether it changed)."""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bertjob_api.spec import SourceSpec
from bertpretrain.data.prepare.corpus.files import (
    detect_format,
    named_errors,
    skip_file,
    source_files,
    unreadable,
)
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS, python_docs
from bertpretrain.data.prepare.corpus.raw import RawDocument, Skipped
from bertpretrain.data.prepare.corpus.readers import READERS


def read_source(source: SourceSpec, skipped: Skipped) -> Iterator[RawDocument]:
    """Yield the documents of one source in a deterministic order (its weight is not applied).

    Files and documents that are skipped are counted in ``skipped`` under a short reason
    (``"empty file"``, ``"redirect"``...); a skipped file also gets one warning line on stderr.

    Raises:
        FileNotFoundError: the path does not exist, or a directory holds no file that could be read.
        ValueError: a file is truncated, corrupt or malformed (the message names the file, and the
            line for JSON Lines); a Parquet/Arrow file lacks the text column; a single file has a
            type that ``auto`` does not know; ``builtin:python-docs`` with another format.
    """
    if source.path == BUILTIN_PYTHON_DOCS or source.format == "python-docs":
        if source.path != BUILTIN_PYTHON_DOCS or source.format not in ("auto", "python-docs"):
            raise ValueError(
                f"corpus source {source.path!r} with format {source.format!r}: the format python-docs "
                f"goes with the path {BUILTIN_PYTHON_DOCS!r}, and only with it"
            )
        yield from python_docs()
        return
    path = Path(source.path)
    files = source_files(source)
    files_read = 0
    for file in files:
        with named_errors(file):
            file_format = source.format if source.format != "auto" else detect_format(file)
            if file_format is None:
                if not path.is_dir():
                    raise ValueError(
                        f"corpus file {file}: unknown file type; name it .txt, .jsonl, .parquet, .arrow, "
                        f".xml.bz2 or .xml.gz, or set the source's format"
                    )
                skip_file(file, "unknown file type", skipped)
                continue
            reason = unreadable(file, file_format)
            if reason:
                skip_file(file, reason, skipped)
                continue
            files_read += 1
            yield from READERS[file_format](file, source.field, skipped)
    if files_read == 0 and path.is_dir():
        found = f"{len(files)} files, all skipped" if files else "no files"
        raise FileNotFoundError(f"corpus directory {path} holds no readable file ({found})")


def identity(sources: Sequence[SourceSpec]) -> list[dict[str, Any]]:
    """What the corpus is made of, to tell whether it changed since an earlier run (JSON-ready).

    Per source: its settings, and under ``files`` the ``[size, mtime_ns]`` of each file it reads,
    by path; for ``builtin:python-docs``, the Python version instead (the text comes with it).
    Files are told apart by size and modification time, as ``make`` and ``rsync`` do, not by a
    hash: hashing would read the whole corpus on every run. A file rewritten within the same
    clock tick at the same size, or copied with its old time kept, is missed.

    Raises:
        FileNotFoundError: a source's path does not exist.
    """
    found = []
    for source in sources:
        if source.path == BUILTIN_PYTHON_DOCS or source.format == "python-docs":
            files: dict[str, Any] = {BUILTIN_PYTHON_DOCS: f"Python {sys.version}"}
        else:
            stats = {str(file): file.stat() for file in source_files(source)}
            files = {name: [stat.st_size, stat.st_mtime_ns] for name, stat in stats.items()}
        found.append({**source.model_dump(mode="json"), "files": files})
    return found


def describe_change(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str:
    """How corpus ``new`` differs from ``old`` (both from :func:`identity`), for a message:
    ``"the corpus changed (size/mtime of /data/a.txt, /data/b.txt added)"``."""
    old_files = {name: value for source in old for name, value in source.get("files", {}).items()}
    new_files = {name: value for source in new for name, value in source.get("files", {}).items()}
    changes = [
        f"size/mtime of {name}" if isinstance(value, list) else f"{name}: {old_files[name]} -> {value}"
        for name, value in new_files.items()
        if name in old_files and old_files[name] != value
    ]
    changes += [f"{name} added" for name in new_files if name not in old_files]
    changes += [f"{name} removed" for name in old_files if name not in new_files]
    if not changes:
        changes = ["a source's format, field or weight"]
    shown = changes[:3] + ([f"{len(changes) - 3} more"] if len(changes) > 3 else [])
    return f"the corpus changed ({', '.join(shown)})"


def read_corpus(sources: Sequence[SourceSpec], seed: int, skipped: Skipped) -> Iterator[RawDocument]:
    """Yield the documents of all sources, one source after another, with the sources' weights applied.

    Each document is yielded ``floor(weight)`` times in a row, and once more with probability
    ``frac(weight)``. That draw is seeded by ``(seed, source index, document index)`` alone, so it
    is deterministic and does not depend on the other sources or on how far the corpus is read.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_source`.
    """
    for source_index, source in enumerate(sources):
        whole = math.floor(source.weight)
        fraction = source.weight - whole
        for document_index, document in enumerate(read_source(source, skipped)):
            extra = fraction > 0 and _uniform(seed, source_index, document_index) < fraction
            for _ in range(whole + extra):
                yield document


def _uniform(seed: int, source_index: int, document_index: int) -> float:
    """A number in [0, 1) that depends on its arguments only (a hash, so no generator state)."""
    digest = hashlib.blake2b(f"{seed}:{source_index}:{document_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
