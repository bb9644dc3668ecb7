"""The BertPretrainJob API: one typed tree shared by the CRD schema, the CLI and the trainer.

Field names are snake_case in Python and camelCase in YAML/JSON (``max_seq_length`` <->
``maxSeqLength``), as Kubeflow's SDK does; the conversion is mechanical, so one set of names
serves the custom resource, the job file read by the CLI, and the trainer's configuration.
Each field's ``description`` is what ``kubectl explain bertpretrainjob.spec`` shows: the CRD in
``manifests/`` is generated from these classes (``python -m bertjob_api.crd``).

Checks that involve one object live here (types, ranges, enums); checks across objects live in
:mod:`bertjob_api.validation`, and defaults that depend on other fields in :mod:`bertjob_api.defaults`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from bertjob_api import kubenames
from bertjob_api.contract import API_VERSION, GROUP, KIND, MPI_RUNTIME, PLURAL, TORCH_RUNTIME, VERSION

__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION"]

LauncherName = Literal["pytorchjob", "mpijob", "trainjob"]
Accelerator = Literal["nvidia-gpu", "habana-hpu", "xeon-cpu"]
Precision = Literal["bf16", "fp16", "fp32"]
ModelPreset = Literal["bert-tiny", "bert-mini", "bert-small", "bert-medium", "bert-base", "bert-large"]

# A Kubernetes object passed through to the pods as written (a toleration, an affinity, an env
# var, a volume source): the CRD keeps it whole, and bertjob_api.passthrough checks it against
# Kubernetes' own schema of its type before anything is created.
KubernetesObject = Annotated[
    dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
]
# A resource quantity ("500m", "64Gi", 8 or 0.5) as Kubernetes takes it in a pod; a float becomes
# its decimal string, since the Kubeflow CRDs take an integer or a string only. The CRD leaves the
# type open, as int-or-string would refuse 0.5 at `kubectl apply`.
Quantity = Annotated[
    int | str,
    PlainValidator(kubenames.quantity),
    WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True}),
]
# Integers as the API server and the Kubeflow types hold them: int32 where a child's field is one
# (replicas, runPolicy, elasticPolicy), int64 everywhere else.
Int32 = Annotated[int, Field(le=kubenames.INT32_MAX, json_schema_extra={"format": "int32"})]


def _rule(check: Callable[[Any], str | None]) -> AfterValidator:
    """A validator that refuses a value ``check`` finds a problem with, saying what it is."""

    def validate(value: Any) -> Any:
        problem = check(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(validate)


# Every integer field is checked against int64's range by _Spec (a constraint here would go into
# the CRD as a maximum on every integer).
Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]
# Names of other objects: a ServiceAccount, Secret, PriorityClass, scheduler or Volcano queue.
DnsSubdomain = Annotated[
    str,
    _rule(kubenames.dns_subdomain_problem),
    Field(
        json_schema_extra={"pattern": kubenames.DNS_SUBDOMAIN_PATTERN, "maxLength": kubenames.MAX_SUBDOMAIN}
    ),
]
LabelValue = Annotated[
    str,
    _rule(kubenames.label_value_problem),
    Field(json_schema_extra={"pattern": kubenames.LABEL_VALUE_PATTERN, "maxLength": kubenames.MAX_LABEL}),
]


# A list of 100,000 wrong items is one mistake: its first problems say what it is.
MAX_PROBLEMS_SHOWN = 20


class SpecError(ValueError):
    """A job file or custom resource that does not fit the API.

    ``problems`` holds one ``(field path, message)`` pair per problem, the path in the YAML
    spelling (``spec.phases[0].maxSeqLength``) so that the user can find the line; the message
    shows the first :data:`MAX_PROBLEMS_SHOWN` of them.
    """

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"  {path}: {message}" for path, message in problems[:MAX_PROBLEMS_SHOWN]]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            lines.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more")
        super().__init__(f"{source}: invalid BertPretrainJob\n" + "\n".join(lines))


class _Spec(BaseModel):
    # strict: a YAML "2" is not the integer 2; extra="forbid": a misspelt field is an error,
    # as the API server's strict field validation makes it for `kubectl apply`; no NaN or
    # infinity, which JSON (and so the API server) cannot carry.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        frozen=True,
        allow_inf_nan=False,
    )

    @field_validator("*", mode="after")
    @classmethod
    def _values_the_api_holds(cls, value: Any) -> Any:
        """Strings (and those of a list or map of them) that a path, an argument, YAML and the API
        server can hold (:func:`bertjob_api.kubenames.string_problem`), and integers that fit in 64 bits."""
        items = [value]
        if isinstance(value, list):
            items = value
        elif isinstance(value, dict):
            items = [*value, *value.values()]
        for item in items:
            problem = kubenames.string_problem(item) if isinstance(item, str) else None
            if problem is not None:
                raise ValueError(f"{kubenames.shown(item)} {problem}")
        if isinstance(value, int) and value > kubenames.INT64_MAX:
            raise ValueError(f"must be at most {kubenames.INT64_MAX} (a 64-bit integer)")
        return value


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


class VocabSpec(_Spec):
    """The WordPiece vocabulary: trained on the corpus, or an existing file. Exactly one of the two."""

    train_size: Int64 | None = Field(
        None, ge=64, description="Train a WordPiece vocabulary of this many tokens on the corpus."
    )
    file: str | None = Field(None, min_length=1, description="An existing vocab.txt or tokenizer.json.")
    pad_to_multiple_of: Int64 | None = Field(
        None,
        ge=1,
        description="Append [unused] tokens until the size is a multiple of this (NVIDIA pads 30522 "
        "to 30528 with 8, for tensor-core-friendly embedding shapes).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> VocabSpec:
        if (self.train_size is None) == (self.file is None):
            raise ValueError("set exactly one of trainSize and file")
        return self


SourceFormat = Literal["auto", "bert", "text", "jsonl", "parquet", "wikipedia", "pubmed", "python-docs"]


class SourceSpec(_Spec):
    """One part of the corpus: a file, a directory of files, or the built-in English text."""

    path: str = Field(
        min_length=1,
        description="A file or a directory (searched recursively, in sorted order), or "
        "'builtin:python-docs': the running Python's docstrings and language reference.",
    )
    format: SourceFormat = Field(
        "auto",
        description="bert (one sentence per line, a blank line between documents), text (raw prose, "
        "one document per file), jsonl, parquet, wikipedia (XML dump, .xml or .xml.bz2), pubmed "
        "(baseline XML, .xml.gz). auto: by file name; a .txt file is bert when most lines end a "
        "sentence, text otherwise.",
    )
    field: str = Field(
        "text", min_length=1, description="The JSON Lines field or Parquet column holding text."
    )
    weight: float = Field(
        1.0,
        gt=0,
        description="Times each document of this source is used: 2 uses every document twice, 0.5 a "
        "seeded half of them.",
    )


class DataSpec(_Spec):
    """The corpus and what is made of it: vocabulary and masked-LM/NSP instances in HDF5 shards."""

    sources: list[SourceSpec] = Field(min_length=1, description="The corpus: one or more sources.")
    shards: str = Field(min_length=1, description="Directory for the vocabulary and the HDF5 shards.")
    vocab: VocabSpec = Field(
        default_factory=lambda: VocabSpec(train_size=8000), description="Default: train 8000 tokens."
    )
    lowercase: bool = Field(True, description="Lower-case and strip accents (an uncased model).")
    whole_word_mask: bool = Field(
        False, description="Mask every WordPiece of a word together (Google's do_whole_word_mask)."
    )
    dupe_factor: Int64 = Field(
        5, ge=1, description="Times each document is turned into instances, with different masks."
    )
    short_seq_prob: float = Field(
        0.1, ge=0, le=1, description="Share of instances given a shorter target length (Google's default)."
    )
    masked_lm_prob: float = Field(0.15, gt=0, lt=1, description="Share of tokens masked per instance.")
    masking: Literal["static", "dynamic"] = Field(
        "static",
        description="static: masks drawn once, stored in NVIDIA's HDF5 schema; dynamic: unmasked "
        "tokens stored, masks drawn afresh each epoch by the loader (RoBERTa).",
    )
    packing: Literal["none", "spfhp", "nnlshp"] = Field(
        "none",
        description="Pack several short sequences per row (Krell et al. 2021): spfhp (shortest-pack-"
        "first histogram packing) or nnlshp (non-negative least squares). Needs static masking. "
        "A phase's globalBatchSize then counts rows.",
    )
    max_sequences_per_pack: Int64 = Field(3, ge=2, le=16, description="Most sequences in one packed row.")
    num_shards: Int64 | None = Field(
        None, ge=1, description="Training shards per phase. Default 4, unless maxShardMB is set."
    )
    max_shard_mb: float | None = Field(
        None,
        alias="maxShardMB",
        gt=0,
        description="Instead of numShards: as many shards as it takes for each to come from at most "
        "this many MB of corpus text (a longer document makes a shard on its own).",
    )
    heldout_fraction: float = Field(
        0.0, ge=0, lt=1, description="Share of documents kept out of training, in held-out shards."
    )
    workers: Int64 | None = Field(
        None, ge=1, description="Processes that prepare the data. Default: the CPUs this process may use."
    )


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
    steps: Int64 = Field(ge=1, description="Optimizer steps in this phase.")

    @model_validator(mode="after")
    def _predictions_fit(self) -> PhaseSpec:
        if self.max_predictions_per_seq >= self.max_seq_length:
            raise ValueError("maxPredictionsPerSeq must be smaller than maxSeqLength")
        return self


class OptimizerSpec(_Spec):
    """The optimizer; LAMB as NVIDIA's FusedLAMB defines it (You et al. 2020)."""

    name: Literal["lamb", "adamw"] = Field("lamb", description="lamb or adamw.")
    weight_decay: float = Field(
        0.01, ge=0, description="Decoupled weight decay; none on biases and LayerNorm."
    )
    beta1: float = Field(0.9, ge=0, lt=1, description="First-moment decay.")
    beta2: float = Field(0.999, ge=0, lt=1, description="Second-moment decay.")
    eps: float = Field(1e-6, gt=0, description="Added to the second-moment root.")
    max_grad_norm: float = Field(1.0, gt=0, description="Global gradient-norm clipping before the update.")
    schedule: Literal["poly", "linear"] = Field(
        "poly",
        description="Learning rate after warm-up: poly (NVIDIA's PolyWarmUpScheduler, (1 - step / "
        "steps) ** polyPower) or linear (to 0 from the end of warm-up, Hugging Face's default).",
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
        None, ge=1, description="Evaluate every this many optimizer steps. Always at the end of a phase."
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


class ResourcesSpec(_Spec):
    """Compute resources of each training pod (a container's ``resources``)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="e.g. {cpu: 16, memory: 64Gi}; a quantity is a number or a string."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="e.g. {memory: 128Gi}. The accelerator's device (nvidia.com/gpu, habana.ai/gaudi) "
        "is added, one per process, unless set here.",
    )

    @field_validator("requests", "limits")
    @classmethod
    def _resource_names(cls, value: dict[str, int | str]) -> dict[str, int | str]:
        for name, amount in value.items():
            problem = kubenames.resource_name_problem(name)
            if problem is None and "/" in name and not _whole(amount):
                # The API server's rule for extended resources (devices): whole units only.
                problem = f"{name} is a device, counted in whole units, not {kubenames.shown(amount)}"
            if problem is not None:
                raise ValueError(problem)
        return value


def _whole(amount: int | str) -> bool:
    value, _ = kubenames.parse_quantity(amount)
    return value is not None and value == value.to_integral_value()


class PodSpec(_Spec):
    """What the cluster needs to know about the training pods; passed through to every replica."""

    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Requests and limits.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="Default: Kubernetes' own (Always for :latest, else IfNotPresent)."
    )
    image_pull_secrets: list[DnsSubdomain] = Field(
        default_factory=list, description="Names of Secrets for pulling the image."
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, description="The pods' nodeSelector: label keys and values."
    )
    tolerations: list[KubernetesObject] = Field(
        default_factory=list, description="Kubernetes tolerations, as written in a pod spec."
    )
    affinity: KubernetesObject | None = Field(
        None, description="A Kubernetes affinity, as written in a pod spec."
    )
    env: list[KubernetesObject] = Field(
        default_factory=list, description="Extra environment variables (Kubernetes EnvVar objects)."
    )
    service_account_name: DnsSubdomain | None = Field(
        None,
        min_length=1,
        description="The pods' service account. Default: one made for the job, allowed only to "
        "report progress to this job's status.",
    )
    priority_class_name: DnsSubdomain | None = Field(
        None, min_length=1, description="The pods' PriorityClass."
    )
    scheduler_name: DnsSubdomain | None = Field(
        None, min_length=1, description="e.g. volcano, or scheduler-plugins' scheduler for gang scheduling."
    )
    security_context: KubernetesObject | None = Field(
        None,
        description="The pod securityContext. Default: runAsNonRoot with the RuntimeDefault seccomp "
        "profile; set fsGroup here when a volume must be writable by the trainer's user.",
    )


class VolumeSpec(_Spec):
    """A volume mounted into every training pod, e.g. a PersistentVolumeClaim for shards and checkpoints."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Volume name; 'data' replaces the default emptyDir at /data.",
    )
    mount_path: str = Field(pattern=r"^/", description="Absolute path in the container.")
    read_only: bool = Field(False, description="Mount read-only (e.g. a shared corpus).")
    source: KubernetesObject = Field(
        default_factory=lambda: {"emptyDir": {}},
        description="A Kubernetes volume source, e.g. {persistentVolumeClaim: {claimName: bert-data}}. "
        "Default: an emptyDir.",
    )


