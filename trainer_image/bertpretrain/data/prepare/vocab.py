"""Making the WordPiece vocabulary: trained on the corpus, or taken from a file, and saved as a directory
that :mod:`bertpretrain.data.format.vocab` reads.

Training is not bit-for-bit reproducible: ``tokenizers`` (0.23) breaks ties between equally
frequent merges in hash-map order (huggingface/tokenizers#1794), so two trainings on the same text
can differ in a few of the rarest tokens. The vocabulary is therefore trained once and kept with
the shards; everything made from a given vocabulary is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, models, trainers

from bertjob_api.files import AtomicPath, write_atomically
from bertpretrain.data.format.vocab import (
    SPECIAL_TOKENS,
    TOKENIZER_FILE,
    VOCAB_FILE,
    bert_pipeline,
    load_tokenizer,
    with_special_tokens,
)


def train_vocab(
    sentences: Iterable[str], size: int, lowercase: bool, out_dir: Path, pad_to_multiple_of: int | None = None
) -> Path:
    """Train a WordPiece vocabulary of at most ``size`` tokens and save it into ``out_dir``.

    Uses ``tokenizers``' ``WordPieceTrainer`` (which, like Google's vocabularies, counts the
    five special tokens within ``size``); a small corpus may give fewer than ``size`` tokens.
    ``sentences`` is read once, as a stream. With ``pad_to_multiple_of``, ``[unused{k}]`` tokens
    are appended until the size is a multiple of it. Writes ``vocab.txt`` and ``tokenizer.json``
    (under temporary names, synced, then renamed) and returns ``out_dir``.
    """
    tokenizer = bert_pipeline(models.WordPiece(unk_token="[UNK]"), lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(sentences, trainer=trainer)
    _save(with_special_tokens(_padded(tokenizer, pad_to_multiple_of)), out_dir, "trained vocabulary")
    return out_dir


def import_vocab(file: Path, lowercase: bool, out_dir: Path, pad_to_multiple_of: int | None = None) -> Path:
    """Copy an existing ``vocab.txt`` or ``tokenizer.json`` into ``out_dir`` as both files.

    ``lowercase`` applies to a ``vocab.txt`` (which does not record it); a ``tokenizer.json``
    keeps its own normalizer. ``pad_to_multiple_of`` appends ``[unused{k}]`` tokens as
    :func:`train_vocab` does. Returns ``out_dir``.

    Raises:
        FileNotFoundError: ``file`` does not exist.
        ValueError: ``file`` is not a WordPiece vocabulary, or lacks a special token.
    """
    _save(
        with_special_tokens(_padded(load_tokenizer(file, lowercase), pad_to_multiple_of)), out_dir, str(file)
    )
    return out_dir


def _padded(tokenizer: Tokenizer, multiple: int | None) -> Tokenizer:
    """The tokenizer with ``[unused{k}]`` tokens appended until its size is a multiple of ``multiple``.

    NVIDIA pads BERT's 30522 tokens to 30528 so that the embedding and output matrices have
    tensor-core-friendly shapes; Google's vocabularies name spare tokens ``[unused{k}]``.
    """
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    if not multiple or len(vocab) % multiple == 0:
        return tokenizer
    assert isinstance(tokenizer.model, models.WordPiece)
    k = 0
    while len(vocab) % multiple:
        while f"[unused{k}]" in vocab:
            k += 1
        vocab[f"[unused{k}]"] = len(vocab)
    model = models.WordPiece(
        vocab, unk_token="[UNK]", continuing_subword_prefix="##",
        max_input_chars_per_word=tokenizer.model.max_input_chars_per_word,
    )  # fmt: skip
    padded = Tokenizer(model)
    padded.normalizer = tokenizer.normalizer
    padded.pre_tokenizer = tokenizer.pre_tokenizer
    padded.decoder = tokenizer.decoder
    return padded


def _save(tokenizer: Tokenizer, out_dir: Path, source: str) -> None:
    """Write ``vocab.txt`` and ``tokenizer.json`` into ``out_dir``, each synced and renamed into place
    (:class:`bertjob_api.files.AtomicPath`); the record written after them says they belong together."""
    if not isinstance(tokenizer.model, models.WordPiece):
        raise ValueError(f"{source}: a {type(tokenizer.model).__name__} tokenizer, BERT needs WordPiece")
    with AtomicPath(out_dir / TOKENIZER_FILE) as tmp:
        tokenizer.save(str(tmp))
    # WordPiece.save writes only to a directory; vocab.txt is the model's tokens, one a line in id order.
    vocab = json.loads(tokenizer.to_str())["model"]["vocab"]
    text = "".join(f"{token}\n" for token in sorted(vocab, key=vocab.__getitem__)).encode("utf-8")
    write_atomically(out_dir / VOCAB_FILE, lambda file: file.write(text), len(text))
