"""Our job documents: the two shared data jobs (the held-out sets), our runs, and the fine-tuning
jobs of exports made elsewhere (the peer's, a random initialisation's).

Every job of a replicate names one data directory (``<work>/data``) with the same corpus, seed and
held-out fraction, so the vocabulary and the tokenized documents are made once and the held-out
documents are the same for all; each distinct dataset setting gets its own dataset directory there
(``seq_len_128_max_pred_{19,20,38}``, ``..._38_dynamic``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ttq.settings import (
    CORPUS,
    DUPE_FACTOR,
    EVAL_MASKING,
    FINETUNE_DROPOUT,
    FINETUNE_SEEDS,
    FINETUNE_TASK,
    OWN_EVAL_SEQUENCES,
    PAIRS_PREDICTIONS,
    SEQ_LEN,
    SINGLES_PREDICTIONS,
    VOCAB_SIZE,
    Recipe,
    Size,
)


def document(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A BertPretrainJob around ``spec``."""
    return {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def base_spec(size: Size, device: str, checkpoints: Path, seed: int) -> dict[str, Any]:
    """What every job shares: this machine, one process, the model, the logs; ``seed`` is the
    replicate's (the held-out split, the data, the initialisation, the fine-tuning)."""
    cuda = device == "cuda"
    return {
        "image": "ghcr.io/bertjob/trainer:0.1.0-cuda" if cuda else "ghcr.io/bertjob/trainer:0.1.0-xeon",
        "accelerator": "nvidia-gpu" if cuda else "xeon-cpu",
        "topology": {"nodes": 1, "processesPerNode": 1},
        "model": {"preset": size.preset},
        "precision": "bf16" if cuda else "fp32",
        "checkpoint": {"path": str(checkpoints), "everySteps": 1_000_000, "keep": 1},
        "logging": {"everySteps": size.log_every, "tensorboard": False},
        "seed": seed,
    }


def data_spec(
    work: Path,
    size: Size,
    *,
    masked_lm_prob: float,
    dupe_factor: int = DUPE_FACTOR,
    masking: str = "static",
    final_masked_lm_prob: float | None = None,
    packing: str = "none",
) -> dict[str, Any]:
    """A job's ``spec.data``: the replicate's one data directory, corpus, vocabulary and held-out
    fraction; the rest as given."""
    data: dict[str, Any] = {
        "sources": [{"path": CORPUS}],
        "shards": str(work / "data"),
        "vocab": {"trainSize": VOCAB_SIZE},
        "lowercase": True,
        "dupeFactor": dupe_factor,
        "numShards": size.num_shards,
        "maskedLmProb": masked_lm_prob,
        "masking": masking,
        "packing": packing,
        "heldoutFraction": size.heldout_fraction,
    }
    if final_masked_lm_prob is not None:
        data["finalMaskedLmProb"] = final_masked_lm_prob
    return data


def _phase(
    size: Size, global_batch: int, predictions: int, learning_rate: float, warmup: float
) -> dict[str, Any]:
    return {
        "maxSeqLength": SEQ_LEN,
        "maxPredictionsPerSeq": predictions,
        "globalBatchSize": global_batch,
        "microBatchSize": size.micro_batch,
        "learningRate": learning_rate,
        "warmupProportion": warmup,
    }


def singles_job(size: Size, device: str, work: Path, seed: int) -> dict[str, Any]:
    """The job that makes the single-segment held-out set (``[CLS] A [SEP]``, objective ``mlm``,
    static masks at 15%) and the peer's training rows (its training shards, made in one pass,
    ``dupeFactor`` 1: the peer masks afresh each batch, so copies would only repeat text and leak
    into its validation split). Only ever prepared."""
    spec = base_spec(size, device, work / "singles" / "checkpoints", seed)
    spec["objective"] = "mlm"
    spec["data"] = data_spec(work, size, masked_lm_prob=EVAL_MASKING, dupe_factor=1)
    spec["phases"] = [{**_phase(size, size.global_batch, SINGLES_PREDICTIONS, 1e-4, 0.01), "steps": 1}]
    return document("time-to-quality-singles", spec)


def pairs_job(size: Size, device: str, work: Path, seed: int) -> dict[str, Any]:
    """The job that makes the sentence-pair held-out set (``[CLS] A [SEP] B [SEP]``, segment ids 0
    and 1, objective ``mlm-nsp``, static masks at 15%): the classic recipe's own data settings, so
    its runs reuse the dataset. Only ever prepared."""
    spec = base_spec(size, device, work / "pairs" / "checkpoints", seed)
    spec["objective"] = "mlm-nsp"
    spec["data"] = data_spec(work, size, masked_lm_prob=EVAL_MASKING)
    spec["phases"] = [{**_phase(size, size.global_batch, PAIRS_PREDICTIONS, 1e-4, 0.01), "steps": 1}]
    return document("time-to-quality-pairs", spec)


def finetune_task(size: Size, init_from: str | None = None) -> dict[str, Any]:
    """The one fine-tuning protocol (``spec.finetune[0]``): the builtin task, the size's epochs
    and learning rate, dropout 0.1 whatever the pretraining's, :data:`FINETUNE_SEEDS` seeds from
    the job's seed; ``init_from`` the export when it was made outside the job."""
    task: dict[str, Any] = {
        "name": FINETUNE_TASK,
        "type": "classification",
        "builtin": "python-docs-modules",
        "epochs": size.finetune_epochs,
        "learningRate": size.finetune_lr,
        "dropout": FINETUNE_DROPOUT,
        "seeds": FINETUNE_SEEDS,
    }
    if init_from is not None:
        task["initFrom"] = init_from
    return task


def our_job(
    recipe: Recipe,
    size: Size,
    device: str,
    work: Path,
    run_dir: Path,
    *,
    budget: int,
    seed: int,
    learning_rate: float,
    finetune: bool,
) -> dict[str, Any]:
    """Our run of ``recipe`` as a BertPretrainJob: one phase at seq 128 for ``spec.budget`` =
    ``budget`` seconds on its own dataset in the replicate's data directory, checkpoints under
    ``run_dir``; with ``finetune``, the one fine-tuning protocol on its export. Its own held-out
    evaluation at the phase's end is capped at :data:`OWN_EVAL_SEQUENCES` (the benchmark scores
    the export itself)."""
    spec = base_spec(size, device, run_dir / "checkpoints", seed)
    spec["objective"] = recipe.objective
    spec["data"] = data_spec(
        work,
        size,
        masked_lm_prob=recipe.masked_lm_prob,
        masking=recipe.masking,
        final_masked_lm_prob=recipe.final_masked_lm_prob,
        packing=recipe.packing,
    )
    spec["model"].update(hiddenDropoutProb=recipe.dropout, attentionProbsDropoutProb=recipe.dropout)
    spec["optimizer"] = {
        "name": recipe.optimizer,
        "weightDecay": 0.01,
        "schedule": recipe.schedule,
        "maxGradNorm": recipe.max_grad_norm,
    }
    if recipe.optimizer == "adamw":
        spec["optimizer"]["beta2"] = recipe.beta2
    spec["evaluation"] = {"maxSequences": OWN_EVAL_SEQUENCES}
    phase = _phase(size, recipe.global_batch(size), recipe.max_predictions, learning_rate, recipe.warmup)
    if recipe.batch_ramp is not None:
        phase["batchRampProportion"] = recipe.batch_ramp
    spec["phases"] = [phase]
    spec["budget"] = {"time": f"{budget}s"}
    if finetune:
        spec["finetune"] = [finetune_task(size)]
    return document(f"time-to-quality-{recipe.name}", spec)


def finetune_job(
    size: Size, device: str, work: Path, run_dir: Path, export: Path, seed: int
) -> dict[str, Any]:
    """The fine-tuning of an export made outside our jobs (the peer's, a random initialisation's),
    by our fine-tuning code (``python -m bertpretrain finetune``): the singles job's settings with
    the one protocol's task, ``initFrom`` the export."""
    job = singles_job(size, device, work, seed)
    job["spec"]["checkpoint"]["path"] = str(run_dir / "checkpoints")
    job["spec"]["finetune"] = [finetune_task(size, init_from=str(export))]
    job["metadata"]["name"] = "time-to-quality-finetune"
    return job
