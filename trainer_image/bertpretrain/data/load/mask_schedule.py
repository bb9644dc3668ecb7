"""A masking rate that changes as a phase trains (``spec.data.finalMaskedLmProb``).

Ankner et al. 2023 ("Dynamic Masking Rate Schedules for MLM Pretraining", arXiv 2305.15096) decay
BERT's masking rate linearly from 30% to 15% over pretraining. Our loader masks a whole shard's
rows at once, often in a worker process, and does not know where training stands; so it masks at
the schedule's highest rate, and the training loop keeps, in each micro-batch, a uniformly random
subset of those masked tokens of the size the rate of that step asks for (:func:`thin_masks`),
unmasking the rest. A uniform subset of a uniform subset is uniform, and each kept token keeps its
own 80/10/10 corruption, so a row is masked as if at the lower rate directly. The draw is seeded
by the step, so a resumed run draws what the interrupted one drew.
"""

from __future__ import annotations

import torch

from bertpretrain.common.batch import Batch
from bertpretrain.common.labels import IGNORE_INDEX


def scheduled_rate(masked_lm_prob: float, final_masked_lm_prob: float, progress: float) -> float:
    """The masking rate at ``progress`` (0 to 1) of a phase: ``masked_lm_prob`` at 0, linearly to
    ``final_masked_lm_prob`` at 1 (Ankner et al. 2023's linear schedule)."""
    return masked_lm_prob + (final_masked_lm_prob - masked_lm_prob) * min(max(progress, 0.0), 1.0)


def thin_masks(batch: Batch, masked_lm_prob: float, generator: torch.Generator) -> Batch:
    """``batch`` with, in each row, at most ``max(1, round(tokens x masked_lm_prob))`` of its masked
    tokens kept (the count the masking itself uses; ``tokens`` counts the row's real tokens, special
    ones included), chosen uniformly at random with ``generator``; the others get their original
    ids back and leave ``masked_lm_positions`` and ``masked_lm_labels``, whose kept slots come first,
    in increasing position, the rest zero and -100.

    ``batch`` is unpacked (``masked_lm_*`` int64 [B, P]) on the CPU; it is not modified. A row
    with fewer masked tokens than asked keeps them all.
    """
    positions, labels = batch["masked_lm_positions"], batch["masked_lm_labels"]
    rows, slots = positions.shape
    length = batch["input_ids"].shape[1]
    masked = labels != IGNORE_INDEX
    tokens = batch["attention_mask"].sum(dim=1, dtype=torch.float64)
    wanted = torch.round(tokens * masked_lm_prob).clamp(min=1).to(torch.int64)
    # A random rank for each masked slot; padding slots rank last.
    keys = torch.rand((rows, slots), generator=generator, dtype=torch.float64)
    keys[~masked] = 2.0
    rank = keys.argsort(dim=1).argsort(dim=1)
    keep = masked & (rank < wanted[:, None])
    dropped = masked & ~keep
    input_ids = batch["input_ids"].clone()
    row_index = torch.arange(rows)[:, None].expand(rows, slots)
    input_ids[row_index[dropped], positions[dropped]] = labels[dropped]
    # Kept slots first, by position (the order the masking writes them in); length sorts after all.
    order = torch.where(keep, positions, torch.full_like(positions, length)).argsort(dim=1, stable=True)
    kept = keep.gather(1, order)
    return {
        **batch,
        "input_ids": input_ids,
        "masked_lm_positions": torch.where(kept, positions.gather(1, order), 0),
        "masked_lm_labels": torch.where(kept, labels.gather(1, order), IGNORE_INDEX),
    }