class SchedulingPolicySpec(_Spec):
    """Gang scheduling (Volcano or scheduler-plugins), the training operator's schedulingPolicy."""

    min_available: Int32 | None = Field(None, ge=1, description="Pods that must be schedulable together.")
    queue: DnsSubdomain | None = Field(None, min_length=1, description="Volcano queue.")
    priority_class: DnsSubdomain | None = Field(
        None, min_length=1, description="PriorityClass of the pod group."
    )
    schedule_timeout_seconds: Int32 | None = Field(
        None, ge=1, description="Seconds the pod group may wait to be scheduled."
    )


class RunPolicySpec(_Spec):
    """The child job's runPolicy (Kubeflow's common RunPolicy)."""

    clean_pod_policy: Literal["None", "Running", "All"] | None = Field(
        None, description="Pods deleted when the job ends. Default: the training operator's (None)."
    )
    ttl_seconds_after_finished: Int32 | None = Field(
        None, ge=0, description="Delete the child job this long after it ends."
    )
    # int64 in Kubeflow's RunPolicy, but kustomize carries integers exactly only up to 2^53.
    active_deadline_seconds: Int64 | None = Field(
        None, ge=1, le=kubenames.JSON_SAFE_INTEGER, description="Fail the job after running this long."
    )
    backoff_limit: Int32 | None = Field(None, ge=0, description="Retries before the job is marked failed.")
    suspend: bool = Field(
        False,
        description="Suspend the job: its pods are deleted; setting it back to false resumes from "
        "the last checkpoint.",
    )
    scheduling_policy: SchedulingPolicySpec | None = Field(None, description="Gang scheduling.")


