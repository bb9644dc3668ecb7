"""The job as a whole: ``spec`` with its topology and model, the resource around it, and the parsers.

:class:`JobSpec` gathers the objects of the other modules of :mod:`bertjob_api.spec`;
:func:`parse_job` and :func:`parse_spec` validate a document or a ``spec`` and raise
:class:`~bertjob_api.spec.base.SpecError` naming each wrong field by its YAML path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bertjob_api import kubenames
from bertjob_api.spec.base import Int32, Int64, LabelValue, SpecError, _rule, _Spec
from bertjob_api.spec.cel import JOB_RULES, MAX_FINETUNE_TASKS, MAX_PHASES
from bertjob_api.spec.cluster import (
    DistributedSpec,
    ElasticSpec,
    MpiSpec,
    PodSpec,
    PrepareSpec,
    RunPolicySpec,
    TrainJobSpec,
    VolumeSpec,
)
from bertjob_api.spec.data import DataSpec
from bertjob_api.spec.finetune import FinetuneTaskSpec
from bertjob_api.spec.phases import (
    BudgetSpec,
    CheckpointSpec,
    EvaluationSpec,
    ExportSpec,
    LoggingSpec,
    OptimizerSpec,
    PhaseSpec,
)

LauncherName = Literal["pytorchjob", "mpijob", "trainjob"]
Accelerator = Literal["nvidia-gpu", "habana-hpu", "xeon-cpu"]
Precision = Literal["bf16", "fp16", "fp32"]
Objective = Literal["mlm-nsp", "mlm"]
ModelPreset = Literal["bert-tiny", "bert-mini", "bert-small", "bert-medium", "bert-base", "bert-large"]


class Topology(_Spec):
    """Where the processes run: ``nodes`` pods, each running ``processes_per_node`` ranks."""

    nodes: Int32 = Field(1, ge=1, description="Pods (one per node); 1 renders the single-node overlay.")
    processes_per_node: Int32 = Field(
        1, ge=1, description="Training processes per pod, usually one per GPU/HPU or per CPU socket."
    )

    @property
    def world_size(self) -> int:
        """Number of training processes (ranks) in the whole job."""
        return self.nodes * self.processes_per_node


class ModelSpec(_Spec):
    """A BERT size: a preset, with any of its dimensions overridden."""

    preset: ModelPreset = Field(
        "bert-tiny",
        description="Google's compact BERTs (tiny, mini, small, medium; Turc et al. 2019) or the paper's "
        "base and large (Devlin et al. 2019).",
    )
    hidden_size: Int64 | None = Field(None, ge=8, description="Overrides the preset's hidden size.")
    num_hidden_layers: Int64 | None = Field(None, ge=1, description="Overrides the preset's layer count.")
    num_attention_heads: Int64 | None = Field(None, ge=1, description="Overrides the preset's head count.")
    intermediate_size: Int64 | None = Field(None, ge=8, description="Overrides the feed-forward width.")
    max_position_embeddings: Int64 | None = Field(
        None, ge=8, description="Longest sequence the model accepts; default 512."
    )
    hidden_dropout_prob: float | None = Field(None, ge=0, lt=1, description="Default 0.1.")
    attention_probs_dropout_prob: float | None = Field(None, ge=0, lt=1, description="Default 0.1.")
    init_from: str | None = Field(
        None,
        min_length=1,
        description="Continue pretraining from existing weights, the format told by the files: a "
        "Hugging Face model directory (config.json with model.safetensors or pytorch_model.bin), an "
        "NVIDIA DeepLearningExamples checkpoint (ckpt_<step>.pt with bert_config.json beside it, or "
        "their directory), a bert_config.json + pytorch_model.bin directory, or a checkpoint of this "
        "trainer. Its dimensions must equal this model's, and data.vocab.file must name its vocabulary "
        "(NVIDIA's padding of the vocabulary to a multiple of 8 is accepted).",
    )


class JobSpec(_Spec):
    """``spec`` of a BertPretrainJob."""

    # The checks across its objects that the API server makes too (bertjob_api.spec.cel).
    model_config = ConfigDict(json_schema_extra=JOB_RULES)

    image: Annotated[str, _rule(kubenames.image_problem)] = Field(
        min_length=1, description="Trainer container image."
    )
    launcher: LauncherName = Field(
        "pytorchjob",
        description="pytorchjob (Kubeflow training operator v1: torchrun, DDP), mpijob (mpi-operator: "
        "mpirun, Horovod) or trainjob (Kubeflow Trainer v2: a TrainJob on a torch or MPI runtime, "
        "spec.trainJob). docs/launchers.md says which to choose.",
    )
    accelerator: Accelerator = Field("nvidia-gpu", description="nvidia-gpu, habana-hpu or xeon-cpu.")
    topology: Topology = Field(default_factory=Topology, description="Nodes and processes per node.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model size.")
    data: DataSpec = Field(description="Corpus, vocabulary and shards.")
    objective: Objective = Field(
        "mlm-nsp",
        description="mlm-nsp: masked LM and next sentence prediction on sentence pairs (Devlin et al., "
        "NVIDIA's recipe); mlm: masked LM alone on single segments of whole sentences (RoBERTa, "
        "Cramming, MosaicBERT): no pairs, no NSP head or pooler, a BertForMaskedLM export.",
    )
    phases: list[PhaseSpec] = Field(
        min_length=1, max_length=MAX_PHASES, description="Phase 1, then optionally phase 2."
    )
    budget: BudgetSpec | None = Field(
        None,
        description="Train for a wall-clock time instead of phases[].steps: each phase times its "
        "steps first and fixes their count to end with its share. Default: phases[].steps.",
    )
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec, description="Optimizer settings.")
    precision: Precision = Field("bf16", description="bf16 or fp16 autocast, or fp32.")
    tf32: bool = Field(
        True, description="Let fp32 matrix products use TensorFloat-32 on NVIDIA GPUs (NVIDIA's default)."
    )
    compile: bool | None = Field(
        None,
        description="Compile the model (each encoder layer, the embeddings and the MLM head) and LAMB's "
        "step with torch.compile. Unset: compiled on nvidia-gpu without DeepSpeed, eager elsewhere, "
        "falling back to eager with a warning if compiling fails; true or false forces it (true stops "
        "the job if it fails).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each layer's activations in the backward pass: less memory, ~30% slower.",
    )
    checkpoint: CheckpointSpec = Field(description="Checkpoint location and frequency.")
    export: ExportSpec = Field(default_factory=ExportSpec, description="Hugging Face export.")
    evaluation: EvaluationSpec = Field(
        default_factory=EvaluationSpec, description="Held-out masked-LM and NSP accuracy."
    )
    logging: LoggingSpec = Field(default_factory=LoggingSpec, description="Progress output and logs.")
    pod: PodSpec = Field(default_factory=PodSpec, description="Pod settings passed through to every replica.")
    volumes: list[VolumeSpec] = Field(
        default_factory=list,
        description="Volumes for corpus, shards and checkpoints. Default: an emptyDir at /data. Every "
        "path the job writes (data.shards, checkpoint.path, export.path, logging.path) must lie on one.",
    )
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec, description="The child job's runPolicy.")
    queue_name: LabelValue | None = Field(
        None, min_length=1, description="Kueue LocalQueue: sets the kueue.x-k8s.io/queue-name label."
    )
    distributed: DistributedSpec = Field(
        default_factory=DistributedSpec, description="Gradient exchange between the ranks."
    )
    elastic: ElasticSpec | None = Field(
        None, description="Elastic training between minNodes and maxNodes. Default: a fixed world."
    )
    mpi: MpiSpec = Field(
        default_factory=MpiSpec, description="mpijob launcher settings (and trainjob's mpi policy)."
    )
    train_job: TrainJobSpec = Field(default_factory=TrainJobSpec, description="trainjob launcher settings.")
    prepare: PrepareSpec = Field(default_factory=PrepareSpec, description="Data preparation as its own Job.")
    finetune: list[FinetuneTaskSpec] = Field(
        default_factory=list,
        # Bounds the cost of the CRD's rule that iterates the tasks (bertjob_api.spec.cel).
        max_length=MAX_FINETUNE_TASKS,
        description="Downstream tasks fine-tuned and scored after the last phase, in the same job "
        "(docs/finetune.md). Default: none.",
    )
    seed: Int64 = Field(12345, ge=0, description="Seed for data creation, initialisation and sampling.")

    @property
    def compiles(self) -> bool:
        """Whether the trainer compiles: ``compile`` when set, else on nvidia-gpu without DeepSpeed
        (where TorchInductor's fused kernels were measured to pay; not on a CPU, where they did not,
        nor under DeepSpeed, whose ZeRO-3 gathers parameters in hooks around each module and which
        has never run compiled here)."""
        if self.compile is not None:
            return self.compile
        return self.accelerator == "nvidia-gpu" and self.distributed.deepspeed is None


class ObjectMeta(BaseModel):
    """The part of Kubernetes metadata the job uses; the API server's own fields pass through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    # The child job takes this name, and the Kubeflow operators name Services after it.
    name: Annotated[str, _rule(kubenames.dns1035_label_problem)] = Field(description="DNS-1035 label.")
    namespace: Annotated[str, _rule(kubenames.dns_label_problem)] = Field("default", description="DNS label.")


