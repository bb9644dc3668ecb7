"""Reading corpus sources as raw documents, and splitting documents into sentences.

Every sample is built here, in a temporary directory: MediaWiki and PubMed XML written by hand,
JSON Lines, Parquet and Arrow written with pyarrow, plain text.
"""

from __future__ import annotations

import bz2
import collections
import gzip
import json
import pickle
import sys
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any, cast
from xml.sax.saxutils import escape

import pyarrow as pa
import pyarrow.feather
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from bertjob_api.spec import SourceSpec
from bertpretrain.data.corpus import (
    BUILTIN_PYTHON_DOCS,
    RawDocument,
    detect_format,
    read_corpus,
    read_source,
    readers,
    sentences,
)

Counter = collections.Counter[str]


def read(path: Path | str, **fields: Any) -> tuple[list[RawDocument], Counter]:
    skipped: Counter = collections.Counter()
    return list(read_source(SourceSpec(path=str(path), **fields), skipped)), skipped


def split(documents: list[RawDocument]) -> list[list[str]]:
    return [sentences(document) for document in documents]


# --- builtin:python-docs --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def python_docs() -> list[RawDocument]:
    return read(BUILTIN_PYTHON_DOCS)[0]


def test_python_docs_are_many_documents_of_prose(python_docs: list[RawDocument]) -> None:
    all_sentences = [s for document in python_docs for s in document.text.split("\n")]
    assert len(python_docs) > 300
    assert len(all_sentences) > 10_000
    assert {document.kind for document in python_docs} == {"lines"}
    assert all(s and s.strip() == s for s in all_sentences)
    # Doctests, grammar rules and tables are left out.
    assert not [s for s in all_sentences if s.startswith((">>>", "...")) or "::=" in s or "+---" in s]


def test_python_docs_hold_docstrings_and_language_reference(python_docs: list[RawDocument]) -> None:
    text = "\n".join(document.text for document in python_docs)
    # The docstring of random.Random.sample and the "del" topic of the language reference.
    assert "\nChooses k unique random elements from a population sequence.\n" in text
    assert "\nDeletion of a target list recursively deletes each target, from left to right.\n" in text
    origins = {document.origin for document in python_docs}
    assert {"builtin:python-docs: random.py", "builtin:python-docs: topic 'del'"} <= origins


def test_python_docs_split_again_are_unchanged(python_docs: list[RawDocument]) -> None:
    # The documents hold sentences one per line; the workers' split must give them back as they are.
    changed = [d.origin for d in python_docs if sentences(d) != d.text.split("\n")]
    assert changed == []


def test_python_docs_import_nothing_and_are_deterministic(python_docs: list[RawDocument]) -> None:
    assert "antigravity" not in sys.modules and "this" not in sys.modules
    again = read_source(SourceSpec(path=BUILTIN_PYTHON_DOCS, format="python-docs"), collections.Counter())
    assert list(islice(again, 20)) == python_docs[:20]


@pytest.mark.parametrize(
    ("path", "fmt"), [(BUILTIN_PYTHON_DOCS, "text"), ("corpus.txt", "python-docs")], ids=["text", "file"]
)
def test_python_docs_format_goes_with_its_path_only(path: str, fmt: str) -> None:
    with pytest.raises(ValueError, match="python-docs"):
        read(path, format=fmt)


# --- sentences ------------------------------------------------------------------------------------


def test_lines_end_sentences_and_long_lines_are_split() -> None:
    document = RawDocument(
        "A line without a stop\nTwo sentences here. Really.\n\n  spaced   out\ttext.  \nMr. Smith\n",
        "lines",
        "x",
    )
    assert sentences(document) == [
        "A line without a stop",
        "Two sentences here.",
        "Really.",
        "spaced out text.",
        "Mr. Smith",
    ]