class MpiSpec(_Spec):
    """How the mpijob launcher starts the ranks."""

    command: Literal["mpirun", "horovodrun"] = Field(
        "mpirun",
        description="mpirun (OpenMPI) or horovodrun, over mpi-operator's /etc/mpi/hostfile; elastic "
        "jobs need horovodrun, which finds the Workers with /etc/mpi/discover_hosts.sh.",
    )
    ssh_auth_mount_path: str = Field(
        "/home/mpiuser/.ssh", pattern=r"^/", description="Where mpi-operator mounts the SSH keys."
    )


MlPolicy = Literal["torch", "mpi"]
# The ClusterTrainingRuntime the chart installs for each ML policy (charts/bertjob).
DEFAULT_RUNTIMES: dict[str, str] = {"torch": TORCH_RUNTIME, "mpi": MPI_RUNTIME}


class RuntimeRefSpec(_Spec):
    """A Kubeflow Trainer v2 runtime that a platform team installed, instead of the chart's."""

    name: DnsSubdomain = Field(description="The runtime's name.")
    kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = Field(
        "ClusterTrainingRuntime",
        description="ClusterTrainingRuntime, or TrainingRuntime (in the job's own namespace).",
    )


class TrainJobSpec(_Spec):
    """How the trainjob launcher runs the job on Kubeflow Trainer v2 (a TrainJob and its runtime)."""

    ml_policy: MlPolicy = Field(
        "torch",
        description="The runtime's ML policy: torch (torchrun, DDP or DeepSpeed; Trainer v2 sets the "
        "PET_* variables) or mpi (mpirun over Trainer v2's hostfile, Horovod or DeepSpeed).",
    )
    runtime_ref: RuntimeRefSpec | None = Field(
        None,
        description="A runtime of that ML policy to run on. Default: the chart's ClusterTrainingRuntime "
        f"{TORCH_RUNTIME} or {MPI_RUNTIME}.",
    )

    @property
    def runtime(self) -> RuntimeRefSpec:
        """``runtimeRef``, else the chart's ClusterTrainingRuntime for ``mlPolicy``."""
        return self.runtime_ref or RuntimeRefSpec(name=DEFAULT_RUNTIMES[self.ml_policy])


