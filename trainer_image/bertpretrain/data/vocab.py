"""The WordPiece vocabulary: trained on the corpus or taken from a file, and tokenization with it.

The tokenizer is BERT's (Devlin et al. 2019; google-research/bert ``tokenization.py``) as Hugging
Face ``tokenizers`` builds it: ``BertNormalizer`` (clean-up, CJK spacing, and lower-casing with
accent stripping for uncased models), ``BertPreTokenizer`` (split on whitespace and punctuation)
and a ``WordPiece`` model with ``##`` continuation pieces and ``[UNK]``. A vocabulary directory
holds ``vocab.txt`` (one token per line, the line number is the id; Google's format) and
``tokenizer.json`` (the whole pipeline, with BERT's ``[CLS] A [SEP] B [SEP]`` post-processor so
that it serves as is after export). Trained vocabularies start with ``[PAD] [UNK] [CLS] [SEP]
[MASK]`` at ids 0-4.

Training is not bit-for-bit reproducible: ``tokenizers`` (0.23) breaks ties between equally
frequent merges in hash-map order (huggingface/tokenizers#1794), so two trainings on the same text
can differ in a few of the rarest tokens. The vocabulary is therefore trained once and kept with
the shards; everything made from a given vocabulary is deterministic.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# The file names belong to the contract (the export carries them too); re-exported for this
# module's callers.
from bertjob_api.contract import TOKENIZER_FILE as TOKENIZER_FILE
from bertjob_api.contract import VOCAB_FILE as VOCAB_FILE

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class SpecialIds:
    """Ids of BERT's five special tokens in one vocabulary."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    @classmethod
    def of(cls, tokenizer: Tokenizer, source: str | Path) -> SpecialIds:
        """Read the ids from ``tokenizer``'s WordPiece vocabulary (not its added tokens).

        Raises:
            ValueError: the vocabulary lacks one of ``[PAD] [UNK] [CLS] [SEP] [MASK]``; the message
                names ``source`` (the file it came from) and the token.
        """
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        for token in SPECIAL_TOKENS:
            if token not in vocab:
                raise ValueError(f"{source}: the vocabulary has no {token} token, which BERT needs")
        return cls(*(vocab[token] for token in SPECIAL_TOKENS))


def train_vocab(
    sentences: Iterable[str], size: int, lowercase: bool, out_dir: Path, pad_to_multiple_of: int | None = None
) -> Path:
    """Train a WordPiece vocabulary of at most ``size`` tokens and save it into ``out_dir``.

    Uses ``tokenizers``' ``WordPieceTrainer`` (which, like Google's vocabularies, counts the
    five special tokens within ``size``); a small corpus may give fewer than ``size`` tokens.
    ``sentences`` is read once, as a stream. With ``pad_to_multiple_of``, ``[unused{k}]`` tokens
    are appended until the size is a multiple of it. Writes ``vocab.txt`` and ``tokenizer.json``
    (under temporary names, then renamed) and returns ``out_dir``.
    """
    tokenizer = _bert_pipeline(models.WordPiece(unk_token="[UNK]"), lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(sentences, trainer=trainer)
    _save(_with_special_tokens(_padded(tokenizer, pad_to_multiple_of)), out_dir, "trained vocabulary")
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
        _with_special_tokens(_padded(load_tokenizer(file, lowercase), pad_to_multiple_of)), out_dir, str(file)
    )
    return out_dir


def continuation_table(tokenizer: Tokenizer) -> np.ndarray:
    """bool [vocab size]: true for the ids of ``##`` pieces (continuations of a word)."""
    table = np.zeros(tokenizer.get_vocab_size(with_added_tokens=False), bool)
    for token, index in tokenizer.get_vocab(with_added_tokens=False).items():
        if token.startswith("##"):
            table[index] = True
    return table


def load_tokenizer(path: Path, lowercase: bool = True) -> Tokenizer:
    """Load a BERT tokenizer from a vocabulary directory, a ``tokenizer.json`` or a ``vocab.txt``.

    A directory is read through its ``tokenizer.json``, or its ``vocab.txt`` when it has none. A
    ``vocab.txt`` gets BERT's pipeline with ``lowercase`` (Google's ``do_lower_case``).

    Raises:
        FileNotFoundError: nothing to load at ``path``.
        ValueError: the file is not a WordPiece vocabulary, or lacks one of the special tokens.
    """
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE if (path / TOKENIZER_FILE).is_file() else path / VOCAB_FILE
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary {path}: no such file")
    if path.suffix == ".json":
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for a bad file
            raise ValueError(f"{path}: not a tokenizers JSON file: {error}") from None
        if not isinstance(tokenizer.model, models.WordPiece):
            raise ValueError(f"{path}: a {type(tokenizer.model).__name__} tokenizer, BERT needs WordPiece")
        SpecialIds.of(tokenizer, path)
        return tokenizer
    try:
        model = models.WordPiece.from_file(str(path), unk_token="[UNK]")
    except Exception as error:
        raise ValueError(f"{path}: not a vocab.txt (one token per line): {error}") from None
    SpecialIds.of(Tokenizer(model), path)
    return _with_special_tokens(_bert_pipeline(model, lowercase))


def has_lowercase(tokenizer: Tokenizer) -> bool | None:
    """Whether the tokenizer's normalizer lower-cases (None: it has no BertNormalizer)."""
    return getattr(tokenizer.normalizer, "lowercase", None)


def _bert_pipeline(model: models.Model, lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


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


def _with_special_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """Register the special tokens (never split, skipped when decoding) and BERT's post-processor."""
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    vocab = tokenizer.get_vocab()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    return tokenizer


def _save(tokenizer: Tokenizer, out_dir: Path, source: str) -> None:
    """Write ``vocab.txt`` and ``tokenizer.json`` into ``out_dir`` through a temporary directory."""
    if not isinstance(tokenizer.model, models.WordPiece):
        raise ValueError(f"{source}: a {type(tokenizer.model).__name__} tokenizer, BERT needs WordPiece")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tmp-vocab-") as tmp:
        tokenizer.model.save(tmp)
        tokenizer.save(os.path.join(tmp, TOKENIZER_FILE))
        for name in (VOCAB_FILE, TOKENIZER_FILE):
            os.replace(os.path.join(tmp, name), out_dir / name)
