"""Google's instance creation: pair packing, truncation, masking and their statistics."""

from __future__ import annotations

import random
from collections import Counter
from itertools import pairwise

import pytest

from bertpretrain.corpus import BUILTIN_PYTHON_DOCS, documents
from bertpretrain.instances import (
    InstanceParams,
    TrainingInstance,
    create_instances_from_document,
    create_masked_lm_predictions,
    create_training_instances,
    truncate_seq_pair,
)
from bertpretrain.vocab import SpecialIds, load_tokenizer, tokenize_documents, train_vocab

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
PARAMS = InstanceParams(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)


def unmasked(instance: TrainingInstance) -> list[int]:
    """The instance's ids before masking."""
    ids = list(instance.input_ids)
    for position, original in zip(instance.masked_lm_positions, instance.masked_lm_ids, strict=True):
        ids[position] = original
    return ids


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[list[int]]], SpecialIds, int]:
    """The Python docs as token ids, with a 2000-token vocabulary trained on them."""
    text = list(documents(BUILTIN_PYTHON_DOCS))
    tokenizer = load_tokenizer(train_vocab(text, 2000, True, tmp_path_factory.mktemp("vocab")))
    return tokenize_documents(tokenizer, text), SpecialIds.of(tokenizer, "test"), tokenizer.get_vocab_size()


@pytest.fixture(scope="module")
def instances(corpus: tuple[list[list[list[int]]], SpecialIds, int]) -> list[TrainingInstance]:
    token_ids, special, vocab_size = corpus
    return create_training_instances(token_ids, PARAMS, special, vocab_size, random.Random(12345))


def test_truncate_seq_pair_trims_the_longer_side_at_both_ends() -> None:
    ends: Counter[tuple[int, int]] = Counter()
    for seed in range(200):
        a, b = list(range(10)), list(range(100, 104))
        truncate_seq_pair(a, b, 9, random.Random(seed))
        assert len(a) + len(b) == 9 and b == [100, 101, 102, 103]
        assert a == list(range(a[0], a[0] + 5))  # still a contiguous run of the original
        ends[(a[0], a[-1])] += 1
    # Five tokens go, each from the front or the back at random: a[0] is Binomial(5, 1/2).
    assert set(ends) == {(k, k + 4) for k in range(6)}
    assert 0.4 < sum(k * n for (k, _), n in ends.items()) / 200 / 5 < 0.6


def test_truncate_seq_pair_takes_from_b_on_ties_and_leaves_short_pairs() -> None:
    a, b = [1, 2, 3], [4, 5, 6]
    truncate_seq_pair(a, b, 5, random.Random(0))
    assert a == [1, 2, 3] and len(b) == 2
    a, b = [1, 2], [3]
    truncate_seq_pair(a, b, 3, random.Random(0))
    assert (a, b) == ([1, 2], [3])


def test_masking_records_every_original_and_spares_cls_and_sep() -> None:
    rng = random.Random(7)
    for _ in range(300):
        length = rng.randint(5, 128)
        sep_at = rng.randint(2, length - 2)
        original = [rng.randint(5, 999) for _ in range(length)]
        original[0], original[sep_at], original[-1] = SPECIAL.cls, SPECIAL.sep, SPECIAL.sep
        masked, positions, labels = create_masked_lm_predictions(original, 0.15, 20, SPECIAL, 1000, rng)
        assert len(masked) == length and positions == sorted(set(positions))
        assert len(positions) == min(20, max(1, round(length * 0.15)))
        assert not {0, sep_at, length - 1} & set(positions)
        assert labels == [original[p] for p in positions]
        assert all(masked[i] == original[i] for i in range(length) if i not in positions)


def test_instances_are_well_formed(instances: list[TrainingInstance]) -> None:
    for instance in instances:
        ids = unmasked(instance)
        length = len(ids)
        assert length <= PARAMS.max_seq_length and len(instance.segment_ids) == length
        assert ids[0] == SPECIAL.cls and ids[-1] == SPECIAL.sep and ids.count(SPECIAL.sep) == 2
        a_end = ids.index(SPECIAL.sep)
        assert 1 < a_end < length - 2  # A and B each hold at least one token
        assert instance.segment_ids == [0] * (a_end + 1) + [1] * (length - a_end - 1)
        assert 0 not in instance.masked_lm_positions
        assert not {a_end, length - 1} & set(instance.masked_lm_positions)
        expected = min(PARAMS.max_predictions_per_seq, max(1, round(length * PARAMS.masked_lm_prob)))
        assert len(instance.masked_lm_positions) == expected


