"""One pretraining phase: build everything from the job spec, run the optimizer steps, checkpoint.

NVIDIA's two-phase recipe (DeepLearningExamples BERT, after You et al. 2020): phase 1 trains
at sequence length 128, phase 2 continues from phase 1's final weights at 512 with a fresh
optimizer, step count and schedule. A phase that finds a checkpoint of its own resumes from the
newest one (model, optimizer, schedule, step and data position) instead.
"""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from bertjob.defaults import gradient_accumulation_steps, micro_batch_size, resolve_model
from bertjob.spec import JobSpec, PhaseSpec
from bertpretrain.checkpoint import (
    checkpoint_path,
    latest,
    load_model_weights,
    load_training_state,
    phase_dir,
    save_checkpoint,
)
from bertpretrain.engine import Engine
from bertpretrain.loader import Batch, DynamicMasking, build_loader
from bertpretrain.model import BertConfig, BertForPreTraining, count_parameters
from bertpretrain.optimizer import build_optimizer
from bertpretrain.schedule import poly_warmup_schedule


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclass
class _Phase:
    """What the loop of one phase needs, built by :func:`_build`."""

    spec: JobSpec
    index: int
    engine: Engine
    model: BertForPreTraining
    loader: DataLoader[Batch]
    accumulation_steps: int
    start_step: int

    @property
    def phase(self) -> PhaseSpec:
        return self.spec.phases[self.index]

    @property
    def name(self) -> str:
        return f"phase {self.index + 1}/{len(self.spec.phases)}"

    @property
    def root(self) -> Path:
        return Path(self.spec.checkpoint.path)


def train_phase(
    spec: JobSpec,
    phase_index: int,
    shard_dir: Path,
    vocab_size: int,
    init_from: Path | None = None,
    vocab_dir: Path | None = None,
) -> Path:
    """Train phase ``phase_index`` (0-based) of ``spec`` on the shards in ``shard_dir``.

    ``spec`` must have been through :func:`bertjob.defaults.with_defaults`. The model starts
    from ``init_from``'s weights (phase 1's final checkpoint, for phase 2) or from random
    initialisation, unless a checkpoint of this phase exists, which is resumed. ``vocab_dir`` (the
    vocabulary the shards were made with) is needed for dynamic masking. Every rank calls
    this; rank 0 prints progress to stdout and writes the checkpoints, which must be on storage
    all ranks share.

    Returns:
        The phase's final checkpoint, ``<checkpoint.path>/phase<n>/step_<steps:06d>.pt``.

    Raises:
        DivergenceError: the loss became NaN or infinite (a RuntimeError).
        bertpretrain.loader.ShardError, bertpretrain.checkpoint.CheckpointError: bad input files.
        RuntimeError: an accelerator that is missing or not supported.
    """
    engine = Engine(spec.accelerator, spec.precision)
    try:
        run = _build(spec, phase_index, shard_dir, vocab_size, init_from, vocab_dir, engine)
        _train(run)
        engine.barrier()
        return checkpoint_path(run.root, phase_index, run.phase.steps)
    finally:
        engine.close()


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def _build(
    spec: JobSpec,
    index: int,
    shard_dir: Path,
    vocab_size: int,
    init_from: Path | None,
    vocab_dir: Path | None,
    engine: Engine,
) -> _Phase:
    phase = spec.phases[index]
    torch.manual_seed(_seed(spec.seed, index))
    model = BertForPreTraining(BertConfig.from_dims(resolve_model(spec.model), vocab_size))
    resume = latest(phase_dir(Path(spec.checkpoint.path), index))
    if resume is None and init_from is not None:
        load_model_weights(init_from, model)
    engine.prepare(model)
    # Dropout differs between ranks; the initial weights above do not.
    torch.manual_seed(_seed(spec.seed, index, engine.rank + 1))

    optimizer = build_optimizer(model, spec.optimizer, phase.learning_rate)
    scheduler = poly_warmup_schedule(optimizer, phase.steps, phase.warmup_proportion)
    engine.attach(
        optimizer, scheduler, None if spec.optimizer.name == "lamb" else spec.optimizer.max_grad_norm
    )
    start_step = load_training_state(resume, model, optimizer, scheduler, engine.scaler) if resume else 0

    accumulation_steps = gradient_accumulation_steps(phase, engine.world_size)
    loader = build_loader(
        shard_dir,
        phase.max_seq_length,
        phase.max_predictions_per_seq,
        vocab_size,
        micro_batch_size(phase, engine.world_size),
        rank=engine.rank,
        world_size=engine.world_size,
        seed=_seed(spec.seed, index),
        skip_batches=start_step * accumulation_steps,
        num_workers=1 if engine.device.type == "cuda" else 0,
        pin_memory=engine.device.type == "cuda",
        masking=_dynamic_masking(spec, vocab_dir),
    )
    run = _Phase(spec, index, engine, model, loader, accumulation_steps, start_step)
    _announce(run, resume or init_from)
    return run


