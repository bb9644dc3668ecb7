"""Evaluation on the held-out shards: masked-LM accuracy (MLPerf's quality metric), NSP accuracy
and the pretraining loss of sequences the model has never trained on.

Every rank evaluates a disjoint part of the held-out rows (``loader.heldout_batches``) with
dropout off, and the hits, totals and loss sums are added over ranks, so the figures do not
depend on the number of ranks or the batch size. The losses are means over all masked positions
and all sentence pairs, not means of per-batch means.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import torch

from bertpretrain.common.batch import Batch
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.sharding import whole_copy
from bertpretrain.training.accuracy import Accuracy, StepStatistics


@dataclass(frozen=True)
class Evaluation:
    """The result of one evaluation; losses in nats per prediction, ``seconds`` of wall time."""

    accuracy: Accuracy
    mlm_loss: float
    nsp_loss: float
    seconds: float

    @property
    def loss(self) -> float:
        """MLM plus NSP loss, as the training loss is defined (MLM alone without NSP)."""
        return self.mlm_loss + (self.nsp_loss if self.accuracy.has_nsp else 0.0)

    def values(self) -> dict[str, float]:
        """The figures by name, for the training log (no NSP figures without NSP)."""
        values = {"loss": self.loss, "mlm_loss": self.mlm_loss, "mlm_accuracy": self.accuracy.mlm}
        if self.accuracy.has_nsp:
            values |= {"nsp_loss": self.nsp_loss, "nsp_accuracy": self.accuracy.nsp}
        return values | {"sequences": float(self.accuracy.sequences)}


@dataclass(frozen=True)
class _Sums:
    """What an evaluation adds up, over batches and then over ranks: each loss weighted by its
    number of predictions (a batch without masked positions has a NaN mean loss that weighs
    nothing), and the accuracy counts as :func:`bertpretrain.training.accuracy.prediction_counts`
    gives them. They travel as one fp32 ``[7]`` tensor in field order (:meth:`of_batch`,
    :meth:`from_tensor`), so that the ranks add them up in one all-reduce."""

    mlm_loss: float  # MLM loss x masked positions
    nsp_loss: float  # NSP loss x sentence pairs
    mlm_correct: float
    mlm_total: float
    nsp_correct: float
    nsp_total: float
    sequences: float

    SIZE: ClassVar[int] = 7  # fields, the length of of_batch()

    @staticmethod
    def of_batch(stats: StepStatistics) -> torch.Tensor:
        """One batch's sums as fp32 ``[7]``, in field order, on the statistics' device."""
        totals = torch.stack([stats.mlm_total, stats.nsp_total])
        losses = torch.stack([stats.mlm_loss, stats.nsp_loss])
        weighted = torch.where(totals > 0, losses * totals, 0.0)
        return torch.cat([weighted, stats.counts()])

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> _Sums:
        """From fp32 ``[7]`` as :meth:`of_batch` makes it (or a sum of such)."""
        return cls(*values.cpu().tolist())

    def accuracy(self) -> Accuracy:
        """Masked-LM and NSP accuracy from the counts."""
        counts = [self.mlm_correct, self.mlm_total, self.nsp_correct, self.nsp_total, self.sequences]
        return Accuracy.from_counts(torch.tensor(counts, dtype=torch.float32))

    @staticmethod
    def mean(loss_sum: float, total: float) -> float:
        """``loss_sum / total``, NaN when nothing was counted."""
        return loss_sum / total if total else float("nan")


def evaluate(engine: Engine, batches: Iterable[Batch]) -> Evaluation:
    """Evaluate ``engine``'s model on this rank's ``batches``; every rank must call it (collective).

    The model is put in eval mode and back in train mode. Evaluation draws nothing from torch's
    random number generators, so a run's training is the same with or without it.
    """
    started = time.perf_counter()
    # _Sums as one tensor, summed over batches here and over ranks in one all-reduce.
    sums = torch.zeros(_Sums.SIZE, device=engine.device)
    # The ranks' batch counts may differ; a ZeRO-3 forward would wait for every rank, so each
    # evaluates a copy of the whole model made once (whole_copy; the model itself otherwise).
    with whole_copy(engine.module) as model:
        model.eval()
        try:
            for batch in batches:
                sums += _Sums.of_batch(StepStatistics.from_tensor(engine.evaluate(batch, model)))
        finally:
            model.train()
    total = _Sums.from_tensor(engine.sum_over_ranks(sums))
    return Evaluation(
        total.accuracy(),
        _Sums.mean(total.mlm_loss, total.mlm_total),
        _Sums.mean(total.nsp_loss, total.nsp_total),
        time.perf_counter() - started,
    )
