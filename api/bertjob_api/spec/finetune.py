"""The downstream tasks fine-tuned and scored after pretraining (``spec.finetune``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from bertjob_api.spec.base import Int64, _Spec

TaskType = Literal["classification", "squad"]
TaskFormat = Literal["auto", "tsv", "csv", "jsonl", "parquet", "squad"]
TaskMetric = Literal["accuracy", "f1", "mcc", "exact_match"]
BuiltinTask = Literal["python-docs-modules"]
# The metrics each task type can report (F1 means a token F1 over answers for squad).
TASK_METRICS: dict[str, tuple[TaskMetric, ...]] = {
    "classification": ("accuracy", "f1", "mcc"),
    "squad": ("exact_match", "f1"),
}


class FinetuneTaskSpec(_Spec):
    """One downstream task: fine-tune the pretrained model on its training file, score it on its
    validation file (GLUE-style classification, or SQuAD-style extractive question answering).
    Defaults that depend on the type (learning rate, sequence length, metrics) are NVIDIA's and
    Google's fine-tuning scripts' (docs/finetune.md)."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="The task's name in logs, finetune.json and status.results (e.g. mrpc, squad).",
    )
    type: TaskType = Field(
        description="classification (single sentences or pairs, GLUE-style) or squad (extractive "
        "question answering, SQuAD v1.1 or v2.0 JSON)."
    )
    train: str | None = Field(None, min_length=1, description="The training file.")
    validation: str | None = Field(None, min_length=1, description="The file the metrics are computed on.")
    builtin: BuiltinTask | None = Field(
        None,
        description="Instead of train and validation: a task made from the running Python's "
        "documentation, needing no download (python-docs-modules: which standard-library module's "
        "documentation a sentence comes from). Classification only.",
    )
    format: TaskFormat = Field(
        "auto",
        description="tsv (GLUE's files: a header row, tabs, no quoting), csv, jsonl, parquet, or squad "
        "(SQuAD v1.1/v2.0 JSON). auto: by the file name (.tsv, .csv, .jsonl, .parquet; .json is squad).",
    )
    text_field: str = Field("sentence", min_length=1, description="Column or field of the first text.")
    text_pair_field: str | None = Field(
        None, min_length=1, description="Column or field of the second text, for sentence pairs."
    )
    label_field: str = Field("label", min_length=1, description="Column or field of the label.")
    labels: list[str] | None = Field(
        None,
        min_length=2,
        description="The labels, in class order (for F1 on two classes the second is the positive "
        "one). Default: those of the training file, sorted (numbers numerically).",
    )
    metrics: list[TaskMetric] | None = Field(
        None,
        min_length=1,
        description="accuracy, f1, mcc (classification; default accuracy and f1) or exact_match, f1 "
        "(squad, the official script's; default both). The first is the task's headline figure.",
    )
    init_from: str | None = Field(
        None,
        min_length=1,
        description="Fine-tune these weights (any format model.initFrom reads, with this job's model "
        "dimensions and vocabulary) instead of the job's export.",
    )
    epochs: Int64 = Field(3, ge=1, description="Passes over the training file.")
    learning_rate: float | None = Field(
        None, gt=0, description="Peak learning rate of AdamW. Default: 2e-5 classification, 3e-5 squad."
    )
    global_batch_size: Int64 = Field(
        32, ge=1, description="Examples (squad: windows) per optimizer step, over all processes of a run."
    )
    micro_batch_size: Int64 | None = Field(
        None, ge=1, description="Per process per forward/backward pass. Default: no accumulation."
    )
    max_seq_length: Int64 | None = Field(
        None, ge=8, description="Tokens per sequence. Default: 128 classification, 384 squad."
    )
    doc_stride: Int64 = Field(
        128, ge=1, description="squad: tokens between the starts of a long context's windows."
    )
    max_query_length: Int64 = Field(64, ge=1, description="squad: tokens kept of each question.")
    max_answer_length: Int64 = Field(30, ge=1, description="squad: longest answer predicted, in tokens.")
    warmup_proportion: float = Field(0.1, ge=0, lt=1, description="Share of steps in linear warm-up.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW's decoupled weight decay.")
    dropout: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="Hidden and attention-probability dropout of the fine-tuned model (the "
        "classification head's dropout is the hidden one), whatever pretraining used "
        "(spec.model.hiddenDropoutProb, attentionProbsDropoutProb), for the pretrained and the "
        "baseline runs alike: MosaicBERT and Cramming pretrain without dropout and fine-tune with 0.1.",
    )
    seeds: Int64 = Field(
        1,
        ge=1,
        description="Runs with different seeds (spec.seed, +1, ...); finetune.json and the status give "
        "each run's metrics, their median and the best.",
    )
    parallelism: Literal["data", "seeds"] = Field(
        "data",
        description="With several processes: data (every run data-parallel over all ranks, as "
        "pretraining is: DDP, Horovod or DeepSpeed) or seeds (each rank runs its own seeds without "
        "gradient exchange, as Intel's scripts do; globalBatchSize is then one rank's).",
    )
    baseline: bool = Field(
        False,
        description="Also fine-tune the same architecture from random weights, with the same settings "
        "and seeds, and report both: how much pretraining helped.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> FinetuneTaskSpec:
        if self.builtin is not None:
            if self.train is not None or self.validation is not None:
                raise ValueError("set either builtin or train and validation, not both")
            if self.type != "classification":
                raise ValueError(f"builtin {self.builtin} is a classification task, not {self.type}")
        elif self.train is None or self.validation is None:
            missing = " and ".join(name for name in ("train", "validation") if getattr(self, name) is None)
            raise ValueError(f"{missing} missing: a task needs a training and a validation file (or builtin)")
        if (self.format == "squad") != (self.type == "squad") and self.format != "auto":
            raise ValueError(f"format {self.format} does not hold {self.type} data")
        if self.type == "squad" and self.text_pair_field is not None:
            raise ValueError("textPairField is for classification; squad reads questions and contexts")
        allowed = TASK_METRICS[self.type]
        wrong = [metric for metric in self.metrics or () if metric not in allowed]
        if wrong:
            raise ValueError(
                f"metrics {', '.join(wrong)} are not for {self.type} (choose from {', '.join(allowed)})"
            )
        return self
