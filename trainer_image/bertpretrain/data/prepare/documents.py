"""Tokenized documents: the corpus as flat arrays of token ids, saved in pieces.

A :class:`TokenizedDocuments` holds many documents in three arrays (no Python object per token),
which is what instance creation works on and what a worker process sends back cheaply. The
corpus is cut into *pieces* of about a megabyte of text; each piece is sentence-split and
tokenized by a worker and saved as ``piece_{i:06d}.npz`` (written to a temporary name, synced, then
renamed), so that a re-run skips the pieces already made and both phases share one tokenization.

Tokenization is BERT's (``bertpretrain.data.format.vocab``) and gives the same ids as encoding each sentence
on its own, but runs many times faster. With BERT's normalizer and pre-tokenizer (which every
vocabulary the data stage makes or imports has), a whitespace-separated chunk of text is tokenized
on its own, whatever surrounds it: the normalizer works character by character and the
pre-tokenizer splits at whitespace (and punctuation) first. So a piece's text is split at whitespace
(``str.split``), each distinct chunk is looked up in a table kept by the worker, only chunks never seen
before go to the tokenizer (one batched call per piece), and the piece's ids
are gathered from the table with array operations. Natural text repeats its words, so the tokenizer
sees a small fraction of the text. Two details keep this exact:

* the characters Python splits at but BERT's normalizer deletes (``\v``, ``\f``, ``\x1c``-``\x1f``,
  ``\x85``: control characters to it) are deleted first, as BERT does;
* sentence and document ends are marked by chunks of their own (``\x00`` and ``\x01``, which BERT
  deletes too, so they are deleted from the text first) that map to no token.

New chunks of printable ASCII (nearly all of English text) skip the normalizer: for them it
only lowercases (when the vocabulary is uncased), which Python does first; the rest get the full
normalizer. Same ids, about half the tokenizer's time.

A tokenizer with another normalizer or pre-tokenizer encodes each document in one call instead,
its sentences joined by a newline that the data tokenizer knows as an added token.

Text that spells a special token (``"[MASK]"``) is split like any other text, as Google's
tokenizer does, so ``[CLS]``/``[SEP]``/``[MASK]`` ids only ever come from instance creation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from bertjob_api.files import write_atomically
from bertpretrain.data.format.vocab import has_lowercase

_SENTENCE_BREAK = "\n"
# Chunks of their own that end a sentence and a document; BERT deletes both characters.
_SENTENCE_MARK = " \x00 "
_DOCUMENT_MARK = " \x01 "
_SENTENCE_INDEX, _DOCUMENT_INDEX = 0, 1
# Deleted before splitting: the marks, and what str.split splits at but BertNormalizer deletes.
_DELETED = re.compile("[\x00\x01\x0b\x0c\x1c-\x1f\x85]")
# Distinct chunks a worker keeps (tens of bytes each) before it starts a new table.
_MOST_CHUNKS = 500_000
# New chunks per text sent to the tokenizer (a batch of such texts is one call).
_CHUNKS_PER_TEXT = 1000


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
        # The chunk table is exact for BERT's normalizer (deleting control characters) and
        # pre-tokenizer (module docstring).
        self._chunked = (
            isinstance(tokenizer.normalizer, normalizers.BertNormalizer)
            and bool(getattr(tokenizer.normalizer, "clean_text", False))
            and isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
        )
        # A copy without the special tokens, so that "[MASK]" in the text is plain text.
        self._full = _without_added_tokens(tokenizer)
        # For chunks of printable ASCII, BERT's normalizer only lowercases (where it does): there is
        # nothing to clean, no Chinese character, no accent. Such chunks (nearly all of English
        # text) are lowercased by Python and go to a copy without the normalizer, which halves the
        # tokenizer's time; the others go to the full tokenizer.
        self._plain = _without_added_tokens(tokenizer, normalizer=False)
        self._plain_lowercase = bool(getattr(tokenizer.normalizer, "lowercase", False))
        self._reset_table()
        self._break_id = self._full.token_to_id(_SENTENCE_BREAK)
        self._hash_key = seed.to_bytes(8, "little")
        self._heldout_threshold = int(heldout_fraction * 2**64)

    def encode(self, documents: Sequence[Sequence[str]]) -> TokenizedDocuments:
        """Tokenize ``documents`` (each a list of sentences, as ``bertpretrain.data.prepare.corpus`` gives
        them).

        Sentences without any token are dropped, then documents without any sentence, as
        Google's ``create_pretraining_data.py`` drops them.
        """
        # The held-out draw and the byte counts are of each document's text, sentences on lines.
        texts = [_SENTENCE_BREAK.join(s.replace(_SENTENCE_BREAK, " ") for s in doc) for doc in documents]
        if self._chunked:
            return self._encode_chunks(documents, texts)
        return self._encode_documents(texts)

    def _encode_chunks(self, documents: Sequence[Sequence[str]], texts: list[str]) -> TokenizedDocuments:
        """The table-driven path (module docstring): split at whitespace, tokenize unseen chunks."""
        text = _DOCUMENT_MARK.join(_SENTENCE_MARK.join(doc) + _SENTENCE_MARK for doc in documents)
        if _DELETED.search(text):
            # Only the documents that hold such a character (texts[d] holds document d's sentences).
            cleaned = [
                [_DELETED.sub("", s) for s in doc] if _DELETED.search(doc_text) else doc
                for doc, doc_text in zip(documents, texts, strict=True)
            ]
            text = _DOCUMENT_MARK.join(_SENTENCE_MARK.join(doc) + _SENTENCE_MARK for doc in cleaned)
        text += _DOCUMENT_MARK
        if len(self._index) > _MOST_CHUNKS:
            self._reset_table()
        self._index.unseen = []
        chunk_ids = np.fromiter(map(self._index.__getitem__, text.split()), np.int64)
        if self._index.unseen:
            self._add_chunks(self._index.unseen)
        counts = self._counts[chunk_ids]
        ends = np.cumsum(counts)
        total = int(ends[-1]) if len(ends) else 0
        # Token j of the piece is table token (start of its chunk) + (j - first token of its chunk).
        shift = np.repeat(self._starts[chunk_ids] - (ends - counts), counts)
        tokens = self._ids[shift + np.arange(total)]
        marks = np.flatnonzero(chunk_ids <= _DOCUMENT_INDEX)
        mark_ends = ends[marks]
        is_sentence = chunk_ids[marks] == _SENTENCE_INDEX
        lengths = np.diff(mark_ends, prepend=0)[is_sentence]
        document_of = np.cumsum(~is_sentence)[is_sentence]
        kept = lengths > 0
        per_document = np.bincount(document_of[kept], minlength=len(texts))
        kept_documents = per_document > 0
        text_bytes, heldout = self._document_facts(texts)
        return TokenizedDocuments(
            tokens,
            np.concatenate([[0], mark_ends[is_sentence][kept]]).astype(np.int64),
            _starts(per_document[kept_documents]),
            text_bytes[kept_documents],
            heldout[kept_documents],
        )

    def _reset_table(self) -> None:
        """An empty chunk table holding the two marks (which map to no token)."""
        self._index = _ChunkIndex(
            {_SENTENCE_MARK.strip(): _SENTENCE_INDEX, _DOCUMENT_MARK.strip(): _DOCUMENT_INDEX}
        )
        self._counts = np.zeros(2, np.int64)
        self._starts = np.zeros(2, np.int64)
        self._ids = np.zeros(0, np.int32)

    def _add_chunks(self, chunks: list[str]) -> None:
        """Tokenize ``chunks`` (new to the table, in index order) and add them.

        Chunks of printable ASCII go to the tokenizer without the normalizer, lowercased here if
        the normalizer lowercases (the same ids: see ``__init__``), the others to the full one. In
        the table, each chunk's ids are a slice (start, count) of the flat id array, so the two
        groups' ids are appended one after the other and only the rows' starts follow the order.
        """
        plain = np.fromiter(map(_printable_ascii, chunks), bool, len(chunks))
        counts = np.zeros(len(chunks), np.int64)
        starts = np.zeros(len(chunks), np.int64)
        parts = [self._ids]
        offset = len(self._ids)
        for group, tokenizer in ((plain, self._plain), (~plain, self._full)):
            texts = list(itertools.compress(chunks, group))
            if tokenizer is self._plain and self._plain_lowercase:
                texts = [text.lower() for text in texts]
            ids, group_counts = self._tokenize(tokenizer, texts)
            counts[group] = group_counts
            starts[group] = offset + _starts(group_counts)[:-1]
            parts.append(ids)
            offset += len(ids)
        self._starts = np.concatenate([self._starts, starts])
        self._counts = np.concatenate([self._counts, counts])
        self._ids = np.concatenate(parts)

    def _tokenize(self, tokenizer: Tokenizer, chunks: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """int32 ids of ``chunks`` one after the other, and int64 [len(chunks)] the count of each.

        The chunks go to the tokenizer as texts of ``_CHUNKS_PER_TEXT`` chunks, each chunk followed
        by the sentence break (an added token, matched before normalization), in one batched call:
        faster than as pre-tokenized words, and the breaks tell which ids belong to which chunk.
        """
        if not chunks:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        texts = [
            _SENTENCE_BREAK.join(chunks[i : i + _CHUNKS_PER_TEXT]) + _SENTENCE_BREAK
            for i in range(0, len(chunks), _CHUNKS_PER_TEXT)
        ]
        encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int32)
        breaks = np.flatnonzero(ids == self._break_id)
        counts = np.diff(breaks, prepend=-1) - 1
        if len(counts) != len(chunks):
            raise AssertionError(f"{len(chunks)} chunks gave {len(counts)} sentence breaks")
        return ids[ids != self._break_id], counts.astype(np.int64)

    def _document_facts(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """int64 [D] UTF-8 bytes and bool [D] held out, of each document's text."""
        text_bytes = np.zeros(len(texts), np.int64)
        heldout = np.zeros(len(texts), bool)
        for d, text in enumerate(texts):
            encoded = text.encode("utf-8", "surrogatepass")
            text_bytes[d] = len(encoded)
            digest = hashlib.blake2b(encoded, digest_size=8, key=self._hash_key).digest()
            heldout[d] = int.from_bytes(digest, "little") < self._heldout_threshold
        return text_bytes, heldout

    def _encode_documents(self, texts: list[str]) -> TokenizedDocuments:
        """A document per call, for tokenizers the table-driven path does not cover."""
        ids = [
            encoding.ids
            for encoding in (self._full.encode_batch_fast(texts, add_special_tokens=False) if texts else [])
        ]
        return self._to_arrays(texts, ids)

    def _to_arrays(self, texts: list[str], ids: list[list[int]]) -> TokenizedDocuments:
        tokens: list[np.ndarray] = []
        sentence_starts = [0]
        document_starts = [0]
        keep = []
        position = 0
        for document_ids in ids:
            array = np.asarray(document_ids, dtype=np.int32)
            breaks = np.flatnonzero(array == self._break_id)
            starts = np.concatenate([[0], breaks + 1])
            ends = np.concatenate([breaks, [len(array)]])
            nonempty = ends > starts
            keep.append(bool(nonempty.any()))
            if not keep[-1]:
                continue
            lengths = (ends - starts)[nonempty]
            tokens.append(array[array != self._break_id])
            sentence_starts.extend((position + np.cumsum(lengths)).tolist())
            position += int(lengths.sum())
            document_starts.append(len(sentence_starts) - 1)
        text_bytes, heldout = self._document_facts(texts)
        kept = np.asarray(keep, dtype=bool)
        return TokenizedDocuments(
            np.concatenate(tokens) if tokens else np.zeros(0, np.int32),
            np.asarray(sentence_starts, dtype=np.int64),
            np.asarray(document_starts, dtype=np.int64),
            text_bytes[kept] if len(texts) else np.zeros(0, np.int64),
            heldout[kept] if len(texts) else np.zeros(0, bool),
        )


