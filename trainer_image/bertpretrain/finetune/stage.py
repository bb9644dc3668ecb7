"""The fine-tuning stage of a job: each task of ``spec.finetune`` -> its files -> features -> runs
(each seed, from the pretrained weights and, with ``baseline``, from random ones) -> summary ->
``finetune.json``, the log and ``status.results``.

It runs after the export on every rank of the job (``run``, ``local``) or alone (``python -m
bertpretrain finetune``). With ``parallelism: data`` every run spans all ranks; with ``seeds`` rank
``r`` runs seeds ``r, r + world size, ...`` alone and rank 0 gathers the results.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertjob_api.contract import TOKENIZER_FILE, VOCAB_FILE
from bertjob_api.plan import Plan
from bertjob_api.spec import FinetuneTaskSpec
from bertpretrain.data.format.vocab import load_tokenizer
from bertpretrain.finetune import results
from bertpretrain.finetune.builtin import write_builtin_task
from bertpretrain.finetune.metrics import classification_metrics
from bertpretrain.finetune.squad import predict_answers, read_squad, squad_features, squad_metrics
from bertpretrain.finetune.tables import encode_classification, read_classification
from bertpretrain.finetune.task_files import TaskFiles, task_files
from bertpretrain.finetune.train import Init, RunResult, TaskData, run
from bertpretrain.model.config import BertConfig
from bertpretrain.model.huggingface import CONFIG_FILE, read_hf_config
from bertpretrain.runtime.parallel import Alone, DataParallel
from bertpretrain.runtime.world import World


def write_builtin(task: FinetuneTaskSpec, plan: Plan) -> bool:
    """Write a builtin task's files where :func:`task_files` says (once, on rank 0); returns
    whether the task is builtin."""
    if task.builtin is None:
        return False
    write_builtin_task(task.builtin, plan.paths.finetune / task.name, plan.spec.seed)
    return True


def check_files(plan: Plan) -> None:
    """Read every task's files (builtin ones are made later) and check their examples, before any
    training: a missing file or a bad row stops the job before hours of pretraining, not after.

    Raises:
        bertpretrain.finetune.errors.TaskDataError: naming the file and the row.
    """
    for task in plan.spec.finetune:
        if task.builtin is None:
            _read_examples(task, task_files(task, plan))


def _read_examples(task: FinetuneTaskSpec, files: TaskFiles) -> tuple[Any, Any, Any]:
    """``(train examples, validation examples, labels or the validation file's SQuAD version)``."""
    if task.type == "squad":  # the spec refuses a table format for squad
        questions, _ = read_squad(files.train)
        held_out, version_2 = read_squad(files.validation)
        return questions, held_out, version_2
    fields = (task.text_field, task.text_pair_field, task.label_field)
    train, labels = read_classification(files.train, files.format, *fields, task.labels)
    validation, _ = read_classification(files.validation, files.format, *fields, labels)
    return train, validation, labels


def tokenizer_source(source: Path | None, plan: Plan) -> Path:
    """The vocabulary of the weights fine-tuned: the one in ``source``'s directory (an export, a
    Hugging Face or NVIDIA directory carry theirs), else ``data.vocab.file``, else the job's own
    (``<data.shards>/vocab``)."""
    if source is not None:
        directory = source if source.is_dir() else source.parent
        for name in (TOKENIZER_FILE, VOCAB_FILE):
            if (directory / name).is_file():
                return directory
    if plan.spec.data.vocab.file is not None:
        return Path(plan.spec.data.vocab.file)
    return plan.paths.vocab


def load_task(task: FinetuneTaskSpec, files: TaskFiles, tokenizer: Tokenizer) -> TaskData:
    """The task's features and scorer (:class:`bertpretrain.finetune.train.TaskData`).

    Raises:
        bertpretrain.finetune.errors.TaskDataError: a file that cannot be used, naming it and the row.
    """
    train, validation, extra = _read_examples(task, files)
    assert task.max_seq_length is not None and task.metrics is not None  # with_defaults sets them
    metrics = list(task.metrics)
    if task.type == "squad":
        args = (tokenizer, task.max_seq_length, task.doc_stride, task.max_query_length)
        train_features = squad_features(train, *args, training=True)
        eval_features = squad_features(validation, *args, training=False)

        def score_squad(outputs: Any) -> tuple[dict[str, float], Any]:
            start, end = outputs
            answers = predict_answers(
                validation,
                eval_features,
                start,
                end,
                max_answer_length=task.max_answer_length,
                version_2=bool(extra),
            )
            found = squad_metrics(validation, answers)
            return {name: found[name] for name in metrics}, answers

        assert train_features.start_positions is not None and train_features.end_positions is not None
        return TaskData(
            train={
                "input_ids": train_features.input_ids,
                "token_type_ids": train_features.token_type_ids,
                "attention_mask": train_features.attention_mask,
                "start_positions": train_features.start_positions,
                "end_positions": train_features.end_positions,
            },
            validation={
                "input_ids": eval_features.input_ids,
                "token_type_ids": eval_features.token_type_ids,
                "attention_mask": eval_features.attention_mask,
            },
            score=score_squad,
            num_labels=None,
            train_file=str(files.train),
        )
    labels: list[str] = extra
    train_encoded = encode_classification(train, tokenizer, task.max_seq_length)
    eval_encoded = encode_classification(validation, tokenizer, task.max_seq_length)
    truth = eval_encoded.pop("labels").tolist()
    rows = [example.row for example in validation]

    def score_classification(logits: Any) -> tuple[dict[str, float], Any]:
        predictions = np.asarray(logits).argmax(axis=-1).tolist()
        named = [{"row": row, "prediction": labels[p]} for row, p in zip(rows, predictions, strict=True)]
        return classification_metrics(truth, predictions, len(labels), metrics), named

    return TaskData(
        train=train_encoded,
        validation=eval_encoded,
        score=score_classification,
        num_labels=len(labels),
        train_file=str(files.train),
    )


def finetune(plan: Plan, parallel: DataParallel, export_dir: Path | None) -> list[dict[str, Any]]:
    """Run every task of ``plan.spec.finetune`` on every rank of ``parallel``; returns each task's
    summary (:func:`bertpretrain.finetune.results.task_summary`), which rank 0 also writes to
    ``finetune.json`` and reports in the job's status after each task.

    ``export_dir``: the job's export, fine-tuned by tasks without ``initFrom``.

    Raises:
        bertpretrain.finetune.errors.TaskDataError: a task's file cannot be used.
        ValueError: a task has no weights to start from (no export and no ``initFrom``).
        bertpretrain.model.config.CheckpointError: the weights cannot be read or do not fit.
    """
    spec, rank = plan.spec, parallel.world.rank
    summaries: list[dict[str, Any]] = []
    for index, task in enumerate(spec.finetune):
        source = Path(task.init_from) if task.init_from else export_dir
        if source is None:
            raise ValueError(
                f"spec.finetune[{index}].initFrom: no weights to fine-tune: the job has no export yet "
                "(run the job first) and the task names none"
            )
        # Rank 0 writes a builtin task's files; the others wait for it (without the collective
        # timeout: the export before it can take long).
        parallel.broadcast_object(write_builtin(task, plan) if rank == 0 else None)
        files = task_files(task, plan)
        tokenizer = load_tokenizer(tokenizer_source(source, plan), spec.data.lowercase)
        started = time.perf_counter()
        data = load_task(task, files, tokenizer)
        if rank == 0:
            print(
                f"finetune {task.name}: {task.type}, {data.train_examples:,} training rows from "
                f"{files.train}, validation {files.validation}, from {source} "
                f"(features in {time.perf_counter() - started:.1f} s)",
                flush=True,
            )
        config = finetune_config(task, plan, _vocab_size(source, tokenizer))
        inits: list[tuple[Init, Path | None]] = [("pretrained", source)]
        if task.baseline:
            inits.append(("random", None))
        runs = _runs(plan, task, data, config, inits, parallel)
        summary = results.task_summary(task, runs, files, source)
        summaries.append(summary)
        if rank == 0:
            for line in results.describe(summary):
                print(line, flush=True)
            results.write_predictions(plan.paths.finetune / task.name, runs)
            results.write(plan.paths.finetune, summaries)
            results.report(summaries)
    return summaries


def finetune_config(task: FinetuneTaskSpec, plan: Plan, vocab_size: int) -> BertConfig:
    """The config every run of ``task`` builds its model with, from pretrained or random weights:
    the job's dimensions (``plan.model``) and ``vocab_size``, with the task's ``dropout`` as both the
    hidden and the attention-probability dropout (the classification head's is the hidden one).

    Pretraining's dropout (``spec.model.hiddenDropoutProb``, ``attentionProbsDropoutProb``) does not
    reach fine-tuning: a job that pretrains without dropout, as MosaicBERT (Portes et al. 2023) and
    Cramming (Geiping and Goldstein 2023) do, fine-tunes with the same dropout as one that pretrains
    with BERT's 0.1 (Devlin et al. 2019), so that a gap in the scores is pretraining's, not the
    fine-tuning recipe's. ``plan.model`` is left as it is.

    Raises:
        ValueError: the dimensions do not make a BERT (see :class:`BertConfig`).
    """
    return dataclasses.replace(
        BertConfig.from_dims(plan.model, vocab_size),
        hidden_dropout_prob=task.dropout,
        attention_probs_dropout_prob=task.dropout,
    )


def _vocab_size(source: Path, tokenizer: Tokenizer) -> int:
    """The vocabulary size of the weights: a Hugging Face directory's config says it (a vocab.txt
    may list a token twice, or be padded), else the tokenizer's."""
    if source.is_dir() and (source / CONFIG_FILE).is_file():
        return read_hf_config(source).vocab_size
    return int(tokenizer.get_vocab_size(with_added_tokens=False))


def _runs(
    plan: Plan,
    task: FinetuneTaskSpec,
    data: TaskData,
    config: BertConfig,
    inits: Sequence[tuple[Init, Path | None]],
    parallel: DataParallel,
) -> list[RunResult]:
    """Every run of the task, in the order (init, seed), on every rank."""
    spec, world = plan.spec, parallel.world
    seeds = [spec.seed + offset for offset in range(task.seeds)]
    every = spec.logging.every_steps

    def label(init: Init, seed: int, rank: str = "") -> str:
        return f"{rank}finetune {task.name} {init} seed {seed}"

    if task.parallelism == "data" or not world.distributed:
        return [
            run(spec, task, data, config, source, seed, parallel, label(init, seed), every, world.rank == 0)
            for init, source in inits
            for seed in seeds
        ]
    alone, tag = Alone(World("single", 0, 1, 0, 1), parallel.device), f"rank {world.rank} "
    mine = [
        run(spec, task, data, config, source, seed, alone, label(init, seed, tag), every, True)
        for init, source in inits
        for seed in seeds[world.rank :: world.world_size]
    ]
    gathered = [result for ranked in parallel.gather_object(mine) for result in ranked]  # type: ignore[attr-defined]
    order = {init: position for position, (init, _) in enumerate(inits)}
    return sorted(gathered, key=lambda result: (order[result.init], result.seed))
