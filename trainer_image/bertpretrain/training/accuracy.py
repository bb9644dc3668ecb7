"""What a training or evaluation step measures: the losses, and masked-LM and next-sentence-
prediction accuracy counted so that sums over ranks stay exact.

Masked-LM accuracy (the share of masked positions whose most probable token is the original one) is
MLPerf's quality target for BERT pretraining; NSP accuracy is the share of sentence pairs classified
right (none with ``objective: mlm``, whose model has no NSP head). Counting hits and totals, rather
than averaging ratios, makes the figure of a whole evaluation independent of how it was split into
batches and ranks. :class:`StepStatistics` names the figures of one micro-batch (or a sum of them),
which travel as one tensor through the engine and the single all-reduce of each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar, NamedTuple

import torch

from bertpretrain.common.batch import Batch
from bertpretrain.common.labels import IGNORE_INDEX
from bertpretrain.model.bert import pretraining_loss

COUNTS = ("mlm_correct", "mlm_total", "nsp_correct", "nsp_total", "sequences")


class MeanLosses(NamedTuple):
    """Losses averaged over micro-batches, in nats: the pretraining loss and its two parts."""

    loss: float  # mlm_loss + nsp_loss (0 without NSP)
    mlm_loss: float  # masked-LM cross-entropy
    nsp_loss: float  # next-sentence cross-entropy


def prediction_counts(
    mlm_logits: torch.Tensor,
    masked_lm_labels: torch.Tensor,
    nsp_logits: torch.Tensor | None,
    next_sentence_labels: torch.Tensor,
    attention_mask: torch.Tensor,
) -> torch.Tensor:
    """Hits and totals of the pretraining tasks in one batch, and its sequences.

    Args:
        mlm_logits: ``[B, P, V]`` (or ``[B, L, V]``); masked_lm_labels: the same without V, int64,
            -100 where nothing is predicted.
        nsp_logits: ``[..., 2]``, or None for a model without NSP (no NSP hits or labels counted);
            next_sentence_labels: the same without the 2, int64, -100 on the empty slots of packed
            rows.
        attention_mask: ``[B, L]`` as the model takes it: 1 for tokens (unpacked), each token's
            sequence number 1..S (packed), so a row's largest entry is its sequence count.

    Returns:
        fp32 ``[5]``: masked-LM hits, masked positions, NSP hits, NSP labels, sequences (see
        ``COUNTS``).
    """
    real = masked_lm_labels != IGNORE_INDEX
    counts = [((mlm_logits.argmax(dim=-1) == masked_lm_labels) & real).sum(), real.sum()]
    if nsp_logits is None:
        counts += [torch.zeros((), device=mlm_logits.device)] * 2
    else:
        real = next_sentence_labels != IGNORE_INDEX
        counts += [((nsp_logits.argmax(dim=-1) == next_sentence_labels) & real).sum(), real.sum()]
    counts.append(attention_mask.amax(dim=1).sum())
    return torch.stack(counts).float()


@dataclass(frozen=True)
class Accuracy:
    """Masked-LM and NSP accuracy over ``sequences`` sequences (NaN where nothing was counted: NSP
    accuracy is NaN for a model without NSP)."""

    mlm: float
    nsp: float
    sequences: int

    @classmethod
    def from_counts(cls, counts: torch.Tensor) -> Accuracy:
        """From a sum of :func:`prediction_counts` results."""
        mlm_correct, mlm_total, nsp_correct, nsp_total, sequences = counts.tolist()
        return cls(
            mlm_correct / mlm_total if mlm_total else float("nan"),
            nsp_correct / nsp_total if nsp_total else float("nan"),
            round(sequences),
        )

    @property
    def has_nsp(self) -> bool:
        """Whether NSP labels were counted (not with ``objective: mlm``)."""
        return not math.isnan(self.nsp)


@dataclass(frozen=True)
class StepStatistics:
    """A micro-batch's losses and accuracy counts, or a sum of them over micro-batches and ranks;
    each a 0-d fp32 tensor (on the device they were computed on).

    ``loss`` = ``mlm_loss`` + ``nsp_loss``, means in nats per prediction (a sum of means, once
    summed; ``nsp_loss`` 0 without NSP); the counts as :func:`prediction_counts` gives them. They
    travel as one ``[8]`` tensor
    (:meth:`to_tensor`, in field order), so that a step needs one all-reduce for all of them.
    """

    loss: torch.Tensor
    mlm_loss: torch.Tensor
    nsp_loss: torch.Tensor
    mlm_correct: torch.Tensor
    mlm_total: torch.Tensor
    nsp_correct: torch.Tensor
    nsp_total: torch.Tensor
    sequences: torch.Tensor

    SIZE: ClassVar[int] = 8  # fields, the length of to_tensor()

    @classmethod
    def of_batch(cls, batch: Batch, outputs: tuple[torch.Tensor, torch.Tensor | None]) -> StepStatistics:
        """The statistics of one micro-batch from the model's ``(mlm_logits, nsp_logits)`` (None
        without NSP): the
        losses of :func:`bertpretrain.model.bert.pretraining_loss` (differentiable) and the counts
        of :func:`prediction_counts`. ``batch`` as :func:`bertpretrain.data.load.loader.to_batch`
        makes it."""
        mlm_logits, nsp_logits = outputs
        targets = (batch["masked_lm_labels"], batch["next_sentence_labels"])
        losses = pretraining_loss(mlm_logits, targets[0], nsp_logits, targets[1])
        nsp = None if nsp_logits is None else nsp_logits.detach()
        counts = prediction_counts(mlm_logits.detach(), targets[0], nsp, targets[1], batch["attention_mask"])
        return cls(*losses, *counts.unbind())

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> StepStatistics:
        """From fp32 ``[8]`` as :meth:`to_tensor` makes it (or a sum of such)."""
        return cls(*values.unbind())

    def to_tensor(self) -> torch.Tensor:
        """fp32 ``[8]``, the fields in order (element 0 the loss, as the engine needs it)."""
        # Not dataclasses.astuple, which deep-copies (and cannot copy a tensor inside a graph).
        return torch.stack([getattr(self, field.name) for field in fields(self)])

    def finite(self) -> bool:
        """Whether the three losses are finite."""
        return bool(torch.isfinite(torch.stack([self.loss, self.mlm_loss, self.nsp_loss])).all())

    def mean_losses(self, micro_batches: int) -> MeanLosses:
        """The three losses divided by ``micro_batches`` (in fp32, as summed): the means of a sum
        over that many micro-batches; NaN for none."""
        if not micro_batches:
            return MeanLosses(math.nan, math.nan, math.nan)
        loss, mlm, nsp = (torch.stack([self.loss, self.mlm_loss, self.nsp_loss]) / micro_batches).tolist()
        return MeanLosses(loss, mlm, nsp)

    def counts(self) -> torch.Tensor:
        """fp32 ``[5]``: the counts, as :func:`prediction_counts` gives them."""
        return torch.stack(
            [self.mlm_correct, self.mlm_total, self.nsp_correct, self.nsp_total, self.sequences]
        )

    def accuracy(self) -> Accuracy:
        """Masked-LM and NSP accuracy from the counts."""
        return Accuracy.from_counts(self.counts())


def step_statistics(batch: Batch, outputs: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    """:meth:`StepStatistics.of_batch` as one tensor: the engine's statistics function
    (:data:`bertpretrain.runtime.engine.Statistics`), element 0 the loss it minimises."""
    return StepStatistics.of_batch(batch, outputs).to_tensor()