class _ChunkIndex(dict[str, int]):
    """Chunk -> row of the chunk table; a chunk not yet there gets the next row and is listed in
    ``unseen`` (``dict.__getitem__`` calls ``__missing__``, so ``map`` over it runs at C speed)."""

    unseen: list[str]

    def __missing__(self, chunk: str) -> int:
        index = self[chunk] = len(self)
        self.unseen.append(chunk)
        return index


def _printable_ascii(chunk: str) -> bool:
    return chunk.isascii() and chunk.isprintable()


def _without_added_tokens(tokenizer: Tokenizer, normalizer: bool = True) -> Tokenizer:
    """The tokenizer's normalizer (unless ``normalizer`` is false), pre-tokenizer and WordPiece
    model, with only the sentence break added (matched before normalization, so the normalizer
    cannot touch it)."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    bare = Tokenizer(copy.model)
    if normalizer:
        bare.normalizer = copy.normalizer
    bare.pre_tokenizer = copy.pre_tokenizer
    bare.add_special_tokens([AddedToken(_SENTENCE_BREAK, special=True, normalized=False)])
    return bare


def save_piece(documents: TokenizedDocuments, path: Path) -> None:
    """Write ``documents`` to the ``.npz`` file ``path``, synced and renamed into place whole
    (:func:`bertjob_api.files.write_atomically`).

    Raises:
        bertjob_api.files.DiskFullError: no space left; nothing is left at ``path``.
    """
    arrays = [getattr(documents, field.name) for field in dataclasses.fields(documents)]
    write_atomically(
        path,
        lambda file: np.savez(
            file,
            tokens=documents.tokens,
            sentence_starts=documents.sentence_starts,
            document_starts=documents.document_starts,
            text_bytes=documents.text_bytes,
            heldout=documents.heldout,
        ),
        sum(array.nbytes for array in arrays),
    )


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