def test_instance_statistics_follow_google(
    instances: list[TrainingInstance], corpus: tuple[list[list[list[int]]], SpecialIds, int]
) -> None:
    assert len(instances) > 5000
    # Half of the multi-sentence chunks get a random next, and one-sentence chunks always do.
    random_next = sum(i.is_random_next for i in instances) / len(instances)
    assert 0.48 < random_next < 0.6
    # Most sequences fill the length; short_seq_prob (0.1) of the documents aim shorter.
    assert sum(len(i.input_ids) > 100 for i in instances) / len(instances) > 0.6
    outcomes: Counter[str] = Counter()
    for instance in instances:
        for position, original in zip(instance.masked_lm_positions, instance.masked_lm_ids, strict=True):
            now = instance.input_ids[position]
            outcomes["mask" if now == SPECIAL.mask else "kept" if now == original else "random"] += 1
    total = sum(outcomes.values())
    assert abs(outcomes["mask"] / total - 0.8) < 0.01
    assert abs(outcomes["kept"] / total - 0.1) < 0.01
    assert abs(outcomes["random"] / total - 0.1) < 0.01
    # Random replacements come from the whole vocabulary.
    _, _, vocab_size = corpus
    replaced = {
        instance.input_ids[p]
        for instance in instances
        for p in instance.masked_lm_positions
        if instance.input_ids[p] != SPECIAL.mask
    }
    assert max(replaced) < vocab_size and len(replaced) > vocab_size // 2


def test_actual_next_pairs_come_from_one_document(
    instances: list[TrainingInstance], corpus: tuple[list[list[list[int]]], SpecialIds, int]
) -> None:
    token_ids, _, _ = corpus
    texts = [" " + " ".join(str(t) for s in document for t in s) + " " for document in token_ids]
    for instance in [i for i in instances if not i.is_random_next][:100]:
        ids = unmasked(instance)
        a_end = ids.index(SPECIAL.sep)
        a = " " + " ".join(map(str, ids[1:a_end])) + " "
        b = " " + " ".join(map(str, ids[a_end + 1 : -1])) + " "
        assert any(a in text and b in text for text in texts)


def test_unused_sentences_are_put_back() -> None:
    # One-token sentences, ids unique over the corpus, and no truncation: each sentence must be
    # used once as part of its own document's A or actual-next B, in every dupe_factor pass.
    docs = [[[100 * d + s] for s in range(30)] for d in range(1, 6)]
    params = InstanceParams(max_seq_length=8, max_predictions_per_seq=2, short_seq_prob=0.0, dupe_factor=1)
    rng = random.Random(3)
    random_nexts = 0
    for index, document in enumerate(docs):
        own = []
        for instance in create_instances_from_document(docs, index, params, SPECIAL, 1000, rng):
            ids = unmasked(instance)
            a_end = ids.index(SPECIAL.sep)
            own += ids[1:a_end] + ([] if instance.is_random_next else ids[a_end + 1 : -1])
            random_nexts += instance.is_random_next
        assert own == [sentence[0] for sentence in document]
    assert random_nexts > 5


def test_fixed_seed_gives_the_same_instances(corpus: tuple[list[list[list[int]]], SpecialIds, int]) -> None:
    token_ids, special, vocab_size = corpus
    params = InstanceParams(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1)
    few = token_ids[:40]
    first = create_training_instances(few, params, special, vocab_size, random.Random(1))
    assert first == create_training_instances(few, params, special, vocab_size, random.Random(1))
    assert first != create_training_instances(few, params, special, vocab_size, random.Random(2))
    assert few == token_ids[:40]  # the documents are not shuffled in place


def test_documents_argument_is_not_modified() -> None:
    docs = [[[10, 11, 12], [13, 14]], [], [[20, 21, 22, 23]]]
    snapshot = [[list(s) for s in d] for d in docs]
    create_training_instances(docs, InstanceParams(16, 3, dupe_factor=3), SPECIAL, 100, random.Random(0))
    assert docs == snapshot


def test_instances_come_out_shuffled() -> None:
    # Instances are made document by document; Google shuffles them all at the end, so that
    # neighbours rarely share a document. The document shows in A's ids (100 * document + s).
    docs = [[[100 * d + s] for s in range(40)] for d in range(1, 21)]
    params = InstanceParams(max_seq_length=8, max_predictions_per_seq=1, dupe_factor=2)
    made = create_training_instances(docs, params, SPECIAL, 10_000, random.Random(5))
    sources = [unmasked(instance)[1] // 100 for instance in made]
    assert len(made) > 300
    assert sum(a == b for a, b in pairwise(sources)) / len(made) < 0.2
