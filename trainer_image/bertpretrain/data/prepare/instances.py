"""Pretraining instances on arrays of token ids: Google's next-sentence-prediction pairs for the
objective ``mlm-nsp``, single segments of whole sentences for ``mlm``.

``mlm-nsp`` (:func:`create_pairs`) is google-research/bert ``create_pretraining_data.py``
(Devlin et al. 2019):

* ``dupe_factor`` passes over the documents; in each, every document is cut into instances.
  The data stage makes held-out shards with :data:`HELDOUT_DUPE_FACTOR` (one) pass instead.
* A document's target length is ``max_seq_length - 3`` ([CLS], [SEP], [SEP]), or, with
  probability ``short_seq_prob``, a uniform draw from ``[2, max_seq_length - 3]`` (to lessen the
  mismatch with the short inputs of fine-tuning); it holds for the whole document in that pass.
* Whole sentences are gathered into a chunk until it reaches the target (or the document ends).
  Segment A is the chunk's first ``a_end`` sentences, ``a_end`` uniform in ``[1, n - 1]``.
* B is the rest of the chunk, except that with probability 0.5, and always for a one-sentence
  chunk, B is taken from a random other document (up to 10 draws to avoid this one): from a
  random sentence on, until it reaches the target length minus A's. The chunk's sentences after A
  then go unused and start the next chunk ("put back", so that no text is wasted).
* ``truncate_seq_pair`` trims the longer of A and B (B when equal), one token at a time from a
  random end, until both fit in ``max_seq_length - 3``.
* Instances are shuffled.

``mlm`` (:func:`create_segments`, masked LM without next sentence prediction) makes one segment
``[CLS] A [SEP]`` per instance, as RoBERTa's DOC-SENTENCES inputs (Liu et al. 2019, section 4.2:
full sentences, contiguous, never across a document boundary, no NSP; Cramming, Geiping and
Goldstein 2022, and MosaicBERT, Portes et al. 2023, also train MLM alone on single segments). The
chunks are Google's, so that the two objectives see the same text in the same units:

* the same passes, and the same target per document and pass: ``max_seq_length - 2`` ([CLS],
  [SEP]), or with probability ``short_seq_prob`` a uniform draw from ``[2, max_seq_length - 2]``;
* whole sentences gathered into a chunk until it reaches the target or the document ends; the
  chunk is A, and the next chunk starts with the next sentence;
* a chunk longer than ``max_seq_length - 2`` (one long sentence, or the last sentence
  overshooting) loses its excess as ``truncate_seq_pair`` trims one side: each token from the
  front or the back at random. RoBERTa instead ends a chunk before the sentence that would not
  fit; reaching the target and trimming, as Google does, fills the rows (less padding) and keeps
  the two objectives' instances alike.
* Instances are shuffled.

How we differ from Google, and why (documented in ``docs/design.md``):

* Draws come from numpy's and Python's generators seeded per shard, not from Google's single
  ``random.Random``: same distributions, different values. Truncation draws how many tokens
  each side loses at its front as one binomial, which is the distribution of Google's token-by-
  token coin flips.
* The random other document, and the shuffle, are within one shard's documents rather than the
  whole corpus (as NVIDIA's pipeline, which runs Google's script per shard, does too): memory is
  bounded by a shard, not the corpus. Shards draw their documents from all over the corpus.

Only sentence boundaries are handled in Python (a few operations per pair: the sentence that ends
a chunk or a random B is found by binary search); the tokens are gathered, truncated and masked
with array operations (``bertpretrain.data.format.masking``).
"""

from __future__ import annotations

import array
import random
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bertpretrain.data.format.vocab import SpecialIds
from bertpretrain.data.prepare.documents import TokenizedDocuments

# Passes over the held-out documents, whatever dupe_factor is (the data stage's choice, not Google's):
# with dupe_factor passes, N held-out rows held about N / dupe_factor distinct segments, each masked
# anew, so accuracy measured on them had a standard error up to sqrt(dupe_factor) times what N
# independent rows give (that much if the copies' masks were alike).
HELDOUT_DUPE_FACTOR = 1

# Instances materialised per array operation: bounds the temporary [rows, max_seq_length] arrays.
_ROWS_PER_BLOCK = 8192


