"""How pretraining runs: the phases, the optimizer, and what a phase saves and reports.

Checkpoints, the Hugging Face export, the held-out evaluation and the logs are settings of the
training phases, so they sit here beside them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from bertjob_api.spec.base import Int64, _Spec
from bertjob_api.spec.cel import Rule, validations


class PhaseSpec(_Spec):
    """One pretraining phase (NVIDIA's recipe: phase 1 at seq 128, phase 2 at seq 512)."""

    max_seq_length: Int64 = Field(ge=8, description="Tokens per sequence, [CLS] and [SEP]s included.")
    max_predictions_per_seq: Int64 = Field(ge=1, description="Masked positions stored per sequence.")
    global_batch_size: Int64 = Field(ge=1, description="Sequences per optimizer step, over all processes.")
    micro_batch_size: Int64 | None = Field(
        None,
        ge=1,
        description="Sequences per process per forward/backward pass; gradient accumulation steps "
        "= globalBatchSize / (world size x microBatchSize). Default: no accumulation.",
    )
    learning_rate: float = Field(gt=0, description="Peak learning rate, reached after warm-up.")
    warmup_proportion: float = Field(
        0.01, ge=0, lt=1, description="Share of the phase's steps spent in linear warm-up."
    )
    steps: Int64 | None = Field(
        None,
        ge=1,
        description="Optimizer steps in this phase; required without spec.budget, refused with it.",
    )
    budget_proportion: float | None = Field(
        None,
        gt=0,
        le=1,
        description="With spec.budget: this phase's share of the budget's time. Default: an equal part "
        "of what the phases that set theirs leave.",
    )
    batch_ramp_proportion: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Share of the phase's steps over which the global batch grows (Cramming's batch "
        "ramp): the gradient accumulation steps rise linearly from 1 at the first step to their full "
        "count at this share of the steps, so the first steps see world size x microBatchSize "
        "sequences. Needs gradient accumulation, DDP (not Horovod or DeepSpeed, which fix the "
        "accumulation for the phase) and lrScaling none. Default: no ramp.",
    )

    @model_validator(mode="after")
    def _predictions_fit(self) -> PhaseSpec:
        if self.max_predictions_per_seq >= self.max_seq_length:
            raise ValueError("maxPredictionsPerSeq must be smaller than maxSeqLength")
        return self


# A Go-style duration of hours, minutes and seconds (2h, 90m, 1h30m, 600s), as kubectl writes them.
DURATION_PATTERN = r"^([0-9]+h([0-9]+m)?([0-9]+s)?|[0-9]+m([0-9]+s)?|[0-9]+s)$"


