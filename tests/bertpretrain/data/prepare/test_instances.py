"""Sentence pairs on arrays (``bertpretrain.data.prepare.instances``) against Google's algorithm.

The oracle is ``google_reference``, the project's draw-for-draw port of Google's
``create_pretraining_data.py``. The two make different draws, so they are compared by their
statistics on a real corpus (the Python docs, tokenized with a vocabulary trained on them), and
by exact invariants on the arrays and on small corpora built so that the draws show.

Statistics of the pairs (random-next share, share of short pairs, share of full pairs, mean
length, masked positions per pair) vary a lot from one pass over the corpus to the next: a
document draws its short target once per pass, and a large document with a small target makes
hundreds of pairs. So they are estimated by stratification: one run with ``short_seq_prob`` 0
and one with 1, mixed with the weights 0.9 and 0.1. Each document draws its target on its own,
so the expected count of any kind of pair in a pass is exactly that mixture; the estimate is
about five times tighter than a run at 0.1 of the same cost. A corpus of one-token sentences, in
which each document's target shows, checks the draw at 0.1 itself. The reference's pairs are made
without its masking (five times faster); its masking is compared on a run of its own.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pytest

from bertjob_api.spec import SourceSpec
from bertpretrain.data.format.masking import mask_tokens
from bertpretrain.data.format.vocab import SpecialIds, load_tokenizer
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS
from bertpretrain.data.prepare.corpus.sources import read_source
from bertpretrain.data.prepare.corpus.splitting import sentences
from bertpretrain.data.prepare.documents import DocumentEncoder, TokenizedDocuments
from bertpretrain.data.prepare.instances import InstanceParams, Pairs, assemble, create_pairs, create_segments
from bertpretrain.data.prepare.vocab import train_vocab
from tests.bertpretrain import google_reference

TOLERANCE = 0.01  # absolute, on every share (the requirement)
VOCAB_SIZE = 2000


@dataclass(frozen=True)
class Corpus:
    """The Python docs as ``TokenizedDocuments`` and as the reference's nested lists of ids."""

    documents: TokenizedDocuments
    lists: list[list[list[int]]]
    special: SpecialIds
    vocab_size: int

    def document_of(self, token: np.ndarray) -> np.ndarray:
        """The document holding each token index."""
        starts = self.documents.sentence_starts[self.documents.document_starts]
        return np.searchsorted(starts, token, side="right") - 1

    def is_sentence_start(self, token: np.ndarray) -> np.ndarray:
        """Whether each token index starts a sentence (or is the end of all tokens)."""
        return np.isin(token, self.documents.sentence_starts)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    texts = [sentences(raw) for raw in read_source(SourceSpec(path=BUILTIN_PYTHON_DOCS), Counter())]
    vocab_dir = train_vocab(
        (s for text in texts for s in text), VOCAB_SIZE, True, tmp_path_factory.mktemp("v")
    )
    tokenizer = load_tokenizer(vocab_dir)
    documents = DocumentEncoder(tokenizer, seed=0, heldout_fraction=0.0).encode(texts)
    assert documents.num_documents > 400 and len(documents.tokens) > 300_000
    tokens, sentence_starts = documents.tokens.tolist(), documents.sentence_starts.tolist()
    lists = [
        [tokens[sentence_starts[s] : sentence_starts[s + 1]] for s in range(first, end)]
        for first, end in zip(documents.document_starts[:-1], documents.document_starts[1:], strict=True)
    ]
    special = SpecialIds.of(tokenizer, vocab_dir)
    return Corpus(documents, lists, special, tokenizer.get_vocab_size())


def make_documents(sentence_lengths: Sequence[Sequence[int]]) -> TokenizedDocuments:
    """Documents of sentences of the given lengths; token ``k`` has id ``5 + k % 1000``."""
    lengths = [n for document in sentence_lengths for n in document]
    sentence_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    document_starts = np.concatenate([[0], np.cumsum([len(d) for d in sentence_lengths])]).astype(np.int64)
    tokens = (5 + np.arange(sentence_starts[-1]) % 1000).astype(np.int32)
    count = len(sentence_lengths)
    return TokenizedDocuments(tokens, sentence_starts, document_starts, np.zeros(count, np.int64),
                              np.zeros(count, bool))  # fmt: skip


def google_num_to_predict(params: InstanceParams) -> np.ndarray:
    """Google's masked positions for each instance length (a lookup table): Python's round."""
    return np.array(
        [
            min(params.max_predictions_per_seq, max(1, round(length * params.masked_lm_prob)))
            for length in range(params.max_seq_length + 1)
        ]
    )


# --- statistics on the real corpus -------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    params: InstanceParams
    reference_passes: tuple[int, int]  # the reference's dupe_factor at short_seq_prob 0 and 1


SETTINGS = [
    Setting(InstanceParams(max_seq_length=128, max_predictions_per_seq=20), (12, 20)),
    Setting(InstanceParams(max_seq_length=512, max_predictions_per_seq=80), (24, 32)),
]
NEW_PASSES = 4  # times the reference's passes: ours are cheap, and this leaves the noise to the reference

