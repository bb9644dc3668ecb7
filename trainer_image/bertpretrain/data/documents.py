"""Tokenized documents: the corpus as flat arrays of token ids, saved in pieces.

A :class:`TokenizedDocuments` holds many documents in three arrays (no Python object per token),
which is what instance creation works on and what a worker process sends back cheaply. The
corpus is cut into *pieces* of about a megabyte of text; each piece is sentence-split and
tokenized by a worker and saved as ``piece_{i:06d}.npz`` (written to a temporary name, then
renamed), so that a re-run skips the pieces already made and both phases share one tokenization.

Tokenization is BERT's (``bertpretrain.data.vocab``) and gives the same ids as encoding each sentence
on its own, but runs several times faster:

* a whole document is encoded in one call, its sentences joined by a newline that the data
  tokenizer knows as an added token, so the newline ids mark the sentence boundaries;
* an ASCII document without control characters skips ``BertNormalizer``: for such text the
  normalizer only lower-cases (uncased models) or does nothing (cased models), which Python's
  ``str.lower`` does far faster. Any other document goes through the full normalizer.

Text that spells a special token (``"[MASK]"``) is split like any other text, as Google's
tokenizer does, so ``[CLS]``/``[SEP]``/``[MASK]`` ids only ever come from instance creation.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, models, normalizers

from bertpretrain.data.vocab import has_lowercase

_SENTENCE_BREAK = "\n"
# What BertNormalizer removes (control characters) or rewrites; \t, \n and \r are whitespace to it.
_NEEDS_NORMALIZER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class TokenizedDocuments:
    """Documents of sentences of token ids, in three flat arrays.

    ``tokens`` int32 [T]: every token, sentence after sentence; ``sentence_starts`` int64 [S + 1]:
    sentence ``k`` is ``tokens[sentence_starts[k]:sentence_starts[k + 1]]``; ``document_starts``
    int64 [D + 1]: document ``d`` is sentences ``document_starts[d]`` to
    ``document_starts[d + 1]``. Every sentence holds at least one token and every document at
    least one sentence. ``text_bytes`` int64 [D]: the UTF-8 size of each document's text, and
    ``heldout`` bool [D]: whether the document is kept out of training.
    """

    tokens: np.ndarray
    sentence_starts: np.ndarray
    document_starts: np.ndarray
    text_bytes: np.ndarray
    heldout: np.ndarray

    @property
    def num_documents(self) -> int:
        """D, the number of documents."""
        return len(self.document_starts) - 1

    @property
    def num_sentences(self) -> int:
        """S, the number of sentences."""
        return len(self.sentence_starts) - 1

    def select(self, documents: np.ndarray) -> TokenizedDocuments:
        """The documents where ``documents`` (bool [D]) is true, in order."""
        sentence_counts = np.diff(self.document_starts)
        token_counts = np.diff(self.sentence_starts)
        sentences = np.repeat(documents, sentence_counts)
        return TokenizedDocuments(
            self.tokens[np.repeat(sentences, token_counts)],
            _starts(token_counts[sentences]),
            _starts(sentence_counts[documents]),
            self.text_bytes[documents],
            self.heldout[documents],
        )


def _starts(counts: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return starts


def empty() -> TokenizedDocuments:
    """No documents."""
    zero = np.zeros(1, dtype=np.int64)
    return TokenizedDocuments(np.zeros(0, np.int32), zero, zero, np.zeros(0, np.int64), np.zeros(0, bool))


def concatenate(parts: Sequence[TokenizedDocuments]) -> TokenizedDocuments:
    """The documents of ``parts``, one after another."""
    if not parts:
        return empty()
    token_offsets = np.cumsum([0] + [len(p.tokens) for p in parts])
    sentence_offsets = np.cumsum([0] + [p.num_sentences for p in parts])
    return TokenizedDocuments(
        np.concatenate([p.tokens for p in parts]),
        np.concatenate(
            [parts[0].sentence_starts[:1]]
            + [p.sentence_starts[1:] + offset for p, offset in zip(parts, token_offsets, strict=False)]
        ),
        np.concatenate(
            [parts[0].document_starts[:1]]
            + [p.document_starts[1:] + offset for p, offset in zip(parts, sentence_offsets, strict=False)]
        ),
        np.concatenate([p.text_bytes for p in parts]),
        np.concatenate([p.heldout for p in parts]),
    )


class DocumentEncoder:
    """Encodes documents (lists of sentences) with a BERT tokenizer into :class:`TokenizedDocuments`.

    ``heldout_fraction`` of the documents, chosen by a keyed hash of their text (so that two
    copies of a document, as source weights make, land on the same side), are marked held out.
    """

    def __init__(self, tokenizer: Tokenizer, seed: int, heldout_fraction: float):
        if not isinstance(tokenizer.model, models.WordPiece):
            raise ValueError(f"a {type(tokenizer.model).__name__} tokenizer, BERT needs WordPiece")
        self.lowercase = bool(has_lowercase(tokenizer))
        # Only BertNormalizer (or none) is known to leave clean ASCII alone apart from lower-casing.
        self._fast_path = tokenizer.normalizer is None or isinstance(
            tokenizer.normalizer, normalizers.BertNormalizer
        )
        # Copies without the special tokens, so that "[MASK]" in the text is plain text.
        self._full = _without_added_tokens(tokenizer)
        self._fast = _without_added_tokens(tokenizer)
        self._fast.normalizer = None
        self._break_id = self._full.token_to_id(_SENTENCE_BREAK)
        self._hash_key = seed.to_bytes(8, "little")
        self._heldout_threshold = int(heldout_fraction * 2**64)

    def encode(self, documents: Sequence[Sequence[str]]) -> TokenizedDocuments:
        """Tokenize ``documents`` (each a list of sentences, as ``bertpretrain.data.corpus`` gives them).

        Sentences without any token are dropped, then documents without any sentence, as
        Google's ``create_pretraining_data.py`` drops them.
        """
        texts = [_SENTENCE_BREAK.join(s.replace(_SENTENCE_BREAK, " ") for s in doc) for doc in documents]
        fast = [
            i
            for i, text in enumerate(texts)
            if self._fast_path and text.isascii() and not _NEEDS_NORMALIZER.search(text)
        ]
        full = sorted(set(range(len(texts))) - set(fast))
        ids: list[list[int]] = [[] for _ in texts]
        batches = (
            (self._fast, fast, [texts[i].lower() if self.lowercase else texts[i] for i in fast]),
            (self._full, full, [texts[i] for i in full]),
        )
        for tokenizer, indices, batch in batches:
            encodings = tokenizer.encode_batch_fast(batch, add_special_tokens=False) if batch else []
            for i, encoding in zip(indices, encodings, strict=True):
                ids[i] = encoding.ids
        return self._to_arrays(texts, ids)

    def _to_arrays(self, texts: list[str], ids: list[list[int]]) -> TokenizedDocuments:
        tokens: list[np.ndarray] = []
        sentence_starts = [0]
        document_starts = [0]
        text_bytes = []
        heldout = []
        position = 0
        for text, document_ids in zip(texts, ids, strict=True):
            array = np.asarray(document_ids, dtype=np.int32)
            breaks = np.flatnonzero(array == self._break_id)
            starts = np.concatenate([[0], breaks + 1])
            ends = np.concatenate([breaks, [len(array)]])
            keep = ends > starts
            if not keep.any():
                continue
            lengths = (ends - starts)[keep]
            tokens.append(array[array != self._break_id])
            sentence_starts.extend((position + np.cumsum(lengths)).tolist())
            position += int(lengths.sum())
            document_starts.append(len(sentence_starts) - 1)
            encoded = text.encode("utf-8", "surrogatepass")
            text_bytes.append(len(encoded))
            digest = hashlib.blake2b(encoded, digest_size=8, key=self._hash_key).digest()
            heldout.append(int.from_bytes(digest, "little") < self._heldout_threshold)
        return TokenizedDocuments(
            np.concatenate(tokens) if tokens else np.zeros(0, np.int32),
            np.asarray(sentence_starts, dtype=np.int64),
            np.asarray(document_starts, dtype=np.int64),
            np.asarray(text_bytes, dtype=np.int64),
            np.asarray(heldout, dtype=bool),
        )


def _without_added_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer's normalizer, pre-tokenizer and WordPiece model, with only the sentence break
    added (matched before normalization, so the normalizer cannot touch it)."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    bare = Tokenizer(copy.model)
    bare.normalizer = copy.normalizer
    bare.pre_tokenizer = copy.pre_tokenizer
    bare.add_special_tokens([AddedToken(_SENTENCE_BREAK, special=True, normalized=False)])
    return bare


def save_piece(documents: TokenizedDocuments, path: Path) -> None:
    """Write ``documents`` to the ``.npz`` file ``path`` (through a temporary name)."""
    tmp = path.with_name(path.name + ".tmp.npz")
    try:
        np.savez(
            tmp,
            tokens=documents.tokens,
            sentence_starts=documents.sentence_starts,
            document_starts=documents.document_starts,
            text_bytes=documents.text_bytes,
            heldout=documents.heldout,
        )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_piece(path: Path) -> TokenizedDocuments:
    """Read a piece written by :func:`save_piece`.

    Raises:
        ValueError: ``path`` is not such a piece (the message names it).
    """
    try:
        with np.load(path) as file:
            return TokenizedDocuments(
                file["tokens"], file["sentence_starts"], file["document_starts"],
                file["text_bytes"], file["heldout"],
            )  # fmt: skip
    except (OSError, KeyError, ValueError) as error:
        raise ValueError(f"{path}: not a tokenized piece ({error})") from None
