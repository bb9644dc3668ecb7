"""Read a corpus's sources as raw documents: each source's files through their format's reader,
sources chained with their weights, and the corpus's identity (to tell whether it changed)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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
from bertpretrain.data.prepare.corpus.pydocs import VERSION as PYTHON_DOCS_VERSION
from bertpretrain.data.prepare.corpus.raw import RawDocument, Skipped
from bertpretrain.data.prepare.corpus.readers import READER_VERSIONS, READERS
from bertpretrain.data.prepare.corpus.splitting import SPLITTER_VERSIONS


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


# A corpus's listing: per source, each file's ``[size, mtime_ns]`` by path (for the built-in corpus,
# its one entry: the Python version).
Listing = list[dict[str, Any]]


@dataclass(frozen=True)
class CorpusIdentity:
    """What the corpus is made of, to tell whether it changed since an earlier run.

    ``key`` (JSON-ready, what the cache keys hold): per source, its settings and under ``files``
    the count and SHA-256 of its listing (:func:`files_key`), a few hundred bytes however many
    files there are. ``listing``: per source, the listing itself, kept in a file beside each record
    (``cache.CORPUS_FILES``) so that a message can say which files changed.
    """

    key: list[dict[str, Any]]
    listing: Listing


def identity(sources: Sequence[SourceSpec]) -> CorpusIdentity:
    """The corpus's identity: per source, its settings and the ``[size, mtime_ns]`` of each file
    it reads, by path; for ``builtin:python-docs``, the Python version instead (the text comes
    with it). Files are told apart by size and modification time, as ``make`` and ``rsync`` do,
    not by a hash of their contents: that would read the whole corpus on every run. A file
    rewritten within the same clock tick at the same size, or copied with its old time kept, is
    missed.

    Raises:
        FileNotFoundError: a source's path does not exist.
    """
    key, listing = [], []
    for source in sources:
        if source.path == BUILTIN_PYTHON_DOCS or source.format == "python-docs":
            files: dict[str, Any] = {BUILTIN_PYTHON_DOCS: f"Python {sys.version}"}
        else:
            stats = {str(file): file.stat() for file in source_files(source)}
            files = {name: [stat.st_size, stat.st_mtime_ns] for name, stat in stats.items()}
        key.append({**source.model_dump(mode="json"), "files": files_key(files)})
        listing.append(files)
    return CorpusIdentity(key, listing)


def files_key(files: dict[str, Any]) -> dict[str, Any]:
    """A source's listing (path -> ``[size, mtime_ns]``) as a key of fixed size: ``{"count": n,
    "sha256": hex}``, the SHA-256 of the listing sorted by path, one ``path NUL value`` line each
    (the value as JSON)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{json.dumps(files[name])}\n".encode("utf-8", "surrogatepass"))
    return {"count": len(files), "sha256": digest.hexdigest()}


def code_versions(sources: Sequence[SourceSpec]) -> dict[str, Any]:
    """The versions of the code that reads and splits ``sources`` (JSON-ready, for the cache keys):
    the reader of each source's format (every reader for ``auto``, which picks them file by file)
    and every kind's splitting. Each is a number bumped by hand when its output changes
    (``readers.READER_VERSIONS``, ``pydocs.VERSION``, ``splitting.SPLITTER_VERSIONS``)."""
    readers: dict[str, int] = {}
    for source in sources:
        if source.path == BUILTIN_PYTHON_DOCS or source.format == "python-docs":
            readers["python-docs"] = PYTHON_DOCS_VERSION
        elif source.format == "auto":
            readers.update(READER_VERSIONS)
        else:
            readers[source.format] = READER_VERSIONS[source.format]
    return {"readers": dict(sorted(readers.items())), "splitting": dict(SPLITTER_VERSIONS)}


def describe_change(
    old: list[dict[str, Any]], new: list[dict[str, Any]], old_listing: Listing | None, new_listing: Listing
) -> str:
    """How corpus ``new`` differs from ``old`` (keys from :func:`identity`), for a message:
    ``"the corpus changed (size/mtime of /data/a.txt, /data/b.txt added)"``, or with many files
    ``"the corpus changed (3 files changed, first: /data/a.txt, 2 files added, first: ...)"``.

    ``old_listing`` is the listing recorded with ``old``; it is used only where its digests match
    ``old``'s (it may be missing, or from another run), else the counts alone are told.
    """
    recorded = (
        old_listing is not None
        and len(old_listing) == len(old)
        and all(
            files_key(files) == source.get("files") for files, source in zip(old_listing, old, strict=True)
        )
    )
    if not recorded:
        before, now = sum(map(_file_count, old)), sum(map(_file_count, new))
        return f"the corpus changed ({before} files before, {now} now; which ones was not recorded)"
    assert old_listing is not None
    old_files = {name: value for files in old_listing for name, value in files.items()}
    new_files = {name: value for files in new_listing for name, value in files.items()}
    changed = [name for name, value in new_files.items() if name in old_files and old_files[name] != value]
    # The built-in corpus's one entry is its Python version, told as it is.
    changes = [f"{n}: {old_files[n]} -> {new_files[n]}" for n in changed if n == BUILTIN_PYTHON_DOCS]
    groups = {
        "changed": [name for name in changed if name != BUILTIN_PYTHON_DOCS],
        "added": [name for name in new_files if name not in old_files],
        "removed": [name for name in old_files if name not in new_files],
    }
    for what, names in groups.items():
        if len(names) == 1:
            changes.append(f"size/mtime of {names[0]}" if what == "changed" else f"{names[0]} {what}")
        elif names:
            changes.append(f"{len(names)} files {what}, first: {names[0]}")
    if not changes:
        changes = ["a source's format, field or weight"]
    return f"the corpus changed ({', '.join(changes)})"


def _file_count(source: dict[str, Any]) -> int:
    files = source.get("files") or {}
    # Records made before the listing moved out of the key held the listing itself.
    return files["count"] if isinstance(files.get("count"), int) else len(files)


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