# Per-pair statistics, as shares of pairs (the last two scaled to [0, 1]):
# * random_next: B is not A's continuation;
# * short: A + B hold fewer than half of max_num_tokens (= max_seq_length - 3). A normal target
#   (max_num_tokens) gathers sentences until it is reached, so its pairs fill the room except at a
#   document's end; a short target is uniform in [2, max_num_tokens], so half of its pairs aim at
#   less than half the room. With short_seq_prob 0.1 the share is about 0.09 (128) and 0.11 (512)
#   above its value at 0, ten times the tolerance (test_short_share_measures_short_targets);
# * full: the pair fills max_seq_length exactly (what truncation leaves of a long chunk);
# * fill: mean length / max_seq_length;
# * masked: mean of Google's num_to_predict for the pair's length / max_predictions_per_seq.
STATISTICS = ("random_next", "short", "full", "fill", "masked")


def pair_sums(lengths: np.ndarray, random_next: np.ndarray, params: InstanceParams) -> np.ndarray:
    """[instances, then the sum over instances of each of STATISTICS]."""
    max_num_tokens = params.max_seq_length - 3
    return np.array(
        [
            len(lengths),
            np.sum(random_next),
            np.sum(lengths - 3 < max_num_tokens / 2),
            np.sum(lengths == params.max_seq_length),
            np.sum(lengths) / params.max_seq_length,
            np.sum(google_num_to_predict(params)[lengths]) / params.max_predictions_per_seq,
        ],
        dtype=float,
    )


@dataclass(frozen=True)
class PairStatistics:
    mixed: dict[str, float]  # at params.short_seq_prob, by stratification
    normal: dict[str, float]  # at short_seq_prob 0
    instances: int


def stratified(
    sums_of: Callable[[InstanceParams, int], np.ndarray], params: InstanceParams, passes: tuple[int, int]
) -> PairStatistics:
    """STATISTICS at ``params.short_seq_prob`` from a run of ``passes[0]`` passes with only normal
    targets and one of ``passes[1]`` passes with only short targets; ``sums_of(params, seed)``."""
    normal = sums_of(replace(params, short_seq_prob=0.0, dupe_factor=passes[0]), 1) / passes[0]
    short = sums_of(replace(params, short_seq_prob=1.0, dupe_factor=passes[1]), 2) / passes[1]
    mixed = (1 - params.short_seq_prob) * normal + params.short_seq_prob * short
    return PairStatistics(
        {name: mixed[i + 1] / mixed[0] for i, name in enumerate(STATISTICS)},
        {name: normal[i + 1] / normal[0] for i, name in enumerate(STATISTICS)},
        int(normal[0] * passes[0] + short[0] * passes[1]),
    )


def _unmasked(input_ids: list[int], *_: object) -> tuple[list[int], list[int], list[int]]:
    return list(input_ids), [], []


def reference_instances(
    corpus: Corpus, params: InstanceParams, seed: int, masking: bool = True
) -> list[google_reference.TrainingInstance]:
    """The reference's instances. Without ``masking``, five times faster: masking draws from the
    same generator but is independent of the pairs, so it does not change their distribution."""
    with pytest.MonkeyPatch.context() as patch:
        if not masking:
            patch.setattr(google_reference, "create_masked_lm_predictions", _unmasked)
        return google_reference.create_training_instances(
            corpus.lists, params, corpus.special, corpus.vocab_size, random.Random(seed)
        )


@pytest.fixture(scope="module", params=SETTINGS, ids=lambda s: f"seq{s.params.max_seq_length}")
def setting(request: pytest.FixtureRequest) -> Setting:
    return request.param


@pytest.fixture(scope="module")
def pair_statistics(setting: Setting, corpus: Corpus) -> dict[str, PairStatistics]:
    def new(params: InstanceParams, seed: int) -> np.ndarray:
        sums = np.zeros(len(STATISTICS) + 1)
        for block in range(0, params.dupe_factor, 16):  # bounded memory
            block_params = replace(params, dupe_factor=min(16, params.dupe_factor - block))
            pairs = create_pairs(corpus.documents, block_params, np.random.default_rng([seed, block]))
            sums += pair_sums(pairs.lengths, pairs.is_random_next, params)
        return sums

    def reference(params: InstanceParams, seed: int) -> np.ndarray:
        made = reference_instances(corpus, params, seed, masking=False)
        lengths = np.array([len(instance.input_ids) for instance in made])
        return pair_sums(lengths, np.array([instance.is_random_next for instance in made]), params)

    passes = setting.reference_passes
    return {
        "new": stratified(new, setting.params, (NEW_PASSES * passes[0], NEW_PASSES * passes[1])),
        "reference": stratified(reference, setting.params, passes),
    }


@pytest.mark.parametrize("statistic", STATISTICS)
def test_pair_statistics_match_google(pair_statistics: dict[str, PairStatistics], statistic: str) -> None:
    new, reference = pair_statistics["new"], pair_statistics["reference"]
    assert reference.instances > 50_000
    assert new.mixed[statistic] == pytest.approx(reference.mixed[statistic], abs=TOLERANCE)
    assert new.normal[statistic] == pytest.approx(reference.normal[statistic], abs=TOLERANCE)