class BertPretrainJob(_Spec):
    """A whole custom resource as written in a job file."""

    api_version: Literal["bertjob.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["BertPretrainJob"]
    metadata: ObjectMeta
    spec: JobSpec


def _problems(error: ValidationError, prefix: str) -> list[tuple[str, str]]:
    problems = []
    for item in error.errors():
        path = kubenames.field_path(prefix, item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "missing":
            message = "required field is missing"
        problems.append((path, message))
    return problems


def parse_job(data: Any, source: str = "<job>") -> BertPretrainJob:
    """Validate a whole BertPretrainJob document (a dict from YAML or JSON).

    Raises:
        SpecError: naming each wrong field by its YAML path and saying what is wrong.
    """
    try:
        return BertPretrainJob.model_validate(data)
    except ValidationError as error:
        raise SpecError(source, _problems(error, "")) from None


def parse_spec(data: Any, source: str = "<spec>") -> JobSpec:
    """Validate the ``spec`` of a custom resource as the operator receives it.

    Raises:
        SpecError: naming each wrong field as ``spec.<path>``.
    """
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(source, _problems(error, "spec")) from None


def to_document(job: BertPretrainJob) -> dict[str, Any]:
    """The job as the dict a YAML file or the API server holds (camelCase, defaults included)."""
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)
