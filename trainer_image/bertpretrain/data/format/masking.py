"""Masked-LM targets: which positions to predict, and how they are corrupted.

Google's ``create_masked_lm_predictions`` (google-research/bert, Devlin et al. 2019), for a
whole array of instances at once:

* ``num_to_predict = min(max_predictions_per_seq, max(1, round(length * masked_lm_prob)))``,
  where ``length`` counts [CLS] and [SEP] (``round`` halves to even, as in Python 3);
* that many positions other than [CLS]/[SEP] are chosen uniformly at random;
* each chosen position becomes [MASK] with probability 0.8, stays as it is with 0.1 (the model
  must also predict tokens it can see), and becomes a uniformly random id of the vocabulary
  with 0.1.

With whole-word masking (Google's ``do_whole_word_mask``), a WordPiece starting with ``##`` joins
the word before it (as in Google's code, even across the [SEP] between A and B), words are taken
in random order and a word is skipped when it would overshoot ``num_to_predict``; each of a
chosen word's pieces is corrupted on its own draw.

Used by the data stage for static masking and by the loader for dynamic masking.
"""

from __future__ import annotations

import numpy as np

from bertpretrain.data.format.vocab import SpecialIds


def mask_tokens(
    input_ids: np.ndarray,
    input_mask: np.ndarray,
    max_predictions_per_seq: int,
    masked_lm_prob: float,
    special: SpecialIds,
    vocab_size: int,
    rng: np.random.Generator,
    continuation: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Choose and corrupt the masked positions of N instances of length L.

    ``input_ids`` int32 [N, L] and ``input_mask`` int8 [N, L] (1 for tokens, 0 padding) are not
    modified. ``continuation`` (bool [vocab_size], true for ``##`` pieces) turns on whole-word
    masking. Returns ``input_ids`` int32 [N, L] after corruption, ``masked_lm_positions`` int32
    [N, P] (increasing, zero-padded) and ``masked_lm_ids`` int32 [N, P] (the original ids there,
    zero-padded), with P = ``max_predictions_per_seq``.

    Raises:
        ValueError: P is not smaller than L.
    """
    count, length = input_ids.shape
    if max_predictions_per_seq >= length:
        raise ValueError(f"max_predictions_per_seq {max_predictions_per_seq} must be below {length}")
    candidates = input_mask.astype(bool) & (input_ids != special.cls) & (input_ids != special.sep)
    lengths = input_mask.sum(axis=1, dtype=np.int64)
    num_to_predict = np.minimum(
        max_predictions_per_seq, np.maximum(1, np.round(lengths * masked_lm_prob).astype(np.int64))
    )
    # The chosen columns, L where a slot holds none: L sorts after every real position, then
    # becomes 0 (padding).
    if continuation is None:
        columns = _choose_tokens(candidates, num_to_predict, max_predictions_per_seq, rng)
    else:
        chosen = _choose_words(input_ids, candidates, num_to_predict, continuation, rng)
        columns = np.where(chosen, np.arange(length), length)
    positions = np.sort(columns, axis=1)[:, :max_predictions_per_seq]
    valid = positions < length
    positions = np.where(valid, positions, 0)
    original = np.where(valid, np.take_along_axis(input_ids, positions, axis=1), 0)
    draw = rng.random(positions.shape)
    random_ids = rng.integers(0, vocab_size, positions.shape)
    replacement = np.where(draw < 0.8, special.mask, np.where(draw < 0.9, original, random_ids))
    masked = input_ids.copy()
    rows = np.broadcast_to(np.arange(count)[:, None], positions.shape)
    masked[rows[valid], positions[valid]] = replacement[valid]
    return {
        "input_ids": masked,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": original.astype(np.int32),
    }


def _choose_tokens(
    candidates: np.ndarray, num_to_predict: np.ndarray, max_predictions: int, rng: np.random.Generator
) -> np.ndarray:
    """int [N, P]: the columns of ``num_to_predict`` candidates per row, chosen uniformly at random,
    in no particular order; L (the row length) in the slots left over.

    Returned as columns, not as a bool [N, L] mask, so that the caller sorts P columns a row, not L."""
    # float32 keys: half the memory traffic of float64. A tie at the cut (keys are 2^-24 apart) is
    # settled by position, a bias far below the sampling noise.
    keys = rng.random(candidates.shape, dtype=np.float32)
    keys[~candidates] = 2.0
    smallest = np.argpartition(keys, max_predictions - 1, axis=1)[:, :max_predictions]
    smallest_keys = np.take_along_axis(keys, smallest, axis=1)
    order = np.argsort(smallest_keys, axis=1)
    ranked = np.take_along_axis(smallest, order, axis=1)
    take = (np.arange(max_predictions) < num_to_predict[:, None]) & (
        np.take_along_axis(smallest_keys, order, axis=1) < 2.0
    )
    return np.where(take, ranked, candidates.shape[1])


def _choose_words(
    input_ids: np.ndarray,
    candidates: np.ndarray,
    num_to_predict: np.ndarray,
    continuation: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """bool [N, L]: whole words, taken in random order while they fit in ``num_to_predict``."""
    count, length = candidates.shape
    starts = candidates & ~continuation[input_ids]
    # A row's first candidate starts a word even when it is a ## piece (Google's code does too).
    first = np.argmax(candidates, axis=1)
    starts[np.arange(count), first] |= candidates[np.arange(count), first]
    word = np.where(candidates, np.cumsum(starts, axis=1) - 1, length)
    sizes = np.zeros((count, length + 1), np.int64)
    np.add.at(sizes, (np.broadcast_to(np.arange(count)[:, None], word.shape), word), 1)
    sizes = sizes[:, :length]
    keys = np.where(sizes > 0, rng.random(sizes.shape), 2.0)
    order = np.argsort(keys, axis=1)
    ordered_sizes = np.take_along_axis(sizes, order, axis=1)
    taken = np.zeros(count, np.int64)
    selected = np.zeros((count, length + 1), bool)
    for k in range(int((sizes > 0).sum(axis=1).max(initial=0))):
        size = ordered_sizes[:, k]
        fits = (size > 0) & (taken + size <= num_to_predict)
        taken += np.where(fits, size, 0)
        selected[np.arange(count), order[:, k]] = fits
    return np.take_along_axis(selected, word, axis=1) & candidates