def test_short_share_measures_short_targets(pair_statistics: dict[str, PairStatistics]) -> None:
    # Without this, the comparison of "short" could not tell short_seq_prob 0.1 from 0.
    for side in pair_statistics.values():
        assert side.mixed["short"] - side.normal["short"] > 5 * TOLERANCE


@dataclass(frozen=True)
class Sample:
    """Our instances at short_seq_prob 0.1, assembled and masked, and the reference's."""

    params: InstanceParams
    pairs: Pairs
    arrays: dict[str, np.ndarray]  # assemble's
    masked: dict[str, np.ndarray]  # mask_tokens'
    reference: list[google_reference.TrainingInstance]


@pytest.fixture(scope="module")
def sample(setting: Setting, corpus: Corpus) -> Sample:
    params = setting.params
    rng = np.random.default_rng(3)
    pairs = create_pairs(corpus.documents, replace(params, dupe_factor=2), rng)
    arrays = assemble(pairs, corpus.documents.tokens, params.max_seq_length, corpus.special)
    masked = mask_tokens(
        arrays["input_ids"], arrays["input_mask"], params.max_predictions_per_seq, params.masked_lm_prob,
        corpus.special, corpus.vocab_size, rng,
    )  # fmt: skip
    reference = reference_instances(corpus, replace(params, dupe_factor=1), seed=3)
    return Sample(params, pairs, arrays, masked, reference)


def outcome_shares(now: np.ndarray, original: np.ndarray, mask: int) -> dict[str, float]:
    """Shares of masked positions now [MASK], still the original, and another id."""
    is_mask = now == mask
    kept = ~is_mask & (now == original)
    return {"mask": is_mask.mean(), "kept": kept.mean(), "random": (~is_mask & ~kept).mean()}


def test_masking_statistics_match_google_and_theory(sample: Sample, corpus: Corpus) -> None:
    params = sample.params
    num_to_predict = google_num_to_predict(params)
    # Ours: exactly Google's count for each instance's length, so the mean is the theory's.
    positions, labels = sample.masked["masked_lm_positions"], sample.masked["masked_lm_ids"]
    counts = np.count_nonzero(positions, axis=1)
    theory = num_to_predict[sample.pairs.lengths]
    np.testing.assert_array_equal(counts, theory)
    assert counts.mean() == pytest.approx(theory.mean(), abs=1e-9)
    valid = positions > 0
    new = outcome_shares(np.take_along_axis(sample.masked["input_ids"], positions, 1)[valid], labels[valid],
                         corpus.special.mask)  # fmt: skip
    # The reference: the same for its own lengths.
    reference_counts = [len(instance.masked_lm_positions) for instance in sample.reference]
    assert reference_counts == [num_to_predict[len(instance.input_ids)] for instance in sample.reference]
    now = [instance.input_ids[p] for instance in sample.reference for p in instance.masked_lm_positions]
    original = [label for instance in sample.reference for label in instance.masked_lm_ids]
    reference = outcome_shares(np.array(now), np.array(original), corpus.special.mask)
    # Google: 80% [MASK], 10% kept, 10% a uniform id, which is the original or [MASK] 1/V of the time.
    v = corpus.vocab_size
    expected = {"mask": 0.8 + 0.1 / v, "kept": 0.1 + 0.1 / v, "random": 0.1 - 0.2 / v}
    assert len(now) > 50_000 and valid.sum() > 50_000
    for outcome, share in expected.items():
        assert new[outcome] == pytest.approx(share, abs=TOLERANCE), outcome
        assert reference[outcome] == pytest.approx(share, abs=TOLERANCE), outcome
        assert new[outcome] == pytest.approx(reference[outcome], abs=TOLERANCE), outcome


# --- the arrays --------------------------------------------------------------------------------


def test_text_never_holds_special_ids(corpus: Corpus) -> None:
    # Masking and instance checks tell [CLS]/[SEP] apart by id: the text must not use them.
    special = corpus.special
    assert not np.isin(corpus.documents.tokens, [special.pad, special.cls, special.sep, special.mask]).any()


def test_assembled_rows_are_cls_a_sep_b_sep(sample: Sample, corpus: Corpus) -> None:
    pairs, arrays, special = sample.pairs, sample.arrays, corpus.special
    length = sample.params.max_seq_length
    tokens = corpus.documents.tokens
    assert arrays["input_ids"].dtype == np.int32 and arrays["input_ids"].shape == (len(pairs), length)
    assert arrays["input_mask"].dtype == arrays["segment_ids"].dtype == np.int8
    np.testing.assert_array_equal(arrays["next_sentence_labels"], pairs.is_random_next.astype(np.int8))
    assert arrays["next_sentence_labels"].dtype == np.int8
    for row in range(len(pairs)):
        a = tokens[pairs.a_start[row] : pairs.a_end[row]]
        b = tokens[pairs.b_start[row] : pairs.b_end[row]]
        used = len(a) + len(b) + 3
        padding = np.zeros(length - used, np.int32)
        expected = np.concatenate([[special.cls], a, [special.sep], b, [special.sep], padding])
        np.testing.assert_array_equal(arrays["input_ids"][row], expected)
        np.testing.assert_array_equal(arrays["input_mask"][row], np.arange(length) < used)
        segments = np.concatenate([np.zeros(len(a) + 2), np.ones(len(b) + 1), padding])
        np.testing.assert_array_equal(arrays["segment_ids"][row], segments)


