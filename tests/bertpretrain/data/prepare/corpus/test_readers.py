"""The readers of each file format but Wikipedia's: bert and text, JSON Lines, Parquet and Arrow
(written here with pyarrow), PubMed (XML written by hand)."""

from __future__ import annotations

import bz2
import collections
import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.feather
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from bertjob_api.spec import SourceSpec
from bertpretrain.data.prepare.corpus import readers
from bertpretrain.data.prepare.corpus.sources import read_source
from tests.bertpretrain.data.prepare.corpus.reading import read, split, write_table

# --- bert and text --------------------------------------------------------------------------------


def test_bert_format_one_sentence_per_line(tmp_path: Path) -> None:
    file = tmp_path / "corpus.txt"
    file.write_text(
        "The cat sat on the mat.\nDr. Smith went. He left.\n\n\n\nDogs bark.\nBirds sing!\n\n",
        encoding="utf-8",
    )
    documents, skipped = read(file)
    assert [(d.kind, d.origin) for d in documents] == [("sentences", f"{file}:1"), ("sentences", f"{file}:6")]
    # A line is a sentence, as Google's and NVIDIA's create_pretraining_data.py take it: a line
    # holding two sentences is not split.
    assert split(documents) == [
        ["The cat sat on the mat.", "Dr. Smith went. He left."],
        ["Dogs bark.", "Birds sing!"],
    ]
    assert skipped == {}


def test_text_format_is_one_document_per_file(tmp_path: Path) -> None:
    file = tmp_path / "book.txt"
    file.write_text(
        "\ufeffIt was a bright cold day in April, and the\nclocks were striking thirteen. Winston\n"
        "Smith slipped quickly through the\nglass doors.\n\nA second paragraph\nstarts here\n",
        encoding="utf-8",
    )
    documents, _ = read(file)
    assert [(d.kind, d.origin) for d in documents] == [("prose", str(file))]
    assert split(documents) == [
        [
            "It was a bright cold day in April, and the clocks were striking thirteen.",
            "Winston Smith slipped quickly through the glass doors.",
            "A second paragraph starts here",
        ]
    ]


def test_explicit_format_overrides_the_guess(tmp_path: Path) -> None:
    file = tmp_path / "lines.txt"
    file.write_text("One.\nTwo.\n\nThree.\n", encoding="utf-8")
    assert split(read(file)[0]) == [["One.", "Two."], ["Three."]]
    assert split(read(file, format="text")[0]) == [["One.", "Two.", "Three."]]


def test_compressed_text_is_read(tmp_path: Path) -> None:
    file = tmp_path / "corpus.txt.gz"
    file.write_bytes(gzip.compress(b"Dogs bark.\nBirds sing!\n\nFish swim.\n"))
    assert split(read(file)[0]) == [["Dogs bark.", "Birds sing!"], ["Fish swim."]]


# --- JSON Lines -----------------------------------------------------------------------------------

JSONL_RECORDS = [
    {"id": 1, "content": "First document. It has two sentences."},
    {"id": 2},
    {"id": 3, "content": "Paragraph one\nwraps here.\n\nParagraph two"},
    None,  # a blank line
    {"id": 5, "content": "  "},
    {"id": 6, "content": 6},
    ["not", "an", "object"],
]


def jsonl_bytes(records: list[Any]) -> bytes:
    return b"".join(b"\n" if r is None else json.dumps(r).encode() + b"\n" for r in records)


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.jsonl.gz", "docs.json.bz2"])
def test_jsonl_one_document_per_record(tmp_path: Path, name: str) -> None:
    data = jsonl_bytes(JSONL_RECORDS)
    file = tmp_path / name
    file.write_bytes(
        gzip.compress(data) if name.endswith(".gz") else bz2.compress(data) if ".bz2" in name else data
    )
    documents, skipped = read(file, field="content")
    assert [(d.kind, d.origin) for d in documents] == [("prose", f"{file}:1"), ("prose", f"{file}:3")]
    assert split(documents) == [
        ["First document.", "It has two sentences."],
        ["Paragraph one wraps here.", "Paragraph two"],
    ]
    assert skipped == {
        "json line without field 'content'": 2,
        "empty document": 1,
        "json field 'content' not a string": 1,
    }


def test_jsonl_line_that_is_not_json_is_named(tmp_path: Path) -> None:
    file = tmp_path / "docs.jsonl"
    # A byte-order mark, as Windows editors write, is not part of the first record.
    file.write_bytes(b'\xef\xbb\xbf{"text": "Fine."}\n\n{"text": "cut off\n')
    documents = read_source(SourceSpec(path=str(file)), collections.Counter())
    # Documents before the bad line come first: the file is read as a stream.
    assert next(documents).text == "Fine."
    with pytest.raises(ValueError, match=r"docs\.jsonl:3: not a JSON value"):
        next(documents)


# --- Parquet and Arrow ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rows.parquet", "rows.arrow", "rows.stream.arrow", "rows.feather"])
def test_parquet_and_arrow_one_document_per_row(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def whole_file(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("read in record batches, not as a whole table")

    monkeypatch.setattr(pq.ParquetFile, "read", whole_file)
    monkeypatch.setattr(pq, "read_table", whole_file)
    monkeypatch.setattr(readers, "_BATCH_ROWS", 2)
    file = tmp_path / name
    write_table(file)
    documents, skipped = read(file)
    assert [(d.kind, d.origin) for d in documents] == [
        ("prose", f"{file}: row 0"),
        ("prose", f"{file}: row 2"),
    ]
    assert split(documents) == [["One row.", "Two sentences."], ["Another row", "in two paragraphs"]]
    assert skipped == {"empty document": 2}


@pytest.mark.parametrize("column_type", [pa.large_string(), pa.dictionary(pa.int32(), pa.string())])
def test_parquet_takes_other_string_columns(tmp_path: Path, column_type: pa.DataType) -> None:
    file = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"body": pa.array(["Big text.", "Big text."]).cast(column_type)}), file)
    assert [d.text for d in read(file, field="body")[0]] == ["Big text.", "Big text."]


