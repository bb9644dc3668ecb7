"""Masked-LM targets (``bertpretrain.data.format.masking``) against Google's ``create_masked_lm_predictions``.

Hand-made rows where the outcome does not depend on the draws, many copies of one row for the
distributions, and instances of the Python docs for whole-word masking, compared with a port of
Google's whole-word code (below; ``google_reference`` has no whole-word masking).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from bertjob_api.spec import SourceSpec
from bertpretrain.data.format.masking import mask_tokens
from bertpretrain.data.format.vocab import SpecialIds, continuation_table, load_tokenizer
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS
from bertpretrain.data.prepare.corpus.sources import read_source
from bertpretrain.data.prepare.corpus.splitting import sentences
from bertpretrain.data.prepare.documents import DocumentEncoder
from bertpretrain.data.prepare.instances import InstanceParams, assemble, create_pairs
from bertpretrain.data.prepare.vocab import train_vocab

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
CLS, SEP = SPECIAL.cls, SPECIAL.sep
VOCAB_SIZE = 1000
# The hand-made vocabulary: ids 20-29 are "##" pieces.
CONTINUATION = np.zeros(VOCAB_SIZE, bool)
CONTINUATION[20:30] = True
A, B, C, D = 10, 11, 12, 13
XA, XB, XC, XD, XE = 20, 21, 22, 23, 24  # ##pieces


def copies(instance: Sequence[int], count: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` copies of one unpadded instance, zero-padded to ``length``: input_ids, input_mask."""
    input_ids = np.zeros((count, length), np.int32)
    input_ids[:, : len(instance)] = instance
    input_mask = np.zeros((count, length), np.int8)
    input_mask[:, : len(instance)] = 1
    return input_ids, input_mask


def chosen_sets(masked: dict[str, np.ndarray]) -> Counter[tuple[int, ...]]:
    """How often each set of positions was chosen."""
    return Counter(tuple(p for p in row if p) for row in masked["masked_lm_positions"].tolist())


def google_num_to_predict(length: int, max_predictions: int, masked_lm_prob: float = 0.15) -> int:
    return min(max_predictions, max(1, round(length * masked_lm_prob)))


# --- hand-made rows ----------------------------------------------------------------------------


def test_a_five_token_instance_masks_one_of_its_two_tokens() -> None:
    input_ids, input_mask = copies([CLS, A, SEP, B, SEP], 4000, 8)
    masked = mask_tokens(input_ids, input_mask, 3, 0.15, SPECIAL, VOCAB_SIZE, np.random.default_rng(0))
    sets = chosen_sets(masked)
    assert set(sets) == {(1,), (3,)}  # round(5 * 0.15) = 1, never [CLS]/[SEP]/padding
    assert sets[(1,)] / 4000 == pytest.approx(0.5, abs=0.04)
    labels = masked["masked_lm_ids"]
    np.testing.assert_array_equal(labels[:, 0], np.where(masked["masked_lm_positions"][:, 0] == 1, A, B))
    assert (labels[:, 1:] == 0).all() and (masked["masked_lm_positions"][:, 1:] == 0).all()


@pytest.mark.parametrize("continuation", [None, CONTINUATION], ids=["tokens", "whole-words"])
def test_max_predictions_must_be_below_the_length(continuation: np.ndarray | None) -> None:
    input_ids, input_mask = copies([CLS, A, SEP, B, SEP], 2, 8)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="max_predictions_per_seq"):
        mask_tokens(input_ids, input_mask, 8, 0.15, SPECIAL, VOCAB_SIZE, rng, continuation)
    masked = mask_tokens(input_ids, input_mask, 7, 0.15, SPECIAL, VOCAB_SIZE, rng, continuation)
    assert masked["masked_lm_positions"].shape == (2, 7)


