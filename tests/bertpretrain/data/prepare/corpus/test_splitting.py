"""Splitting raw documents into sentences, by kind (sentences, lines, prose, wikitext)."""

from __future__ import annotations

import pickle
from typing import Any, cast

import pytest

from bertpretrain.data.prepare.corpus.raw import RawDocument
from bertpretrain.data.prepare.corpus.splitting import sentences

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


def test_bert_format_lines_are_exactly_its_sentences() -> None:
    # What the bert reader yields: every non-blank line is one sentence, however many sentence ends
    # it holds, as Google's and NVIDIA's create_pretraining_data.py take it.
    text = "Dr. Smith went. He left.\n  spaced   out\ttext.  \n\nWait! What? Yes.\nMr. Smith\n"
    document = RawDocument(text, "sentences", "x")
    assert sentences(document) == [
        "Dr. Smith went. He left.",
        "spaced out text.",
        "Wait! What? Yes.",
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


@pytest.mark.parametrize("kind", ["sentences", "lines", "prose", "wikitext"])
def test_blank_documents_have_no_sentences(kind: str) -> None:
    assert sentences(RawDocument(" \n\n\t", cast(Any, kind), "x")) == []


def test_unknown_kind_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"f\.txt:3: unknown document kind 'html'"):
        sentences(RawDocument("<p>Hi.</p>", cast(Any, "html"), "f.txt:3"))


def test_raw_documents_survive_pickling() -> None:
    document = RawDocument("'''Foo''' is a bar.", "wikitext", "dump.xml.bz2: page 'Foo'")
    assert pickle.loads(pickle.dumps(document)) == document
