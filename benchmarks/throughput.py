"""Training throughput of the trainer's own step (forward, backward, LAMB) on synthetic batches.

    python benchmarks/throughput.py                       # bert-tiny, cpu, fp32 and bf16
    python benchmarks/throughput.py --preset bert-base --accelerator nvidia-gpu --precision bf16

Prints sequences/s per (sequence length, micro-batch, precision). Rows are synthetic and full
length (no padding) with NVIDIA's masked-prediction counts, so the figures compare across machines.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np
import torch

from bertjob_api.defaults import MODEL_PRESETS
from bertjob_api.spec import Accelerator, OptimizerSpec, Precision
from bertpretrain.data.load.loader import to_batch
from bertpretrain.model.bert import BertConfig, BertForPreTraining
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel.joining import join
from bertpretrain.training.accuracy import step_statistics
from bertpretrain.training.optimizer import build_optimizer
from bertpretrain.training.schedule import poly_warmup_schedule

SHAPES = ((128, 20, 32), (512, 80, 8))  # (max_seq_length, max_predictions_per_seq, micro-batch)
VOCAB_SIZE = 30528  # NVIDIA's padded uncased vocabulary


def synthetic_rows(batch: int, seq_length: int, predictions: int, rng: np.random.Generator) -> dict:
    """Shard rows in NVIDIA's schema: random ids, every position real, sorted masked positions."""
    positions = np.stack(
        [np.sort(rng.choice(np.arange(1, seq_length), predictions, replace=False)) for _ in range(batch)]
    )
    return {
        "input_ids": rng.integers(5, VOCAB_SIZE, (batch, seq_length)).astype(np.int32),
        "input_mask": np.ones((batch, seq_length), np.int8),
        "segment_ids": np.repeat((np.arange(seq_length) >= seq_length // 2)[None].astype(np.int8), batch, 0),
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": rng.integers(5, VOCAB_SIZE, (batch, predictions)).astype(np.int32),
        "next_sentence_labels": rng.integers(0, 2, batch).astype(np.int8),
    }


def measure(
    preset: str, accelerator: Accelerator, precision: Precision, shape: tuple[int, int, int], steps: int
) -> float:
    """Sequences/s over ``steps`` optimizer steps, after two warm-up steps."""
    seq_length, predictions, batch = shape
    engine = Engine(join(accelerator), precision, step_statistics)
    model = engine.prepare(BertForPreTraining(BertConfig.from_dims(MODEL_PRESETS[preset], VOCAB_SIZE)))
    optimizer = build_optimizer(model, OptimizerSpec(), lr=1e-3)
    engine.attach(optimizer, poly_warmup_schedule(optimizer, steps + 2, 0.1), clip_grad_norm=None)
    rows = to_batch(synthetic_rows(batch, seq_length, predictions, np.random.default_rng(0)))
    rows = {name: tensor.to(engine.device) for name, tensor in rows.items()}
    started = time.perf_counter()
    for step in range(steps + 2):
        if step == 2:
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
        engine.forward_backward(rows, accumulation_steps=1)
        engine.optimizer_step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - started)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the throughput table; returns the exit code."""
    parser = argparse.ArgumentParser(description="Training throughput of the trainer's step.")
    parser.add_argument("--preset", default="bert-tiny", choices=MODEL_PRESETS)
    parser.add_argument("--accelerator", default="xeon-cpu", choices=["xeon-cpu", "nvidia-gpu"])
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    print(f"{args.preset} on {args.accelerator}, torch {torch.__version__}, {threads} threads")
    for precision in args.precision:
        for shape in SHAPES:
            rate = measure(args.preset, args.accelerator, precision, shape, args.steps)
            print(f"  seq {shape[0]:4d}  micro-batch {shape[2]:3d}  {precision:5s} {rate:9.1f} sequences/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
