"""One fine-tuning run: a head on the encoder -> AdamW with linear warm-up and decay -> epochs over
the training features -> predictions on the validation features -> metrics.

The engine is pretraining's (:class:`bertpretrain.runtime.engine.Engine`): the device, the
precision, gradient accumulation and the data parallelism (DDP, Horovod or DeepSpeed over every
rank, or one rank alone for independent seeds) are behind it, so the loop reads as the recipe:
Devlin et al. 2019's fine-tuning (Adam with weight decay, linear decay after a 10% warm-up,
dropout 0.1, a few epochs), as Google's ``run_classifier.py``/``run_squad.py`` and NVIDIA's
scripts run it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import nn

from bertjob_api import deepspeed
from bertjob_api.defaults import gradient_accumulation_steps, micro_batch_size
from bertjob_api.spec import FinetuneTaskSpec, JobSpec
from bertpretrain.common.batch import TaskBatch, tensors
from bertpretrain.finetune.errors import TaskDataError
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.model.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    classification_loss,
    span_loss,
)
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel import DataParallel
from bertpretrain.training.checkpoint import load_initial_weights
from bertpretrain.training.optimizer import param_groups
from bertpretrain.training.schedule import build_schedule

# BERT's Adam: beta2 0.999 and epsilon 1e-6 (Google's AdamWeightDecayOptimizer).
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-6
Init = Literal["pretrained", "random"]


@dataclass(frozen=True)
class TaskData:
    """A task's features, the same on every rank, and how its predictions are scored.

    ``train`` and ``validation`` map names to tensors of N rows: ``input_ids``, ``token_type_ids``,
    ``attention_mask`` ``[N, L]`` int64, and the targets (``labels [N]`` for classification,
    ``start_positions``/``end_positions [N]`` for SQuAD; absent from ``validation``). ``score``
    turns the model's outputs on every validation row, in order (``[N, C]`` logits, or a pair of
    ``[N, L]`` start and end logits), into the task's metrics and the predictions they score (a
    list of ``{"row", "prediction"}`` label names, or SQuAD's ``{id: answer text}``, the official
    evaluation script's input). ``num_labels`` is None for SQuAD.
    """

    train: TaskBatch
    validation: TaskBatch
    score: Callable[[Any], tuple[dict[str, float], Any]]
    num_labels: int | None
    train_file: str

    @property
    def train_examples(self) -> int:
        """Training rows (classification examples, or SQuAD windows)."""
        return int(self.train["input_ids"].shape[0])


@dataclass(frozen=True)
class RunResult:
    """One run's outcome: its ``metrics`` on the validation file, ``steps`` optimizer steps in
    ``seconds`` of training (evaluation excluded), the mean training loss of its last logging
    window (nats), and its ``predictions`` on the validation file (see :class:`TaskData`)."""

    init: Init
    seed: int
    metrics: dict[str, float]
    steps: int
    seconds: float
    final_loss: float
    predictions: Any = field(repr=False, default=None)


@dataclass(frozen=True)
class _Split:
    """A run's batch split over its ranks and its length, derived once from the task."""

    micro_batch_size: int  # rows per rank per forward/backward pass
    accumulation_steps: int  # forward/backward passes per optimizer step on each rank
    steps: int  # optimizer steps: the whole global batches of an epoch x epochs


def build_model(
    task: FinetuneTaskSpec, config: BertConfig, num_labels: int | None, source: Path | None
) -> nn.Module:
    """The task's head on an encoder with the weights of ``source`` (any format
    :func:`bertpretrain.training.checkpoint.load_initial_weights` reads), or on a freshly
    initialised one (``source`` None: the random-weights baseline); seed torch first.

    Raises:
        bertpretrain.model.config.CheckpointError: ``source`` cannot be read or does not fit.
    """
    pretraining = BertForPreTraining(config)
    if source is not None:
        load_initial_weights(source, pretraining)
    if task.type == "squad":
        return BertForQuestionAnswering(pretraining.bert, config)
    assert num_labels is not None
    return BertForSequenceClassification(pretraining.bert, config, num_labels)


def _forward(model: Callable[..., Any], batch: TaskBatch) -> Any:
    return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])


