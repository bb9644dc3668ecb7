"""Google's create_pretraining_data.py, draw for draw, on token ids: the tests' reference.

``bertpretrain.data.prepare.instances`` and ``bertpretrain.data.format.masking`` implement the same
algorithm with array operations and their own random draws; the statistical tests compare the two
on a real corpus.
This is the project's first, straightforward port (google-research/bert, Devlin et al. 2019):
tokens are ids, the random token is a uniform id in ``[0, vocab_size)``, and ``round`` halves to
even as under Python 3. Whole-word masking is not in it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bertpretrain.data.format.vocab import SpecialIds
from bertpretrain.data.prepare.instances import InstanceParams

Document = Sequence[Sequence[int]]
"""A document: its sentences, each a sequence of token ids."""


@dataclass(frozen=True)
class TrainingInstance:
    """One sequence pair ``[CLS] A [SEP] B [SEP]`` with its masked-LM targets; lists of ids.

    ``input_ids`` (after masking) and ``segment_ids`` (0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``)
    have the same length, at most ``max_seq_length``, unpadded. ``masked_lm_positions`` are
    indices into ``input_ids`` in increasing order and ``masked_lm_ids`` the original ids there.
    ``is_random_next`` is true when B does not follow A in the corpus.
    """

    input_ids: list[int]
    segment_ids: list[int]
    masked_lm_positions: list[int]
    masked_lm_ids: list[int]
    is_random_next: bool


def create_training_instances(
    documents: Sequence[Document],
    params: InstanceParams,
    special: SpecialIds,
    vocab_size: int,
    rng: random.Random,
) -> list[TrainingInstance]:
    """All instances of a corpus, in random order (Google's ``create_training_instances``).

    ``documents`` is not modified. ``rng`` drives every random choice, so a fresh
    ``random.Random(seed)`` gives the same instances each time.
    """
    all_documents = [document for document in documents if document]
    rng.shuffle(all_documents)
    instances = []
    for _ in range(params.dupe_factor):
        for document_index in range(len(all_documents)):
            instances.extend(
                create_instances_from_document(
                    all_documents, document_index, params, special, vocab_size, rng
                )
            )
    rng.shuffle(instances)
    return instances


def create_instances_from_document(
    all_documents: Sequence[Document],
    document_index: int,
    params: InstanceParams,
    special: SpecialIds,
    vocab_size: int,
    rng: random.Random,
) -> list[TrainingInstance]:
    """The instances of ``all_documents[document_index]`` (Google's function of the same name).

    Random-next B segments are taken from another document of ``all_documents`` (up to 10 draws
    to find one that is not this document, as Google does). Every document must hold at least
    one sentence and every sentence at least one token, as :func:`create_training_instances`
    and :func:`bertpretrain.data.format.vocab.tokenize_documents` ensure.
    """
    document = all_documents[document_index]
    # [CLS], [SEP], [SEP]
    max_num_tokens = params.max_seq_length - 3
    # Mostly full sequences (padding wastes compute), but sometimes shorter ones, to lessen the
    # mismatch with the short inputs of fine-tuning. A target, not a limit: chunks hold whole
    # sentences and may overshoot it until truncate_seq_pair cuts them to max_num_tokens.
    target_seq_length = max_num_tokens
    if rng.random() < params.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    current_chunk: list[Sequence[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        current_chunk.append(document[i])
        current_length += len(document[i])
        if i == len(document) - 1 or current_length >= target_seq_length:
            # Segments are cut at sentence boundaries, not at a random token: a cut inside a
            # sentence would make next-sentence prediction too easy.
            a_end = rng.randint(1, len(current_chunk) - 1) if len(current_chunk) >= 2 else 1
            tokens_a = [token for sentence in current_chunk[:a_end] for token in sentence]
            tokens_b: list[int] = []
            is_random_next = len(current_chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                target_b_length = target_seq_length - len(tokens_a)
                for _ in range(10):
                    random_document_index = rng.randint(0, len(all_documents) - 1)
                    if random_document_index != document_index:
                        break
                random_document = all_documents[random_document_index]
                random_start = rng.randint(0, len(random_document) - 1)
                for sentence in random_document[random_start:]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target_b_length:
                        break
                # The chunk's sentences after A went unused: start the next chunk with them.
                i -= len(current_chunk) - a_end
            else:
                tokens_b = [token for sentence in current_chunk[a_end:] for token in sentence]
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

            input_ids = [special.cls, *tokens_a, special.sep, *tokens_b, special.sep]
            segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
            input_ids, masked_lm_positions, masked_lm_ids = create_masked_lm_predictions(
                input_ids, params.masked_lm_prob, params.max_predictions_per_seq, special, vocab_size, rng
            )
            instances.append(
                TrainingInstance(input_ids, segment_ids, masked_lm_positions, masked_lm_ids, is_random_next)
            )
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def create_masked_lm_predictions(
    input_ids: Sequence[int],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    special: SpecialIds,
    vocab_size: int,
    rng: random.Random,
) -> tuple[list[int], list[int], list[int]]:
    """Choose and corrupt the masked-LM positions (Google's function of the same name).

    Returns ``(masked input_ids, masked_lm_positions, masked_lm_ids)``: the input with chosen
    positions replaced (80% ``[MASK]``, 10% unchanged, 10% a uniformly random id in
    ``[0, vocab_size)``), the chosen positions in increasing order, and the original ids there.
    ``[CLS]`` and ``[SEP]`` are never chosen. ``input_ids`` is not modified.
    """
    candidates = [i for i, token in enumerate(input_ids) if token not in (special.cls, special.sep)]
    rng.shuffle(candidates)
    num_to_predict = min(max_predictions_per_seq, max(1, round(len(input_ids) * masked_lm_prob)))
    output = list(input_ids)
    positions = sorted(candidates[:num_to_predict])
    # Draws in the order the positions were chosen, as Google's loop makes them.
    for index in candidates[:num_to_predict]:
        if rng.random() < 0.8:
            output[index] = special.mask
        elif rng.random() >= 0.5:
            output[index] = rng.randint(0, vocab_size - 1)
        # Otherwise the token stays: the model must also predict tokens that it can see.
    return output, positions, [input_ids[i] for i in positions]


def truncate_seq_pair(
    tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random
) -> None:
    """Shorten the pair in place until ``len(tokens_a) + len(tokens_b) <= max_num_tokens``.

    One token at a time from the longer of the two (``tokens_b`` when equal), from its front or
    its back with equal probability, to avoid a bias toward either end (Google's function).
    """
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()