@dataclass(frozen=True)
class InstanceParams:
    """How instances are made; names and defaults as in Google's script.

    ``next_sentence_prediction``: sentence pairs for the objective ``mlm-nsp`` (:func:`create_pairs`)
    when true, single segments for ``mlm`` (:func:`create_segments`) when false.
    """

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    next_sentence_prediction: bool = True


@dataclass(frozen=True)
class Pairs:
    """Sentence pairs before masking, as spans of ``TokenizedDocuments.tokens``; N pairs.

    Segment A is ``tokens[a_start:a_end]`` and B ``tokens[b_start:b_end]`` (int32 [N] each, int64 for a
    shard of 2^31 tokens or more; after truncation); ``is_random_next`` bool [N] is true when B
    does not follow A in the corpus. An empty B (``b_start == b_end == a_end``, ``is_random_next``
    false) makes a single segment ``[CLS] A [SEP]``, as :func:`create_segments` makes them.
    """

    a_start: np.ndarray
    a_end: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    is_random_next: np.ndarray

    def __len__(self) -> int:
        return len(self.a_start)

    def __getitem__(self, rows: slice) -> Pairs:
        """The pairs of ``rows`` (a slice), as views."""
        return Pairs(self.a_start[rows], self.a_end[rows], self.b_start[rows], self.b_end[rows],
                     self.is_random_next[rows])  # fmt: skip

    @property
    def lengths(self) -> np.ndarray:
        """int [N], the spans' dtype: tokens of each instance, [CLS] and both [SEP] included (one
        [SEP] where B is empty)."""
        return (self.a_end - self.a_start) + (self.b_end - self.b_start) + 3 - (self.b_end == self.b_start)


def create_pairs(documents: TokenizedDocuments, params: InstanceParams, rng: np.random.Generator) -> Pairs:
    """All sentence pairs of ``dupe_factor`` passes over ``documents``, shuffled, truncated.

    Each document must hold a sentence and each sentence a token (as ``DocumentEncoder`` makes
    them). ``rng`` drives every draw, so the same generator state gives the same pairs.

    Raises:
        ValueError: ``max_seq_length`` leaves no room for two one-token segments.
    """
    max_num_tokens = params.max_seq_length - 3
    if max_num_tokens < 2:
        raise ValueError(f"max_seq_length {params.max_seq_length} is too short for a sentence pair")
    table = _spans(documents, params, max_num_tokens, _document_pairs, 5, rng)
    a_start, a_end, b_start, b_end = _truncate(
        table[:, 0], table[:, 1], table[:, 2], table[:, 3], max_num_tokens, rng
    )
    random_next = table[:, 4].astype(bool)
    del table
    order = rng.permutation(len(a_start))
    return Pairs(a_start[order], a_end[order], b_start[order], b_end[order], random_next[order])


