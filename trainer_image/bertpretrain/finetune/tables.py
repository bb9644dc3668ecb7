"""Classification task files (GLUE-style single sentences or sentence pairs) and their features.

A task file is a table with a text column, optionally a second text column (sentence pairs such
as MRPC, QQP, MNLI) and a label column, stored as TSV (the way GLUE ships it), CSV, JSON Lines
or Parquet. :func:`read_classification` turns it into :class:`ClassificationExample` rows and
:func:`encode_classification` turns those into BERT's ``[CLS] A [SEP] (B [SEP])`` features.

Labels are strings, whatever the file stores: a JSON or Parquet integer ``1`` is the label
``"1"``, so that the same task gives the same label set in every format. The class index of a
label is its position in the label list (declared, or derived from the training file).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from bertpretrain.common.batch import TaskBatch
from bertpretrain.data.format.vocab import SpecialIds
from bertpretrain.finetune.errors import TaskDataError

FORMATS = ("auto", "tsv", "csv", "jsonl", "parquet")
_SUFFIXES = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
_NAMED = "tsv, csv, jsonl or parquet"
_INTEGER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class ClassificationExample:
    """One row of a classification file.

    ``text`` is sentence A, ``text_pair`` sentence B (None for single-sentence tasks), ``label``
    the class index (the position of the row's label in the label list) and ``row`` where the
    example is in its file (counted as :class:`TaskDataError` counts rows).
    """

    text: str
    text_pair: str | None
    label: int
    row: int


def detect_format(path: Path) -> str:
    """The format of ``path`` from its suffix (for ``format: auto``): ``.tsv``, ``.csv``,
    ``.jsonl`` or ``.parquet`` (case-insensitive).

    Raises:
        TaskDataError: any other suffix. ``.json`` included: it may hold one JSON document (a
            list, or a SQuAD file) rather than JSON Lines, so its format must be named.
    """
    suffix = Path(path).suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    if suffix == ".json":
        problem = (
            'a .json file may hold one JSON document or JSON Lines: set format ("jsonl": one object a line)'
        )
        raise TaskDataError(path, problem)
    shown = suffix or "(none)"
    raise TaskDataError(path, f"cannot tell the format from the suffix {shown!r}: set format to {_NAMED}")


def read_classification(
    path: Path,
    format: str,
    text_field: str,
    text_pair_field: str | None,
    label_field: str,
    labels: Sequence[str] | None,
) -> tuple[list[ClassificationExample], list[str]]:
    """Read a classification file: its examples, and the label list their ``label`` indexes.

    Formats: ``"tsv"`` as GLUE ships it: a header row naming the columns, tab-separated, with
    no quoting (GLUE's MRPC and SST-2 sentences contain unbalanced ``"``, which are kept as
    text); ``"csv"``: comma-separated with standard ``"`` quoting and a header row; ``"jsonl"``:
    one JSON object per line, blank lines skipped; ``"parquet"``: columns by name (pyarrow);
    ``"auto"``: from the suffix (:func:`detect_format`). Text files are UTF-8 (a byte-order mark
    is allowed); blank lines of a TSV or CSV are skipped.

    Labels are read as strings with surrounding whitespace removed: a JSON or Parquet integer
    ``1`` becomes ``"1"``, an integral float ``1.0`` becomes ``"1"``; a fractional float, a
    boolean (``true`` could be ``"True"``, ``"true"`` or ``"1"``: write the label itself), a null
    or an empty label is an error.

    Args:
        labels: the label set, in class-index order. A validation file is read with the list its
            training file gave, so a label the training file lacks is an error. None: the sorted
            set of labels in this file, integers (``-?[0-9]+``) first and in numeric order (``"2"``
            before ``"10"``), then the others in string order.

    Returns:
        The examples in file order, and the label list (``labels`` itself, or the derived one).

    Raises:
        TaskDataError (naming the file, and the row where there is one): the file is missing or
            not readable in its format; a column is missing (the message lists the columns
            found); a TSV/CSV row has the wrong number of fields; a text is empty or whitespace;
            a label is outside ``labels``, or not a string or integer; a JSON Lines line is not a
            JSON object; the file has no examples.
        ValueError: ``format`` is unknown, or ``labels`` is empty or has duplicates.
    """
    path = Path(path)
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}: use one of {', '.join(FORMATS)}")
    if labels is not None:
        labels = list(labels)
        if not labels or len(set(labels)) != len(labels):
            raise ValueError(f"the label set {labels} must be non-empty and without duplicates")
    if not path.is_file():
        raise TaskDataError(path, "no such file")
    if format == "auto":
        format = detect_format(path)
    fields = [text_field, *([text_pair_field] if text_pair_field is not None else []), label_field]
    reader = {"tsv": _delimited_rows, "csv": _delimited_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows}
    raw: list[tuple[int, str, str | None, str]] = []
    for row, values in reader[format](path, format, fields):
        text = _text(path, row, text_field, values[0])
        text_pair = _text(path, row, text_pair_field, values[1]) if text_pair_field is not None else None
        raw.append((row, text, text_pair, _label(path, row, label_field, values[-1])))
    if not raw:
        raise TaskDataError(path, "no examples")
    if labels is None:
        labels = sorted({label for *_, label in raw}, key=_label_order)
    index = {label: position for position, label in enumerate(labels)}
    examples = []
    for row, text, text_pair, label in raw:
        if label not in index:
            raise TaskDataError(path, f"label {label!r} is not in the label set {labels}", row)
        examples.append(ClassificationExample(text, text_pair, index[label], row))
    return examples, labels


def encode_classification(
    examples: Sequence[ClassificationExample], tokenizer: Tokenizer, max_seq_length: int
) -> TaskBatch:
    """BERT's classification features: ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]``, padded.

    Texts are tokenized with ``tokenizer.encode_batch(..., add_special_tokens=False)`` (any
    truncation or padding configured on the tokenizer is ignored). A pair longer than
    ``max_seq_length - 3`` tokens loses one token at a time from the end of the longer text
    (of B on a tie), as ``_truncate_seq_pair`` in Google's BERT ``run_classifier.py`` does; a
    single text keeps its first ``max_seq_length - 2`` tokens.

    Returns:
        ``input_ids``, ``token_type_ids`` (0 up to the first ``[SEP]``, 1 for B and its
        ``[SEP]``), ``attention_mask`` (1 for tokens, 0 for ``[PAD]``): int64
        [N, max_seq_length]; ``labels``: int64 [N], the examples' class indices.

    Raises:
        ValueError: ``max_seq_length`` leaves no room for a token besides the special tokens;
            the tokenizer's vocabulary lacks a special token.
    """
    has_pairs = any(example.text_pair is not None for example in examples)
    if max_seq_length < (4 if has_pairs else 3):
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for text after [CLS] and [SEP]")
    special = SpecialIds.of(tokenizer, "the fine-tuning tokenizer")
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        # A copy, so that the caller's tokenizer keeps its settings.
        tokenizer = Tokenizer.from_str(tokenizer.to_str())
        tokenizer.no_truncation()
        tokenizer.no_padding()
    pairs = [example.text_pair for example in examples if example.text_pair is not None]
    encoded = tokenizer.encode_batch([example.text for example in examples] + pairs, add_special_tokens=False)
    pair_ids = iter(encoding.ids for encoding in encoded[len(examples) :])
    count = len(examples)
    input_ids = np.full((count, max_seq_length), special.pad, np.int64)
    token_type_ids = np.zeros((count, max_seq_length), np.int64)
    attention_mask = np.zeros((count, max_seq_length), np.int64)
    for position, example in enumerate(examples):
        tokens_a = list(encoded[position].ids)
        if example.text_pair is None:
            ids = [special.cls, *tokens_a[: max_seq_length - 2], special.sep]
            length_a = len(ids)
        else:
            tokens_b = list(next(pair_ids))
            truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
            ids = [special.cls, *tokens_a, special.sep, *tokens_b, special.sep]
            length_a = len(tokens_a) + 2
        input_ids[position, : len(ids)] = ids
        token_type_ids[position, length_a : len(ids)] = 1
        attention_mask[position, : len(ids)] = 1
    return TaskBatch(
        input_ids=torch.from_numpy(input_ids),
        token_type_ids=torch.from_numpy(token_type_ids),
        attention_mask=torch.from_numpy(attention_mask),
        labels=torch.tensor([example.label for example in examples], dtype=torch.int64),
    )


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_length: int) -> None:
    """Shorten the two lists in place until together they hold at most ``max_length`` tokens,
    removing the last token of the longer one (of ``tokens_b`` when they are as long), one token
    at a time: ``_truncate_seq_pair`` of Google's BERT ``run_classifier.py``. Taking from the
    longer text keeps as much of the shorter one, whose every token carries more of its meaning.
    """
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def _label_order(label: str) -> tuple[int, int, str]:
    return (0, int(label), label) if _INTEGER.fullmatch(label) else (1, 0, label)


def _text(path: Path, row: int, field: str, value: Any) -> str:
    if value is not None and not isinstance(value, str):
        raise TaskDataError(path, f"{field!r} is a {type(value).__name__}, not a text", row)
    if value is None or not value.strip():
        raise TaskDataError(path, f"empty text in {field!r}", row)
    return value


def _label(path: Path, row: int, field: str, value: Any) -> str:
    if isinstance(value, bool):
        problem = f"label {value!r} in {field!r} is a boolean: write the label itself (a string or integer)"
        raise TaskDataError(path, problem, row)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise TaskDataError(path, f"label {value!r} in {field!r} is not an integer", row)
        return str(int(value))
    if not isinstance(value, str):
        raise TaskDataError(path, f"label {value!r} in {field!r} is not a string or integer", row)
    if not value.strip():
        raise TaskDataError(path, f"empty label in {field!r}", row)
    return value.strip()


def _decoded(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise TaskDataError(path, f"not UTF-8 text: {error.reason}", line) from None


def _columns(path: Path, found: Sequence[str], fields: Sequence[str], row: int | None = None) -> list[int]:
    """Positions of ``fields`` among the ``found`` column names."""
    for field in fields:
        if field not in found:
            raise TaskDataError(path, f"no column {field!r}; the columns are {list(found)}", row)
        if list(found).count(field) > 1:
            raise TaskDataError(path, f"the column {field!r} appears more than once", row)
    return [list(found).index(field) for field in fields]


def _delimited_rows(path: Path, format: str, fields: Sequence[str]) -> Iterator[tuple[int, list[Any]]]:
    """(line, values of ``fields``) for each data row of a TSV or CSV file; line is where the row starts."""
    if format == "tsv":
        reader = csv.reader(io.StringIO(_decoded(path), newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(_decoded(path), newline=""))
    header: list[str] | None = None
    positions: list[int] = []
    start = 1
    try:
        for record in reader:
            row, start = start, reader.line_num + 1
            if not record:
                continue
            if header is None:
                header = record
                positions = _columns(path, header, fields, row)
                continue
            if len(record) != len(header):
                raise TaskDataError(
                    path, f"{len(record)} fields, the header has {len(header)} (is the file {format}?)", row
                )
            yield row, [record[position] for position in positions]
    except csv.Error as error:
        raise TaskDataError(path, f"not {format.upper()}: {error}", start) from None
    if header is None:
        raise TaskDataError(path, "no examples (the file is empty, not even a header row)")


def _jsonl_rows(path: Path, format: str, fields: Sequence[str]) -> Iterator[tuple[int, list[Any]]]:
    # Split on "\n" only: str.splitlines also splits on U+2028 and U+0085, which JSON strings may hold raw.
    for row, line in enumerate(_decoded(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskDataError(path, f"not JSON: {error.msg}", row) from None
        if not isinstance(record, dict):
            raise TaskDataError(path, f"a JSON {type(record).__name__}, not an object", row)
        for field in fields:
            if field not in record:
                raise TaskDataError(path, f"no field {field!r}; the fields are {list(record)}", row)
        yield row, [record[field] for field in fields]


def _parquet_rows(path: Path, format: str, fields: Sequence[str]) -> Iterator[tuple[int, list[Any]]]:
    import pyarrow
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        _columns(path, names, fields)
        table = pq.read_table(path, columns=list(dict.fromkeys(fields)))
    except (pyarrow.ArrowException, OSError) as error:
        raise TaskDataError(path, f"not a Parquet file: {error}") from None
    columns = [table.column(field).to_pylist() for field in fields]
    for index, values in enumerate(zip(*columns, strict=True)):
        yield index + 1, list(values)
