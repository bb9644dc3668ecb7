"""Read a corpus's sources as raw documents, and split documents into sentences.

Reading and splitting are two steps: :func:`read_source` and :func:`read_corpus` run in one
process and yield :class:`RawDocument` objects (text plus how to split it), and
:func:`sentences` turns one document into sentences; the data pipeline runs it in worker
processes, so it is a pure function of the document.

Formats (``SourceSpec.format``)
-------------------------------
``python-docs`` (path ``builtin:python-docs``)
    English text shipped with the running interpreter, so that a job runs with no download:
    the docstrings of each standard-library module (module, classes and functions, in source
    order; found with :mod:`ast`, nothing is imported) as one document per module, then each
    topic of the language reference in ``pydoc_data.topics`` as one document per topic.
    Paragraphs that are code rather than prose (doctests, code examples, grammar, tables) are
    dropped. On CPython 3.11: about 490 documents, 22,000 sentences, 1.8 MB of text. The
    documents hold their sentences one per line, already split.
``bert``
    Google's BERT input format: one sentence per line, a blank line between documents. A line
    that holds several sentences is split further.
``text``
    Raw prose, one document per file (a book, an article): lines are joined, blank lines
    separate paragraphs, and paragraphs are split into sentences.
``jsonl``
    JSON Lines, optionally ``.gz`` or ``.bz2`` compressed: one document per record, its text
    (prose, blank lines separating paragraphs) in the field ``SourceSpec.field``.
``parquet``
    Parquet, or Arrow IPC (file or stream format, which is also what Feather v2 is), read with
    pyarrow one record batch at a time: one document per row of the column ``SourceSpec.field``.
    Which of the three a file is comes from its first bytes, not its name.
``wikipedia``
    A MediaWiki XML dump (``.xml``, ``.xml.bz2`` or ``.xml.gz``) read page by page with
    ``mwxml``. Only articles are kept: pages outside the main namespace, redirects and
    disambiguation pages are skipped and counted. The markup is stripped in :func:`sentences`
    (in the workers) with ``mwparserfromhell``; see :func:`_wikitext_to_prose` for what is kept.
    Stubs are not skipped: how many sentences a page has is known only after stripping.
``pubmed``
    A PubMed baseline file (gzip-compressed XML, ``.xml.gz``) read with ``pubmed_parser``: one
    document per article, its title then its abstract; articles without an abstract are skipped
    and counted. The labels of structured abstracts (``BACKGROUND``, ``METHODS``) are dropped.
``auto``
    By file name: ``builtin:python-docs``; ``.txt`` (also ``.txt.gz``/``.txt.bz2``) is ``bert`` when
    at least 80% of its first 1000 non-blank lines end like a sentence, ``text`` otherwise;
    ``.jsonl``, ``.json`` (also ``.gz``/``.bz2``) ``jsonl``; ``.parquet``, ``.arrow``, ``.feather``
    ``parquet``; ``.xml``, ``.xml.bz2`` ``wikipedia``; ``.xml.gz`` ``pubmed``. In a directory,
    files of other types are skipped and counted; a single file of another type is an error.

A directory is searched recursively and read in sorted path order; names starting with a dot
(``.git``, Kubernetes' ``..data`` links) are ignored. With an explicit format, every file of a
directory is read in that format. ``.gz`` and ``.bz2`` files are decompressed as they are read.

Memory is bounded by one document (plus one record batch for Parquet/Arrow), never a file:
text is read line by line, XML with streaming parsers. One exception: ``pubmed_parser`` clears
each article once parsed but keeps an empty element per article until the file ends, so its
memory grows with the number of articles in one file (about 30,000 in a baseline file), not
with their text.

Bad input
---------
Every problem either stops the job with an error that names the file, or skips and counts:

* skipped, counted, and one warning line per file on stderr: empty files, binary files (a NUL
  byte in the first 8 KiB), files of unknown type in a directory;
* counted without a warning, as they are routine: redirects, pages outside the main namespace,
  disambiguation pages, articles without abstract, records without the text field or with
  empty text;
* bytes that are not UTF-8: the *document* holding them is skipped and counted, and the rest of
  the file is still read, so that one bad record does not cost a whole dump; one warning per
  file names the line and byte offset of the first bad byte. For ``text`` the document is the
  whole file;
* errors (``ValueError`` naming the file): truncated or corrupt ``.gz``/``.bz2`` data, XML that
  is not well formed or not a MediaWiki dump/PubMed set, a JSON Lines line that is not JSON
  (``file:line``), a Parquet/Arrow file without the text column (naming the columns it has) or
  that is not Parquet/Arrow at all. A job should not quietly train on half of a dump.
* a missing path, or a directory with no file that could be read: ``FileNotFoundError``.

Sentences are found with BlingFire's ``text_to_sentences`` (rule based, no model). Line and
paragraph breaks are handed to it as U+2029 (paragraph separator), after which it always ends
a sentence, so that one call splits a whole document.
"""

