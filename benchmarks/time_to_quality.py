"""Time to quality: our classic recipe, our modern recipe and a Hugging Face peer, each given the
same corpus and the same wall-clock budget on this machine, one after the other, scored the same way.

    python benchmarks/time_to_quality.py --size tiny --budget 4 --seeds 1    # CI's (CPU, 2 min on 2 cores)
    python benchmarks/time_to_quality.py --size demo --budget 300            # bert-tiny, 5 min per run
    python benchmarks/time_to_quality.py --size base --device cuda --budget 600

Steps, in order (every subprocess's output goes to a log file under the work directory; the lines
printed here say where):

1. **The shared corpus**, once: ``builtin:python-docs`` through our data stage (``python -m
   bertpretrain prepare``): a WordPiece vocabulary of 8000 tokens, the tokenized documents, and a
   dataset of single segments ``[CLS] A [SEP]`` (objective ``mlm``) of 128 tokens with static masking
   at 15% (19 positions at most), :data:`HELDOUT_FRACTION` of the documents in its held-out shards.
   **Those held-out shards are the one evaluation set of every run**; its training shards are the
   peer's. Single segments, not sentence pairs: segment B's type embedding is never trained by an
   ``mlm`` model (ours modern, the peer), and the classic model has seen ``[CLS] A [SEP]`` as the
   first half of every pair. Our runs' jobs name the same data directory with the same data settings
   but the masking, so they reuse the vocabulary and the documents (the data stage's keys) and make
   only their own dataset; the held-out documents are the same for all (chosen by a keyed hash of
   their text, the seed and the fraction), so no run trains on the evaluation set.
2. **classic**, our recipe as ``examples/bert-tiny-local.yaml``'s phase 1: objective ``mlm-nsp``
   (sentence pairs, NSP head), static masking at 15%, LAMB, poly decay after 10% warm-up, dropout
   0.1, clipping at norm 1.
3. **modern**, our recipe after Cramming and MosaicBERT: objective ``mlm`` (single segments, no NSP),
   masking at 30% (:data:`MODERN_MASKING`, at most ``round(128 x 0.3)`` = 38 positions), dropout 0,
   LAMB with the one-cycle schedule (30% warm-up, torch's ``OneCycleLR`` default ``pct_start``),
   clipping at norm 0.5.
4. **hf-peer**: ``transformers.Trainer`` training ``transformers.BertForMaskedLM`` of the same
   dimensions and vocabulary on the same training shards' token ids (the shared corpus's training
   shards, read with h5py): each row's masked positions are given back their original tokens, the
   row is cut to its length, and ``DataCollatorForLanguageModeling`` masks 15% afresh in every batch
   (80% ``[MASK]``, 10% random, 10% kept) and pads to the batch's longest row. Dynamic masking and
   per-batch padding, not our static masks: that is how a Trainer-based MLM pretraining is written
   (``run_mlm.py``), so the peer is Hugging Face's own recipe at its best, not ours in its clothes.
   AdamW (betas 0.9/0.999, eps 1e-6, weight decay 0.01), linear decay after 10% warm-up, clipping at
   norm 1, dropout 0.1, the same global batch as ours in one pass. Its learning rate is chosen by a
   3-point sweep (:attr:`Size.sweep`), each point trained for :data:`SWEEP_FRACTION` of the budget from
   the same initialisation and scored on the shared held-out set; the best is trained again for the
   whole budget. The sweep scores on the evaluation set itself, a selection in the peer's favour;
   all three points are in the JSON output. The sweep's time is not part of the peer's budget.

**The budget.** The peer's Trainer is stopped by a ``TrainerCallback`` that sets
``control.should_training_stop`` once ``--budget`` seconds have passed since ``on_train_begin``; its
linear schedule still needs ``max_steps``, which is ``ceil(budget x steps/s)`` with steps/s measured
first: by a calibration run of :attr:`Size.calibration_steps` steps for the sweep, then by the
sweep's runs (the median of their rates) for the final run; each rate is 1 / the median step's
seconds, the first step (which holds the start) left out, so that a burst of other work on a shared
machine moves it less than a mean would. Our runs carry the budget themselves (``spec.budget``,
whole seconds): the trainer calibrates and fixes its steps (docs/training.md), and the calibration
it recorded is in the JSON; ``--steps`` gives them a step count instead. A run whose load changes
after its calibration trains longer or shorter than the budget: the table's seconds column says how
long, and a line below it names each run more than 25% off. :func:`our_job` makes our job documents.

**Scores**, the same for every run:

- *held-out MLM accuracy* (:func:`mlm_accuracy`): the model loaded with
  ``transformers.AutoModelForMaskedLM.from_pretrained`` from its export (ours is exported as
  ``BertForPreTraining`` or ``BertForMaskedLM``, the peer's is ``save_pretrained``'s), run on the
  shared held-out shards as stored (their ``input_ids`` already masked at 15%), the share of the
  shards' ``masked_lm_positions`` whose argmax token is the label ``masked_lm_ids``; slots whose
  position is 0 are padding (``[CLS]`` is never masked), as in our loader's ``to_batch``;
- *steps*, *sequences* (steps x global batch) and *seconds* of training: ours from the run's
  ``train.jsonl`` (from the phase's ``PARAMETER`` record to its last step), the peer's from its
  callback (``on_train_begin`` to the last ``on_step_end``);
- *fine-tuned*: the builtin downstream task ``python-docs-modules`` (which of 8 standard-library
  modules a sentence comes from), median accuracy over ``--seeds`` seeds: our runs fine-tune in their
  own job (``spec.finetune``); the peer's export is fine-tuned by ``python -m bertpretrain finetune``
  with the task's ``initFrom`` naming it, the same code and settings, which also fine-tunes the
  same architecture from random weights for reference (printed below the table). The fine-tuning
  uses each job's model settings: the modern run's without dropout.

Then the ratios (modern/classic, classic/peer, modern/peer) of accuracy, fine-tuned score and
sequences. Output: the Markdown tables on stdout, and the same as JSON (with every setting, the
calibrations and the sweep) in ``--out``/time_to_quality.json, the tables in time_to_quality.md. The
work files (shards, checkpoints, exports, logs) are under ``--out``/work, deleted at the end unless
``--keep`` or a step failed; a later run reuses the prepared data there (the data stage's keys
decide) and starts every training afresh.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import yaml

from bertjob_api.defaults import MODEL_PRESETS

REPO = Path(__file__).resolve().parents[1]
CORPUS = "builtin:python-docs"
SEQ_LEN = 128  # tokens per sequence, every run
EVAL_MASKING = 0.15  # the shared evaluation set's masking, and the classic recipe's and the peer's
EVAL_PREDICTIONS = 19  # masked positions stored per sequence at 15%: round(128 x 0.15)
MODERN_MASKING = 0.3
HELDOUT_FRACTION = 0.05  # share of the documents held out: the evaluation set
VOCAB_SIZE = 8000  # WordPiece tokens trained on the corpus
SEED = 12345
OWN_EVAL_SEQUENCES = 256  # our trainer's own held-out evaluation, at each run's end (not the score)
SWEEP_FRACTION = 0.25  # of the budget, per point of the peer's learning-rate sweep
OFF_BUDGET = 0.25  # a run whose training seconds are further than this share off the budget is named
FINETUNE_TASK = "python-modules"
FINETUNE_METRIC = "accuracy"
RUNS = ("classic", "modern", "hf-peer")
RATIOS = (("modern", "classic"), ("classic", "hf-peer"), ("modern", "hf-peer"))
COLUMNS = ("run", "recipe", "held-out MLM acc", "steps", "sequences", "seconds", "fine-tuned acc")
RATIO_COLUMNS = ("ratio", "held-out MLM acc", "fine-tuned acc", "sequences")
RESULTS_FILE = "time_to_quality.json"
TABLE_FILE = "time_to_quality.md"


@dataclass(frozen=True)
class Size:
    """One ``--size``: the model and the settings that depend on it."""

    preset: str  # bertjob_api.defaults.MODEL_PRESETS
    global_batch: int  # sequences per optimizer step, every run
    micro_batch: int  # ours per forward/backward pass (the peer runs the global batch in one)
    num_shards: int  # training shards of each prepared dataset
    classic_lr: float  # LAMB peak learning rate, poly schedule
    modern_lr: float  # LAMB peak learning rate, one-cycle schedule
    sweep: tuple[float, float, float]  # the peer's AdamW learning rates
    calibration_steps: int  # optimizer steps of each calibration run
    finetune_epochs: int
    finetune_lr: float  # AdamW peak learning rate of the fine-tuning
    budget: float  # default --budget: seconds of training per run


SIZES = {
    # CI's: bert-tiny (2 layers, hidden 128), 32 sequences a step, one epoch of fine-tuning. The
    # peer's grid for bert-tiny is centred on 3e-3, which beat 1e-3 and 3e-4 in this script's first
    # runs here (5 s and 60 s a run); a line is printed when the best is at an edge of the grid.
    "tiny": Size("bert-tiny", 32, 32, 2, 0.01, 0.01, (1e-3, 3e-3, 1e-2), 6, 1, 1e-3, 5.0),
    # The demo's model and batch (examples/bert-tiny-local.yaml: 64 = 4 x 16, LAMB 0.01) and its
    # fine-tuning (4 epochs at 1e-3).
    "demo": Size("bert-tiny", 64, 16, 2, 0.01, 0.01, (1e-3, 3e-3, 1e-2), 10, 4, 1e-3, 300.0),
    # bert-base on one GPU, 256 sequences a step in one pass (train_step.py's micro-batch at seq
    # 128), LAMB at 2e-3; fine-tuning as BERT's (3 epochs at 5e-5). Not yet run: no GPU was lent.
    "base": Size("bert-base", 256, 256, 4, 2e-3, 2e-3, (1e-4, 3e-4, 1e-3), 30, 3, 5e-5, 600.0),
}


class BenchmarkError(RuntimeError):
    """A step that failed; the message names it and its log."""


# Our job documents -------------------------------------------------------------------------------


def _document(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def _base_spec(size: Size, device: str, checkpoints: Path) -> dict[str, Any]:
    """What every job here shares: this machine, one process, the model, the logs."""
    cuda = device == "cuda"
    return {
        "image": "ghcr.io/bertjob/trainer:0.1.0-cuda" if cuda else "ghcr.io/bertjob/trainer:0.1.0-xeon",
        "accelerator": "nvidia-gpu" if cuda else "xeon-cpu",
        "topology": {"nodes": 1, "processesPerNode": 1},
        "model": {"preset": size.preset},
        "precision": "bf16" if cuda else "fp32",
        "checkpoint": {"path": str(checkpoints), "everySteps": 1_000_000, "keep": 1},
        "logging": {"everySteps": 10, "tensorboard": False},
        "seed": SEED,
    }


def _data(work: Path, size: Size, masked_lm_prob: float) -> dict[str, Any]:
    """Every job's ``spec.data``: one directory, the same fields but the masking. The data stage
    keys each thing it makes by what made it, so the vocabulary and the tokenized documents are made
    once (by the shared job) and each dataset directory (``seq_len_128_max_pred_{19,20,38}``: the
    shared set, classic's, modern's) by its own job."""
    return {
        "sources": [{"path": CORPUS}],
        "shards": str(work / "data"),
        "vocab": {"trainSize": VOCAB_SIZE},
        "lowercase": True,
        "dupeFactor": 5,
        "numShards": size.num_shards,
        "maskedLmProb": masked_lm_prob,
        "heldoutFraction": HELDOUT_FRACTION,
    }


def _finetune_task(size: Size, seeds: int, **fields: Any) -> dict[str, Any]:
    return {
        "name": FINETUNE_TASK,
        "type": "classification",
        "builtin": "python-docs-modules",
        "epochs": size.finetune_epochs,
        "learningRate": size.finetune_lr,
        "seeds": seeds,
        **fields,
    }


def shared_data_job(size: Size, device: str, work: Path) -> dict[str, Any]:
    """The job whose data stage makes the shared corpus: vocabulary, training shards (the peer's)
    and the held-out shards (everyone's evaluation set); it is only ever prepared, never trained."""
    spec = _base_spec(size, device, work / "shared" / "checkpoints")
    spec["objective"] = "mlm"
    spec["data"] = _data(work, size, EVAL_MASKING)
    spec["phases"] = [
        {
            "maxSeqLength": SEQ_LEN,
            "maxPredictionsPerSeq": EVAL_PREDICTIONS,
            "globalBatchSize": size.global_batch,
            "learningRate": 1e-4,
            "steps": 1,
        }
    ]
    return _document("time-to-quality-data", spec)


def recipe(name: str, size: Size) -> dict[str, Any]:
    """The ``spec`` fields of our recipe ``name`` (classic or modern), besides the data's masking."""
    if name == "classic":
        return {
            "objective": "mlm-nsp",
            "optimizer": {"name": "lamb", "weightDecay": 0.01, "schedule": "poly", "maxGradNorm": 1.0},
            "learningRate": size.classic_lr,
            "warmupProportion": 0.1,
            "maskedLmProb": EVAL_MASKING,
            "maxPredictionsPerSeq": 20,  # NVIDIA's at seq 128
            "dropout": 0.1,
        }
    if name == "modern":
        return {
            "objective": "mlm",
            "optimizer": {"name": "lamb", "weightDecay": 0.01, "schedule": "one-cycle", "maxGradNorm": 0.5},
            "learningRate": size.modern_lr,
            "warmupProportion": 0.3,
            "maskedLmProb": MODERN_MASKING,
            # The spec refuses fewer than round(maxSeqLength x maskedLmProb).
            "maxPredictionsPerSeq": round(SEQ_LEN * MODERN_MASKING),
            "dropout": 0.0,
        }
    raise ValueError(f"no recipe {name!r}: classic or modern")


def describe_recipe(name: str, size: Size, peer_lr: float | None = None) -> str:
    """A few words for the table's recipe column."""
    if name == "hf-peer":
        lr = "?" if peer_lr is None else f"{peer_lr:g}"
        return f"HF Trainer, mlm 15% dynamic, AdamW {lr} (swept) linear"
    chosen = recipe(name, size)
    optimizer = chosen["optimizer"]
    return (
        f"{chosen['objective']} {chosen['maskedLmProb']:.0%}, dropout {chosen['dropout']:g}, "
        f"{optimizer['name'].upper()} {chosen['learningRate']:g} {optimizer['schedule']}, "
        f"clip {optimizer['maxGradNorm']:g}"
    )


def our_job(
    name: str,
    size: Size,
    device: str,
    work: Path,
    *,
    budget: float,
    seeds: int,
    steps: int | None = None,
) -> dict[str, Any]:
    """Our run ``name`` (classic or modern) as a BertPretrainJob: one phase at seq 128 on its own
    dataset (in the shared data directory, made from the same documents with the same vocabulary),
    trained for ``spec.budget`` = ``budget`` seconds (rounded to whole seconds, at least 1), or for
    ``steps`` when given; then the fine-tuning. Its own held-out evaluation at the phase's end is
    capped at :data:`OWN_EVAL_SEQUENCES` sequences: the benchmark's score is :func:`mlm_accuracy`'s.
    """
    chosen = recipe(name, size)
    checkpoints = work / name / "checkpoints"
    spec = _base_spec(size, device, checkpoints)
    masking = chosen["maskedLmProb"]
    spec["objective"] = chosen["objective"]
    spec["data"] = _data(work, size, masking)
    spec["model"].update(hiddenDropoutProb=chosen["dropout"], attentionProbsDropoutProb=chosen["dropout"])
    spec["optimizer"] = chosen["optimizer"]
    spec["evaluation"] = {"maxSequences": OWN_EVAL_SEQUENCES}
    spec["phases"] = [
        {
            "maxSeqLength": SEQ_LEN,
            "maxPredictionsPerSeq": chosen["maxPredictionsPerSeq"],
            "globalBatchSize": size.global_batch,
            "microBatchSize": size.micro_batch,
            "learningRate": chosen["learningRate"],
            "warmupProportion": chosen["warmupProportion"],
        }
    ]
    if steps is None:
        spec["budget"] = {"time": f"{max(1, round(budget))}s"}
    else:
        spec["phases"][0]["steps"] = steps
    spec["logging"]["everySteps"] = 10
    spec["finetune"] = [_finetune_task(size, seeds)]
    return _document(f"time-to-quality-{name}", spec)


def peer_finetune_job(size: Size, device: str, work: Path, export: Path, seeds: int) -> dict[str, Any]:
    """The fine-tuning of the peer's export, by our fine-tuning code (``python -m bertpretrain
    finetune``): the shared job with a task whose ``initFrom`` is the export, and the same task from
    random weights beside it (``baseline``)."""
    document = shared_data_job(size, device, work)
    spec = document["spec"]
    spec["checkpoint"]["path"] = str(work / "hf-peer" / "checkpoints")
    spec["finetune"] = [_finetune_task(size, seeds, initFrom=str(export), baseline=True)]
    document["metadata"]["name"] = "time-to-quality-hf-peer-finetune"
    return document


# Subprocesses -----------------------------------------------------------------------------------


def _run_logged(label: str, command: list[str], log: Path) -> float:
    """Run ``command`` with its output in ``log``; returns its seconds.

    Raises:
        BenchmarkError: it failed; the message has the log's last lines.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"time_to_quality: {label}: {' '.join(command[1:])} (log {log})", flush=True)
    started = time.perf_counter()
    with log.open("w") as output:
        code = subprocess.call(command, stdout=output, stderr=subprocess.STDOUT, cwd=REPO)
    seconds = time.perf_counter() - started
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BenchmarkError(f"{label}: exit {code} after {seconds:.0f} s; the end of {log}:\n{tail}")
    print(f"time_to_quality: {label}: done in {seconds:.1f} s", flush=True)
    return seconds


def _write_job(document: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def prepare_shared(size: Size, device: str, work: Path) -> tuple[Path, Path]:
    """The shared corpus (``python -m bertpretrain prepare``); returns (the vocabulary directory,
    the dataset directory holding ``shard_*.hdf5`` and ``heldout_*.hdf5``)."""
    job = _write_job(shared_data_job(size, device, work), work / "shared" / "job.yaml")
    _run_logged(
        "shared corpus",
        [sys.executable, "-m", "bertpretrain", "prepare", "--config", str(job)],
        work / "shared" / "prepare.log",
    )
    data = work / "data"
    dataset = data / f"seq_len_{SEQ_LEN}_max_pred_{EVAL_PREDICTIONS}"
    if not sorted(dataset.glob("heldout_*.hdf5")):
        raise BenchmarkError(f"shared corpus: no held-out shards in {dataset}")
    return data / "vocab", dataset


@dataclass(frozen=True)
class TrainLog:
    """What a run's ``train.jsonl`` says of its phase: steps, sequences, seconds of training."""

    steps: int
    sequences: int
    seconds: float  # from the phase's PARAMETER record to its last step's record
    steps_per_second: float | None  # the median logged interval's, the first left out (None: fewer than 2)


def read_train_log(path: Path) -> TrainLog:
    """Read ``train.jsonl`` (one phase).

    Raises:
        BenchmarkError: no training record in it.
    """
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    start = next((r["elapsedtime"] for r in records if r["type"] == "PARAMETER"), None)
    train = [r for r in records if r["type"] == "LOG" and r["data"].get("split") == "train"]
    if start is None or not train:
        raise BenchmarkError(f"{path}: no PARAMETER or training record")
    rates = [
        (after["step"][1] - before["step"][1]) / max(after["elapsedtime"] - before["elapsedtime"], 1e-9)
        for before, after in itertools.pairwise(train)
    ]
    return TrainLog(
        steps=int(train[-1]["step"][1]),
        sequences=round(sum(r["data"]["sequences"] for r in train)),
        seconds=train[-1]["elapsedtime"] - start,
        steps_per_second=statistics.median(rates) if rates else None,
    )


def run_ours(
    name: str, size: Size, device: str, work: Path, budget: float, steps: int | None, seeds: int
) -> dict[str, Any]:
    """Our recipe ``name`` for ``budget`` seconds (or ``steps`` steps), fine-tuned; its figures,
    export and the trainer's calibration (None with ``steps``)."""
    document = our_job(name, size, device, work, budget=budget, steps=steps, seeds=seeds)
    job = _write_job(document, work / name / "job.yaml")
    wall = _run_logged(name, [sys.executable, "-m", "bertjob", "run", str(job)], work / name / "run.log")
    checkpoints = work / name / "checkpoints"
    log = read_train_log(checkpoints / "logs" / "train.jsonl")
    calibration = checkpoints / "phase1" / "budget.json"
    return {
        "calibration": json.loads(calibration.read_text()) if calibration.is_file() else None,
        "steps": log.steps,
        "sequences": log.sequences,
        "seconds": log.seconds,
        "job_seconds": wall,
        "export": str(checkpoints / "hf"),
        "finetune": finetune_score(checkpoints / "finetune" / "finetune.json"),
        "job": document["spec"],
    }


def finetune_score(path: Path, init: str = "pretrained") -> dict[str, Any]:
    """The task's median accuracy over its seeds, from ``finetune.json``."""
    results = json.loads(path.read_text())
    task = next(t for t in results["tasks"] if t["task"] == FINETUNE_TASK)
    summary = task["summary"][init][FINETUNE_METRIC]
    return {"metric": FINETUNE_METRIC, "median": summary["median"], "seeds": task["seeds"], "file": str(path)}


# Evaluation -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeldOut:
    """The shared evaluation set: the held-out shards' rows, as stored (masked at 15%)."""

    input_ids: np.ndarray  # [N, 128]
    input_mask: np.ndarray  # [N, 128]
    segment_ids: np.ndarray  # [N, 128]
    positions: np.ndarray  # [N, 19]; 0 is a padding slot
    labels: np.ndarray  # [N, 19]
    files: tuple[str, ...]

    @classmethod
    def read(cls, dataset: Path) -> HeldOut:
        files = sorted(dataset.glob("heldout_*.hdf5"))
        parts: dict[str, list[np.ndarray]] = {}
        names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")
        for file in files:
            with h5py.File(file, "r") as shard:
                for name in names:
                    parts.setdefault(name, []).append(shard[name][:])
        ids, mask, segments, positions, labels = (
            np.concatenate(parts[name]).astype(np.int64) for name in names
        )
        return cls(ids, mask, segments, positions, labels, tuple(map(str, files)))

    @property
    def sequences(self) -> int:
        return len(self.input_ids)

    @property
    def predictions(self) -> int:
        return int((self.positions != 0).sum())


def mlm_accuracy(model: torch.nn.Module, heldout: HeldOut, device: str, batch_size: int = 64) -> float:
    """Held-out masked-LM accuracy: the share of the held-out rows' masked positions (those not 0)
    whose argmax token under ``model`` (a transformers masked-LM, in eval mode here) is the label."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for start in range(0, heldout.sequences, batch_size):
            rows = slice(start, start + batch_size)
            logits = model(
                input_ids=torch.from_numpy(heldout.input_ids[rows]).to(device),
                attention_mask=torch.from_numpy(heldout.input_mask[rows]).to(device),
                token_type_ids=torch.from_numpy(heldout.segment_ids[rows]).to(device),
            ).logits
            positions = torch.from_numpy(heldout.positions[rows]).to(device)
            labels = torch.from_numpy(heldout.labels[rows]).to(device)
            picked = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
            valid = positions != 0
            correct += int(((picked.argmax(-1) == labels) & valid).sum())
            total += int(valid.sum())
    return correct / max(total, 1)


def quiet_transformers() -> None:
    """No progress bars (loading, saving) and no warnings from transformers: lines in a log."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    disable_progress_bars()


def export_accuracy(export: Path, heldout: HeldOut, device: str) -> float:
    """:func:`mlm_accuracy` of the model in the Hugging Face directory ``export``."""
    from transformers import AutoModelForMaskedLM

    quiet_transformers()
    model = AutoModelForMaskedLM.from_pretrained(str(export)).to(device)
    return mlm_accuracy(model, heldout, device)


# The Hugging Face peer ------------------------------------------------------------------------------


class UnmaskedRows(torch.utils.data.Dataset[dict[str, list[int]]]):
    """The shared training shards' rows with their original tokens, cut to their length, for
    ``DataCollatorForLanguageModeling`` (``input_ids`` and ``special_tokens_mask``)."""

    def __init__(self, dataset: Path, special_ids: Sequence[int]):
        self.rows: list[np.ndarray] = []
        for file in sorted(dataset.glob("shard_*.hdf5")):
            with h5py.File(file, "r") as shard:
                ids = shard["input_ids"][:].astype(np.int64)
                lengths = shard["input_mask"][:].sum(axis=1)
                positions = shard["masked_lm_positions"][:].astype(np.int64)
                labels = shard["masked_lm_ids"][:].astype(np.int64)
            rows, slots = np.nonzero(positions)
            ids[rows, positions[rows, slots]] = labels[rows, slots]
            self.rows.extend(ids[row, :length] for row, length in enumerate(lengths))
        self.special = np.array(sorted(special_ids))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        row = self.rows[index]
        return {
            "input_ids": row.tolist(),
            "special_tokens_mask": np.isin(row, self.special).astype(int).tolist(),
        }


@dataclass
class PeerRun:
    """One training of the peer."""

    learning_rate: float
    max_steps: int  # the schedule's length
    steps: int = 0  # optimizer steps taken
    seconds: float = 0.0  # on_train_begin to the last on_step_end
    steps_per_second: float | None = None  # 1 / the median step's seconds, the first step left out
    stopped_by_budget: bool = False
    final_loss: float | None = None
    heldout_mlm_accuracy: float | None = None


def _peer_tools(vocab_dir: Path) -> tuple[Any, Any]:
    """(the tokenizer built from the shared vocabulary, the masking collator at 15%)."""
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(vocab_dir / "tokenizer.json"),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    collator = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=EVAL_MASKING, pad_to_multiple_of=8, seed=SEED
    )
    return tokenizer, collator


def train_peer(
    rows: UnmaskedRows,
    tokenizer: Any,
    collator: Any,
    size: Size,
    device: str,
    run: PeerRun,
    budget: float,
    scratch: Path,
    label: str,
) -> torch.nn.Module:
    """Train a fresh ``BertForMaskedLM`` (seed :data:`SEED`) with ``transformers.Trainer`` for
    ``run.max_steps`` steps or ``budget`` seconds, whichever ends first; fills ``run`` in and
    returns the model."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    class Budget(TrainerCallback):
        """Stops training once ``budget`` seconds have passed; prints a line per log."""

        def __init__(self) -> None:
            self.started = 0.0
            self.ends: list[float] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            now = time.perf_counter()
            self.ends.append(now)
            if now - self.started >= budget:
                control.should_training_stop = True
                run.stopped_by_budget = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
            if logs and "loss" in logs:
                run.final_loss = float(logs["loss"])
                print(
                    f"time_to_quality: {label}: step {state.global_step}/{run.max_steps} loss "
                    f"{logs['loss']:.3f} lr {logs.get('learning_rate', 0):.2e} "
                    f"{time.perf_counter() - self.started:.1f} s",
                    flush=True,
                )

    dims = MODEL_PRESETS[size.preset]
    set_seed(SEED)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=dims.hidden_size,
            num_hidden_layers=dims.num_hidden_layers,
            num_attention_heads=dims.num_attention_heads,
            intermediate_size=dims.intermediate_size,
            max_position_embeddings=dims.max_position_embeddings,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    arguments = TrainingArguments(
        output_dir=str(scratch),
        per_device_train_batch_size=size.global_batch,
        learning_rate=run.learning_rate,
        weight_decay=0.01,
        adam_epsilon=1e-6,
        lr_scheduler_type="linear",
        warmup_steps=0.1,  # a share of max_steps
        max_steps=run.max_steps,
        max_grad_norm=1.0,
        logging_strategy="steps",
        logging_steps=max(1, run.max_steps // 10),
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=SEED,
        data_seed=SEED,
        bf16=device == "cuda",
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    clock = Budget()
    trainer = Trainer(
        model=model, args=arguments, train_dataset=rows, data_collator=collator, callbacks=[clock]
    )
    trainer.remove_callback(PrinterCallback)  # its dicts; Budget prints a line instead
    trainer.train()
    run.steps = len(clock.ends)
    run.seconds = (clock.ends[-1] - clock.started) if clock.ends else 0.0
    if len(clock.ends) >= 3:  # the median step, the first (which holds the start) left out
        run.steps_per_second = 1 / max(statistics.median(np.diff(clock.ends[1:])), 1e-9)
    return model


def run_peer(
    size: Size,
    device: str,
    work: Path,
    vocab_dir: Path,
    dataset: Path,
    heldout: HeldOut,
    budget: float,
    seeds: int,
) -> dict[str, Any]:
    """The peer: calibration, the 3-point learning-rate sweep, the budgeted run, its export and its
    fine-tuning."""
    quiet_transformers()
    peer = work / "hf-peer"
    tokenizer, collator = _peer_tools(vocab_dir)
    special = [tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id]
    rows = UnmaskedRows(dataset, special)
    print(f"time_to_quality: hf-peer: {len(rows)} training rows from {dataset}", flush=True)
    scratch = peer / "trainer"

    calibration = PeerRun(size.sweep[1], size.calibration_steps)
    train_peer(rows, tokenizer, collator, size, device, calibration, math.inf, scratch, "hf-peer calibration")
    if calibration.steps_per_second is None:
        raise BenchmarkError("hf-peer calibration: fewer than 3 steps")
    print(f"time_to_quality: hf-peer calibration: {calibration.steps_per_second:.2f} steps/s", flush=True)

    sweep_budget = SWEEP_FRACTION * budget
    sweep_steps = max(1, math.ceil(sweep_budget * calibration.steps_per_second))
    sweep = []
    for lr in size.sweep:
        point = PeerRun(lr, sweep_steps)
        model = train_peer(
            rows, tokenizer, collator, size, device, point, sweep_budget, scratch, f"hf-peer sweep lr {lr:g}"
        )
        point.heldout_mlm_accuracy = mlm_accuracy(model, heldout, device)
        print(
            f"time_to_quality: hf-peer sweep lr {lr:g}: held-out MLM accuracy "
            f"{point.heldout_mlm_accuracy:.4f} after {point.steps} steps",
            flush=True,
        )
        sweep.append(point)
    best = max(sweep, key=lambda point: point.heldout_mlm_accuracy or 0.0)
    if best.learning_rate in (size.sweep[0], size.sweep[-1]):
        print(
            f"time_to_quality: hf-peer: the best learning rate, {best.learning_rate:g}, is at the edge "
            "of the sweep",
            flush=True,
        )
    rates = [point.steps_per_second for point in sweep if point.steps_per_second]
    rate = statistics.median(rates) if rates else calibration.steps_per_second

    final = PeerRun(best.learning_rate, max(1, math.ceil(budget * rate)))
    model = train_peer(rows, tokenizer, collator, size, device, final, budget, scratch, "hf-peer")
    export = peer / "hf"
    model.save_pretrained(str(export))  # type: ignore[operator]
    tokenizer.save_pretrained(str(export))
    for name in ("vocab.txt", "tokenizer.json"):  # the vocabulary as our data stage wrote it
        shutil.copyfile(vocab_dir / name, export / name)
    shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"time_to_quality: hf-peer: {final.steps} steps in {final.seconds:.1f} s at lr "
        f"{final.learning_rate:g}, exported to {export}",
        flush=True,
    )

    job = _write_job(peer_finetune_job(size, device, work, export, seeds), peer / "finetune.yaml")
    command = [sys.executable, "-m", "bertpretrain", "finetune", "--config", str(job)]
    _run_logged("hf-peer fine-tuning", command, peer / "finetune.log")
    results = peer / "checkpoints" / "finetune" / "finetune.json"
    return {
        "steps": final.steps,
        "sequences": final.steps * size.global_batch,
        "seconds": final.seconds,
        "export": str(export),
        "finetune": finetune_score(results),
        "random_init_finetune": finetune_score(results, "random"),
        "learning_rate": final.learning_rate,
        "max_steps": final.max_steps,
        "stopped_by_budget": final.stopped_by_budget,
        "calibration": asdict(calibration),
        "sweep": [asdict(point) for point in sweep],
        "sweep_seconds_each": sweep_budget,
    }


# The table -------------------------------------------------------------------------------------


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or bottom == 0:
        return None
    return top / bottom


def ratios(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """modern/classic, classic/peer and modern/peer of accuracy, fine-tuned score and sequences."""
    found: dict[str, dict[str, float | None]] = {}
    for top, bottom in RATIOS:
        a, b = runs[top], runs[bottom]
        found[f"{top}/{bottom}"] = {
            "heldout_mlm_accuracy": _ratio(a["heldout_mlm_accuracy"], b["heldout_mlm_accuracy"]),
            "finetune": _ratio(
                a["finetune"] and a["finetune"]["median"], b["finetune"] and b["finetune"]["median"]
            ),
            "sequences": _ratio(a["sequences"], b["sequences"]),
        }
    return found


def _cell(value: float | None, digits: int = 4, missing: str = "not measured") -> str:
    return missing if value is None else f"{value:.{digits}f}"


def table(results: dict[str, Any]) -> list[str]:
    """The Markdown lines: the runs, the ratios, and the fine-tuning from random weights."""
    lines = [f"| {' | '.join(COLUMNS)} |", "| --- | --- |" + " ---: |" * (len(COLUMNS) - 2)]
    for name in RUNS:
        run = results["runs"][name]
        finetune = run["finetune"]["median"] if run["finetune"] else None
        cells = [
            name,
            run["recipe"],
            _cell(run["heldout_mlm_accuracy"]),
            str(run["steps"]),
            str(run["sequences"]),
            f"{run['seconds']:.1f}",
            _cell(finetune),
        ]
        lines.append(f"| {' | '.join(cells)} |")
    lines += ["", f"| {' | '.join(RATIO_COLUMNS)} |", "| --- |" + " ---: |" * (len(RATIO_COLUMNS) - 1)]
    for name, values in results["ratios"].items():
        cells = [
            name,
            *(_cell(values[key], 2, "n/a") for key in ("heldout_mlm_accuracy", "finetune", "sequences")),
        ]
        lines.append(f"| {' | '.join(cells)} |")
    random_init = results["runs"]["hf-peer"].get("random_init_finetune")
    lines.append("")
    if random_init:
        lines += [
            f"Fine-tuned from random weights (no pretraining), for reference: {random_init['median']:.4f} "
            f"(median of {random_init['seeds']} seed(s)).",
        ]
    budget = results["budget_seconds"]
    for name in RUNS:
        seconds = results["runs"][name]["seconds"]
        if abs(seconds - budget) > OFF_BUDGET * budget:
            why = "its steps came from a calibration" if name != "hf-peer" else "its last step ended there"
            lines.append(f"{name} trained {seconds:.1f} s against a budget of {budget:g} s ({why}).")
    evaluation, sweep = results["evaluation"], results["runs"]["hf-peer"]["sweep"]
    points = ", ".join(f"{p['learning_rate']:g}: {_cell(p['heldout_mlm_accuracy'])}" for p in sweep)
    lines.append(
        f"Held-out MLM accuracy on {evaluation['sequences']} sequences, {evaluation['predictions']} masked "
        f"positions (15%); {results['budget_seconds']:g} s per run on {results['device']} "
        f"({results['size']}, {results['preset']}); the peer's learning-rate sweep: {points}."
    )
    return lines


# The command -----------------------------------------------------------------------------------


def _clean(work: Path) -> None:
    """Remove a previous run's trainings (our trainer would resume from their checkpoints), keeping
    the prepared data."""
    for name in RUNS:
        for sub in ("checkpoints", "calibration", "trainer", "hf"):
            shutil.rmtree(work / name / sub, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns 0, or 1 when a step failed (its log's end is printed)."""
    parser = argparse.ArgumentParser(
        prog="time_to_quality.py",
        description="Our classic and modern recipes and a Hugging Face Trainer peer, each trained for the "
        "same wall-clock budget on the same corpus, scored on one held-out set and one fine-tuning task.",
    )
    defaults = ", ".join(f"{name} {size.budget:g}" for name, size in SIZES.items())
    parser.add_argument("--budget", type=float, help=f"seconds of training per run (default: {defaults})")
    parser.add_argument(
        "--size",
        choices=list(SIZES),
        default="tiny",
        help="tiny (CI) and demo: bert-tiny; base: bert-base (default tiny)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds per run, their median shown")
    parser.add_argument("--steps", type=int, help="our runs' steps, instead of spec.budget")
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "runs" / "time-to-quality",
        help=f"where {RESULTS_FILE}, {TABLE_FILE} and the work files go",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work files (shards, exports, logs)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or (args.steps is not None and args.steps < 1) or (args.budget or 1) <= 0:
        parser.error("--seeds and --steps are at least 1, --budget is positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    size = SIZES[args.size]
    budget = args.budget or size.budget
    out: Path = args.out.resolve()
    work = out / "work"
    _clean(work)
    started = time.perf_counter()
    try:
        results = benchmark(size, args, budget, work)
    except BenchmarkError as error:
        print(f"time_to_quality: {error}\n(the work files are kept in {work})", file=sys.stderr, flush=True)
        return 1
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    results["seconds"] = time.perf_counter() - started
    lines = table(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=1) + "\n")
    (out / TABLE_FILE).write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines), flush=True)
    print(
        f"\ntime_to_quality: {out / RESULTS_FILE}, {out / TABLE_FILE}; {results['seconds']:.0f} s in all",
        flush=True,
    )
    return 0