def test_masked_positions_are_well_formed(sample: Sample, corpus: Corpus) -> None:
    special, params = corpus.special, sample.params
    unmasked, masked = sample.arrays["input_ids"], sample.masked["input_ids"]
    positions, labels = sample.masked["masked_lm_positions"], sample.masked["masked_lm_ids"]
    assert positions.shape == labels.shape == (len(unmasked), params.max_predictions_per_seq)
    assert positions.dtype == labels.dtype == masked.dtype == np.int32
    valid = positions > 0  # position 0 is [CLS]: 0 pads
    assert not (valid[:, 1:] & ~valid[:, :-1]).any()  # the padding comes last
    assert (np.diff(positions, axis=1)[valid[:, 1:]] > 0).all()  # increasing
    at = np.take_along_axis(unmasked, positions, 1)
    assert not np.isin(at[valid], [special.cls, special.sep]).any()
    assert np.take_along_axis(sample.arrays["input_mask"], positions, 1)[valid].all()  # never padding
    np.testing.assert_array_equal(labels, np.where(valid, at, 0))
    chosen = np.zeros(unmasked.shape, bool)
    np.put_along_axis(chosen, positions, valid, 1)
    chosen[:, 0] = False
    np.testing.assert_array_equal(masked[~chosen], unmasked[~chosen])
    replaced = masked[chosen]
    assert ((replaced >= 0) & (replaced < corpus.vocab_size)).all()


def test_pairs_keep_to_documents_and_sentences(sample: Sample, corpus: Corpus) -> None:
    pairs, max_num_tokens = sample.pairs, sample.params.max_seq_length - 3
    a_start, a_end, b_start, b_end = pairs.a_start, pairs.a_end, pairs.b_start, pairs.b_end
    assert ((a_start < a_end) & (b_start < b_end)).all()
    assert (pairs.lengths - 3 <= max_num_tokens).all()
    document = corpus.document_of
    # Each segment lies in one document.
    np.testing.assert_array_equal(document(a_start), document(a_end - 1))
    np.testing.assert_array_equal(document(b_start), document(b_end - 1))
    starts = corpus.is_sentence_start
    aligned = starts(a_start) & starts(a_end) & starts(b_start) & starts(b_end)
    actual = ~pairs.is_random_next
    # Truncation only trims the ends of A and B: a pair not cut at sentence boundaries, or with a gap
    # between A and B, was truncated, hence holds exactly max_num_tokens.
    trimmed = ~aligned | (actual & (b_start != a_end))
    assert trimmed.any() and (pairs.lengths[trimmed] - 3 == max_num_tokens).all()
    # B follows A in A's document: whatever was trimmed, A's untrimmed end (a sentence start) lies
    # between A's end and B's start.
    assert (document(a_start[actual]) == document(b_start[actual])).all()
    assert (a_end[actual] <= b_start[actual]).all()
    next_start = corpus.documents.sentence_starts[np.searchsorted(corpus.documents.sentence_starts, a_end)]
    assert (next_start[actual] <= b_start[actual]).all()
    assert (actual & ~trimmed).sum() > 0.1 * len(pairs)  # the untruncated case is well represented
    # A random B comes from another document (485 of them: 10 draws always find one).
    assert (document(a_start[~actual]) != document(b_start[~actual])).all()


def test_pairs_come_out_shuffled(sample: Sample, corpus: Corpus) -> None:
    # Pairs are made document by document, then shuffled all together (Google's last step): two
    # neighbours share a document as often as two pairs drawn at random do.
    document = corpus.document_of(sample.pairs.a_start)
    counts = np.bincount(document).astype(float)
    expected = np.sum(counts * (counts - 1)) / (len(document) * (len(document) - 1))
    assert np.mean(document[1:] == document[:-1]) == pytest.approx(expected, abs=TOLERANCE)