def _spans(
    documents: TokenizedDocuments,
    params: InstanceParams,
    max_num_tokens: int,
    per_document: Callable[..., None],
    columns: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """What ``per_document`` (:func:`_document_pairs` or :func:`_document_segments`) emits over
    ``dupe_factor`` passes of every document, as int32 [N, ``columns``] (int64 for a shard of 2^31
    tokens or more); its draws come from one ``random.Random`` seeded from ``rng``."""
    # Plain ints in an array, not tuples of Python ints: a shard's pairs take 20 bytes each.
    wide = len(documents.tokens) >= 2**31
    spans = array.array("q" if wide else "i")
    uniform = random.Random(int(rng.integers(2**63))).random
    sentence_starts = documents.sentence_starts.tolist()
    document_starts = documents.document_starts.tolist()
    for _ in range(params.dupe_factor):
        for document in range(documents.num_documents):
            per_document(
                document,
                document_starts,
                sentence_starts,
                max_num_tokens,
                params.short_seq_prob,
                uniform,
                spans.extend,
            )
    return np.frombuffer(spans, dtype=np.int64 if wide else np.int32).reshape(-1, columns)


def _document_pairs(
    document: int,
    document_starts: list[int],
    sentence_starts: list[int],
    max_num_tokens: int,
    short_seq_prob: float,
    uniform: Callable[[], float],
    emit: Callable[[tuple[int, int, int, int, int]], None],
) -> None:
    """Emit one document's pairs, untruncated, as ``(a_start, a_end, b_start, b_end,
    is_random_next)``. Google's ``create_instances_from_document`` on sentence boundaries;
    ``uniform`` draws from [0, 1) (Google's ``rng.randint(a, b)`` is ``a + int(uniform() * (b - a + 1))``)."""
    first, end = document_starts[document], document_starts[document + 1]
    num_documents = len(document_starts) - 1
    target = max_num_tokens
    if uniform() < short_seq_prob:
        target = 2 + int(uniform() * (max_num_tokens - 1))
    chunk_start = first
    i = first
    while i < end:
        # The chunk grows to the first sentence i at which it reaches the target, or the document's
        # last. Sentences are contiguous, so a chunk's length is a difference of starts, which grows
        # with i: a binary search (in C) finds that i instead of a Python step per sentence.
        i = bisect_left(sentence_starts, sentence_starts[chunk_start] + target, i + 1, end) - 1
        chunk = i + 1 - chunk_start
        a_end = chunk_start + (1 + int(uniform() * (chunk - 1)) if chunk >= 2 else 1)
        a_lo, a_hi = sentence_starts[chunk_start], sentence_starts[a_end]
        if chunk == 1 or uniform() < 0.5:
            for _ in range(10):
                other = int(uniform() * num_documents)
                if other != document:
                    break
            other_first, other_end = document_starts[other], document_starts[other + 1]
            sentence = other_first + int(uniform() * (other_end - other_first))
            b_lo = sentence_starts[sentence]
            b_target = b_lo + target - (a_hi - a_lo)
            # B runs to its first sentence that reaches b_target, or the other document's last.
            sentence = bisect_left(sentence_starts, b_target, sentence + 1, other_end) - 1
            b_hi = sentence_starts[sentence + 1]
            is_random_next = 1
            # The chunk's sentences after A went unused: the next chunk starts with them.
            i = a_end - 1
        else:
            b_lo, b_hi = a_hi, sentence_starts[i + 1]
            is_random_next = 0
        emit((a_lo, a_hi, b_lo, b_hi, is_random_next))
        chunk_start = i + 1
        i += 1


def create_segments(documents: TokenizedDocuments, params: InstanceParams, rng: np.random.Generator) -> Pairs:
    """All single segments of ``dupe_factor`` passes over ``documents`` (objective ``mlm``),
    shuffled, truncated, as :class:`Pairs` with an empty B (see the module docstring).

    Each document must hold a sentence and each sentence a token (as ``DocumentEncoder`` makes
    them). ``rng`` drives every draw, so the same generator state gives the same segments.

    Returns:
        Pairs of N segments: ``a_start``/``a_end`` int32 [N] (int64 for 2^31 tokens or more), each
        span within one document and at most ``max_seq_length - 2`` long; ``b_start == b_end ==
        a_end``; ``is_random_next`` bool [N], all false.

    Raises:
        ValueError: ``max_seq_length`` leaves no room for a segment of two tokens.
    """
    max_num_tokens = params.max_seq_length - 2
    if max_num_tokens < 2:
        raise ValueError(f"max_seq_length {params.max_seq_length} is too short for a segment")
    table = _spans(documents, params, max_num_tokens, _document_segments, 2, rng)
    # An empty B: _truncate then trims A alone, as truncate_seq_pair trims the longer side.
    a_start, a_end, _, _ = _truncate(table[:, 0], table[:, 1], table[:, 1], table[:, 1], max_num_tokens, rng)
    del table
    order = rng.permutation(len(a_start))
    a_start, a_end = a_start[order], a_end[order]
    return Pairs(a_start, a_end, a_end, a_end, np.zeros(len(a_start), bool))


def _document_segments(
    document: int,
    document_starts: list[int],
    sentence_starts: list[int],
    max_num_tokens: int,
    short_seq_prob: float,
    uniform: Callable[[], float],
    emit: Callable[[tuple[int, int]], None],
) -> None:
    """Emit one document's chunks of whole sentences, untruncated, as ``(start, end)`` token
    indices: :func:`_document_pairs`' chunks and target, each chunk a segment of its own."""
    first, end = document_starts[document], document_starts[document + 1]
    target = max_num_tokens
    if uniform() < short_seq_prob:
        target = 2 + int(uniform() * (max_num_tokens - 1))
    chunk_start = first
    while chunk_start < end:
        # The chunk's last sentence: the first at which it reaches the target, or the document's last.
        last = bisect_left(sentence_starts, sentence_starts[chunk_start] + target, chunk_start + 1, end) - 1
        emit((sentence_starts[chunk_start], sentence_starts[last + 1]))
        chunk_start = last + 1


def _truncate(
    a_start: np.ndarray,
    a_end: np.ndarray,
    b_start: np.ndarray,
    b_end: np.ndarray,
    max_num_tokens: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Google's ``truncate_seq_pair`` for all pairs at once.

    The token-by-token loop trims the longer side (B when equal) until the pair fits. So the
    longer side first loses the difference in length, then the two lose tokens in turn, B first;
    each token comes off the front or the back with equal probability, so the number taken from
    the front is binomial.
    """
    length_a, length_b = a_end - a_start, b_end - b_start
    excess = np.maximum(length_a + length_b - max_num_tokens, 0)
    difference = np.abs(length_a - length_b)
    first = np.minimum(excess, difference)
    rest = excess - first
    a_longer = length_a > length_b
    trim_a = np.where(a_longer, first, 0) + rest // 2
    trim_b = np.where(a_longer, 0, first) + rest - rest // 2
    front_a = rng.binomial(trim_a, 0.5).astype(a_start.dtype)
    front_b = rng.binomial(trim_b, 0.5).astype(a_start.dtype)
    return a_start + front_a, a_end - (trim_a - front_a), b_start + front_b, b_end - (trim_b - front_b)


def assemble(
    pairs: Pairs, tokens: np.ndarray, max_seq_length: int, special: SpecialIds
) -> dict[str, np.ndarray]:
    """The unmasked instances ``[CLS] A [SEP] B [SEP]``, or ``[CLS] A [SEP]`` where B is empty,
    zero-padded, in NVIDIA's dtypes.

    Returns ``input_ids`` int32 [N, L], ``input_mask`` int8 [N, L] (1 for tokens, 0 padding),
    ``segment_ids`` int8 [N, L] (1 for ``B [SEP]``, so all 0 for a single segment) and
    ``next_sentence_labels`` int8 [N] (1 for a random next sentence; 0 for a single segment,
    whose shards leave it out), with L = ``max_seq_length``.

    Raises:
        ValueError: a pair does not fit in ``max_seq_length``.
    """
    lengths = pairs.lengths
    if len(lengths) and lengths.max() > max_seq_length:
        raise ValueError(f"a pair of {lengths.max()} tokens does not fit max_seq_length {max_seq_length}")
    count = len(pairs)
    arrays: dict[str, np.ndarray] = {
        "input_ids": np.zeros((count, max_seq_length), np.int32),
        "input_mask": np.zeros((count, max_seq_length), np.int8),
        "segment_ids": np.zeros((count, max_seq_length), np.int8),
        "next_sentence_labels": pairs.is_random_next.astype(np.int8),
    }
    # In the pairs' dtype (int32 for any shard under 2^31 tokens): half the memory traffic of int64.
    column = np.arange(max_seq_length, dtype=pairs.a_start.dtype)[None, :]
    for start in range(0, count, _ROWS_PER_BLOCK):
        rows = slice(start, start + _ROWS_PER_BLOCK)
        length_a = (pairs.a_end[rows] - pairs.a_start[rows])[:, None]
        length = lengths[rows][:, None].astype(column.dtype)
        # Column c holds tokens[a_start + c - 1] in A, tokens[b_start + c - length_a - 2] in B: the
        # offset is chosen per row and column, then the column added in place.
        source = np.where(
            column > length_a, pairs.b_start[rows][:, None] - length_a - 2, pairs.a_start[rows][:, None] - 1
        )
        source += column
        # mode="clip" keeps [CLS], [SEP] and padding columns in bounds in the same pass as the gather.
        ids = tokens.take(source, mode="clip") if len(tokens) else np.zeros_like(source)
        ids[:, 0] = special.cls
        np.copyto(ids, special.sep, where=(column == length_a + 1) | (column == length - 1))
        real = column < length
        np.multiply(ids, real, out=arrays["input_ids"][rows])
        arrays["input_mask"][rows] = real
        np.logical_and(real, column > length_a + 1, out=arrays["segment_ids"][rows], casting="unsafe")
    return arrays