from __future__ import annotations

import ast
import bz2
import collections
import gzip
import hashlib
import io
import json
import math
import os
import re
import sys
import sysconfig
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import blingfire

from bertjob_api.spec import SourceFormat, SourceSpec

if TYPE_CHECKING:
    from mwparserfromhell.nodes import Node, Wikilink

BUILTIN_PYTHON_DOCS = "builtin:python-docs"

DocumentKind = Literal["lines", "prose", "wikitext"]


@dataclass(frozen=True, slots=True)
class RawDocument:
    """A document as read, before sentence splitting; picklable (sent to worker processes).

    ``kind`` says how :func:`sentences` splits ``text``: ``lines`` holds one sentence per line (a
    line may still hold several sentences, which are split further); ``prose`` holds paragraphs
    separated by blank lines; ``wikitext`` is MediaWiki markup, stripped first, then prose.
    ``origin`` says where the document came from, for messages (``file.jsonl:123``).
    """

    text: str
    kind: DocumentKind
    origin: str


Skipped = collections.Counter[str]
_Reader = Callable[[Path, str, Skipped], Iterator[RawDocument]]

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
# Parquet batches are decoded one at a time; rows of web text average a few KB.
_BATCH_ROWS = 1024

# U+2029 (paragraph separator) ends a sentence for BlingFire whatever precedes it, unlike "\n",
# which it reads as a space. The space after it matters: BlingFire ends a sentence after
# "\u2029Mr." but not after "\u2029 Mr.".
_BREAK_CHAR = "\u2029"
_BREAK = "\u2029 "
_BLANK_LINES = re.compile(r"\n[^\S\n]*\n\s*")


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
        yield from _python_docs()
        return
    path = Path(source.path)
    files = source_files(source)
    files_read = 0
    for file in files:
        with _named_errors(file):
            file_format = source.format if source.format != "auto" else detect_format(file)
            if file_format is None:
                if not path.is_dir():
                    raise ValueError(
                        f"corpus file {file}: unknown file type; name it .txt, .jsonl, .parquet, .arrow, "
                        f".xml.bz2 or .xml.gz, or set the source's format"
                    )
                _skip_file(file, "unknown file type", skipped)
                continue
            reason = _unreadable(file, file_format)
            if reason:
                _skip_file(file, reason, skipped)
                continue
            files_read += 1
            yield from _READERS[file_format](file, source.field, skipped)
    if files_read == 0 and path.is_dir():
        found = f"{len(files)} files, all skipped" if files else "no files"
        raise FileNotFoundError(f"corpus directory {path} holds no readable file ({found})")


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


