"""Defaults that depend on other fields, and values derived from the spec.

Fixed defaults sit on the fields in :mod:`bertjob_api.spec`; this module fills what can only be
known from the rest of the job (a phase's micro-batch from the world size, the export path from
the checkpoint path, a model's dimensions from its preset) and computes what is derived, so that
no value is ever asked for twice (world size, gradient accumulation steps). The trainer reads the
derived values once, through :class:`bertjob_api.plan.Plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bertjob_api.spec import TASK_METRICS, FinetuneTaskSpec, JobSpec, ModelSpec, PhaseSpec, VolumeSpec

DEFAULT_NUM_SHARDS = 4
# Fine-tuning defaults by task type: Devlin et al. 2019's (and NVIDIA's scripts') sequence lengths,
# and the low ends of their learning-rate grids (2e-5 for GLUE, 3e-5 for SQuAD).
FINETUNE_LEARNING_RATES = {"classification": 2e-5, "squad": 3e-5}
FINETUNE_SEQ_LENGTHS = {"classification": 128, "squad": 384}
# The base pod's scratch volume (kustomize/base); a job volume of this name replaces it.
DEFAULT_VOLUME = VolumeSpec(name="data", mount_path="/data")


@dataclass(frozen=True)
class ModelDims:
    """A BERT's dimensions, without the vocabulary size (which comes from the vocabulary file)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1


