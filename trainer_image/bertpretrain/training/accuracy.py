"""Masked-LM and next-sentence-prediction accuracy, counted so that sums over ranks stay exact.

Masked-LM accuracy (the share of masked positions whose most probable token is the original one)
is MLPerf's quality target for BERT pretraining; NSP accuracy is the share of sentence pairs
classified right. Counting hits and totals, rather than averaging ratios, makes the figure of a
whole evaluation independent of how it was split into batches and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertpretrain.model.bert import IGNORE_INDEX

COUNTS = ("mlm_correct", "mlm_total", "nsp_correct", "nsp_total")


def prediction_counts(
    mlm_logits: torch.Tensor,
    masked_lm_labels: torch.Tensor,
    nsp_logits: torch.Tensor,
    next_sentence_labels: torch.Tensor,
) -> torch.Tensor:
    """Hits and totals of the two pretraining tasks in one batch.

    Args:
        mlm_logits: ``[B, P, V]`` (or ``[B, L, V]``); masked_lm_labels: the same without V, int64,
            -100 where nothing is predicted.
        nsp_logits: ``[..., 2]``; next_sentence_labels: the same without the 2, int64, -100 on
            the empty slots of packed rows.

    Returns:
        fp32 ``[4]``: masked-LM hits, masked positions, NSP hits, NSP labels (see ``COUNTS``).
    """
    counts = []
    for logits, labels in ((mlm_logits, masked_lm_labels), (nsp_logits, next_sentence_labels)):
        real = labels != IGNORE_INDEX
        hits = (logits.argmax(dim=-1) == labels) & real
        counts += [hits.sum(), real.sum()]
    return torch.stack(counts).float()


@dataclass(frozen=True)
class Accuracy:
    """Masked-LM and NSP accuracy over ``sequences`` sequences (NaN where nothing was counted)."""

    mlm: float
    nsp: float
    sequences: int

    @classmethod
    def from_counts(cls, counts: torch.Tensor) -> Accuracy:
        """From a sum of :func:`prediction_counts` results."""
        mlm_correct, mlm_total, nsp_correct, nsp_total = counts.tolist()
        return cls(
            mlm_correct / mlm_total if mlm_total else float("nan"),
            nsp_correct / nsp_total if nsp_total else float("nan"),
            round(nsp_total),
        )