def sentences(document: RawDocument) -> list[str]:
    """The document's sentences, stripped and non-empty, found with BlingFire.

    ``lines``: every line break ends a sentence; ``prose``: blank lines end paragraphs and single
    line breaks are spaces; ``wikitext``: the markup is stripped with mwparserfromhell first, then
    as prose. Runs of whitespace inside a sentence become one space. A pure function: it runs in
    worker processes.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if document.kind == "lines":
        text = document.text.strip().replace("\n", _BREAK)
    elif document.kind == "prose":
        text = _prose_breaks(document.text)
    elif document.kind == "wikitext":
        text = _prose_breaks(_wikitext_to_prose(document.text))
    else:
        raise ValueError(f"{document.origin}: unknown document kind {document.kind!r}")
    if not text or text.isspace():
        return []
    split = blingfire.text_to_sentences(text)
    if split.count(_BREAK_CHAR) != text.count(_BREAK_CHAR):
        # Never seen, but cheap to check: the breaks must survive, or lines would be joined.
        return [s for part in text.split(_BREAK_CHAR) for s in split_sentences(part)]
    # Whitespace is collapsed per sentence: a regular expression over the whole text is slower.
    parts = split.replace(_BREAK_CHAR, "\n").split("\n")
    return [s for s in (" ".join(part.split()) for part in parts) if s]


def split_sentences(text: str) -> list[str]:
    """Split one paragraph of prose into sentences with BlingFire; whitespace is collapsed."""
    text = " ".join(text.split())
    if not text:
        return []
    sentences = (s.strip() for s in blingfire.text_to_sentences(text).split("\n"))
    return [s for s in sentences if s]


def detect_format(file: Path) -> SourceFormat | None:
    """The format ``auto`` gives a file (see the module docstring), or None for an unknown type.

    A ``.txt`` file is opened to tell ``bert`` from ``text``; other types are told by name alone.
    """
    name = file.name.lower()
    by_name = next((fmt for suffix, fmt in _FORMATS_BY_SUFFIX if name.endswith(suffix)), None)
    if by_name != "txt":
        return by_name
    with _open_binary(file) as stream:
        # Only a sample, so bad bytes need not stop the guess; reading reports them.
        lines = (raw.decode("utf-8", errors="replace").strip() for raw in stream)
        sample = list(islice((line for line in lines if line), _FORMAT_SAMPLE_LINES))
    ended = sum(1 for line in sample if _SENTENCE_END.search(line))
    return "bert" if ended >= _ONE_SENTENCE_PER_LINE_SHARE * max(len(sample), 1) else "text"


# --- files ---------------------------------------------------------------------------------------


def _directory_files(directory: Path) -> list[Path]:
    files = (p for p in directory.rglob("*") if p.is_file())
    visible = (p for p in files if not any(part.startswith(".") for part in p.relative_to(directory).parts))
    return sorted(visible)


def _skip_file(file: Path, reason: str, skipped: Skipped) -> None:
    skipped[reason] += 1
    print(f"corpus: skipped {file}: {reason}", file=sys.stderr)


def _open_binary(file: Path) -> io.BufferedIOBase:
    name = file.name.lower()
    if name.endswith(".gz"):
        return gzip.open(file, "rb")
    if name.endswith(".bz2"):
        return bz2.open(file, "rb")
    return file.open("rb")


def _unreadable(file: Path, file_format: str) -> str | None:
    """Why a file is skipped before its reader opens it: empty or binary; None to read it."""
    if file.stat().st_size == 0:
        return "empty file"
    if file_format == "parquet":
        return None
    with _open_binary(file) as stream:
        head = stream.read(_SNIFF_BYTES)
    if not head:
        return "empty file"
    if b"\0" in head:
        return "binary file"
    return None


@contextmanager
def _named_errors(file: Path) -> Iterator[None]:
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


def _lines(file: Path, stream: io.BufferedIOBase) -> Iterator[tuple[int, str | None]]:
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


# --- one reader per format -----------------------------------------------------------------------


def _read_bert(file: Path, field: str, skipped: Skipped) -> Iterator[RawDocument]:
    with _open_binary(file) as stream:
        block: list[str] = []
        first_line = 0
        undecodable = False
        for number, line in _lines(file, stream):
            text = line.strip() if line is not None else None
            if text != "":
                if not block and not undecodable:
                    first_line = number
                if text is None:
                    undecodable = True
                else:
                    block.append(text)
                continue
            if undecodable:
                skipped["not UTF-8"] += 1
            elif block:
                yield RawDocument("\n".join(block), "lines", f"{file}:{first_line}")
            block, undecodable = [], False
        if undecodable:
            skipped["not UTF-8"] += 1
        elif block:
            yield RawDocument("\n".join(block), "lines", f"{file}:{first_line}")


def _read_text(file: Path, field: str, skipped: Skipped) -> Iterator[RawDocument]:
    lines = []
    with _open_binary(file) as stream:
        for _, line in _lines(file, stream):
            if line is None:
                # The file is the document: nothing more of it will be used.
                skipped["not UTF-8"] += 1
                return
            lines.append(line)
    text = "".join(lines)
    if text.isspace():
        skipped["empty document"] += 1
        return
    yield RawDocument(text, "prose", str(file))


def _read_jsonl(file: Path, field: str, skipped: Skipped) -> Iterator[RawDocument]:
    with _open_binary(file) as stream:
        for number, line in _lines(file, stream):
            if line is None:
                skipped["not UTF-8"] += 1
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"corpus file {file}:{number}: not a JSON value ({error.msg}, column {error.colno})"
                ) from None
            if not isinstance(record, dict) or field not in record:
                skipped[f"json line without field {field!r}"] += 1
            elif not isinstance(record[field], str):
                skipped[f"json field {field!r} not a string"] += 1
            elif not record[field].strip():
                skipped["empty document"] += 1
            else:
                yield RawDocument(record[field], "prose", f"{file}:{number}")


def _read_parquet(file: Path, field: str, skipped: Skipped) -> Iterator[RawDocument]:
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    with file.open("rb") as stream:
        magic = stream.read(6)
    row = 0
    try:
        if magic.startswith(b"PAR1"):
            with pq.ParquetFile(file) as parquet:
                _check_text_column(file, field, parquet.schema_arrow)
                for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=[field]):
                    yield from _column_documents(file, batch.column(0), row, skipped)
                    row += batch.num_rows
            return
        with pa.memory_map(str(file)) as source:
            if magic == b"ARROW1":
                ipc_file = pa.ipc.open_file(source)
                _check_text_column(file, field, ipc_file.schema)
                batches: Iterable[pa.RecordBatch] = (
                    ipc_file.get_batch(i) for i in range(ipc_file.num_record_batches)
                )
            else:
                ipc_stream = pa.ipc.open_stream(source)
                _check_text_column(file, field, ipc_stream.schema)
                batches = ipc_stream
            for batch in batches:
                yield from _column_documents(file, batch.column(field), row, skipped)
                row += batch.num_rows
    except (pa.ArrowException, OSError) as error:
        # pyarrow reports corrupt pages ("Corrupt snappy compressed data") as OSError.
        raise ValueError(f"corpus file {file} is not a readable Parquet or Arrow IPC file: {error}") from None


def _check_text_column(file: Path, field: str, schema: Any) -> None:
    import pyarrow as pa

    if field not in schema.names:
        raise ValueError(
            f"corpus file {file} has no column {field!r}; its columns: {', '.join(schema.names)}"
        )
    column_type = schema.field(field).type
    if pa.types.is_dictionary(column_type):
        column_type = column_type.value_type
    # string_view is compared by name: pyarrow 15 does not have it.
    if column_type not in (pa.string(), pa.large_string()) and str(column_type) != "string_view":
        raise ValueError(f"corpus file {file}: column {field!r} holds {column_type}, not strings")


def _column_documents(file: Path, column: Any, first_row: int, skipped: Skipped) -> Iterator[RawDocument]:
    for row, text in enumerate(column.to_pylist(), first_row):
        if text is None or not text.strip():
            skipped["empty document"] += 1
        else:
            yield RawDocument(text, "prose", f"{file}: row {row}")


# A disambiguation page carries one of these templates (or one whose name ends in "disambiguation",
# such as {{Human name disambiguation}}); a set-index article does not and is kept.
_DISAMBIGUATION = re.compile(
    r"\{\{\s*(?:[^{}|]*disambiguation|disambig|disamb|dab|hndis|geodis)\s*(?:\||\}\})", re.IGNORECASE
)
_REDIRECT = re.compile(r"\s*#redirect", re.IGNORECASE)


def _read_wikipedia(file: Path, field: str, skipped: Skipped) -> Iterator[RawDocument]:
    from xml.etree.ElementTree import ParseError

    import mwxml
    from mwxml.errors import MalformedXML

    with _open_binary(file) as stream:
        try:
            dump = mwxml.Dump.from_file(stream)
            for page in dump.pages:
                text, model = None, None
                # Dumps of current pages hold one revision; with history, the latest is last.
                for revision in page:
                    text, model = revision.text, revision.model
                if page.namespace != 0:
                    skipped["not main namespace"] += 1
                elif page.redirect or (text and _REDIRECT.match(text)):
                    skipped["redirect"] += 1
                elif model not in (None, "wikitext"):
                    skipped["not wikitext"] += 1
                elif not text or text.isspace():
                    skipped["empty document"] += 1
                elif page.title.endswith("(disambiguation)") or _DISAMBIGUATION.search(text):
                    skipped["disambiguation page"] += 1
                else:
                    yield RawDocument(text, "wikitext", f"{file}: page {page.title!r}")
        except (ParseError, MalformedXML, AssertionError) as error:
            # mwxml asserts that the root element is <mediawiki>.
            problem = str(error) or "the root element is not <mediawiki>"
            raise ValueError(
                f"corpus file {file} is not a well-formed MediaWiki XML dump: {problem}"
            ) from None


# A structured abstract's section label ("BACKGROUND", "Methods and findings") sits on a line of its
# own at the start of each of pubmed_parser's paragraphs.
_ABSTRACT_LABEL_WORDS = 6


def _read_pubmed(file: Path, field: str, skipped: Skipped) -> Iterator[RawDocument]:
    import pubmed_parser
    from lxml import etree

    with file.open("rb") as stream:
        if stream.read(2) != b"\x1f\x8b":
            raise ValueError(f"corpus file {file} is not gzip-compressed; PubMed files are read as .xml.gz")
    articles = pubmed_parser.parse_medline_xml(str(file))
    pmid = None
    while True:
        try:
            article = next(articles)
        except StopIteration:
            return
        except etree.XMLSyntaxError as error:
            raise ValueError(f"corpus file {file} is not well-formed XML: {error}") from None
        except (AttributeError, IndexError, KeyError, TypeError) as error:
            # pubmed_parser assumes the elements of NLM's DTD are there and fails deep inside.
            where = f"after PMID {pmid}" if pmid else "first"
            raise ValueError(
                f"corpus file {file}: pubmed_parser cannot read the article {where} "
                f"({type(error).__name__}: {error}); is it a PubMed baseline file?"
            ) from None
        pmid = article.get("pmid") or pmid
        abstract = (article.get("abstract") or "").strip()
        if not abstract:
            skipped["no abstract"] += 1
            continue
        title = (article.get("title") or "").strip()
        # Titles translated into English are bracketed: "[Tea in the morning]."
        if title.startswith("[") and title.rstrip(".").endswith("]"):
            title = title[1:].rstrip(".")[:-1] + "."
        yield RawDocument(f"{title}\n\n{_drop_abstract_labels(abstract)}", "prose", f"{file}: PMID {pmid}")


def _drop_abstract_labels(abstract: str) -> str:
    if "\n" not in abstract:
        return abstract
    paragraphs = []
    for paragraph in _BLANK_LINES.split(abstract):
        first, _, rest = paragraph.partition("\n")
        is_label = rest and len(first.split()) <= _ABSTRACT_LABEL_WORDS and not _SENTENCE_END.search(first)
        paragraphs.append(rest if is_label else paragraph)
    return "\n\n".join(paragraphs)


_READERS: dict[str, _Reader] = {
    "bert": _read_bert,
    "text": _read_text,
    "jsonl": _read_jsonl,
    "parquet": _read_parquet,
    "wikipedia": _read_wikipedia,
    "pubmed": _read_pubmed,
}


def _uniform(seed: int, source_index: int, document_index: int) -> float:
    """A number in [0, 1) that depends on its arguments only (a hash, so no generator state)."""
    digest = hashlib.blake2b(f"{seed}:{source_index}:{document_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


# --- sentences -----------------------------------------------------------------------------------


def _prose_breaks(text: str) -> str:
    """Prose with paragraph breaks as U+2029 and line breaks within paragraphs as spaces."""
    return _BLANK_LINES.sub(_BREAK, text.strip()).replace("\n", " ")


# Sections of lists, links and citations rather than prose.
_SKIPPED_SECTIONS = frozenset(
    {
        "references", "external links", "see also", "further reading", "notes", "bibliography",
        "sources", "citations", "footnotes", "notes and references", "references and notes",
        "works cited", "general references", "explanatory notes", "gallery",
    }
)  # fmt: skip
# Tags whose content is not running text: citations, tables, formulas, code, media.
_DROPPED_TAGS = frozenset(
    {
        "ref", "references", "table", "gallery", "math", "chem", "ce", "score", "timeline", "graph",
        "hiero", "imagemap", "inputbox", "categorytree", "templatedata", "templatestyles", "section",
        "syntaxhighlight", "source", "pre", "mapframe", "maplink", "indicator", "noinclude",
    }
)  # fmt: skip
_HIDDEN_LINK_NAMESPACES = frozenset({"file", "image", "media", "category"})
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:-[a-z]+)*")
_LIST_MARKUP = frozenset({"*", "#", ";", ":"})
_REFS_AND_COMMENTS = re.compile(
    r"<ref\b[^>]*?/>|<ref\b[^>]*>.*?</ref\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL
)
_BEHAVIOUR_SWITCH = re.compile(r"__[A-Z]+__")
# What removed templates leave behind: "(; born 1900)", "( )", "foos, )", "word ."
_EMPTY_BRACKETS = re.compile(r"\(\s*[,;:]?\s*\)")
_BRACKET_OPEN_PUNCTUATION = re.compile(r"\(\s*[,;:]\s*")
_BRACKET_CLOSE_PUNCTUATION = re.compile(r"\s*[,;:]\s*\)")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"[^\S\n]+([,.;:!?])")


def _wikitext_to_prose(wikitext: str) -> str:
    """Running text of an article, paragraphs separated by blank lines.

    ``strip_code()`` alone keeps too much (file captions, categories, headings, citations and
    table cells), so a walk over mwparserfromhell's tree keeps only prose: text, the shown text of
    links, bold and italics and the contents of other inline tags, HTML entities. Dropped:
    templates (infoboxes, citations, navboxes), comments, ``<ref>``, tables, formulas, galleries,
    file/image/category links and interlanguage links, numbered links ``[http://...]``, list and
    indented lines, and
    whole sections that are lists of references or links ("See also", "References"...). Headings
    become paragraph breaks.
    """
    import mwparserfromhell

    # Citations and comments are often a third of an article's markup and never shown in its text;
    # removing them with a regular expression spares the parser that much work.
    wikitext = _REFS_AND_COMMENTS.sub("", wikitext)
    try:
        code = mwparserfromhell.parse(wikitext)
    except mwparserfromhell.parser.ParserError:
        # The parser's own consistency check; a page it cannot parse yields no sentences.
        return ""
    parts: list[str] = []
    _plain_text(code.nodes, parts)
    prose = _BEHAVIOUR_SWITCH.sub("", "".join(parts))
    prose = _EMPTY_BRACKETS.sub("", prose)
    prose = _BRACKET_OPEN_PUNCTUATION.sub("(", prose)
    prose = _BRACKET_CLOSE_PUNCTUATION.sub(")", prose)
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", prose)


def _plain_text(nodes: Iterable[Node], parts: list[str]) -> None:
    # Imported here, not at the top: only workers that meet wikitext need the parser.
    from mwparserfromhell.nodes import ExternalLink, Heading, HTMLEntity, Tag, Text, Wikilink

    skipped_section_level = 0  # while inside a skipped section: its heading's level
    skipping_line = False  # after a list or indentation marker, until the end of its line
    for node in nodes:
        if isinstance(node, Heading):
            if skipped_section_level and node.level > skipped_section_level:
                continue
            title = str(node.title.strip_code()).strip().lower()
            skipped_section_level = node.level if title in _SKIPPED_SECTIONS else 0
            skipping_line = False
            parts.append("\n\n")
        elif skipped_section_level:
            continue
        elif skipping_line:
            if isinstance(node, Text) and "\n" in node.value:
                parts.append(node.value[node.value.index("\n") :])
                skipping_line = False
        elif isinstance(node, Text):
            parts.append(node.value)
        elif isinstance(node, Wikilink):
            _link_text(node, parts)
        elif isinstance(node, Tag):
            if node.wiki_markup in _LIST_MARKUP:
                skipping_line = True
                continue
            tag = str(node.tag).strip().lower()
            if tag == "br":
                parts.append(" ")
            elif tag == "hr":
                parts.append("\n\n")
            elif tag not in _DROPPED_TAGS and node.contents is not None and not node.self_closing:
                _plain_text(node.contents.nodes, parts)
        elif isinstance(node, ExternalLink):
            # MediaWiki shows a bracketed link without a title as a number: "[1]".
            if not node.brackets:
                parts.append(str(node.url))
            elif node.title is not None:
                _plain_text(node.title.nodes, parts)
        elif isinstance(node, HTMLEntity):
            parts.append(node.normalize())
        # Templates, template arguments and comments are dropped.


def _link_text(link: Wikilink, parts: list[str]) -> None:
    title = str(link.title).strip()
    if title.startswith(":"):
        # [[:Category:Foo]] links to the category page instead of filing the article in it.
        title = title[1:]
    elif ":" in title:
        prefix = title.split(":", 1)[0].strip().lower()
        if prefix in _HIDDEN_LINK_NAMESPACES or (link.text is None and _LANGUAGE_CODE.fullmatch(prefix)):
            return
    if link.text is not None and str(link.text).strip():
        _plain_text(link.text.nodes, parts)
    else:
        parts.append(title)


# --- builtin:python-docs -------------------------------------------------------------------------


def _python_docs() -> Iterator[RawDocument]:
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