def test_same_seed_same_instances(corpus: Corpus) -> None:
    documents = corpus.documents.select(np.arange(corpus.documents.num_documents) < 60)
    params = InstanceParams(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)

    def make(seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        pairs = create_pairs(documents, params, rng)
        arrays = assemble(pairs, documents.tokens, params.max_seq_length, corpus.special)
        return {
            "a_start": pairs.a_start, "a_end": pairs.a_end, "b_start": pairs.b_start, "b_end": pairs.b_end,
            "random_next": pairs.is_random_next, **arrays,
            **mask_tokens(arrays["input_ids"], arrays["input_mask"], params.max_predictions_per_seq,
                          params.masked_lm_prob, corpus.special, corpus.vocab_size, rng),
        }  # fmt: skip

    first, again, other = make(1), make(1), make(2)
    assert len(first["a_start"]) > 500
    for name, values in first.items():
        np.testing.assert_array_equal(values, again[name], err_msg=name)
    assert not np.array_equal(first["a_start"], other["a_start"])
    assert not np.array_equal(first["masked_lm_positions"], other["masked_lm_positions"])


# --- small corpora where the draws show --------------------------------------------------------


@dataclass(frozen=True)
class TwoSentencePairs:
    """Pairs of documents of two sentences, the first shorter than the target (short_seq_prob 0),
    so that a pass over a document makes either the pair (first, second) or, for a random next, a
    pair from the first and then (put back) one from the second."""

    pairs: Pairs
    owner: np.ndarray  # the document of A
    in_first: np.ndarray  # whether A is (in) the first sentence
    front: np.ndarray  # actual-next pairs [M, 2]: tokens trimmed off the front of A and of B
    back: np.ndarray  # and off the back


def two_sentence_pairs(
    sizes: list[tuple[int, int]], max_seq_length: int, dupe_factor: int
) -> TwoSentencePairs:
    params = InstanceParams(max_seq_length, 1, short_seq_prob=0.0, dupe_factor=dupe_factor)
    assert all(first < max_seq_length - 3 for first, _ in sizes)
    documents = make_documents(sizes)
    pairs = create_pairs(documents, params, np.random.default_rng(5))
    first_start = documents.sentence_starts[documents.document_starts[:-1]]
    second_start = documents.sentence_starts[documents.document_starts[:-1] + 1]
    second_end = documents.sentence_starts[documents.document_starts[1:]]
    owner = np.searchsorted(first_start, pairs.a_start, side="right") - 1
    actual, document = ~pairs.is_random_next, owner[~pairs.is_random_next]
    front = np.stack(
        [pairs.a_start[actual] - first_start[document], pairs.b_start[actual] - second_start[document]], 1
    )
    back = np.stack(
        [second_start[document] - pairs.a_end[actual], second_end[document] - pairs.b_end[actual]], 1
    )
    return TwoSentencePairs(pairs, owner, pairs.a_start < second_start[owner], front, back)


def test_pairs_of_two_sentences_are_put_back_and_truncated_as_google_does() -> None:
    # Sentence lengths are every pair in [1, 16] x [1, 60], so that truncation meets every case.
    max_seq_length, dupe_factor = 20, 8
    sizes = [(a, b) for a in range(1, max_seq_length - 3) for b in range(1, 61)]
    made = two_sentence_pairs(sizes, max_seq_length, dupe_factor)
    actual = ~made.pairs.is_random_next
    assert not (actual & ~made.in_first).any()
    per_document = Counter(zip(made.owner.tolist(), actual.tolist(), made.in_first.tolist(), strict=True))
    for document in range(len(sizes)):
        random_from_first = per_document[(document, False, True)]
        assert random_from_first == per_document[(document, False, False)]
        assert random_from_first + per_document[(document, True, True)] == dupe_factor
    # Actual-next pairs: A is what is left of the first sentence, B of the second, as long as
    # Google's truncate_seq_pair leaves them.
    assert (made.front >= 0).all() and (made.back >= 0).all()
    kept = np.stack([made.pairs.a_end - made.pairs.a_start, made.pairs.b_end - made.pairs.b_start], 1)[actual]
    for document, (length_a, length_b) in zip(made.owner[actual].tolist(), kept.tolist(), strict=True):
        tokens_a, tokens_b = (list(range(n)) for n in sizes[document])
        google_reference.truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3, random.Random(0))
        assert (length_a, length_b) == (len(tokens_a), len(tokens_b)), sizes[document]
    trimmed = made.front + made.back
    np.testing.assert_array_equal(trimmed, np.array(sizes)[made.owner[actual]] - kept)
    assert (trimmed[:, 0] > 0).sum() > 100 and (trimmed[:, 1] > 0).sum() > 1000


def test_truncation_takes_each_token_from_either_end_at_random() -> None:
    # (90, 90) into 100 tokens: each side loses 40; (40, 200): B loses 140.
    made = two_sentence_pairs([(90, 90)] * 2000 + [(40, 200)] * 1000, 103, 4)
    for side in (0, 1):
        front, trimmed = made.front[:, side], made.front[:, side] + made.back[:, side]
        assert trimmed.sum() > 100_000
        # Each token from the front or the back with equal chances: the front's count is
        # binomial(trimmed, 1/2), whose variance is trimmed / 4.
        assert front.sum() / trimmed.sum() == pytest.approx(0.5, abs=TOLERANCE)
        assert np.sum((front - trimmed / 2) ** 2) / np.sum(trimmed / 4) == pytest.approx(1, abs=0.1)


