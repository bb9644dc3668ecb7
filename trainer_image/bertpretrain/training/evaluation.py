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

from bertpretrain.runtime.engine import Batch, Engine
from bertpretrain.training.accuracy import Accuracy


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
    model = engine.module
    model.eval()
    # [MLM loss x masked positions, NSP loss x pairs, hits and totals of prediction_counts]
    sums = torch.zeros(6, device=engine.device)
    try:
        for batch in batches:
            stats = engine.evaluate(batch)
            # A batch without masked positions has a NaN mean loss that weighs nothing.
            weighted = torch.where(stats[[4, 6]] > 0, stats[[1, 2]] * stats[[4, 6]], 0.0)
            sums += torch.cat([weighted, stats[3:]])
    finally:
        model.train()
    sums = engine.sum_over_ranks(sums).cpu()
    accuracy = Accuracy.from_counts(sums[2:])
    mlm_total, nsp_total = float(sums[3]), float(sums[5])
    return Evaluation(
        accuracy,
        float(sums[0]) / mlm_total if mlm_total else float("nan"),
        float(sums[1]) / nsp_total if nsp_total else float("nan"),
        time.perf_counter() - started,
    )