def test_count_is_googles_for_every_length() -> None:
    # One row of each length 5..64, [SEP] in the middle: Google's count, which Python's round
    # takes half to even (length 30: 4.5 -> 4) and max_predictions_per_seq caps (5 here).
    length = 64
    instances = [[CLS, *[A] * ((n - 3) // 2), SEP, *[B] * (n - 3 - (n - 3) // 2), SEP] for n in range(5, 65)]
    input_ids = np.zeros((len(instances), length), np.int32)
    input_mask = np.zeros((len(instances), length), np.int8)
    for row, instance in enumerate(instances):
        input_ids[row, : len(instance)] = instance
        input_mask[row, : len(instance)] = 1
    masked = mask_tokens(input_ids, input_mask, 5, 0.15, SPECIAL, VOCAB_SIZE, np.random.default_rng(1))
    counts = np.count_nonzero(masked["masked_lm_positions"], axis=1).tolist()
    assert counts == [google_num_to_predict(len(instance), 5) for instance in instances]
    assert counts[30 - 5] == 4 and counts[10 - 5] == 2 and counts[-1] == 5


def test_positions_are_uniform_and_replacements_follow_google() -> None:
    # 97 candidates (100 tokens less [CLS] and two [SEP]), 15 chosen: each with probability 15/97.
    instance = [CLS, *range(100, 140), SEP, *range(200, 257), SEP]
    count = 20000
    input_ids, input_mask = copies(instance, count, 128)
    before = input_ids.copy(), input_mask.copy()
    masked = mask_tokens(input_ids, input_mask, 20, 0.15, SPECIAL, VOCAB_SIZE, np.random.default_rng(2))
    np.testing.assert_array_equal(input_ids, before[0])  # the inputs are left alone
    np.testing.assert_array_equal(input_mask, before[1])
    positions = masked["masked_lm_positions"]
    assert (np.count_nonzero(positions, axis=1) == 15).all() and (positions[:, 15:] == 0).all()
    assert (np.diff(positions[:, :15], axis=1) > 0).all()
    frequency = np.bincount(positions[:, :15].ravel(), minlength=128) / count
    candidates = [i for i, token in enumerate(instance) if token not in (CLS, SEP)]
    assert frequency[candidates] == pytest.approx(np.full(97, 15 / 97), abs=0.012)
    assert frequency[[0, 41, 99]].sum() == 0 and frequency[100:].sum() == 0
    original = input_ids[np.arange(count)[:, None], positions[:, :15]]
    np.testing.assert_array_equal(masked["masked_lm_ids"][:, :15], original)
    now = masked["input_ids"][np.arange(count)[:, None], positions[:, :15]]
    unchosen = np.ones(input_ids.shape, bool)
    np.put_along_axis(unchosen, positions[:, :15], False, 1)
    np.testing.assert_array_equal(masked["input_ids"][unchosen], input_ids[unchosen])
    # 80% [MASK], 10% kept, 10% a uniform id of the vocabulary (which may be [MASK] or the original).
    is_mask, kept = now == SPECIAL.mask, now == original
    replaced = now[~is_mask & ~kept]
    v = VOCAB_SIZE
    assert is_mask.mean() == pytest.approx(0.8 + 0.1 / v, abs=0.004)
    assert kept.mean() == pytest.approx(0.1 + 0.1 / v, abs=0.004)
    assert len(replaced) / now.size == pytest.approx(0.1 - 0.2 / v, abs=0.004)
    assert replaced.min() == 0 and replaced.max() == v - 1  # the whole vocabulary, specials too, as Google's
    assert np.bincount(replaced // 100, minlength=10) / len(replaced) == pytest.approx(
        np.full(10, 0.1), abs=0.01
    )


def test_same_generator_state_same_masks() -> None:
    input_ids, input_mask = copies([CLS, *range(100, 120), SEP, *range(200, 230), SEP], 50, 64)

    def make(seed: int, continuation: np.ndarray | None) -> dict[str, np.ndarray]:
        return mask_tokens(input_ids, input_mask, 10, 0.15, SPECIAL, VOCAB_SIZE, np.random.default_rng(seed),
                           continuation)  # fmt: skip

    for continuation in (None, CONTINUATION):
        first, again, other = make(1, continuation), make(1, continuation), make(2, continuation)
        for name in first:
            np.testing.assert_array_equal(first[name], again[name])
        assert not np.array_equal(first["masked_lm_positions"], other["masked_lm_positions"])
        assert not np.array_equal(first["input_ids"], other["input_ids"])


# Whole words, where only one choice fits num_to_predict, so that the draws do not matter. Google
# groups a "##" piece with the word before it, skipping [CLS]/[SEP] (so a piece after [SEP] joins
# A's last word), and a leading piece starts a word; words are taken in random order, and one
# that would overshoot num_to_predict is skipped (not the end of the search).
WHOLE_WORD_CASES = {
    # 7 tokens: num_to_predict 1
    "only the one-piece word fits": ([CLS, A, XA, XB, SEP, B, SEP], {(5,)}),
    "a piece after [SEP] joins A's last word": ([CLS, A, XA, SEP, XB, B, SEP], {(5,)}),
    "no word fits": ([CLS, A, XA, SEP, B, XB, SEP], {()}),
    # 11 tokens: 2
    "a leading piece starts a word": ([CLS, XA, XB, SEP, A, XC, XD, B, XE, XA, SEP], {(1, 2)}),
    # 18 tokens: 3, and three words of 4 pieces to skip before or after the one of 3
    "every word is tried": (
        [CLS, A, XA, XB, XC, B, XA, XB, XC, SEP, C, XA, XB, XC, D, XD, XE, SEP],
        {(14, 15, 16)},
    ),
}


@pytest.mark.parametrize(("instance", "expected"), WHOLE_WORD_CASES.values(), ids=WHOLE_WORD_CASES.keys())
def test_whole_words_in_hand_made_rows(instance: list[int], expected: set[tuple[int, ...]]) -> None:
    input_ids, input_mask = copies(instance, 2000, 24)
    masked = mask_tokens(
        input_ids, input_mask, 5, 0.15, SPECIAL, VOCAB_SIZE, np.random.default_rng(3), CONTINUATION
    )
    assert set(chosen_sets(masked)) == expected
    if expected == {()}:
        np.testing.assert_array_equal(masked["input_ids"], input_ids)


def test_whole_word_pieces_are_corrupted_each_on_its_own_draw() -> None:
    input_ids, input_mask = copies([CLS, XA, XB, SEP, A, XC, XD, B, XE, XA, SEP], 8000, 16)
    masked = mask_tokens(
        input_ids, input_mask, 5, 0.15, SPECIAL, VOCAB_SIZE, np.random.default_rng(4), CONTINUATION
    )
    is_mask = masked["input_ids"][:, 1:3] == SPECIAL.mask
    assert is_mask.mean() == pytest.approx(0.8, abs=0.02)
    assert is_mask.all(axis=1).mean() == pytest.approx(0.64, abs=0.03)  # 0.8 * 0.8, not 0.8


# --- whole words on real text ------------------------------------------------------------------

PARAMS = InstanceParams(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=4)


def google_whole_word_masking(
    input_ids: list[int], continuation: np.ndarray, vocab_size: int, rng: random.Random
) -> tuple[list[int], list[int]]:
    """Google's ``create_masked_lm_predictions`` with ``do_whole_word_mask``, on ids: the masked
    ids and the masked positions (sorted)."""
    cand_indexes: list[list[int]] = []
    for i, token in enumerate(input_ids):
        if token in (CLS, SEP):
            continue
        if len(cand_indexes) >= 1 and continuation[token]:
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    rng.shuffle(cand_indexes)
    output = list(input_ids)
    num_to_predict = google_num_to_predict(len(input_ids), PARAMS.max_predictions_per_seq)
    masked: list[int] = []
    for index_set in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(index_set) > num_to_predict:
            continue
        for index in index_set:
            if rng.random() < 0.8:
                output[index] = SPECIAL.mask
            elif rng.random() >= 0.5:
                output[index] = rng.randint(0, vocab_size - 1)
            masked.append(index)
    return output, sorted(masked)


class Words:
    """Instances of the Python docs with a 2000-token vocabulary: unmasked arrays and ## table."""

    def __init__(self, directory: Path) -> None:
        builtin = read_source(SourceSpec(path=BUILTIN_PYTHON_DOCS), Counter())
        texts = [sentences(raw) for raw in islice(builtin, 120)]
        tokenizer = load_tokenizer(train_vocab((s for text in texts for s in text), 2000, True, directory))
        documents = DocumentEncoder(tokenizer, seed=0, heldout_fraction=0.0).encode(texts)
        self.special = SpecialIds.of(tokenizer, directory)
        pairs = create_pairs(documents, PARAMS, np.random.default_rng(0))
        self.arrays = assemble(pairs, documents.tokens, PARAMS.max_seq_length, self.special)
        self.lengths = pairs.lengths
        self.vocab_size = tokenizer.get_vocab_size()
        self.continuation = continuation_table(tokenizer)

    def mask(self, seed: int, whole_words: bool) -> dict[str, np.ndarray]:
        return mask_tokens(
            self.arrays["input_ids"], self.arrays["input_mask"], PARAMS.max_predictions_per_seq,
            PARAMS.masked_lm_prob, self.special, self.vocab_size, np.random.default_rng(seed),
            self.continuation if whole_words else None,
        )  # fmt: skip

    def rows(self) -> list[list[int]]:
        return [
            row[:length] for row, length in zip(self.arrays["input_ids"].tolist(), self.lengths, strict=True)
        ]


@pytest.fixture(scope="module")
def words(tmp_path_factory: pytest.TempPathFactory) -> Words:
    made = Words(tmp_path_factory.mktemp("vocab"))
    assert made.special == SPECIAL  # the hand-made ids above are a trained vocabulary's
    return made


def google_words(row: list[int], continuation: np.ndarray) -> list[list[int]]:
    """Google's whole words of an instance, in order: lists of positions."""
    groups: list[list[int]] = []
    for i, token in enumerate(row):
        if token in (CLS, SEP):
            continue
        if groups and continuation[token]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def test_whole_words_are_masked_whole(words: Words) -> None:
    masked = words.mask(5, whole_words=True)
    positions = masked["masked_lm_positions"].tolist()
    pieces_after_special = 0
    for row, chosen_row in zip(words.rows(), positions, strict=True):
        chosen = {p for p in chosen_row if p}
        num_to_predict = google_num_to_predict(len(row), PARAMS.max_predictions_per_seq)
        assert len(chosen) <= num_to_predict
        for word in google_words(row, words.continuation):
            taken = chosen.intersection(word)
            assert not taken or taken == set(word), (row, word, chosen)
            # Words are tried until none fits: every word left out would overshoot.
            assert taken or len(word) > num_to_predict - len(chosen)
        # In the text's order, a ## piece goes with the token before it, unless that is [CLS] or
        # [SEP]: Google's rule makes it start a word after [CLS] and join A's last word after [SEP].
        for i in range(2, len(row)):
            if words.continuation[row[i]]:
                if row[i - 1] in (CLS, SEP):
                    pieces_after_special += 1
                else:
                    assert (i in chosen) == (i - 1 in chosen), (row, i, chosen)
    assert pieces_after_special > 10  # truncation does cut words: both exceptions are exercised


def test_whole_word_statistics_match_google(words: Words) -> None:
    rows = words.rows()
    rng = random.Random(6)
    google = [google_whole_word_masking(row, words.continuation, words.vocab_size, rng) for row in rows]
    masked = words.mask(6, whole_words=True)
    ours = [
        (row_ids[:length], [p for p in row_positions if p])
        for row_ids, row_positions, length in zip(
            masked["input_ids"].tolist(), masked["masked_lm_positions"].tolist(), words.lengths, strict=True
        )
    ]
    by_tokens = words.mask(6, whole_words=False)

    def statistics(made: list[tuple[list[int], list[int]]]) -> dict[str, float]:
        chosen = [
            (row, output, p) for row, (output, positions) in zip(rows, made, strict=True) for p in positions
        ]
        two_piece = [
            output[word[0]] == output[word[1]] == SPECIAL.mask
            for row, (output, positions) in zip(rows, made, strict=True)
            for word in google_words(row, words.continuation)
            if len(word) == 2 and word[0] in positions
        ]
        return {
            "two_piece_words": len(two_piece),
            "masked_per_token": len(chosen) / sum(len(row) - 3 for row in rows),
            "continuations": np.mean([words.continuation[row[p]] for row, _, p in chosen]),
            "mask": np.mean([output[p] == SPECIAL.mask for _, output, p in chosen]),
            "kept": np.mean([output[p] == row[p] for row, output, p in chosen]),
            "both_pieces_mask": np.mean(two_piece),
        }

    ours_statistics, google_statistics = statistics(ours), statistics(google)
    # Two-piece words are a few hundred per run (which varies with the trained vocabulary), too
    # few for 0.01: allow four standard errors of a share near 0.64.
    two_piece_error = 4 * np.sqrt(0.64 * 0.36 / ours_statistics.pop("two_piece_words"))
    google_statistics.pop("two_piece_words")
    for name, value in google_statistics.items():
        tolerance = np.sqrt(2) * two_piece_error if name == "both_pieces_mask" else 0.01
        assert ours_statistics[name] == pytest.approx(value, abs=tolerance), name
    assert ours_statistics["continuations"] > 0.1  # ## pieces are common in this vocabulary
    assert ours_statistics["both_pieces_mask"] == pytest.approx(0.64, abs=two_piece_error)
    # Words that overshoot are skipped, but one-piece words mostly fill the rest: about as many
    # tokens are masked as without whole words.
    by_tokens_share = np.count_nonzero(by_tokens["masked_lm_positions"]) / sum(len(row) - 3 for row in rows)
    assert ours_statistics["masked_per_token"] == pytest.approx(by_tokens_share, abs=0.01)