def _preset(layers: int, hidden: int) -> ModelDims:
    # Every released BERT uses 64-dimensional heads and a 4x feed-forward.
    return ModelDims(hidden, layers, hidden // 64, 4 * hidden)


# Sources: Turc et al. 2019, "Well-Read Students Learn Better" (google-research/bert's 24 compact
# models, of which these are the named four), and Devlin et al. 2019 for base and large.
MODEL_PRESETS: dict[str, ModelDims] = {
    "bert-tiny": _preset(2, 128),
    "bert-mini": _preset(4, 256),
    "bert-small": _preset(4, 512),
    "bert-medium": _preset(8, 512),
    "bert-base": _preset(12, 768),
    "bert-large": _preset(24, 1024),
}


def resolve_model(model: ModelSpec) -> ModelDims:
    """The preset's dimensions with the spec's overrides applied."""
    overrides = {
        name: value
        for name, value in model.model_dump(exclude={"preset", "init_from"}).items()
        if value is not None
    }
    base = MODEL_PRESETS[model.preset]
    if "hidden_size" in overrides:
        # Scaling the width alone keeps the preset's 64-dimensional heads and 4x feed-forward.
        hidden = overrides["hidden_size"]
        base = ModelDims(hidden, base.num_hidden_layers, max(hidden // 64, 1), 4 * hidden)
    return ModelDims(**{**base.__dict__, **overrides})


def with_defaults(spec: JobSpec) -> JobSpec:
    """The spec with every field that depends on others filled in.

    Each phase without ``microBatchSize`` gets ``globalBatchSize // world size`` (no gradient
    accumulation); the export path defaults to ``<checkpoint.path>/hf`` and the log directory to
    ``<checkpoint.path>/logs``; the data gets
    ``DEFAULT_NUM_SHARDS`` shards unless ``maxShardMB`` sizes them. Call
    :func:`bertjob_api.validation.check` on the result.
    """
    world_size = spec.topology.world_size
    phases = [
        phase.model_copy(update={"micro_batch_size": micro_batch_size(phase, world_size)})
        for phase in spec.phases
    ]
    checkpoints = spec.checkpoint.path.rstrip("/")
    export = spec.export
    if export.path is None:
        export = export.model_copy(update={"path": checkpoints + "/hf"})
    logging = spec.logging
    if logging.path is None:
        logging = logging.model_copy(update={"path": checkpoints + "/logs"})
    data = spec.data
    if data.num_shards is None and data.max_shard_mb is None:
        data = data.model_copy(update={"num_shards": DEFAULT_NUM_SHARDS})
    finetune = [_task_defaults(task, world_size) for task in spec.finetune]
    return spec.model_copy(
        update={"phases": phases, "export": export, "logging": logging, "data": data, "finetune": finetune}
    )


def _task_defaults(task: FinetuneTaskSpec, world_size: int) -> FinetuneTaskSpec:
    update = {
        "learning_rate": task.learning_rate or FINETUNE_LEARNING_RATES[task.type],
        "max_seq_length": task.max_seq_length or FINETUNE_SEQ_LENGTHS[task.type],
        "metrics": task.metrics or list(TASK_METRICS[task.type][:2]),
        "micro_batch_size": micro_batch_size(task, task_world_size(task, world_size)),
    }
    return task.model_copy(update=update)


def task_world_size(task: FinetuneTaskSpec, world_size: int) -> int:
    """Processes one fine-tuning run of ``task`` spans: all ``world_size`` with parallelism data,
    one with seeds (each rank runs its own seeds)."""
    return world_size if task.parallelism == "data" else 1


class Batching(Protocol):
    """What splits into micro-batches: a pretraining phase or a fine-tuning task."""

    @property
    def global_batch_size(self) -> int: ...
    @property
    def micro_batch_size(self) -> int | None: ...


def micro_batch_size(phase: Batching, world_size: int) -> int:
    """Sequences per process per forward/backward pass: ``microBatchSize``, or by default
    ``globalBatchSize // world size`` (no gradient accumulation)."""
    return phase.micro_batch_size or max(phase.global_batch_size // world_size, 1)


def batch_split_problem(phase: Batching, world_size: int) -> str | None:
    """What is wrong with splitting ``globalBatchSize`` over ``world_size`` processes, or None
    when it splits into whole micro-batches."""
    micro = micro_batch_size(phase, world_size)
    if phase.global_batch_size % (world_size * micro) == 0:
        return None
    return f"{phase.global_batch_size} is not divisible by world size {world_size} x microBatchSize {micro}"


def masked_count(length: int, masked_lm_prob: float) -> int:
    """Tokens masked in a sequence of ``length`` tokens (special tokens included) at rate
    ``masked_lm_prob`` before the ``maxPredictionsPerSeq`` cap: ``max(1, round(length x rate))``
    with round half to even, as Google's ``create_pretraining_data.py`` (Python's ``round``) and
    the trainer's masking (``numpy.round``) count it."""
    return max(1, round(length * masked_lm_prob))


def masking_cap_problem(
    max_seq_length: int, max_predictions_per_seq: int, masked_lm_prob: float
) -> str | None:
    """What is wrong when ``maxPredictionsPerSeq`` caps the masking of a full sequence below
    ``spec.data.maskedLmProb`` (the rate would silently drop), or None."""
    wanted = masked_count(max_seq_length, masked_lm_prob)
    if max_predictions_per_seq >= wanted:
        return None
    return (
        f"{max_predictions_per_seq} caps the masking: spec.data.maskedLmProb {masked_lm_prob} masks "
        f"{wanted} of maxSeqLength {max_seq_length} tokens, so the rate would silently drop to "
        f"{max_predictions_per_seq / max_seq_length:.1%}; set maxPredictionsPerSeq to at least {wanted}"
    )


# How far the phases' budgetProportion may add up from 1 (floating-point sums of decimals).
SHARE_TOLERANCE = 1e-9


def budget_shares(phases: Sequence[PhaseSpec]) -> list[float] | None:
    """Each phase's share of ``spec.budget``'s time: its ``budgetProportion``, or an equal part of
    what the phases that set theirs leave; None when the shares do not add up to 1 (all set and
    not summing to 1, or leaving nothing for the unset ones)."""
    written = [phase.budget_proportion for phase in phases]
    given = sum(share for share in written if share is not None)
    unset = written.count(None)
    if (unset == 0 and abs(given - 1.0) > SHARE_TOLERANCE) or (unset and given >= 1.0):
        return None
    return [(1.0 - given) / unset if share is None else share for share in written]


def gradient_accumulation_steps(phase: Batching, world_size: int) -> int:
    """Forward/backward passes per optimizer step on each process:
    ``globalBatchSize / (world size x microBatchSize)``.

    Raises:
        ValueError: the global batch does not split so (:func:`bertjob_api.validation.check` refuses
            such a spec for its own world size; an elastic job can meet another one).
    """
    problem = batch_split_problem(phase, world_size)
    if problem is not None:
        raise ValueError(f"globalBatchSize {problem}; choose elastic node counts that divide it")
    return phase.global_batch_size // (world_size * micro_batch_size(phase, world_size))


def volumes(spec: JobSpec) -> list[VolumeSpec]:
    """Every volume a training pod mounts besides the job file and /dev/shm: the spec's own, and
    the base's emptyDir at /data unless a volume named ``data`` replaces it."""
    if any(volume.name == DEFAULT_VOLUME.name for volume in spec.volumes):
        return list(spec.volumes)
    return [DEFAULT_VOLUME, *spec.volumes]
