"""Directories, the ``auto`` format by file name, and bad files (empty, binary, not UTF-8, corrupt)."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.feather
import pyarrow.ipc
import pytest

from bertpretrain.data.prepare.corpus.files import detect_format
from tests.bertpretrain.data.prepare.corpus.reading import read, split, write_table

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
    assert [(d.text, d.kind) for d in documents] == [("First file.", "sentences"), ("Read too.", "sentences")]
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
