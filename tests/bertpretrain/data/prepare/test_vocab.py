"""WordPiece vocabularies: training, saving, loading, special tokens and tokenization."""

from __future__ import annotations

import collections
from itertools import islice
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from bertjob_api.spec import SourceSpec
from bertpretrain.data.format.vocab import SPECIAL_TOKENS, SpecialIds, continuation_table, load_tokenizer
from bertpretrain.data.prepare.corpus import splitting
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS
from bertpretrain.data.prepare.corpus.sources import read_source
from bertpretrain.data.prepare.vocab import import_vocab, train_vocab


@pytest.fixture(scope="module")
def small_corpus() -> list[str]:
    """The sentences of 80 documents of the Python docs."""
    builtin = read_source(SourceSpec(path=BUILTIN_PYTHON_DOCS), collections.Counter())
    return [s for document in islice(builtin, 80) for s in splitting.sentences(document)]


@pytest.fixture(scope="module")
def vocab_dir(small_corpus: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_vocab(small_corpus, 1000, True, tmp_path_factory.mktemp("vocab"))


def test_trained_vocabulary_starts_with_the_special_tokens(vocab_dir: Path) -> None:
    lines = (vocab_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines[:5] == list(SPECIAL_TOKENS)
    assert len(lines) == 1000 == len(set(lines))
    assert sorted(p.name for p in vocab_dir.iterdir()) == ["tokenizer.json", "vocab.txt"]
    assert SpecialIds.of(load_tokenizer(vocab_dir), vocab_dir) == SpecialIds(0, 1, 2, 3, 4)


def test_vocab_txt_and_tokenizer_json_tokenize_alike(vocab_dir: Path) -> None:
    text = "Return the number of items in a container, or raise TypeError."
    from_json = load_tokenizer(vocab_dir / "tokenizer.json")
    from_txt = load_tokenizer(vocab_dir / "vocab.txt", lowercase=True)
    encoding = from_json.encode(text)
    assert encoding.ids == from_txt.encode(text).ids
    # The saved tokenizer is a whole BERT tokenizer: [CLS] ... [SEP], lower-cased word pieces.
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
    assert "return" in encoding.tokens
    assert from_json.decode(encoding.ids) == text.lower()


def test_cased_vocabulary_keeps_case(small_corpus: list[str], tmp_path: Path) -> None:
    cased = load_tokenizer(train_vocab(small_corpus, 1000, False, tmp_path))
    assert cased.encode("Return", add_special_tokens=False).tokens[0].startswith("R")


@pytest.mark.parametrize("source", ["vocab.txt", "tokenizer.json"])
def test_padding_appends_unused_tokens_to_a_multiple(vocab_dir: Path, tmp_path: Path, source: str) -> None:
    out = import_vocab(vocab_dir / source, True, tmp_path / "padded", pad_to_multiple_of=24)
    lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1008 and lines[:1000] == (vocab_dir / "vocab.txt").read_text().splitlines()
    assert lines[1000:] == [f"[unused{k}]" for k in range(8)]
    padded = load_tokenizer(out)
    assert padded.get_vocab_size(with_added_tokens=False) == 1008
    text = "Return the number of items in a container."
    assert padded.encode(text).ids == load_tokenizer(vocab_dir).encode(text).ids
    assert import_vocab(vocab_dir / source, True, tmp_path / "same", pad_to_multiple_of=8) and (
        (tmp_path / "same" / "vocab.txt").read_text() == (vocab_dir / "vocab.txt").read_text()
    )


def test_trained_vocabulary_can_be_padded(small_corpus: list[str], tmp_path: Path) -> None:
    tokenizer = load_tokenizer(train_vocab(small_corpus, 997, True, tmp_path, pad_to_multiple_of=8))
    assert tokenizer.get_vocab_size(with_added_tokens=False) == 1000
    assert tokenizer.token_to_id("[unused2]") == 999


def test_continuation_table_marks_word_pieces(vocab_dir: Path) -> None:
    tokenizer = load_tokenizer(vocab_dir)
    table = continuation_table(tokenizer)
    pieces = {tokenizer.id_to_token(i) for i in range(len(table)) if table[i]}
    assert pieces and all(piece.startswith("##") for piece in pieces)
    assert not table[tokenizer.token_to_id("the")]


def test_import_vocab_txt_writes_both_files(vocab_dir: Path, tmp_path: Path) -> None:
    out = import_vocab(vocab_dir / "vocab.txt", True, tmp_path / "copy")
    assert (out / "vocab.txt").read_bytes() == (vocab_dir / "vocab.txt").read_bytes()
    text = "open a file"
    assert load_tokenizer(out).encode(text).ids == load_tokenizer(vocab_dir).encode(text).ids


def test_vocabulary_without_mask_is_named(vocab_dir: Path, tmp_path: Path) -> None:
    lines = (vocab_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    broken = tmp_path / "vocab.txt"
    broken.write_text("\n".join(t for t in lines if t != "[MASK]") + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab\.txt: the vocabulary has no \[MASK\] token"):
        load_tokenizer(broken)
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        import_vocab(broken, True, tmp_path / "out")
    assert not (tmp_path / "out" / "vocab.txt").exists()


def test_non_wordpiece_tokenizer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    Tokenizer(models.BPE()).save(str(path))
    with pytest.raises(ValueError, match="BERT needs WordPiece"):
        load_tokenizer(path)


def test_missing_vocabulary_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothing\.txt"):
        load_tokenizer(tmp_path / "nothing.txt")