def _statistics(task: FinetuneTaskSpec) -> Callable[[TaskBatch, Any], torch.Tensor]:
    if task.type == "squad":

        def squad(batch: TaskBatch, outputs: Any) -> torch.Tensor:
            start, end = outputs
            return span_loss(start, end, batch["start_positions"], batch["end_positions"]).reshape(1)

        return squad

    def classification(batch: TaskBatch, outputs: Any) -> torch.Tensor:
        return classification_loss(outputs, batch["labels"]).reshape(1)

    return classification


def _trimmed(batch: TaskBatch) -> TaskBatch:
    """``batch`` cut to its longest row (padding is at the end of each row): the short sentences of
    classification tasks then cost what their length does, not maxSeqLength."""
    length = int(batch["attention_mask"].sum(dim=1).max())
    return cast(TaskBatch, {name: t[:, :length] if t.dim() == 2 else t for name, t in tensors(batch).items()})


def _rows(features: TaskBatch, index: np.ndarray | slice) -> TaskBatch:
    return cast(TaskBatch, {name: tensor[index] for name, tensor in tensors(features).items()})


def run(
    spec: JobSpec,
    task: FinetuneTaskSpec,
    data: TaskData,
    config: BertConfig,
    source: Path | None,
    seed: int,
    parallel: DataParallel,
    label: str,
    log_every: int,
    verbose: bool,
) -> RunResult:
    """Fine-tune once with ``seed`` over the ranks of ``parallel`` (all of them, data-parallel, or
    one alone), then score the validation file. Every rank of ``parallel`` calls it; each returns
    the same result. ``label`` starts each progress line (task, init and seed), printed every
    ``log_every`` optimizer steps and at the last when ``verbose``.

    Raises:
        bertpretrain.finetune.errors.TaskDataError: fewer training rows than one global batch.
        bertpretrain.model.config.CheckpointError: ``source`` cannot be read or does not fit.
    """
    rows, batch = data.train_examples, task.global_batch_size
    if rows < batch:
        raise TaskDataError(
            data.train_file, f"{rows} training rows, fewer than one globalBatchSize of {batch}"
        )
    world_size = parallel.world.world_size
    split = _Split(
        micro_batch_size(task, world_size),
        gradient_accumulation_steps(task, world_size),
        (rows // batch) * task.epochs,
    )
    torch.manual_seed(seed)
    model = build_model(task, config, data.num_labels, source)
    engine = _engine(spec, task, model, parallel, split)
    # Dropout differs between ranks; the weights above do not.
    torch.manual_seed(seed * 1000 + parallel.world.rank + 1)
    started = time.perf_counter()

    def say(line: str) -> None:
        if verbose:
            print(f"{label} {line}", flush=True)

    final_loss = _train(engine, task, data, split, seed, say, log_every)
    seconds = time.perf_counter() - started
    model.eval()
    outputs = predict(engine, data.validation, split.micro_batch_size, task.type == "classification")
    metrics, predictions = data.score(outputs)
    init: Init = "random" if source is None else "pretrained"
    return RunResult(init, seed, metrics, split.steps, seconds, final_loss, predictions)


def _engine(
    spec: JobSpec, task: FinetuneTaskSpec, model: nn.Module, parallel: DataParallel, split: _Split
) -> Engine:
    """The engine with ``model`` on its device and AdamW with a linear warm-up and decay over the
    run's optimizer steps attached; every rank starts from rank 0's weights."""
    world_size, accumulation = parallel.world.world_size, split.accumulation_steps
    engine = Engine(parallel, spec.precision, _statistics(task), _forward)
    engine.prepare(model, compile=spec.compiles, required=spec.compile is not None)
    assert task.learning_rate is not None  # with_defaults sets it
    adamw = torch.optim.AdamW(
        param_groups(model, task.weight_decay), lr=task.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS
    )
    uses_deepspeed = spec.distributed.deepspeed is not None and parallel.world.distributed
    config = (
        deepspeed.phase_config(spec, split.micro_batch_size, accumulation, world_size)
        if uses_deepspeed
        else None
    )
    optimizer = engine.wrap_optimizer(adamw, accumulation, config)
    scheduler = build_schedule(optimizer, "linear", split.steps, task.warmup_proportion)
    engine.attach(optimizer, scheduler, spec.optimizer.max_grad_norm)
    engine.broadcast_state()
    return engine


def _train(
    engine: Engine,
    task: FinetuneTaskSpec,
    data: TaskData,
    split: _Split,
    seed: int,
    say: Callable[[str], object],
    log_every: int,
) -> float:
    """The epochs: the training rows shuffled per epoch with ``seed``, each optimizer step the next
    ``globalBatchSize`` of them (an epoch's remainder dropped, as the reference scripts' loaders
    do), each rank its share as accumulated micro-batches. Every ``log_every`` steps and at the
    last, ``say``s the mean loss over the ranks since the last line. Returns that last mean loss
    (nats)."""
    rank, micro, accumulation, steps = (
        engine.rank,
        split.micro_batch_size,
        split.accumulation_steps,
        split.steps,
    )
    rows, batch, share = data.train_examples, task.global_batch_size, micro * accumulation
    engine.module.train()
    window = torch.zeros(2)  # loss sum, micro-batches
    window_start, step, mean_loss = time.perf_counter(), 0, math.nan
    warmed_up = False
    for epoch in range(task.epochs):
        order = np.random.default_rng([seed, epoch]).permutation(rows)
        for first in range(0, rows - batch + 1, batch):
            mine = order[first + rank * share : first + (rank + 1) * share]
            for part in range(accumulation):
                micro_batch = _trimmed(_rows(data.train, mine[part * micro : (part + 1) * micro]))
                if not warmed_up:  # compile before the first step, as pretraining does
                    warmed_up, seconds = True, engine.warm_up(micro_batch)
                    if seconds is not None:
                        say(f"compiled the model for micro-batch {micro} in {seconds:.1f} s")
                        window_start = time.perf_counter()
                window += torch.tensor([float(engine.forward_backward(micro_batch, accumulation)[0]), 1.0])
            lr, _ = engine.optimizer_step()
            step += 1
            if step % log_every == 0 or step == steps:
                total = engine.sum_over_ranks(window.to(engine.device)).cpu()  # a collective
                mean_loss = float(total[0] / total[1])
                now = time.perf_counter()
                done = batch * (step % log_every or log_every)
                say(
                    f"epoch {epoch + 1}/{task.epochs} step {step}/{steps} loss {mean_loss:.4f} lr {lr:.2e} "
                    f"seq/s {done / max(now - window_start, 1e-9):.1f}"
                )
                window, window_start = torch.zeros(2), now
    return mean_loss


def predict(engine: Engine, features: TaskBatch, batch_size: int, trim: bool) -> Any:
    """The model's outputs on every row of ``features``, in order, on every rank: each rank runs
    batches ``rank, rank + world size, ...`` of ``batch_size`` rows, every rank the same number of
    forward passes (a rank short of one repeats its first, whose outputs are dropped: under ZeRO-3
    each forward is a collective), and the outputs are gathered. Returns ``[N, C]`` logits, or a
    ``([N, L], [N, L])`` pair, as fp32 numpy arrays; ``trim`` cuts each batch to its longest row
    (classification; SQuAD's logits keep their ``L`` columns).
    """
    rows = int(features["input_ids"].shape[0])
    rank, world_size = engine.rank, engine.world_size
    batches = math.ceil(rows / batch_size)
    mine = list(range(rank, batches, world_size))
    rounds = math.ceil(batches / world_size)
    # The encoder inputs alone: validation features may carry targets.
    inputs = TaskBatch(
        input_ids=features["input_ids"],
        token_type_ids=features["token_type_ids"],
        attention_mask=features["attention_mask"],
    )
    outputs: list[tuple[int, Any]] = []
    for turn in range(rounds):
        # A rank short of a batch repeats its first (rank 0's first, when it has none at all).
        kept = turn < len(mine)
        number = mine[turn] if kept else mine[0] if mine else 0
        batch = _rows(inputs, slice(number * batch_size, (number + 1) * batch_size))
        result = engine.predict(_trimmed(batch) if trim else batch)
        if kept:
            parts = result if isinstance(result, tuple) else (result,)
            outputs.append((number, tuple(part.float().cpu().numpy() for part in parts)))
    gathered = sorted(
        (pair for ranked in engine.gather(outputs) for pair in ranked),  # type: ignore[attr-defined]
        key=lambda pair: pair[0],
    )
    columns = list(zip(*(parts for _, parts in gathered), strict=True))
    joined = tuple(np.concatenate(column) for column in columns)
    return joined[0] if len(joined) == 1 else joined