def test_prose_joins_lines_and_breaks_at_blank_lines() -> None:
    document = RawDocument(
        "It was a bright cold day in April, and the\nclocks were striking thirteen. Winston\n"
        "Smith slipped quickly through the\nglass doors\n \t\nA heading without a stop\n\n\nLast one.\n",
        "prose",
        "x",
    )
    assert sentences(document) == [
        "It was a bright cold day in April, and the clocks were striking thirteen.",
        "Winston Smith slipped quickly through the glass doors",
        "A heading without a stop",
        "Last one.",
    ]


@pytest.mark.parametrize("kind", ["lines", "prose", "wikitext"])
def test_blank_documents_have_no_sentences(kind: str) -> None:
    assert sentences(RawDocument(" \n\n\t", cast(Any, kind), "x")) == []


def test_unknown_kind_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"f\.txt:3: unknown document kind 'html'"):
        sentences(RawDocument("<p>Hi.</p>", cast(Any, "html"), "f.txt:3"))


def test_raw_documents_survive_pickling() -> None:
    document = RawDocument("'''Foo''' is a bar.", "wikitext", "dump.xml.bz2: page 'Foo'")
    assert pickle.loads(pickle.dumps(document)) == document


# --- bert and text --------------------------------------------------------------------------------


def test_bert_format_one_sentence_per_line(tmp_path: Path) -> None:
    file = tmp_path / "corpus.txt"
    file.write_text(
        "The cat sat on the mat.\nIt was warm there. It purred.\n\n\n\nDogs bark.\nBirds sing!\n\n",
        encoding="utf-8",
    )
    documents, skipped = read(file)
    assert [(d.kind, d.origin) for d in documents] == [("lines", f"{file}:1"), ("lines", f"{file}:6")]
    assert split(documents) == [
        ["The cat sat on the mat.", "It was warm there.", "It purred."],
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

TABLE = pa.table(
    {
        "id": [1, 2, 3, 4],
        "text": ["One row. Two sentences.", None, "Another row\n\nin two paragraphs", ""],
    }
)


def write_table(file: Path, table: pa.Table = TABLE) -> None:
    if file.suffix == ".parquet":
        pq.write_table(table, file, row_group_size=1)
    elif file.suffix == ".feather":
        pyarrow.feather.write_feather(table, file)
    elif file.name.endswith(".stream.arrow"):
        with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1)
    else:
        with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=3)


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


# --- Wikipedia ------------------------------------------------------------------------------------

ARTICLE = """{{Short description|Imaginary chemical element}}
{{Infobox element
| name = Foonium
| number = {{val|120}}
}}
'''Foonium''' (from [[Latin]] ''foonus'', {{lang-la|foonus}}) is a [[chemical element|metal]] with the \
symbol Fo.<ref name="a">{{cite web |title=Foo |url=http://example.com}}</ref> It was found in 1800.<ref \
name="a"/>
[[File:Foonium.jpg|thumb|A sample of [[foonium]].]]
<!-- a comment. -->

== History ==
Foonium was named by [[Humphry Davy]] &ndash; a chemist. See [http://example.com the site] or \
[http://example.org].
* A list item.
# A numbered item.
{| class="wikitable"
! Isotope !! Mass
|-
| Fo-1 || 1.0
|}
=== Uses ===
Foonium is used in <b>bold</b> things<br/>and more.
:An indented line.
<math>x^2</math>

== See also ==
* [[Barium]]
=== Nested ===
Nothing here is kept.

== References ==
{{reflist}}

== Later ==
Later text is kept.
__NOTOC__
[[Category:Chemical elements]]
[[de:Foonium]]
"""

FOONIUM_SENTENCES = [
    "Foonium (from Latin foonus) is a metal with the symbol Fo.",
    "It was found in 1800.",
    "Foonium was named by Humphry Davy – a chemist.",
    "See the site or.",
    "Foonium is used in bold things and more.",
    "Later text is kept.",
]


def page(title: str, text: str, ns: int = 0, redirect: str | None = None) -> str:
    redirect_tag = f'<redirect title="{escape(redirect)}" />' if redirect else ""
    return (
        f"<page><title>{escape(title)}</title><ns>{ns}</ns><id>{abs(hash(title)) % 1000}</id>{redirect_tag}"
        f"<revision><id>1</id><model>wikitext</model><format>text/x-wiki</format>"
        f'<text bytes="{len(text)}" xml:space="preserve">{escape(text)}</text></revision></page>\n'
    )


