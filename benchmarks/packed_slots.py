"""A training step on packed rows with every prediction slot the shard keeps, against the slots the
batch uses (:func:`bertpretrain.data.load.loader.used_prediction_slots`), side by side.

    python benchmarks/packed_slots.py                 # bert-tiny, vocabulary 8000, 40 pairs of steps
    python benchmarks/packed_slots.py --pairs 100 --preset bert-mini

The rows are made up, shaped as the time-to-quality demo's packed rows (issue 47): ``--micro-batch``
rows of 128 tokens, one sequence of 90 to 127 tokens in four rows of five and two of 60 in the fifth
(about 1.2 sequences a row), 30% of each sequence's tokens masked, 3 x 38 = 114 slots a row as the
packed shard keeps them. A step is our ``BertForPreTraining`` without NSP (``objective: mlm``):
forward, :func:`bertpretrain.model.bert.pretraining_loss`, backward, an AdamW step, on CPU in fp32.
Each pair runs the two widths one after the other, alternating, after 3 untimed pairs.

Prints the two widths, the median milliseconds a micro-batch of each, the ratio of the medians
(used slots / all slots) and the 10th and 90th percentiles of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch

from bertjob_api.defaults import MODEL_PRESETS
from bertpretrain.data.load.loader import used_prediction_slots
from bertpretrain.model.bert import IGNORE_INDEX, BertConfig, BertForPreTraining, pretraining_loss

SEQ_LEN = 128
SEQUENCES_PER_PACK = 3
PREDICTIONS_PER_SEQ = 38  # round(128 x 0.3)
MASKED_LM_PROB = 0.3
WARM_UP_PAIRS = 3


def packed_rows(rows: int, vocab_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Made-up packed rows (int64 arrays): ``input_ids``, ``attention_mask`` (sequence number),
    ``position_ids`` [rows, 128]; ``next_sentence_positions`` [rows, 3]; ``masked_lm_positions``
    and ``masked_lm_labels`` [rows, 114], left-aligned, 0 and -100 on empty slots."""
    arrays = {
        "input_ids": rng.integers(5, vocab_size, (rows, SEQ_LEN)),
        "attention_mask": np.zeros((rows, SEQ_LEN), np.int64),
        "position_ids": np.zeros((rows, SEQ_LEN), np.int64),
        "next_sentence_positions": np.zeros((rows, SEQUENCES_PER_PACK), np.int64),
        "masked_lm_positions": np.zeros((rows, SEQUENCES_PER_PACK * PREDICTIONS_PER_SEQ), np.int64),
    }
    for row in range(rows):
        lengths = [60, 60] if row % 5 == 0 else [int(rng.integers(90, SEQ_LEN))]
        start = slot = 0
        for index, length in enumerate(lengths):
            arrays["attention_mask"][row, start : start + length] = index + 1
            arrays["position_ids"][row, start : start + length] = np.arange(length)
            arrays["next_sentence_positions"][row, index] = start
            count = round(length * MASKED_LM_PROB)
            chosen = np.sort(rng.choice(np.arange(start + 1, start + length), count, replace=False))
            arrays["masked_lm_positions"][row, slot : slot + count] = chosen
            slot += count
            start += length
    positions = arrays["masked_lm_positions"]
    arrays["masked_lm_labels"] = np.where(
        positions == 0, IGNORE_INDEX, rng.integers(5, vocab_size, positions.shape)
    )
    return arrays


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the comparison; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bert-tiny", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--micro-batch", type=int, default=16, help="packed rows a step")
    parser.add_argument("--pairs", type=int, default=40, help="timed pairs of steps")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    arrays = packed_rows(args.micro_batch, args.vocab_size, np.random.default_rng(0))
    model = BertForPreTraining(
        BertConfig.from_dims(MODEL_PRESETS[args.preset], args.vocab_size), next_sentence_prediction=False
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    inputs = {
        name: torch.from_numpy(arrays[name]) for name in ("input_ids", "attention_mask", "position_ids")
    }
    next_sentence_positions = torch.from_numpy(arrays["next_sentence_positions"])
    no_nsp = torch.full(next_sentence_positions.shape, IGNORE_INDEX)
    every = (arrays["masked_lm_positions"], arrays["masked_lm_labels"])
    widths = {"all slots": every, "used slots": used_prediction_slots(*every)}
    batches = {name: tuple(torch.from_numpy(a) for a in pair) for name, pair in widths.items()}

    def step(name: str) -> float:
        positions, labels = batches[name]
        start = time.perf_counter()
        mlm_logits, _ = model(
            inputs["input_ids"],
            torch.zeros_like(inputs["input_ids"]),
            inputs["attention_mask"],
            positions,
            position_ids=inputs["position_ids"],
            next_sentence_positions=next_sentence_positions,
        )
        pretraining_loss(mlm_logits, labels, None, no_nsp)[0].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for _ in range(WARM_UP_PAIRS):
        step("all slots"), step("used slots")
    times: dict[str, list[float]] = {name: [] for name in batches}
    for _ in range(args.pairs):
        for name in batches:
            times[name].append(step(name))
    real = int((arrays["masked_lm_positions"] != 0).sum())
    print(
        f"packed_slots: {args.preset}, vocabulary {args.vocab_size}, {args.micro_batch} rows of {SEQ_LEN} "
        f"tokens, {real} predictions; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    for name, (positions, _) in batches.items():
        print(
            f"{name}: {positions.shape[1]} slots a row, {statistics.median(times[name]) * 1e3:.1f} ms a step"
        )
    ratios = sorted(used / every for used, every in zip(times["used slots"], times["all slots"], strict=True))
    tenth = ratios[len(ratios) // 10]
    ninetieth = ratios[-(len(ratios) // 10) - 1]
    median_ratio = statistics.median(times["used slots"]) / statistics.median(times["all slots"])
    print(
        f"used / all slots, time a step: {median_ratio:.3f} (per pair: 10th percentile {tenth:.3f}, "
        f"90th {ninetieth:.3f}, {args.pairs} pairs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
