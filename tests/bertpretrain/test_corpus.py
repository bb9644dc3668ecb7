"""Reading corpora as documents of sentences: the built-in Python docs and text files."""

from __future__ import annotations

import sys
from itertools import islice
from pathlib import Path

import pytest

from bertpretrain.corpus import BUILTIN_PYTHON_DOCS, documents


@pytest.fixture(scope="module")
def python_docs() -> list[list[str]]:
    return list(documents(BUILTIN_PYTHON_DOCS))


def test_python_docs_are_many_documents_of_prose(python_docs: list[list[str]]) -> None:
    sentences = [s for document in python_docs for s in document]
    assert len(python_docs) > 300
    assert len(sentences) > 10_000
    assert all(document and all(s.strip() == s and s for s in document) for document in python_docs)
    # Doctests, grammar rules and tables are left out.
    assert not [s for s in sentences if s.startswith((">>>", "...")) or "::=" in s or "+---" in s]


def test_python_docs_hold_docstrings_and_language_reference(python_docs: list[list[str]]) -> None:
    text = "\n".join(s for document in python_docs for s in document)
    # The docstring of random.Random.sample and the "del" topic of the language reference.
    assert "Chooses k unique random elements from a population sequence." in text
    assert "Deletion of a target list recursively deletes each target, from left to right." in text


def test_python_docs_import_nothing_and_are_deterministic(python_docs: list[list[str]]) -> None:
    assert "antigravity" not in sys.modules and "this" not in sys.modules
    assert list(islice(documents(BUILTIN_PYTHON_DOCS), 20)) == python_docs[:20]


def test_bert_format_one_sentence_per_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "The cat sat on the mat.\nIt was warm there. It purred.\n\n\n\nDogs bark.\nBirds sing!\n\n",
        encoding="utf-8",
    )
    assert list(documents(str(corpus))) == [
        ["The cat sat on the mat.", "It was warm there.", "It purred."],
        ["Dogs bark.", "Birds sing!"],
    ]


def test_wrapped_prose_is_joined_then_split(tmp_path: Path) -> None:
    corpus = tmp_path / "book.txt"
    corpus.write_text(
        "It was a bright cold day in April, and the\nclocks were striking thirteen. Winston\n"
        "Smith slipped quickly through the\nglass doors.\n\nA second paragraph\nstarts here.\n",
        encoding="utf-8",
    )
    assert list(documents(str(corpus))) == [
        [
            "It was a bright cold day in April, and the clocks were striking thirteen.",
            "Winston Smith slipped quickly through the glass doors.",
        ],
        ["A second paragraph starts here."],
    ]


def test_directory_reads_txt_files_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.txt").write_text("Second file.\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("First file.\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("Not read.\n", encoding="utf-8")
    assert list(documents(str(tmp_path))) == [["First file."], ["Second file."]]


def test_missing_corpus_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.txt"
    with pytest.raises(FileNotFoundError, match=r"nowhere\.txt"):
        list(documents(str(missing)))


def test_directory_without_text_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no \.txt file"):
        list(documents(str(tmp_path)))


def test_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("Café au lait.\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8"):
        list(documents(str(corpus)))
