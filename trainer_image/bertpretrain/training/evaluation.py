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
        """MLM plus NSP loss, as the training loss is defined."""
        return self.mlm_loss + self.nsp_loss

    def values(self) -> dict[str, float]:
        """The figures by name, for the training log."""
        return {
            "loss": self.loss,
            "mlm_loss": self.mlm_loss,
            "nsp_loss": self.nsp_loss,
            "mlm_accuracy": self.accuracy.mlm,
            "nsp_accuracy": self.accuracy.nsp,
            "sequences": float(self.accuracy.sequences),
        }


def evaluate(engine: Engine, batches: Iterable[Batch]) -> Evaluation:
    """Evaluate ``engine``'s model on this rank's ``batches``; every rank must call it (collective).

    The model is put in eval mode and back in train mode. Evaluation draws nothing from torch's
    random number generators, so a run's training is the same with or without it.
    """
    started = time.perf_counter()
    # [MLM loss x masked positions, NSP loss x pairs, then StepStatistics.counts()], summed over
    # batches here and over ranks in one all-reduce.
    sums = torch.zeros(6, device=engine.device)
    # The ranks' batch counts may differ; a ZeRO-3 forward would wait for every rank, so each
    # evaluates a copy of the whole model made once (whole_copy; the model itself otherwise).
    with whole_copy(engine.module) as model:
        model.eval()
        try:
            for batch in batches:
                stats = StepStatistics.from_tensor(engine.evaluate(batch, model))
                totals = torch.stack([stats.mlm_total, stats.nsp_total])
                losses = torch.stack([stats.mlm_loss, stats.nsp_loss])
                # A batch without masked positions has a NaN mean loss that weighs nothing.
                weighted = torch.where(totals > 0, losses * totals, 0.0)
                sums += torch.cat([weighted, stats.counts()])
        finally:
            model.train()
    mlm_loss_sum, nsp_loss_sum, *counts = engine.sum_over_ranks(sums).cpu().unbind()
    accuracy = Accuracy.from_counts(torch.stack(counts))
    mlm_total, nsp_total = float(counts[1]), float(counts[3])
    return Evaluation(
        accuracy,
        float(mlm_loss_sum) / mlm_total if mlm_total else float("nan"),
        float(nsp_loss_sum) / nsp_total if nsp_total else float("nan"),
        time.perf_counter() - started,
    )
