"""The ``builtin:python-docs`` corpus: many documents of prose, deterministic, imported from nothing."""

from __future__ import annotations

import collections
import sys
from itertools import islice

import pytest

from bertjob_api.spec import SourceSpec
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS
from bertpretrain.data.prepare.corpus.raw import RawDocument
from bertpretrain.data.prepare.corpus.sources import read_source
from bertpretrain.data.prepare.corpus.splitting import sentences
from tests.bertpretrain.data.prepare.corpus.reading import read

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


def test_python_docs_keep_the_splitting_path(python_docs: list[RawDocument]) -> None:
    # The built-in corpus (the demo's, the embedded default job's) is read as kind "lines", whose
    # lines are still split where they hold sentences: not as BERT's format, whose lines are kept whole.
    assert {document.kind for document in python_docs} == {"lines"}
    assert sentences(RawDocument("Dr. Smith went. He left.", "lines", "x")) == ["Dr. Smith went.", "He left."]


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
