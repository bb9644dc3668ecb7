"""What the cluster runs: the pods, their volumes, the run policy and the launchers' own settings.

The pod settings are passed through to every replica; the run policy is Kubeflow's; MPI, Kubeflow
Trainer v2, DeepSpeed, elastic training and the data-preparation Job are the launchers' settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from bertjob_api import kubenames
from bertjob_api.contract import GROUP, MPI_RUNTIME, TORCH_RUNTIME
from bertjob_api.spec.base import DnsSubdomain, Int32, Int64, KubernetesObject, LabelValue, Quantity, _Spec
from bertjob_api.spec.cel import Rule, quote, validations


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


class PrepareResourcesSpec(ResourcesSpec):
    """Compute resources of the data-preparation pod, which gets no accelerator device."""

    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="e.g. {memory: 64Gi}. Unlike the training pods', no accelerator device is added: "
        "the data stage runs on CPUs.",
    )


def _whole(amount: int | str) -> bool:
    value, _ = kubenames.parse_quantity(amount)
    return value is not None and value == value.to_integral_value()


# Pod label keys that spec.pod.labels may not set: those the operator sets on every pod and selects
# them by (bertjob.render.job_labels: bertjob.dev/job, app.kubernetes.io/name and component; the
# whole bertjob.dev/ domain is kept for the operator), and those of the controllers that make the
# pods from our templates, which select their pods by them or read them back: training-operator and
# mpi-operator (training.kubeflow.org/), Trainer v2 (trainer.kubeflow.org/), JobSet
# (jobset.sigs.k8s.io/), the Job controller (batch.kubernetes.io/, and its older job-name and
# controller-uid; the MPIJob launcher, JobSet's replicas and the data Job are Jobs) and Kueue
# (kueue.x-k8s.io/: spec.queueName sets its queue label where Kueue reads it, on the job). Annotations
# have no reserved keys: the operator sets none on pods, and some of those controllers' own are
# meant to be written by users (Kueue's topology requests on a pod template).
RESERVED_POD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/component", "job-name", "controller-uid")
RESERVED_POD_LABEL_PREFIXES = (
    f"{GROUP}/",
    "training.kubeflow.org/",
    "trainer.kubeflow.org/",
    "jobset.sigs.k8s.io/",
    "batch.kubernetes.io/",
    "kueue.x-k8s.io/",
)
# The most labels spec.pod.labels holds: the schema's maxProperties, which bounds the cost of the
# CRD's rule that reads every key (bertjob_api.spec.cel).
MAX_POD_LABELS = 64
POD_LABELS_RESERVED = (
    "the keys of the operator (bertjob.dev/*, app.kubernetes.io/name, app.kubernetes.io/component) and "
    "of the controllers that run the pods (training.kubeflow.org/*, trainer.kubeflow.org/*, "
    "jobset.sigs.k8s.io/*, batch.kubernetes.io/*, job-name, controller-uid, kueue.x-k8s.io/*: set "
    "spec.queueName for Kueue) are reserved"
)


def reserved_pod_label(key: str) -> bool:
    """Whether ``key`` is a label key of :data:`RESERVED_POD_LABELS` or under one of
    :data:`RESERVED_POD_LABEL_PREFIXES`."""
    return key in RESERVED_POD_LABELS or key.startswith(RESERVED_POD_LABEL_PREFIXES)


def _reserved_label_rule() -> Rule:
    """:func:`reserved_pod_label` for the API server: core CEL's ``==`` and ``startsWith`` on each
    key of the map (at most :data:`MAX_POD_LABELS` of them)."""
    tests = [f"k == {quote(key)}" for key in RESERVED_POD_LABELS]
    tests += [f"k.startsWith({quote(prefix)})" for prefix in RESERVED_POD_LABEL_PREFIXES]
    return Rule(
        f"!has(self.labels) || self.labels.all(k, !({' || '.join(tests)}))",
        f"spec.pod.labels: holds a reserved key: {POD_LABELS_RESERVED}",
        field_path=".labels",
    )


class PodSpec(_Spec):
    """What the cluster needs to know about the training pods; passed through to every replica."""

    # _pod_labels' reserved keys, for the API server (bertjob_api.spec.cel).
    model_config = ConfigDict(json_schema_extra=validations(_reserved_label_rule()))

    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_POD_LABELS,
        description="Labels added to every pod of the job (each launcher's replicas, and the "
        "data-preparation Job's), e.g. for a NetworkPolicy, a cost report or a sidecar injector. "
        "Keys of the operator and of the controllers that run the pods are refused (docs/operator.md).",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations added to every pod of the job, e.g. {sidecar.istio.io/inject: "
        '"false"} in a namespace where Istio injects sidecars (docs/operator.md, Kubeflow).',
    )
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
        description="The pods' service account. Default: the namespace's default account. The "
        "trainer needs no RBAC: it reports progress to the operator with a projected token.",
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

    @field_validator("labels")
    @classmethod
    def _pod_labels(cls, value: dict[str, str]) -> dict[str, str]:
        """Label keys as the API server takes them, none of them reserved (:func:`reserved_pod_label`).

        Raises:
            ValueError: naming each wrong key and what is wrong with it.
        """
        found = []
        for key in value:
            problem = kubenames.qualified_name_problem(key)
            if problem is None and reserved_pod_label(key):
                problem = f"{kubenames.shown(key)} is a reserved key: {POD_LABELS_RESERVED}"
            if problem is not None:
                found.append(problem)
        if found:
            raise ValueError("; ".join(found))
        return value

    @field_validator("annotations")
    @classmethod
    def _pod_annotations(cls, value: dict[str, str]) -> dict[str, str]:
        """Annotation keys as the API server takes them, and all of them within its size limit.

        Raises:
            ValueError: naming each wrong key, or the size.
        """
        found = [
            problem
            for key in value
            if (problem := kubenames.qualified_name_problem(key, "annotation key")) is not None
        ]
        if not found and (problem := kubenames.annotations_size_problem(value)) is not None:
            found.append(problem)
        if found:
            raise ValueError("; ".join(found))
        return value


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

    # _range, for the API server (bertjob_api.spec.cel).
    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "self.minNodes <= self.maxNodes",
                "spec.elastic: minNodes must not be greater than maxNodes",
            )
        )
    )

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
    resources: PrepareResourcesSpec = Field(
        default_factory=PrepareResourcesSpec, description="Requests and limits of the preparation pod."
    )
