"""Finding, opening and sniffing a corpus's files: directory listing, decompression, format by name,
errors that name the file, and lines decoded one at a time."""

from __future__ import annotations

import bz2
import gzip
import io
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Literal

from bertjob_api.spec import SourceFormat, SourceSpec
from bertpretrain.data.prepare.corpus.raw import Skipped
from bertpretrain.data.prepare.corpus.splitting import SENTENCE_END

_FORMAT_SAMPLE_LINES = 1000
_ONE_SENTENCE_PER_LINE_SHARE = 0.8

# Longest suffix first, so that ".xml.gz" is not taken for ".gz" or ".xml".
_FORMATS_BY_SUFFIX: tuple[tuple[str, SourceFormat | Literal["txt"]], ...] = (
    (".jsonl.bz2", "jsonl"),
    (".jsonl.gz", "jsonl"),
    (".json.bz2", "jsonl"),
    (".json.gz", "jsonl"),
    (".txt.bz2", "txt"),
    (".txt.gz", "txt"),
    (".xml.bz2", "wikipedia"),
    (".xml.gz", "pubmed"),
    (".feather", "parquet"),
    (".parquet", "parquet"),
    (".arrow", "parquet"),
    (".jsonl", "jsonl"),
    (".json", "jsonl"),
    (".txt", "txt"),
    (".xml", "wikipedia"),
)
_SNIFF_BYTES = 8192


def source_files(source: SourceSpec) -> list[Path]:
    """The files a source other than ``builtin:python-docs`` is read from, in reading order.

    Raises:
        FileNotFoundError: the path does not exist.
    """
    path = Path(source.path)
    if path.is_dir():
        return _directory_files(path)
    if path.is_file():
        return [path]
    raise FileNotFoundError(f"corpus source {source.path!r}: no such file or directory")


def detect_format(file: Path) -> SourceFormat | None:
    """The format ``auto`` gives a file (see :mod:`bertpretrain.data.prepare.corpus`), or None for an
    unknown type.

    A ``.txt`` file is opened to tell ``bert`` from ``text``; other types are told by name alone.
    """
    name = file.name.lower()
    by_name = next((fmt for suffix, fmt in _FORMATS_BY_SUFFIX if name.endswith(suffix)), None)
    if by_name != "txt":
        return by_name
    with open_binary(file) as stream:
        # Only a sample, so bad bytes need not stop the guess; reading reports them.
        lines = (raw.decode("utf-8", errors="replace").strip() for raw in stream)
        sample = list(islice((line for line in lines if line), _FORMAT_SAMPLE_LINES))
    ended = sum(1 for line in sample if SENTENCE_END.search(line))
    return "bert" if ended >= _ONE_SENTENCE_PER_LINE_SHARE * max(len(sample), 1) else "text"


def _directory_files(directory: Path) -> list[Path]:
    files = (p for p in directory.rglob("*") if p.is_file())
    visible = (p for p in files if not any(part.startswith(".") for part in p.relative_to(directory).parts))
    return sorted(visible)


def skip_file(file: Path, reason: str, skipped: Skipped) -> None:
    """Count a skipped file under ``reason`` and say so in one warning line on stderr."""
    skipped[reason] += 1
    print(f"corpus: skipped {file}: {reason}", file=sys.stderr)


def open_binary(file: Path) -> io.BufferedIOBase:
    """``file`` opened for reading bytes, decompressed as it is read when it ends in ``.gz``/``.bz2``."""
    name = file.name.lower()
    if name.endswith(".gz"):
        return gzip.open(file, "rb")
    if name.endswith(".bz2"):
        return bz2.open(file, "rb")
    return file.open("rb")


def unreadable(file: Path, file_format: str) -> str | None:
    """Why a file is skipped before its reader opens it: empty or binary; None to read it."""
    if file.stat().st_size == 0:
        return "empty file"
    if file_format == "parquet":
        return None
    with open_binary(file) as stream:
        head = stream.read(_SNIFF_BYTES)
    if not head:
        return "empty file"
    if b"\0" in head:
        return "binary file"
    return None


@contextmanager
def named_errors(file: Path) -> Iterator[None]:
    """Turn the decompressors' errors into errors that name the file.

    OSError is translated only for compressed files: there it is how gzip and bz2 report bad data,
    while for plain files it is a real I/O error and passes unchanged.
    """
    try:
        yield
    except EOFError as error:
        raise ValueError(f"corpus file {file} is truncated: {error}") from error
    except zlib.error as error:
        raise ValueError(f"corpus file {file} is corrupt: {error}") from error
    except OSError as error:
        compressed = file.name.lower().endswith((".gz", ".bz2"))
        if not compressed or isinstance(error, FileNotFoundError | PermissionError):
            raise
        raise ValueError(f"corpus file {file} is not valid compressed data: {error}") from error


def decoded_lines(file: Path, stream: io.BufferedIOBase) -> Iterator[tuple[int, str | None]]:
    """``(line number, line)`` for each line of a file; the line is None where it is not UTF-8.

    The first line that is not UTF-8 is reported once per file, with its byte offset.
    """
    warned = False
    offset = 0
    for number, raw in enumerate(stream, 1):
        try:
            line: str | None = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            if not warned:
                print(
                    f"corpus: {file}: skipping documents that are not UTF-8; the first bad byte is on "
                    f"line {number} (byte offset {offset + error.start})",
                    file=sys.stderr,
                )
                warned = True
            line = None
        if number == 1 and line is not None:
            line = line.removeprefix("\ufeff")
        offset += len(raw)
        yield number, line