def mediawiki(*pages: str) -> bytes:
    return (
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" xml:lang="en">\n'
        "<siteinfo><sitename>Wikipedia</sitename><dbname>enwiki</dbname><namespaces>"
        '<namespace key="0" case="first-letter" /><namespace key="1" case="first-letter">Talk</namespace>'
        "</namespaces></siteinfo>\n" + "".join(pages) + "</mediawiki>\n"
    ).encode()


WIKI_DUMP = mediawiki(
    page("Foonium", ARTICLE),
    page("Fooium", "#REDIRECT [[Foonium]]", redirect="Foonium"),
    page("Foonium metal", "#redirect [[Foonium]]"),
    page("Talk:Foonium", "Is this real? I think not.", ns=1),
    page("Foo", "'''Foo''' may be:\n* [[Foonium]]\n\n{{disambiguation}}"),
    page("Bar (disambiguation)", "'''Bar''' may be a [[pub]]."),
    page("Bar", "A '''bar''' serves drinks. [[:Category:Pubs|Pubs]] are bars."),
    page("Empty", " "),
)


@pytest.fixture()
def wiki_dump(tmp_path: Path) -> Path:
    file = tmp_path / "enwiki-pages-articles.xml.bz2"
    file.write_bytes(bz2.compress(WIKI_DUMP))
    return file


def test_wikipedia_articles_are_read_and_stripped(wiki_dump: Path) -> None:
    documents, skipped = read(wiki_dump)
    assert [(d.kind, d.origin) for d in documents] == [
        ("wikitext", f"{wiki_dump}: page 'Foonium'"),
        ("wikitext", f"{wiki_dump}: page 'Bar'"),
    ]
    assert documents[0].text == ARTICLE
    assert split(documents) == [FOONIUM_SENTENCES, ["A bar serves drinks.", "Pubs are bars."]]
    assert skipped == {"redirect": 2, "not main namespace": 1, "disambiguation page": 2, "empty document": 1}


def test_wikipedia_plain_xml_is_read(tmp_path: Path) -> None:
    file = tmp_path / "dump.xml"
    file.write_bytes(WIKI_DUMP)
    assert [d.origin for d in read(file)[0]] == [f"{file}: page 'Foonium'", f"{file}: page 'Bar'"]


def test_truncated_wikipedia_dump_is_an_error(tmp_path: Path) -> None:
    file = tmp_path / "dump.xml.bz2"
    file.write_bytes(bz2.compress(WIKI_DUMP)[:-40])
    with pytest.raises(ValueError, match=r"dump\.xml\.bz2 is truncated"):
        read(file)


@pytest.mark.parametrize(
    ("xml", "problem"),
    [
        (WIKI_DUMP.replace(b"</page>", b"</pag>", 1), "mismatched tag"),
        (WIKI_DUMP.replace(b"mediawiki", b"wiki"), "the root element is not <mediawiki>"),
        (b"<mediawiki><page><title>No site info</title></page></mediawiki>", "<siteinfo> tag not found"),
    ],
    ids=["mismatched", "root", "siteinfo"],
)
def test_malformed_wikipedia_dump_is_an_error(tmp_path: Path, xml: bytes, problem: str) -> None:
    file = tmp_path / "dump.xml"
    file.write_bytes(xml)
    with pytest.raises(ValueError, match=rf"dump\.xml is not a well-formed MediaWiki XML dump: .*{problem}"):
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