def duration_seconds(text: str) -> int:
    """Seconds in a duration written as :data:`DURATION_PATTERN` allows (``1h30m`` is 5400).

    Raises:
        ValueError: ``text`` is not such a duration.
    """
    match = re.fullmatch(r"(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?", text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration such as 2h, 90m, 1h30m or 600s")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


class BudgetSpec(_Spec):
    """A wall-clock budget for the training phases, in place of their steps (docs/training.md)."""

    time: str = Field(
        pattern=DURATION_PATTERN,
        description="Wall-clock time of all training phases (not data preparation, export or "
        "fine-tuning), as 2h, 90m, 1h30m or 600s. The phases share it by time (phases[].budgetProportion); "
        "each fixes its steps from its measured speed before step 1.",
    )
    calibration_proportion: float = Field(
        0.02,
        gt=0,
        lt=1,
        description="Share of each phase's time spent timing its optimizer steps (at least 4 steps) "
        "before its step count is fixed; those steps are not kept.",
    )

    @model_validator(mode="after")
    def _some_time(self) -> BudgetSpec:
        if duration_seconds(self.time) == 0:
            raise ValueError("time must be longer than 0s")
        return self


class OptimizerSpec(_Spec):
    """The optimizer; LAMB as NVIDIA's FusedLAMB defines it (You et al. 2020)."""

    # _scaling_has_reference, for the API server (bertjob_api.spec.cel).
    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "self.lrScaling == 'none' || has(self.referenceGlobalBatchSize)",
                "spec.optimizer: lrScaling linear or sqrt needs referenceGlobalBatchSize",
                message_expression="'spec.optimizer: lrScaling ' + (self.lrScaling == 'linear' ? 'linear' "
                ": 'sqrt') + ' needs referenceGlobalBatchSize'",
            )
        )
    )

    name: Literal["lamb", "adamw"] = Field("lamb", description="lamb or adamw.")
    weight_decay: float = Field(
        0.01, ge=0, description="Decoupled weight decay; none on biases and LayerNorm."
    )
    beta1: float = Field(0.9, ge=0, lt=1, description="First-moment decay.")
    beta2: float = Field(0.999, ge=0, lt=1, description="Second-moment decay.")
    eps: float = Field(1e-6, gt=0, description="Added to the second-moment root.")
    max_grad_norm: float = Field(1.0, gt=0, description="Global gradient-norm clipping before the update.")
    schedule: Literal["poly", "linear", "one-cycle"] = Field(
        "poly",
        description="Learning rate: poly (NVIDIA's PolyWarmUpScheduler: linear warm-up, then (1 - "
        "step / steps) ** polyPower), linear (linear warm-up, then linear to 0, Hugging Face's "
        "default) or one-cycle (Smith and Topin 2019, torch's OneCycleLR: a half-cosine from 0 up to "
        "the peak over the warm-up, then a half-cosine down to 0 at the phase's end).",
    )
    poly_power: float = Field(0.5, gt=0, description="Exponent of the poly schedule's decay.")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none",
        description="Scale each phase's learningRate by (globalBatchSize / referenceGlobalBatchSize) "
        "(linear, Goyal et al. 2017) or its square root (sqrt, as Intel Model Zoo scales by the MPI "
        "process count); none uses learningRate as written.",
    )
    reference_global_batch_size: Int64 | None = Field(
        None,
        ge=1,
        description="The global batch size the phases' learningRate was tuned for; needed by lrScaling "
        "linear and sqrt.",
    )

    @model_validator(mode="after")
    def _scaling_has_reference(self) -> OptimizerSpec:
        if self.lr_scaling != "none" and self.reference_global_batch_size is None:
            raise ValueError(f"lrScaling {self.lr_scaling} needs referenceGlobalBatchSize")
        return self


class CheckpointSpec(_Spec):
    """Where and how often training state is saved."""

    path: str = Field(min_length=1, description="Directory for checkpoints (one sub-directory per phase).")
    every_steps: Int64 = Field(200, ge=1, description="Save every this many optimizer steps, and at the end.")
    keep: Int64 = Field(3, ge=1, description="Checkpoints kept per phase; older ones are deleted.")


class ExportSpec(_Spec):
    """The final model in Hugging Face format."""

    path: str | None = Field(None, min_length=1, description="Default: <checkpoint.path>/hf.")
    nvidia: bool = Field(
        False,
        description="Also write NVIDIA DeepLearningExamples' format (ckpt_<step>.pt with its parameter "
        "names, bert_config.json, vocab.txt) in <export.path>/nvidia, for NVIDIA's fine-tuning scripts.",
    )


class EvaluationSpec(_Spec):
    """Masked-LM and NSP accuracy on the held-out shards (made with data.heldoutFraction)."""

    every_steps: Int64 | None = Field(
        None,
        ge=1,
        description="Evaluate every this many optimizer steps, and always at the end of a phase. "
        "Default: only at the end of each phase (with held-out shards).",
    )
    max_sequences: Int64 | None = Field(
        None, ge=1, description="Held-out sequences per evaluation. Default: all of them."
    )


class LoggingSpec(_Spec):
    """What the trainer prints and writes."""

    every_steps: Int64 = Field(
        10, ge=1, description="Print one progress line every this many optimizer steps."
    )
    path: str | None = Field(
        None,
        min_length=1,
        description="Directory for the JSON-lines log and TensorBoard scalars. Default: "
        "<checkpoint.path>/logs.",
    )
    tensorboard: bool = Field(True, description="Write TensorBoard scalars beside the JSON-lines log.")
    format: Literal["jsonl", "dllogger"] = Field(
        "jsonl",
        description="The log file's format: jsonl (one JSON object per line, train.jsonl) or dllogger "
        "(NVIDIA DLLogger's DLLL lines with its field names, dllogger.json, as NVIDIA's and Habana's "
        "BERT scripts write).",
    )
