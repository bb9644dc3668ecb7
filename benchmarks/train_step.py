"""Our training step against transformers' ``BertForPreTraining``: sequences/s and peak memory.

    python benchmarks/train_step.py                            # bert-mini and bert-small, cpu, fp32
    python benchmarks/train_step.py --presets bert-base --device cuda --precision bf16

One step is forward, loss, backward and an optimizer step, for both models:

- ours: :class:`bertpretrain.model.bert.BertForPreTraining` with ``masked_lm_positions``, so the MLM
  head runs on the masked positions only, and :func:`bertpretrain.model.bert.pretraining_loss`;
- Hugging Face's: ``transformers.BertForPreTraining`` (default attention, SDPA) with ``labels``
  (-100 outside the masked positions) and ``next_sentence_label``, so it computes MLM logits on
  every token and returns the same loss (mean MLM plus mean NSP cross-entropy).

Both have the same config (vocabulary 30522, as bert-base-uncased), start from the same weights
(ours at seed 0, written once and loaded into each), take the same synthetic batch
(``benchmarks/throughput.py``'s rows: seq 128, 20 masked positions, no padding), run in the same
precision (fp32, or bf16 autocast) and use the same optimizer: our LAMB
(:class:`bertpretrain.training.optimizer.Lamb`, apex FusedLAMB semantics, weight decay 0.01 on
:func:`bertpretrain.training.optimizer.param_groups`). Dropout is on (training mode). The first
``WARMUP_STEPS`` steps are not timed; sequences/s is the micro-batch over the median of the timed
steps' times (each step ends with a device synchronisation on CUDA), so that a few steps slowed
by other processes on a shared machine do not move it. The load average before and after the
run is printed with the table; the benchmark's own two threads account for about 2 of it.

Each model is measured in a fresh process (multiprocessing ``spawn``), one after the other, so
that its peak memory is its own. On CPU the peak is the process's peak resident set in MiB
(``VmHWM``, which is what ``ru_maxrss`` would report without what a spawned process inherits, see
:func:`max_rss_mb`); it includes the interpreter, torch and transformers (both processes import
the same modules, and the peak after the imports is printed too), the weights and the optimizer
state. On CUDA it is ``torch.cuda.max_memory_allocated`` in MiB. Before training, each process
also computes the loss in evaluation mode (no dropout) on the batch, and the two are printed:
equal losses show that the models start from the same weights and compute the same thing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from throughput import synthetic_rows

from bertjob_api.defaults import MODEL_PRESETS
from bertpretrain.data.loader import to_batch
from bertpretrain.model.bert import IGNORE_INDEX, BertConfig, BertForPreTraining, pretraining_loss
from bertpretrain.training.optimizer import Lamb, param_groups

SEQ_LENGTH, PREDICTIONS, MICRO_BATCH = 128, 20, 32
VOCAB_SIZE = 30522  # bert-base-uncased
WARMUP_STEPS = 3
LEARNING_RATE, WEIGHT_DECAY = 1e-3, 0.01
MODELS = ("ours", "hf")


def make_batch(device: torch.device) -> dict[str, torch.Tensor]:
    """The batch both models train on: ``to_batch`` tensors plus Hugging Face's ``labels`` [B, L].

    ``labels`` holds the masked tokens' ids at their positions and -100 elsewhere.
    """
    rows = synthetic_rows(MICRO_BATCH, SEQ_LENGTH, PREDICTIONS, np.random.default_rng(0))
    # throughput.py draws ids below NVIDIA's padded vocabulary (30528); fold them into 30522.
    rows["input_ids"] %= VOCAB_SIZE
    rows["masked_lm_ids"] %= VOCAB_SIZE
    batch = to_batch(rows)
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    labels.scatter_(1, batch["masked_lm_positions"], batch["masked_lm_labels"])
    batch["labels"] = labels
    return {name: tensor.to(device) for name, tensor in batch.items()}


def build_model(name: str, config: BertConfig, weights: Path) -> torch.nn.Module:
    """``name``'s model (``"ours"`` or ``"hf"``) with the weights saved at ``weights``."""
    model: torch.nn.Module
    if name == "ours":
        model = BertForPreTraining(config)
    else:
        model = transformers.BertForPreTraining(transformers.BertConfig(**config.to_hf_dict()))
    model.load_state_dict(torch.load(weights, weights_only=True))
    return model