@pytest.mark.parametrize("name", ["rows.parquet", "rows.arrow"])
def test_parquet_without_the_column_is_named(tmp_path: Path, name: str) -> None:
    file = tmp_path / name
    write_table(file)
    with pytest.raises(ValueError, match=rf"{name} has no column 'body'; its columns: id, text"):
        read(file, field="body")


def test_parquet_column_that_is_not_text_is_named(tmp_path: Path) -> None:
    file = tmp_path / "rows.parquet"
    write_table(file)
    with pytest.raises(ValueError, match=r"rows\.parquet: column 'id' holds int64, not strings"):
        read(file, field="id")


def parquet_bytes() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": ["One row. Two sentences."] * 1000}), sink, row_group_size=100)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize(
    "data",
    [
        b"id,text\n1,hello\n",
        parquet_bytes()[:-100],
        parquet_bytes()[:200] + bytes(100) + parquet_bytes()[300:],
    ],
    ids=["csv", "truncated", "corrupt"],
)
def test_bad_parquet_file_is_an_error(tmp_path: Path, data: bytes) -> None:
    file = tmp_path / "rows.parquet"
    file.write_bytes(data)
    with pytest.raises(ValueError, match=r"rows\.parquet is not a readable Parquet or Arrow IPC file"):
        read(file)


# --- PubMed ---------------------------------------------------------------------------------------


def pubmed_article(pmid: int, title: str, abstract: str | None, journal_issue: bool = True) -> str:
    issue = "<JournalIssue><PubDate><Year>2001</Year></PubDate></JournalIssue>" if journal_issue else ""
    return (
        f'<PubmedArticle><MedlineCitation Status="MEDLINE" Owner="NLM"><PMID Version="1">{pmid}</PMID>'
        f'<Article PubModel="Print"><Journal>{issue}<Title>Journal of Tests</Title></Journal>'
        f"<ArticleTitle>{title}</ArticleTitle>{abstract or ''}</Article></MedlineCitation></PubmedArticle>\n"
    )


def pubmed_set(*articles: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<!DOCTYPE PubmedArticleSet PUBLIC "-//NLM//DTD PubMedArticle, 1st January 2024//EN" '
        '"https://dtd.nlm.nih.gov/ncbi/pubmed/out/pubmed_240101.dtd">\n'
        "<PubmedArticleSet>\n" + "".join(articles) + "</PubmedArticleSet>\n"
    ).encode()


PUBMED = pubmed_set(
    pubmed_article(
        101,
        "Effects of <i>coffee</i> on sleep.",
        "<Abstract><AbstractText>Coffee delays sleep onset. We measured it in ten adults.</AbstractText>"
        "</Abstract>",
    ),
    pubmed_article(102, "A letter without abstract.", None),
    pubmed_article(
        103,
        "[Tea in the morning].",
        '<Abstract><AbstractText Label="BACKGROUND" NlmCategory="BACKGROUND">Tea is popular.</AbstractText>'
        '<AbstractText Label="METHODS AND RESULTS" NlmCategory="METHODS">We asked people. They answered.'
        "</AbstractText></Abstract>",
    ),
)


def test_pubmed_articles_are_title_and_abstract(tmp_path: Path) -> None:
    file = tmp_path / "pubmed24n0001.xml.gz"
    file.write_bytes(gzip.compress(PUBMED))
    documents, skipped = read(file)
    assert [(d.kind, d.origin) for d in documents] == [
        ("prose", f"{file}: PMID 101"),
        ("prose", f"{file}: PMID 103"),
    ]
    assert split(documents) == [
        ["Effects of coffee on sleep.", "Coffee delays sleep onset.", "We measured it in ten adults."],
        ["Tea in the morning.", "Tea is popular.", "We asked people.", "They answered."],
    ]
    assert skipped == {"no abstract": 1}


def test_pubmed_file_must_be_gzip(tmp_path: Path) -> None:
    file = tmp_path / "pubmed.xml"
    file.write_bytes(PUBMED)
    with pytest.raises(ValueError, match=r"pubmed\.xml is not gzip-compressed"):
        read(file, format="pubmed")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (gzip.compress(PUBMED)[:-30], r"is truncated"),
        (gzip.compress(PUBMED.replace(b"</PMID>", b"</PMD>")), r"is not well-formed XML"),
        (
            gzip.compress(
                pubmed_set(pubmed_article(7, "Fine.", None), pubmed_article(8, "No issue.", None, False))
            ),
            r"pubmed_parser cannot read the article after PMID 7 \(IndexError",
        ),
    ],
    ids=["truncated", "malformed", "not-medline"],
)
def test_bad_pubmed_file_is_an_error(tmp_path: Path, data: bytes, problem: str) -> None:
    file = tmp_path / "pubmed.xml.gz"
    file.write_bytes(data)
    with pytest.raises(ValueError, match=rf"pubmed\.xml\.gz:? {problem}"):
        read(file)