class DeepSpeedSpec(_Spec):
    """DeepSpeed as the data-parallel engine, under either launcher (torchrun or mpirun)."""

    zero_stage: int = Field(
        1,
        ge=0,
        le=3,
        json_schema_extra={"format": "int32"},
        description="ZeRO stage: 1 shards the optimizer states over the ranks, 2 the gradients too, 3 "
        "the parameters too. 0 (no sharding, what DDP does) is refused: leave deepspeed unset.",
    )
    config: KubernetesObject = Field(
        default_factory=dict,
        description="More DeepSpeed config keys (e.g. zero_optimization.overlap_comm, "
        "communication_data_type), merged into the one the job makes; a key the job sets itself "
        "(batch sizes, precision, optimizer, clipping, ZeRO stage) is refused where it disagrees.",
    )


class DistributedSpec(_Spec):
    """How the ranks exchange gradients: DDP under pytorchjob, Horovod under mpijob.

    The trainer detects its world itself (torchrun's variables, Open MPI's or Horovod's), so
    these settings only tune the communication.
    """

    gradient_compression: Literal["none", "fp16", "bf16"] = Field(
        "none",
        description="Compress gradients to this dtype for the all-reduce: a DDP communication hook "
        "under pytorchjob, hvd.Compression.fp16 under mpijob. Horovod has no bf16 compression, so "
        "launcher mpijob refuses bf16.",
    )
    timeout_seconds: Int32 = Field(
        600,
        ge=10,
        description="How long a collective waits for a missing rank before the job fails (the "
        "process-group timeout).",
    )
    deepspeed: DeepSpeedSpec | None = Field(
        None,
        description="Train with DeepSpeed (ZeRO) instead of DDP or Horovod. Default: DDP under "
        "pytorchjob, Horovod under mpijob.",
    )