def _dynamic_masking(spec: JobSpec, vocab_dir: Path | None) -> DynamicMasking | None:
    data = spec.data
    if data.masking != "dynamic":
        return None
    if vocab_dir is None:
        raise ValueError("data.masking is dynamic, but the trainer was given no vocabulary to mask with")
    return DynamicMasking.from_vocab(vocab_dir, data.masked_lm_prob, data.whole_word_mask)


def _announce(run: _Phase, source: Path | None) -> None:
    if not run.engine.is_main:
        return
    phase, spec = run.phase, run.spec
    origin = "random initialisation" if source is None else str(source)
    print(
        f"{run.name}: {spec.model.preset} ({count_parameters(run.model):,} parameters), "
        f"{phase.steps} steps x {phase.global_batch_size} sequences of {phase.max_seq_length} tokens "
        f"(micro-batch {phase.micro_batch_size} x {run.accumulation_steps} accumulation steps x "
        f"world size {run.engine.world_size}), {run.engine.device} {spec.precision} {spec.optimizer.name}; "
        f"from {origin} at step {run.start_step}",
        flush=True,
    )


def _train(run: _Phase) -> None:
    phase, engine = run.phase, run.engine
    batches = iter(run.loader)
    progress = _Progress(run)
    for step in range(run.start_step + 1, phase.steps + 1):
        losses = torch.zeros(3, device=engine.device)
        for _ in range(run.accumulation_steps):
            losses += engine.forward_backward(next(batches), run.accumulation_steps)
        lr = engine.optimizer_step()
        losses = engine.mean_over_ranks(losses / run.accumulation_steps)
        progress.record(step, losses.tolist(), lr)
        if engine.is_main and (step % run.spec.checkpoint.every_steps == 0 or step == phase.steps):
            save_checkpoint(
                run.root,
                run.index,
                step,
                model=run.model,
                optimizer=engine.optimizer,
                scheduler=engine.scheduler,
                scaler=engine.scaler,
                keep=run.spec.checkpoint.keep,
            )


class _Progress:
    """Checks each step's loss and prints one line per ``logging.every_steps`` steps (rank 0).

    The loss shown is the mean over the steps since the last line; seq/s counts sequences of
    all ranks per second of wall-clock time over those steps.
    """

    def __init__(self, run: _Phase):
        self.run = run
        self.sums = [0.0, 0.0, 0.0]
        self.steps = 0
        self.start = time.perf_counter()

    def record(self, step: int, losses: list[float], lr: float) -> None:
        if not all(math.isfinite(value) for value in losses):
            raise DivergenceError(
                f"{self.run.name} step {step}: loss is {losses[0]} (mlm {losses[1]} nsp {losses[2]}); "
                f"stopping. Lower the learning rate, or use bf16 or fp32 instead of fp16."
            )
        self.sums = [total + value for total, value in zip(self.sums, losses, strict=True)]
        self.steps += 1
        if step % self.run.spec.logging.every_steps == 0 or step == self.run.phase.steps:
            self._print(step, lr)
            self.sums, self.steps, self.start = [0.0, 0.0, 0.0], 0, time.perf_counter()

    def _print(self, step: int, lr: float) -> None:
        if not self.run.engine.is_main:
            return
        phase = self.run.phase
        elapsed = time.perf_counter() - self.start
        total, mlm, nsp = (value / self.steps for value in self.sums)
        eta = datetime.timedelta(seconds=round((phase.steps - step) * elapsed / self.steps))
        print(
            f"{self.run.name} step {step}/{phase.steps} loss {total:.3f} (mlm {mlm:.3f} nsp {nsp:.3f}) "
            f"lr {lr:.1e} seq/s {self.steps * phase.global_batch_size / elapsed:.1f} eta {eta}",
            flush=True,
        )