def loss_of(name: str, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The pretraining loss (fp32 scalar, nats) of ``name``'s model on ``batch``, as each is called."""
    if name == "ours":
        mlm_logits, nsp_logits = model(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"]
        )
        return pretraining_loss(
            mlm_logits, batch["masked_lm_labels"], nsp_logits, batch["next_sentence_labels"]
        )[0]
    output = model(
        input_ids=batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
        next_sentence_label=batch["next_sentence_labels"],
    )
    return output.loss


def max_rss_mb() -> float:
    """This process's peak resident set so far, MiB: ``VmHWM`` of ``/proc/self/status`` (Linux).

    Not ``ru_maxrss``: Linux carries the peak of the address space that ``exec`` replaces into
    it, so a spawned child's ``ru_maxrss`` starts at the parent's resident set at the fork.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**10  # kB
    raise RuntimeError("/proc/self/status has no VmHWM (not Linux?)")


def measure(name: str, preset: str, device_name: str, precision: str, steps: int, weights: str) -> dict:
    """Train ``name``'s model for ``WARMUP_STEPS + steps`` steps; run in a fresh process.

    Returns:
        ``seq_per_s``, the micro-batch over the median time of the timed steps; ``peak_mb``
        (MiB, see the module's docstring); ``imports_mb``, the peak resident set before the
        model is built (the interpreter and the imported modules); ``initial_loss``, in
        evaluation mode before any step.
    """
    imports_mb = max_rss_mb()
    device = torch.device(device_name)
    torch.manual_seed(1)  # dropout's masks; the initial weights come from ``weights``
    config = BertConfig.from_dims(MODEL_PRESETS[preset], VOCAB_SIZE)
    model = build_model(name, config, Path(weights)).to(device)
    optimizer = Lamb(param_groups(model, WEIGHT_DECAY), lr=LEARNING_RATE)
    batch = make_batch(device)
    autocast: Any = (
        torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    )

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    model.eval()
    with torch.no_grad(), autocast:
        initial_loss = loss_of(name, model, batch).item()
    model.train()
    seconds = []
    for _ in range(WARMUP_STEPS + steps):
        started = time.perf_counter()
        with autocast:
            loss = loss_of(name, model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize()
        seconds.append(time.perf_counter() - started)
    on_cuda = device.type == "cuda"
    return {
        "seq_per_s": MICRO_BATCH / statistics.median(seconds[WARMUP_STEPS:]),
        "peak_mb": torch.cuda.max_memory_allocated(device) / 2**20 if on_cuda else max_rss_mb(),
        "imports_mb": imports_mb,
        "initial_loss": initial_loss,
    }


def _load_average() -> str:
    return ", ".join(f"{load:.2f}" for load in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    """Print the comparison table (Markdown); returns the exit code."""
    parser = argparse.ArgumentParser(
        description="Our training step against transformers' BertForPreTraining."
    )
    parser.add_argument("--presets", nargs="+", default=["bert-mini", "bert-small"], choices=MODEL_PRESETS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps, after the warm-up ones")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    load_before = _load_average()
    print(
        f"{args.device}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads; optimizer: our LAMB for both; "
        f"{WARMUP_STEPS} warm-up + {args.steps} timed steps; peak memory: "
        f"{'max_memory_allocated' if args.device == 'cuda' else 'peak resident set (VmHWM) of each process'}"
    )
    print()
    print("| preset | seq | batch | precision | ours seq/s | HF seq/s | ratio | ours peak MB | HF peak MB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    notes = []
    spawn = get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            weights = Path(tmp) / f"{preset}.pt"
            torch.manual_seed(0)
            model = BertForPreTraining(BertConfig.from_dims(MODEL_PRESETS[preset], VOCAB_SIZE))
            torch.save(model.state_dict(), weights)
            del model
            for precision in args.precision:
                results = {}
                for name in MODELS:
                    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                        results[name] = pool.submit(
                            measure, name, preset, args.device, precision, args.steps, str(weights)
                        ).result()
                ours, hf = results["ours"], results["hf"]
                print(
                    f"| {preset} | {SEQ_LENGTH} | {MICRO_BATCH} | {precision} | {ours['seq_per_s']:.1f} "
                    f"| {hf['seq_per_s']:.1f} | {ours['seq_per_s'] / hf['seq_per_s']:.2f} "
                    f"| {ours['peak_mb']:.0f} | {hf['peak_mb']:.0f} |",
                    flush=True,
                )
                notes.append((preset, precision, ours, hf))
    print()
    print(f"load average (1, 5, 15 min) before: {load_before}, after: {_load_average()}")
    for preset, precision, ours, hf in notes:
        print(
            f"{preset} {precision}: initial loss (eval mode) ours {ours['initial_loss']:.6f}, "
            f"HF {hf['initial_loss']:.6f}; peak RSS after imports ours {ours['imports_mb']:.0f} MB, "
            f"HF {hf['imports_mb']:.0f} MB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