class ElasticSpec(_Spec):
    """Elastic training: the job starts on topology.nodes nodes and goes on between minNodes and
    maxNodes when nodes leave or join (torchrun's c10d rendezvous under pytorchjob, elastic
    Horovod under mpijob with mpi.command horovodrun)."""

    min_nodes: Int32 = Field(ge=1, description="Fewest nodes the job keeps training on.")
    max_nodes: Int32 = Field(ge=1, description="Most nodes the job trains on.")
    max_restarts: Int32 = Field(
        3,
        ge=0,
        description="Restarts of the worker group before the job fails: torchrun's --max-restarts "
        "under pytorchjob (failures; nodes joining do not count), horovodrun's --reset-limit under "
        "mpijob (every reset, failures and node changes alike).",
    )

    @model_validator(mode="after")
    def _range(self) -> ElasticSpec:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"minNodes {self.min_nodes} is greater than maxNodes {self.max_nodes}")
        return self


class PrepareSpec(_Spec):
    """The optional data-preparation Job that runs before training."""

    enabled: bool = Field(
        False,
        description="Run `python -m bertpretrain prepare` as a batch/v1 Job first; training starts when "
        "it succeeds. Otherwise rank 0 of the training job prepares the data itself.",
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="Requests and limits of the preparation pod."
    )


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


class JobSpec(_Spec):
    """``spec`` of a BertPretrainJob."""

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
    phases: list[PhaseSpec] = Field(
        min_length=1, max_length=2, description="Phase 1, then optionally phase 2."
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


def load_job(path: str | Path) -> BertPretrainJob:
    """Read a job file as kubectl would, and validate it: :func:`bertjob_api.jobfile.load_job`.

    Raises:
        SpecError: the file cannot be read, is refused as YAML, or does not fit the API.
    """
    # Imported here: bertjob_api.jobfile imports this module.
    from bertjob_api import jobfile

    return jobfile.load_job(path)


def to_document(job: BertPretrainJob) -> dict[str, Any]:
    """The job as the dict a YAML file or the API server holds (camelCase, defaults included)."""
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)