# --- directories and auto ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("lines.txt", "bert"),
        ("book.txt", "text"),
        ("lines.txt.gz", "bert"),
        ("book.txt.bz2", "text"),
        ("a.jsonl", "jsonl"),
        ("a.json", "jsonl"),
        ("a.jsonl.gz", "jsonl"),
        ("a.jsonl.bz2", "jsonl"),
        ("a.json.gz", "jsonl"),
        ("A.JSONL", "jsonl"),
        ("a.parquet", "parquet"),
        ("a.arrow", "parquet"),
        ("a.feather", "parquet"),
        ("enwiki.xml", "wikipedia"),
        ("enwiki.xml.bz2", "wikipedia"),
        ("pubmed24n0001.xml.gz", "pubmed"),
        ("notes.md", None),
        ("data.csv", None),
        ("archive.gz", None),
        ("README", None),
    ],
)
def test_auto_format_by_file_name(tmp_path: Path, name: str, expected: str | None) -> None:
    # 4 of the 5 lines of lines.* end like a sentence, just enough; book.* is wrapped prose.
    text = (
        "One.\nTwo!\nThree?\n'Four.'\nFive\n" if name.startswith("lines") else "It was a\nbright cold day.\n"
    )
    data = text.encode()
    file = tmp_path / name
    file.write_bytes(
        gzip.compress(data) if name.endswith(".gz") else bz2.compress(data) if ".bz2" in name else data
    )
    assert detect_format(file) == expected


def test_directory_reads_each_file_in_its_format_in_sorted_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.jsonl").write_text('{"text": "Second file."}\n', encoding="utf-8")
    (tmp_path / "a.txt").write_text("First file.\n", encoding="utf-8")
    (tmp_path / "c.parquet").write_bytes(b"")
    write_table(tmp_path / "d.arrow", pa.table({"text": ["Fourth file."]}))
    (tmp_path / "notes.md").write_text("Not read.\n", encoding="utf-8")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.txt").write_text("Hidden.\n", encoding="utf-8")
    documents, skipped = read(tmp_path)
    assert [d.text for d in documents] == ["First file.", "Second file.", "Fourth file."]
    assert skipped == {"empty file": 1, "unknown file type": 1}
    assert capsys.readouterr().err.splitlines() == [
        f"corpus: skipped {tmp_path / 'c.parquet'}: empty file",
        f"corpus: skipped {tmp_path / 'notes.md'}: unknown file type",
    ]


def test_directory_with_explicit_format_reads_every_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("First file.\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("Read too.\n", encoding="utf-8")
    documents, skipped = read(tmp_path, format="bert")
    assert [(d.text, d.kind) for d in documents] == [("First file.", "lines"), ("Read too.", "lines")]
    assert skipped == {}


def test_single_file_of_unknown_type_is_an_error(tmp_path: Path) -> None:
    file = tmp_path / "data.csv"
    file.write_text("text\nHello.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"data\.csv: unknown file type"):
        read(file)


def test_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nowhere\.txt"):
        read(tmp_path / "nowhere.txt")


def test_directory_without_readable_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "notes.md").write_text("Not read.\n", encoding="utf-8")
    with pytest.raises(
        FileNotFoundError, match=rf"{tmp_path} holds no readable file \(2 files, all skipped\)"
    ):
        read(tmp_path)
    (tmp_path / "void").mkdir()
    with pytest.raises(FileNotFoundError, match=r"void holds no readable file \(no files\)"):
        read(tmp_path / "void", format="bert")


# --- bad files ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "data"), [("empty.txt", b""), ("empty.jsonl.gz", gzip.compress(b""))])
def test_empty_file_is_skipped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes
) -> None:
    file = tmp_path / name
    file.write_bytes(data)
    assert read(file) == ([], {"empty file": 1})
    assert capsys.readouterr().err == f"corpus: skipped {file}: empty file\n"


def test_binary_file_is_skipped_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "image.txt"
    file.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    assert read(file) == ([], {"binary file": 1})
    assert capsys.readouterr().err == f"corpus: skipped {file}: binary file\n"


def test_documents_that_are_not_utf8_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "mixed.txt"
    file.write_bytes(
        b"Good one.\nStill good.\n\n"
        + "Caf\u00e9 au lait.\nBad document.\n\n".encode("latin-1")
        + b"Good again.\n\nAlso bad \xff.\n"
    )
    documents, skipped = read(file, format="bert")
    assert split(documents) == [["Good one.", "Still good."], ["Good again."]]
    assert skipped == {"not UTF-8": 2}
    assert capsys.readouterr().err == (
        f"corpus: {file}: skipping documents that are not UTF-8; the first bad byte is on line 4 "
        f"(byte offset 26)\n"
    )
    assert read(file, format="text") == ([], {"not UTF-8": 1})