def test_short_target_is_drawn_once_per_document_with_short_seq_prob() -> None:
    # One-token sentences: a chunk is exactly the target long, and a random B exactly the target
    # less A, unless they reach the end of their document. So those pairs show their document's
    # target (no truncation: it is at most max_num_tokens).
    params = InstanceParams(max_seq_length=23, max_predictions_per_seq=3, dupe_factor=1)
    max_num_tokens = params.max_seq_length - 3
    count = 4000
    documents = make_documents([[1] * 200] * count)
    pairs = create_pairs(documents, params, np.random.default_rng(11))
    owner = pairs.a_start // 200
    shows = pairs.b_end % 200 != 0  # B does not end its document
    assert shows[pairs.is_random_next].mean() > 0.8 and shows[~pairs.is_random_next].mean() > 0.8
    targets: dict[int, set[int]] = {}
    for document, length in zip(owner[shows].tolist(), (pairs.lengths[shows] - 3).tolist(), strict=True):
        targets.setdefault(document, set()).add(length)
    assert len(targets) > 0.99 * count
    assert all(len(seen) == 1 for seen in targets.values())  # one target per document and pass
    target = np.array([seen.pop() for seen in targets.values()])
    short = target[target < max_num_tokens]
    # short_seq_prob of the documents draw a target uniform in [2, max_num_tokens]; one value in
    # max_num_tokens - 1 is max_num_tokens itself, which does not show.
    expected = params.short_seq_prob * (max_num_tokens - 2) / (max_num_tokens - 1)
    assert len(short) / len(target) == pytest.approx(expected, abs=0.02)
    assert short.min() == 2 and short.max() == max_num_tokens - 1
    assert short.mean() == pytest.approx((2 + max_num_tokens - 1) / 2, abs=1.0)


