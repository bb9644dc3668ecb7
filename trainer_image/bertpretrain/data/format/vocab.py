"""The WordPiece vocabulary as the data stage and the loader read it: its files, special ids and tokenizer.

The tokenizer is BERT's (Devlin et al. 2019; google-research/bert ``tokenization.py``) as Hugging
Face ``tokenizers`` builds it: ``BertNormalizer`` (clean-up, CJK spacing, and lower-casing with
accent stripping for uncased models), ``BertPreTokenizer`` (split on whitespace and punctuation)
and a ``WordPiece`` model with ``##`` continuation pieces and ``[UNK]``. A vocabulary directory
holds ``vocab.txt`` (one token per line, the line number is the id; Google's format) and
``tokenizer.json`` (the whole pipeline, with BERT's ``[CLS] A [SEP] B [SEP]`` post-processor so
that it serves as is after export). Trained vocabularies start with ``[PAD] [UNK] [CLS] [SEP]
[MASK]`` at ids 0-4.

This module reads a vocabulary; :mod:`bertpretrain.data.prepare.vocab` trains or imports one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

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
    return with_special_tokens(bert_pipeline(model, lowercase))


def has_lowercase(tokenizer: Tokenizer) -> bool | None:
    """Whether the tokenizer's normalizer lower-cases (None: it has no BertNormalizer)."""
    return getattr(tokenizer.normalizer, "lowercase", None)


def bert_pipeline(model: models.Model, lowercase: bool) -> Tokenizer:
    """BERT's normalizer, pre-tokenizer and decoder around a WordPiece ``model``."""
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def with_special_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """Register the special tokens (never split, skipped when decoding) and BERT's post-processor."""
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    vocab = tokenizer.get_vocab()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    return tokenizer
