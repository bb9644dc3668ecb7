"""Tokenized documents: the fast encoder gives BERT's ids, pieces round-trip, selection keeps order."""

from __future__ import annotations

import collections
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, pre_tokenizers

from bertjob_api.spec import SourceSpec
from bertpretrain.data.format.vocab import SpecialIds, load_tokenizer
from bertpretrain.data.prepare.corpus import splitting
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS
from bertpretrain.data.prepare.corpus.sources import read_source
from bertpretrain.data.prepare.documents import (
    DocumentEncoder,
    TokenizedDocuments,
    concatenate,
    load_piece,
    save_piece,
)
from bertpretrain.data.prepare.vocab import train_vocab

AWKWARD = [
    ["Ünïcödé text with [MASK] and [CLS] here.", "Second\x0bsentence\twith a tab.", "   ", "Café!"],
    ["\t"],
    ["Read the FILE.", "Plain ASCII, nothing else."],
    ["Control\x01characters\x7fare removed.", "Line\nbreak inside a sentence."],
    # Python splits at these, BERT deletes them (the encoder's chunks must not split there); the
    # encoder's own marks (\x00, \x01) standing alone; whitespace both agree on.
    ["Split\x1cjoined\x1fand\x85here\x0cthen.", "a \x00 b \x01 c\x00d", "\u2028next\u00a0to\u3000that"],
    ["\x00", "Ending."],
    # Printable ASCII goes to the tokenizer without its normalizer (lowercased first when uncased):
    # capitals, a word too long for WordPiece, ASCII punctuation, and DEL (not printable) alone.
    ["MiXeD CAPS " + "LONG" * 30 + " x", "Tilde~caret^back`tick|pipe", "\x7f", "Ab\x7fCd"],
]


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    builtin = read_source(SourceSpec(path=BUILTIN_PYTHON_DOCS), collections.Counter())
    sentences = [s for document in islice(builtin, 40) for s in splitting.sentences(document)]
    return load_tokenizer(train_vocab(sentences, 800, request.param, tmp_path_factory.mktemp("vocab")))


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    builtin = read_source(SourceSpec(path=BUILTIN_PYTHON_DOCS), collections.Counter())
    return [splitting.sentences(document) for document in islice(builtin, 100)] + AWKWARD


def one_sentence_at_a_time(tokenizer: Tokenizer, documents: list[list[str]]) -> list[list[list[int]]]:
    """The plain way: each sentence encoded alone, special-token text taken as text."""
    tokenizer.encode_special_tokens = True
    try:
        encoded = [[tokenizer.encode(s, add_special_tokens=False).ids for s in doc] for doc in documents]
    finally:
        tokenizer.encode_special_tokens = False
    return [[s for s in doc if s] for doc in encoded if any(doc)]


def as_lists(tokenized: TokenizedDocuments) -> list[list[list[int]]]:
    tokens, starts = tokenized.tokens.tolist(), tokenized.sentence_starts.tolist()
    return [
        [tokens[starts[s] : starts[s + 1]] for s in range(first, last)]
        for first, last in zip(tokenized.document_starts[:-1], tokenized.document_starts[1:], strict=True)
    ]


def test_encoder_gives_the_ids_of_sentence_by_sentence_encoding(
    tokenizer: Tokenizer, documents: list[list[str]]
) -> None:
    tokenized = DocumentEncoder(tokenizer, seed=0, heldout_fraction=0.0).encode(documents)
    assert as_lists(tokenized) == one_sentence_at_a_time(tokenizer, documents)
    assert tokenized.tokens.dtype == np.int32
    assert tokenized.num_documents == len(documents) - 1  # the blank document is dropped


def test_encoder_reuses_its_chunk_table_across_calls(
    tokenizer: Tokenizer, documents: list[list[str]]
) -> None:
    encoder = DocumentEncoder(tokenizer, seed=0, heldout_fraction=0.0)
    first = as_lists(encoder.encode(documents[:60]))
    # The second call finds most chunks in the table; its ids must be those of a fresh encoder.
    assert as_lists(encoder.encode(documents)) == one_sentence_at_a_time(tokenizer, documents)
    assert first == one_sentence_at_a_time(tokenizer, documents[:60])


def test_encoder_without_bert_pre_tokenizer_encodes_whole_documents(
    tokenizer: Tokenizer, documents: list[list[str]]
) -> None:
    other = Tokenizer.from_str(tokenizer.to_str())
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenized = DocumentEncoder(other, seed=0, heldout_fraction=0.0).encode(documents)
    assert as_lists(tokenized) == one_sentence_at_a_time(other, documents)
    assert len(tokenized.text_bytes) == tokenized.num_documents and (tokenized.text_bytes > 0).all()


def test_special_token_text_is_plain_text(tokenizer: Tokenizer) -> None:
    special = SpecialIds.of(tokenizer, "test")
    tokenized = DocumentEncoder(tokenizer, 0, 0.0).encode([["Use [MASK] and [SEP] and [CLS] here."]])
    assert not {special.cls, special.sep, special.mask} & set(tokenized.tokens.tolist())


def test_heldout_choice_follows_the_text_and_the_seed(
    tokenizer: Tokenizer, documents: list[list[str]]
) -> None:
    doubled = [document for document in documents[:100] for _ in range(2)]
    tokenized = DocumentEncoder(tokenizer, seed=3, heldout_fraction=0.3).encode(doubled)
    # Copies of a document (as source weights make) fall on the same side.
    assert np.array_equal(tokenized.heldout[0::2], tokenized.heldout[1::2])
    assert 0.15 < tokenized.heldout.mean() < 0.45
    reseeded = DocumentEncoder(tokenizer, seed=4, heldout_fraction=0.3).encode(doubled)
    assert not np.array_equal(reseeded.heldout, tokenized.heldout)
    assert not DocumentEncoder(tokenizer, seed=3, heldout_fraction=0.0).encode(doubled).heldout.any()


def test_select_and_concatenate_keep_documents_whole(
    tokenizer: Tokenizer, documents: list[list[str]]
) -> None:
    tokenized = DocumentEncoder(tokenizer, 0, 0.5).encode(documents[:30])
    keep = tokenized.heldout
    selected = tokenized.select(keep)
    everything = as_lists(tokenized)
    assert as_lists(selected) == [doc for doc, chosen in zip(everything, keep, strict=True) if chosen]
    rejoined = concatenate([tokenized.select(~keep), selected])
    assert as_lists(rejoined) == [d for d, c in zip(everything, keep, strict=True) if not c] + as_lists(
        selected
    )
    assert as_lists(concatenate([])) == []


def test_piece_round_trip_and_bad_file(
    tokenizer: Tokenizer, documents: list[list[str]], tmp_path: Path
) -> None:
    tokenized = DocumentEncoder(tokenizer, 0, 0.2).encode(documents[:10])
    save_piece(tokenized, tmp_path / "piece.npz")
    loaded = load_piece(tmp_path / "piece.npz")
    assert all(
        np.array_equal(getattr(loaded, name), getattr(tokenized, name))
        for name in ("tokens", "sentence_starts", "document_starts", "text_bytes", "heldout")
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["piece.npz"]
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"bad\.npz: not a tokenized piece"):
        load_piece(tmp_path / "bad.npz")