def test_one_sentence_chunks_always_take_a_random_next() -> None:
    # Every sentence reaches the target alone: every chunk has one sentence, so B comes from
    # another document, and each sentence starts an A once per pass.
    params = InstanceParams(max_seq_length=20, max_predictions_per_seq=2, short_seq_prob=0.0, dupe_factor=3)
    documents = make_documents([[17, 30, 17]] * 50)
    pairs = create_pairs(documents, params, np.random.default_rng(2))
    assert len(pairs) == 50 * 3 * 3 and pairs.is_random_next.all()
    assert ((pairs.a_start // 64) != (pairs.b_start // 64)).all()
    sentence = np.searchsorted(documents.sentence_starts, pairs.a_start, side="right") - 1
    assert Counter(sentence.tolist()) == dict.fromkeys(range(documents.num_sentences), 3)


def test_one_document_takes_its_random_next_from_itself(corpus: Corpus) -> None:
    # Google draws another document ten times, then keeps what it drew: with one, it is the same.
    sizes = np.diff(corpus.documents.document_starts)
    only = corpus.documents.select(np.arange(len(sizes)) == np.argmax(sizes))
    params = InstanceParams(max_seq_length=128, max_predictions_per_seq=20, short_seq_prob=0.0, dupe_factor=2)
    pairs = create_pairs(only, params, np.random.default_rng(0))
    assert pairs.is_random_next.sum() > 100 and (~pairs.is_random_next).sum() > 100
    assert (pairs.b_end <= len(only.tokens)).all() and (pairs.lengths <= params.max_seq_length).all()
    arrays = assemble(pairs, only.tokens, params.max_seq_length, corpus.special)
    assert arrays["input_ids"].shape == (len(pairs), params.max_seq_length)
    reference = google_reference.create_training_instances(
        corpus.lists[int(np.argmax(sizes)) : int(np.argmax(sizes)) + 1], params, corpus.special,
        corpus.vocab_size, random.Random(0),
    )  # fmt: skip
    assert len(reference) == pytest.approx(len(pairs), rel=0.1)


def test_max_seq_length_must_leave_room_for_a_pair() -> None:
    documents = make_documents([[3, 4, 5]] * 10)
    with pytest.raises(ValueError, match="too short"):
        create_pairs(
            documents, InstanceParams(max_seq_length=4, max_predictions_per_seq=1), np.random.default_rng(0)
        )
    pairs = create_pairs(
        documents, InstanceParams(max_seq_length=5, max_predictions_per_seq=1), np.random.default_rng(0)
    )
    assert len(pairs) > 0 and (pairs.lengths == 5).all()


def test_assemble_rejects_a_pair_that_does_not_fit() -> None:
    documents = make_documents([[40, 50, 60]] * 10)
    pairs = create_pairs(
        documents, InstanceParams(max_seq_length=128, max_predictions_per_seq=20), np.random.default_rng(0)
    )
    assert pairs.lengths.max() > 64
    special = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
    with pytest.raises(ValueError, match="does not fit"):
        assemble(pairs, documents.tokens, 64, special)
    one = Pairs(np.array([0]), np.array([3]), np.array([3]), np.array([6]), np.array([False]))  # 3 + 3 tokens
    assert assemble(one, documents.tokens, 9, special)["input_ids"].shape == (1, 9)
    with pytest.raises(ValueError, match="does not fit"):
        assemble(one, documents.tokens, 8, special)


# --- single segments (objective mlm) -----------------------------------------------------------


def segments_by_pass(pairs: Pairs, documents: TokenizedDocuments) -> list[list[tuple[int, int]]]:
    """Each document's segments as ``(start, end)``, in corpus order (a document holds the same
    segments, one per pass, ``dupe_factor`` times over)."""
    starts = documents.sentence_starts[documents.document_starts]
    owner = np.searchsorted(starts, pairs.a_start, side="right") - 1
    made: list[list[tuple[int, int]]] = [[] for _ in range(documents.num_documents)]
    spans = zip(pairs.a_start.tolist(), pairs.a_end.tolist(), strict=True)
    for document, span in zip(owner.tolist(), spans, strict=True):
        made[document].append(span)
    return [sorted(spans) for spans in made]


def test_segments_are_cls_a_sep_within_one_document(corpus: Corpus) -> None:
    params = InstanceParams(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2,
                            next_sentence_prediction=False)  # fmt: skip
    pairs = create_segments(corpus.documents, params, np.random.default_rng(4))
    assert len(pairs) > 5000
    # An empty B at A's end, never a random next: the rest of the pipeline sees one segment.
    np.testing.assert_array_equal(pairs.b_start, pairs.a_end)
    np.testing.assert_array_equal(pairs.b_end, pairs.a_end)
    assert not pairs.is_random_next.any()
    lengths = pairs.a_end - pairs.a_start
    assert (lengths >= 1).all() and (pairs.lengths <= params.max_seq_length).all()
    np.testing.assert_array_equal(pairs.lengths, lengths + 2)
    np.testing.assert_array_equal(corpus.document_of(pairs.a_start), corpus.document_of(pairs.a_end - 1))
    # Whole sentences, unless truncated, and then exactly max_seq_length - 2 long.
    aligned = corpus.is_sentence_start(pairs.a_start) & corpus.is_sentence_start(pairs.a_end)
    assert (~aligned).any() and (lengths[~aligned] == params.max_seq_length - 2).all()
    assert aligned.mean() > 0.1  # the untruncated case is well represented
    # Most segments fill the row (the short_seq_prob share and documents' last chunks do not).
    assert np.mean(lengths == params.max_seq_length - 2) > 0.5

    arrays = assemble(pairs, corpus.documents.tokens, params.max_seq_length, corpus.special)
    ids, special = arrays["input_ids"], corpus.special
    assert not arrays["segment_ids"].any()
    real = np.arange(params.max_seq_length) < pairs.lengths[:, None]
    np.testing.assert_array_equal(arrays["input_mask"], real)
    assert (ids[:, 0] == special.cls).all()
    # Exactly one [SEP], the last token.
    sep_row, sep_column = np.nonzero(ids == special.sep)
    np.testing.assert_array_equal(sep_row, np.arange(len(pairs)))
    np.testing.assert_array_equal(sep_column, pairs.lengths - 1)
    for row in range(0, len(pairs), 97):
        np.testing.assert_array_equal(
            ids[row, 1 : lengths[row] + 1], corpus.documents.tokens[pairs.a_start[row] : pairs.a_end[row]]
        )


def test_segments_tile_each_document_in_corpus_order_when_nothing_is_truncated() -> None:
    # Chunks of sentences that sum to exactly the target (max_seq_length - 2 = 10), then a
    # shorter remainder: no chunk overshoots, so nothing is truncated.
    rng = np.random.default_rng(8)

    def sentences(total: int) -> list[int]:
        """Sentence lengths that add up to ``total``."""
        cuts = rng.choice(np.arange(1, total), int(rng.integers(0, total)), replace=False)
        return np.diff(np.sort(np.concatenate([[0, total], cuts]))).tolist()

    sizes, expected = [], []
    for _ in range(300):
        chunks = [sentences(10) for _ in range(rng.integers(0, 4))] + [sentences(int(rng.integers(1, 10)))]
        sizes.append([n for chunk in chunks for n in chunk])
        expected.append([sum(chunk) for chunk in chunks])
    documents = make_documents(sizes)
    params = InstanceParams(max_seq_length=12, max_predictions_per_seq=2, short_seq_prob=0.0, dupe_factor=3,
                            next_sentence_prediction=False)  # fmt: skip
    pairs = create_segments(documents, params, np.random.default_rng(1))
    starts = documents.sentence_starts[documents.document_starts]
    for document, spans in enumerate(segments_by_pass(pairs, documents)):
        lengths = np.array(expected[document])
        ends = starts[document] + np.cumsum(lengths)
        chunk_spans = list(zip((ends - lengths).tolist(), ends.tolist(), strict=True))
        # Each pass: the chunks in order, covering every token of the document once.
        assert spans == sorted(chunk_spans * params.dupe_factor), document
    covered = np.zeros(len(documents.tokens), np.int64)
    for start, end in zip(pairs.a_start.tolist(), pairs.a_end.tolist(), strict=True):
        covered[start:end] += 1
    assert (covered == params.dupe_factor).all()
    # Shuffled: not in the order they were made.
    assert (np.diff(pairs.a_start) < 0).mean() > 0.4


def test_long_segments_are_truncated_at_random_ends() -> None:
    # A 50-token sentence alone (the chunk of one long sentence), and a 6 + 6 chunk whose last
    # sentence overshoots the target of 10: both lose their excess, each token from the front or
    # the back at random.
    params = InstanceParams(max_seq_length=12, max_predictions_per_seq=2, short_seq_prob=0.0, dupe_factor=4,
                            next_sentence_prediction=False)  # fmt: skip
    documents = make_documents([[50]] * 1000 + [[6, 6]] * 1000)
    pairs = create_segments(documents, params, np.random.default_rng(6))
    assert len(pairs) == 2000 * params.dupe_factor
    assert (pairs.a_end - pairs.a_start == 10).all()
    first = documents.sentence_starts[documents.document_starts[:-1]]
    owner = np.searchsorted(first, pairs.a_start, side="right") - 1
    front = pairs.a_start - first[owner]
    for long, trimmed in ((owner < 1000, 40), (owner >= 1000, 2)):
        assert (front[long] >= 0).all() and (front[long] <= trimmed).all()
        # Binomial(trimmed, 1/2): mean trimmed / 2, variance trimmed / 4.
        assert front[long].mean() == pytest.approx(trimmed / 2, abs=0.1 * trimmed / 2 + 0.05)
        assert front[long].var() == pytest.approx(trimmed / 4, rel=0.15)


def segment_targets(short_seq_prob: float, count: int, seed: int) -> tuple[np.ndarray, int]:
    """Each document's target, as its segments show it, and max_num_tokens (max_seq_length - 2):
    with one-token sentences, every segment but a document's last is exactly the target long."""
    params = InstanceParams(max_seq_length=22, max_predictions_per_seq=3, short_seq_prob=short_seq_prob,
                            dupe_factor=1, next_sentence_prediction=False)  # fmt: skip
    documents = make_documents([[1] * 200] * count)
    pairs = create_segments(documents, params, np.random.default_rng(seed))
    owner = pairs.a_start // 200
    shows = pairs.a_end % 200 != 0  # not the document's last segment
    targets: dict[int, set[int]] = {}
    for document, length in zip(owner[shows].tolist(), (pairs.lengths[shows] - 2).tolist(), strict=True):
        targets.setdefault(document, set()).add(length)
    assert len(targets) == count and all(len(seen) == 1 for seen in targets.values())
    return np.array([seen.pop() for seen in targets.values()]), params.max_seq_length - 2


def test_segments_draw_a_short_target_once_per_document_with_short_seq_prob() -> None:
    target, max_num_tokens = segment_targets(0.1, 4000, 12)
    short = target[target < max_num_tokens]
    # Uniform in [2, max_seq_length - 2]: max_num_tokens itself does not show as short.
    expected = 0.1 * (max_num_tokens - 2) / (max_num_tokens - 1)
    assert len(short) / len(target) == pytest.approx(expected, abs=0.02)
    assert short.min() == 2 and short.max() == max_num_tokens - 1
    assert short.mean() == pytest.approx((2 + max_num_tokens - 1) / 2, abs=1.0)
    # Every document short: each target in [2, max_num_tokens] as often, max_num_tokens included.
    target, _ = segment_targets(1.0, 2000, 13)
    counts = np.bincount(target, minlength=max_num_tokens + 1)[2:]
    assert len(counts) == max_num_tokens - 1 and target.max() == max_num_tokens
    assert counts / len(target) == pytest.approx(np.full(len(counts), 1 / len(counts)), abs=0.02)


def test_same_seed_same_segments() -> None:
    documents = make_documents([[3, 9, 4, 12, 1, 7]] * 200)
    params = InstanceParams(max_seq_length=16, max_predictions_per_seq=2, dupe_factor=2,
                            next_sentence_prediction=False)  # fmt: skip
    first, again, other = (create_segments(documents, params, np.random.default_rng(s)) for s in (1, 1, 2))
    np.testing.assert_array_equal(first.a_start, again.a_start)
    np.testing.assert_array_equal(first.a_end, again.a_end)
    assert not np.array_equal(first.a_start, other.a_start)


def test_max_seq_length_must_leave_room_for_a_segment() -> None:
    documents = make_documents([[3, 4, 5]] * 10)
    params = InstanceParams(max_seq_length=3, max_predictions_per_seq=1, next_sentence_prediction=False)
    with pytest.raises(ValueError, match="too short for a segment"):
        create_segments(documents, params, np.random.default_rng(0))
    pairs = create_segments(documents, replace(params, max_seq_length=4), np.random.default_rng(0))
    assert len(pairs) > 0 and (pairs.lengths == 4).all()


def test_an_empty_b_assembles_to_cls_a_sep() -> None:
    documents = make_documents([[3, 3]])
    special = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
    # A = tokens 0..2 alone, and beside it the pair with B = tokens 3..5, unchanged.
    starts, ends = np.array([0, 0]), np.array([3, 3])
    pairs = Pairs(starts, ends, ends, np.array([3, 6]), np.array([False, True]))
    np.testing.assert_array_equal(pairs.lengths, [5, 9])
    arrays = assemble(pairs, documents.tokens, 10, special)
    np.testing.assert_array_equal(arrays["input_ids"], [[2, 5, 6, 7, 3, 0, 0, 0, 0, 0],
                                                        [2, 5, 6, 7, 3, 8, 9, 10, 3, 0]])  # fmt: skip
    np.testing.assert_array_equal(arrays["input_mask"], [[1] * 5 + [0] * 5, [1] * 9 + [0]])
    np.testing.assert_array_equal(arrays["segment_ids"], [[0] * 10, [0] * 5 + [1] * 4 + [0]])
    assert assemble(pairs[:1], documents.tokens, 5, special)["input_ids"].shape == (1, 5)
    with pytest.raises(ValueError, match="does not fit"):
        assemble(pairs[:1], documents.tokens, 4, special)