def test_jsonl_records_that_are_not_utf8_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "docs.jsonl"
    file.write_bytes(b'{"text": "Caf\xe9."}\n{"text": "Fine."}\n')
    assert [d.text for d in read(file)[0]] == ["Fine."]
    assert "line 1 (byte offset 13)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "data", "problem"),
    [
        ("docs.jsonl.gz", b"definitely not gzip data", "is not valid compressed data"),
        ("docs.jsonl.bz2", b"BZh9 not really bzip2 data", "is not valid compressed data"),
        ("docs.jsonl.gz", gzip.compress(b'{"text": "A."}\n' * 5000)[:-100], "is truncated"),
        ("docs.txt.bz2", bz2.compress(b"Dogs bark.\n" * 5000)[:-100], "is truncated"),
    ],
    ids=["not-gzip", "not-bzip2", "truncated-gzip", "truncated-bzip2"],
)
def test_bad_compressed_data_is_an_error(tmp_path: Path, name: str, data: bytes, problem: str) -> None:
    file = tmp_path / name
    file.write_bytes(data)
    with pytest.raises(ValueError, match=rf"corpus file {file} {problem}"):
        read(file)


def test_corrupt_gzip_is_an_error(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(b"".join(b'{"text": "Line %d."}\n' % i for i in range(3000))))
    data[len(data) // 2] ^= 0xFF
    file = tmp_path / "docs.jsonl.gz"
    file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"corpus file {file} is (corrupt|not valid compressed data)"):
        read(file)


# --- weights --------------------------------------------------------------------------------------


@pytest.fixture()
def numbered(tmp_path: Path) -> str:
    file = tmp_path / "numbered.txt"
    file.write_text("".join(f"Document {i}.\n\n" for i in range(400)), encoding="utf-8")
    return str(file)


def weighted(path: str, weights: list[float], seed: int = 1) -> Iterator[RawDocument]:
    sources = [SourceSpec(path=path, weight=weight) for weight in weights]
    return read_corpus(sources, seed, collections.Counter())


def numbers(documents: Iterator[RawDocument]) -> list[int]:
    return [int(d.text.removeprefix("Document ").removesuffix(".")) for d in documents]


def test_whole_weights_repeat_each_document(numbered: str) -> None:
    assert numbers(weighted(numbered, [2.0])) == [i for i in range(400) for _ in range(2)]
    assert numbers(weighted(numbered, [1.0, 3.0])) == list(range(400)) + [
        i for i in range(400) for _ in range(3)
    ]


def test_fractional_weight_keeps_a_seeded_share(numbered: str) -> None:
    half = numbers(weighted(numbered, [0.5]))
    assert 160 <= len(half) <= 240
    assert half == sorted(set(half))
    assert numbers(weighted(numbered, [0.5])) == half
    assert numbers(weighted(numbered, [0.5], seed=2)) != half
    # The draw depends on the source's index: the same file twice gives two different halves.
    both = numbers(weighted(numbered, [0.5, 0.5]))
    assert both[: len(half)] == half and both[len(half) :] != half


def test_weight_above_one_adds_a_share_of_second_copies(numbered: str) -> None:
    used = collections.Counter(numbers(weighted(numbered, [1.5])))
    assert set(used) == set(range(400))
    assert 160 <= sum(1 for count in used.values() if count == 2) <= 240
    assert set(used.values()) == {1, 2}


def test_read_corpus_chains_sources_and_counts_skips(tmp_path: Path, numbered: str) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    skipped: Counter = collections.Counter()
    sources = [SourceSpec(path=str(empty)), SourceSpec(path=numbered, weight=0.01)]
    documents = list(read_corpus(sources, 0, skipped))
    assert 0 < len(documents) < 20
    assert skipped == {"empty file": 1}
