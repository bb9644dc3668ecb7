"""The batches every trainer stage passes on: the data loader yields them, the engine consumes them.

Defined here, in the package every stage may import, so that neither the data stage nor the
runtime imports the other for a type. The keys are named once, in the two ``TypedDict``s below, and
a type checker holds every use to them; they are the model's argument names (Hugging Face's), while
the HDF5 datasets they are read from keep NVIDIA's names (``segment_ids``, ``input_mask``,
``masked_lm_ids``), which are part of the shard format (:mod:`bertpretrain.data.format.shards`).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict, cast

import torch


class Batch(TypedDict):
    """One pretraining micro-batch, as :func:`bertpretrain.data.load.loader.to_batch` makes it from
    shard rows: B rows of L tokens (``max_seq_length``), P predictions per row
    (``max_predictions_per_seq``); every tensor int64, labels ``IGNORE_INDEX`` (-100) where there is
    nothing to predict.

    - ``input_ids`` [B, L]: token ids after masking, zero-padded (NVIDIA's ``input_ids``);
    - ``token_type_ids`` [B, L]: 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]`` (``segment_ids``);
    - ``attention_mask`` [B, L]: 1 for real tokens, 0 for padding (``input_mask``);
    - ``masked_lm_positions`` [B, P]: the masked positions, zero-padded (``masked_lm_positions``);
    - ``masked_lm_labels`` [B, P]: the original ids there, -100 on padding (``masked_lm_ids``);
    - ``next_sentence_labels`` [B]: 1 when B is a random next sentence (``next_sentence_labels``).

    Packed rows (S instances each, :mod:`bertpretrain.data.format.packed`) add ``position_ids``
    [B, L] (each instance's own positions) and ``next_sentence_positions`` [B, S] (each instance's
    ``[CLS]``); their ``masked_lm_*`` are [B, W] (W up to S*P: the loader drops the slots no row
    of the batch uses), ``next_sentence_labels`` [B, S] (-100 on empty
    slots), and ``attention_mask`` holds each token's instance number (1..S, 0 on padding).
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    masked_lm_positions: torch.Tensor
    masked_lm_labels: torch.Tensor
    next_sentence_labels: torch.Tensor
    position_ids: NotRequired[torch.Tensor]
    next_sentence_positions: NotRequired[torch.Tensor]


class TaskBatch(TypedDict):
    """Fine-tuning features or one micro-batch of them: N rows of L tokens, every tensor int64.

    ``input_ids``, ``token_type_ids``, ``attention_mask`` [N, L] as in :class:`Batch`; the targets,
    absent from validation features: ``labels`` [N] for a classification task, ``start_positions``
    and ``end_positions`` [N] (the answer's first and last token) for SQuAD.
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: NotRequired[torch.Tensor]
    start_positions: NotRequired[torch.Tensor]
    end_positions: NotRequired[torch.Tensor]


def tensors(batch: Batch | TaskBatch) -> dict[str, torch.Tensor]:
    """``batch`` as a plain dict of its tensors, for code that treats every entry alike (moving them
    to the device, slicing rows); a type checker sees a ``TypedDict``'s values as objects."""
    return cast(dict[str, torch.Tensor], batch)
