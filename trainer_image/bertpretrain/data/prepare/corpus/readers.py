"""One reader per file format (``bert``, ``text``, ``jsonl``, ``parquet``, ``wikipedia``, ``pubmed``):
a file in, its raw documents out, skips counted; see :mod:`bertpretrain.data.prepare.corpus` for the
formats."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from bertpretrain.data.prepare.corpus.files import decoded_lines, open_binary
from bertpretrain.data.prepare.corpus.raw import RawDocument, Skipped
from bertpretrain.data.prepare.corpus.splitting import BLANK_LINES, SENTENCE_END

_Reader = Callable[[Path, str, Skipped], Iterator[RawDocument]]

# Parquet batches are decoded one at a time; rows of web text average a few KB.
_BATCH_ROWS = 1024


def _read_bert(file: Path, field: str, skipped: Skipped) -> Iterator[RawDocument]:
    with open_binary(file) as stream:
        block: list[str] = []
        first_line = 0
        undecodable = False
        for number, line in decoded_lines(file, stream):
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
                yield RawDocument("\n".join(block), "sentences", f"{file}:{first_line}")
            block, undecodable = [], False
        if undecodable:
            skipped["not UTF-8"] += 1
        elif block:
            yield RawDocument("\n".join(block), "sentences", f"{file}:{first_line}")


def _read_text(file: Path, field: str, skipped: Skipped) -> Iterator[RawDocument]:
    lines = []
    with open_binary(file) as stream:
        for _, line in decoded_lines(file, stream):
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
    with open_binary(file) as stream:
        for number, line in decoded_lines(file, stream):
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

    with open_binary(file) as stream:
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
    for paragraph in BLANK_LINES.split(abstract):
        first, _, rest = paragraph.partition("\n")
        is_label = rest and len(first.split()) <= _ABSTRACT_LABEL_WORDS and not SENTENCE_END.search(first)
        paragraphs.append(rest if is_label else paragraph)
    return "\n\n".join(paragraphs)


# The version of each reader's output. Bump a reader's number by hand whenever it yields other
# documents for the same file (other text, kind, order or skips): the vocabulary's and the
# documents' cache keys hold these numbers (sources.code_versions), so that a corpus read by
# older code is read again instead of reused. bert 2: lines are sentences, never split further.
READER_VERSIONS: dict[str, int] = {
    "bert": 2,
    "text": 1,
    "jsonl": 1,
    "parquet": 1,
    "wikipedia": 1,
    "pubmed": 1,
}

READERS: dict[str, _Reader] = {
    "bert": _read_bert,
    "text": _read_text,
    "jsonl": _read_jsonl,
    "parquet": _read_parquet,
    "wikipedia": _read_wikipedia,
    "pubmed": _read_pubmed,
}
