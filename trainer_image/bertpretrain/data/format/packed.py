"""The packed shard schema: several pretraining instances per row, with no attention between them.

Sequence packing (Krell et al. 2021, arXiv:2107.02027) is made by
:mod:`bertpretrain.data.prepare.packing`; this is what it writes and the loader reads.

The packed schema (R rows, L = ``max_seq_length``, S = ``max_sequences_per_pack``, P =
``max_predictions_per_seq``) follows Graphcore's packed BERT:

===========================  =====  ========  ================================================
dataset                      dtype  shape     content
===========================  =====  ========  ================================================
``input_ids``                int32  [R, L]    the pack's sequences one after the other, each
                                              with its own ``[CLS] A [SEP] B [SEP]``, then 0s
``input_mask``               int8   [R, L]    k (1..S) on the tokens of the row's k-th
                                              sequence, 0 on padding
``segment_ids``              int8   [R, L]    each sequence's own segment ids, 0 padding
``position_ids``             int16  [R, L]    0, 1, ... from each sequence's start, 0 padding
``masked_lm_positions``      int32  [R, S*P]  positions in the row, increasing, 0-padded
``masked_lm_ids``            int32  [R, S*P]  original ids there, 0-padded
``next_sentence_positions``  int32  [R, S]    row position of each sequence's ``[CLS]``
``next_sentence_labels``     int8   [R, S]    1 = random next, 0 also on padding slots
``next_sentence_weights``    int8   [R, S]    1 for a sequence, 0 for a padding slot
===========================  =====  ========  ================================================

Shards made for the objective ``mlm`` hold single segments ``[CLS] A [SEP]`` (``segment_ids`` 0)
and no ``next_sentence_labels``, as unpacked ones (``bertpretrain.data.format.shards``);
``next_sentence_positions`` and ``next_sentence_weights`` stay, to tell where each sequence starts
and which slots hold one.

``input_mask`` holds sequence numbers rather than 0/1, as in Graphcore's packed BERT: one array
gives both what is padding and which tokens may attend to which (``attention_mask``), so a
packed row needs no [L, L] mask on disk. ``masked_lm_*`` are S*P wide because each of the S
sequences may bring its own P predictions. Position 0 of a row holds the first ``[CLS]``, which is
never masked, so a 0 in ``masked_lm_positions`` after the first slot is padding, as in NVIDIA's
schema; ``next_sentence_weights`` marks the NSP slots instead, since the first sequence's
``[CLS]`` sits at position 0.
"""

from __future__ import annotations

import numpy as np

PACKED_DTYPES: dict[str, type[np.integer]] = {
    "input_ids": np.int32,
    "input_mask": np.int8,
    "segment_ids": np.int8,
    "position_ids": np.int16,
    "masked_lm_positions": np.int32,
    "masked_lm_ids": np.int32,
    "next_sentence_positions": np.int32,
    "next_sentence_labels": np.int8,
    "next_sentence_weights": np.int8,
}


def packed_shapes(
    rows: int, max_seq_length: int, max_sequences_per_pack: int, max_predictions_per_seq: int
) -> dict[str, tuple[int, int]]:
    """The shape of each dataset of ``PACKED_DTYPES`` for ``rows`` packed rows."""
    widths = {
        "masked_lm_positions": max_sequences_per_pack * max_predictions_per_seq,
        "masked_lm_ids": max_sequences_per_pack * max_predictions_per_seq,
        "next_sentence_positions": max_sequences_per_pack,
        "next_sentence_labels": max_sequences_per_pack,
        "next_sentence_weights": max_sequences_per_pack,
    }
    return {name: (rows, widths.get(name, max_seq_length)) for name in PACKED_DTYPES}


def attention_mask(input_mask: np.ndarray) -> np.ndarray:
    """Which tokens of a packed row may attend to which.

    Args:
        input_mask: int [R, L] as ``bertpretrain.data.prepare.packing.pack_instances`` makes it (k
            on the k-th sequence, 0 padding); an unpacked 0/1 mask gives BERT's usual mask.

    Returns:
        bool [R, L, L]: ``[r, i, j]`` is true iff tokens i and j of row r belong to the same
        sequence (the same nonzero value). Padding attends to nothing and nothing to padding.
        This is the reference for the mask the trainer builds in torch.

    Raises:
        ValueError: ``input_mask`` is not 2-D.
    """
    mask = np.asarray(input_mask)
    if mask.ndim != 2:
        raise ValueError(f"input_mask must be 2-D [rows, max_seq_length], got shape {mask.shape}")
    same = mask[:, :, None] == mask[:, None, :]
    return same & (mask != 0)[:, :, None]