def benchmark(size: Size, args: argparse.Namespace, budget: float, work: Path) -> dict[str, Any]:
    """Every step in order; returns the results (see the module's docstring)."""
    device = args.device
    vocab_dir, dataset = prepare_shared(size, device, work)
    heldout = HeldOut.read(dataset)
    print(
        f"time_to_quality: evaluation set: {heldout.sequences} held-out sequences, "
        f"{heldout.predictions} masked positions",
        flush=True,
    )
    runs: dict[str, dict[str, Any]] = {}
    for name in ("classic", "modern"):
        figures = run_ours(name, size, device, work, budget, args.steps, args.seeds)
        runs[name] = {"recipe": describe_recipe(name, size), **figures}
    peer = run_peer(size, device, work, vocab_dir, dataset, heldout, budget, args.seeds)
    runs["hf-peer"] = {"recipe": describe_recipe("hf-peer", size, peer["learning_rate"]), **peer}
    for name in RUNS:
        runs[name]["heldout_mlm_accuracy"] = export_accuracy(Path(runs[name]["export"]), heldout, device)
        print(
            f"time_to_quality: {name}: held-out MLM accuracy {runs[name]['heldout_mlm_accuracy']:.4f}",
            flush=True,
        )
    return {
        "size": args.size,
        "preset": size.preset,
        "device": device,
        "budget_seconds": budget,
        "seeds": args.seeds,
        "steps_argument": args.steps,
        "corpus": CORPUS,
        "settings": asdict(size),
        "evaluation": {
            "files": list(heldout.files),
            "sequences": heldout.sequences,
            "predictions": heldout.predictions,
            "masked_lm_prob": EVAL_MASKING,
        },
        "runs": runs,
        "ratios": ratios(runs),
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
