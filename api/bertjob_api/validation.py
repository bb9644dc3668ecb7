"""Checks across fields of a schema-valid spec (what the CRD schema cannot express).

Modelled on the training operator's ``pytorch_validation.go``/``mpi_validation.go``: each check
names the field at fault in its YAML spelling, so a user or a status condition can point at it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any, Literal

from bertjob_api import deepspeed, kubenames, passthrough
from bertjob_api.contract import JOB_FILE, RESERVED_VOLUMES, TRAINJOB_LAUNCHER, TRAINJOB_NODE
from bertjob_api.defaults import (
    ModelDims,
    batch_split_problem,
    budget_shares,
    masking_cap_problem,
    micro_batch_size,
    resolve_model,
    task_world_size,
    volumes,
    with_defaults,
)
from bertjob_api.files import format_size
from bertjob_api.jobfile import MAX_BYTES, dump
from bertjob_api.spec import BertPretrainJob, JobSpec, MpiSpec, PhaseSpec, SpecError, to_document
from bertjob_api.spec.cel import (
    BUDGET_AND_STEPS,
    BUDGET_NO_STEPS,
    BUDGET_SHARE_ALONE,
    BUDGET_SHARES,
    MLM_NVIDIA_EXPORT,
    RAMP_ENGINE,
    RAMP_LR_SCALING,
    RAMP_NO_ACCUMULATION,
)
from bertjob_api.spec.data import FINAL_MASKING_PROBLEM

# Volumes the base pod template mounts itself (kustomize/base): a job volume may not take their names.
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def problems(spec: JobSpec, training: bool = True) -> list[tuple[str, str]]:
    """Every cross-field problem of ``spec`` (run on the output of ``with_defaults``), as
    ``(field path, message)`` pairs; empty when the spec is consistent. ``training=False``
    checks the spec for the data stage alone (``python -m bertpretrain prepare``)."""
    found: list[tuple[str, str]] = []
    world_size = spec.topology.world_size
    dims = resolve_model(spec.model)

    if dims.hidden_size % dims.num_attention_heads:
        found.append(
            (
                "spec.model.numAttentionHeads",
                f"hidden size {dims.hidden_size} is not divisible by {dims.num_attention_heads} heads",
            )
        )

    data = spec.data
    if data.num_shards is not None and data.max_shard_mb is not None:
        found.append(("spec.data.maxShardMB", "set numShards or maxShardMB, not both"))
    if data.packing != "none" and data.masking == "dynamic":
        found.append(
            ("spec.data.packing", "packing needs static masking: packs are made of masked instances")
        )
    final = data.final_masked_lm_prob
    if final is not None and (
        data.masking != "dynamic" or data.whole_word_mask or final > data.masked_lm_prob
    ):
        found.append(("spec.data.finalMaskedLmProb", FINAL_MASKING_PROBLEM.split(": ", 1)[1]))
    if spec.model.init_from is not None and data.vocab.file is None:
        found.append(
            (
                "spec.data.vocab.file",
                "model.initFrom continues an existing model, which needs its own vocabulary: "
                "set file to its vocab.txt",
            )
        )
    if spec.objective == "mlm" and spec.export.nvidia:
        found.append(("spec.export.nvidia", MLM_NVIDIA_EXPORT))
    if training and spec.evaluation.every_steps is not None and data.heldout_fraction == 0:
        found.append(
            (
                "spec.evaluation.everySteps",
                "evaluation needs held-out shards: set spec.data.heldoutFraction above 0",
            )
        )

    found += _budget_problems(spec)
    for index, phase in enumerate(spec.phases):
        where = f"spec.phases[{index}]"
        problem = batch_split_problem(phase, world_size)
        if problem is not None:
            found.append((f"{where}.globalBatchSize", problem))
        capped = masking_cap_problem(phase.max_seq_length, phase.max_predictions_per_seq, data.masked_lm_prob)
        if capped is not None:
            found.append((f"{where}.maxPredictionsPerSeq", capped))
        found += [(f"{where}.{field}", message) for field, message in _ramp_problems(spec, phase, world_size)]
        if phase.max_seq_length > dims.max_position_embeddings:
            found.append(
                (
                    f"{where}.maxSeqLength",
                    f"{phase.max_seq_length} exceeds the model's maxPositionEmbeddings "
                    f"{dims.max_position_embeddings}",
                )
            )
    if len(spec.phases) == 2 and spec.phases[1].max_seq_length < spec.phases[0].max_seq_length:
        found.append(("spec.phases[1].maxSeqLength", "phase 2 must not use shorter sequences than phase 1"))
    return found + _distributed_problems(spec) + _finetune_problems(spec, dims)


def _budget_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """Steps and budget together or neither, a budget share without a budget, shares that do not
    add up to 1."""
    found = []
    for index, phase in enumerate(spec.phases):
        where = f"spec.phases[{index}]"
        if spec.budget is None and phase.steps is None:
            found.append((f"{where}.steps", BUDGET_NO_STEPS))
        if spec.budget is not None and phase.steps is not None:
            found.append((f"{where}.steps", BUDGET_AND_STEPS))
        if spec.budget is None and phase.budget_proportion is not None:
            found.append((f"{where}.budgetProportion", BUDGET_SHARE_ALONE))
    if spec.budget is not None and budget_shares(spec.phases) is None:
        found.append(("spec.budget", BUDGET_SHARES))
    return found


def _ramp_problems(spec: JobSpec, phase: PhaseSpec, world_size: int) -> list[tuple[str, str]]:
    """What a phase's batch ramp cannot run with, as (field under the phase, message) pairs: an
    engine that fixes the accumulation for the phase (Horovod under mpirun, DeepSpeed), lrScaling,
    and a phase without gradient accumulation."""
    if phase.batch_ramp_proportion is None:
        return []
    found = []
    mpi = spec.launcher == "mpijob" or (spec.launcher == "trainjob" and spec.train_job.ml_policy == "mpi")
    for refused, message in (
        (mpi or spec.distributed.deepspeed is not None, RAMP_ENGINE),
        (spec.optimizer.lr_scaling != "none", RAMP_LR_SCALING),
        (
            phase.global_batch_size < 2 * world_size * micro_batch_size(phase, world_size),
            RAMP_NO_ACCUMULATION,
        ),
    ):
        if refused:
            field, _, text = message.partition(": ")
            found.append((field, text))
    return found


# [CLS] question [SEP] context [SEP]
_SQUAD_SPECIAL_TOKENS = 3


def _finetune_problems(spec: JobSpec, dims: ModelDims) -> list[tuple[str, str]]:
    """What a fine-tuning task cannot run with: a name used twice, a batch that does not split
    over its processes, sequences longer than the model's, SQuAD windows with no room for the
    context or with gaps between them."""
    found: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for index, task in enumerate(spec.finetune):
        where = f"spec.finetune[{index}]"
        if task.name in seen:
            found.append((f"{where}.name", f"{task.name} is also spec.finetune[{seen[task.name]}]"))
        seen.setdefault(task.name, index)
        problem = batch_split_problem(task, task_world_size(task, spec.topology.world_size))
        if problem is not None:
            found.append((f"{where}.globalBatchSize", problem))
        length = task.max_seq_length or 0  # with_defaults sets it
        if length > dims.max_position_embeddings:
            found.append(
                (
                    f"{where}.maxSeqLength",
                    f"{length} exceeds the model's maxPositionEmbeddings {dims.max_position_embeddings}",
                )
            )
        if task.type != "squad":
            continue
        window = length - task.max_query_length - _SQUAD_SPECIAL_TOKENS
        if window < 1:
            found.append(
                (
                    f"{where}.maxQueryLength",
                    f"{task.max_query_length} leaves no room for the context in maxSeqLength {length} "
                    f"({_SQUAD_SPECIAL_TOKENS} tokens go to [CLS] and [SEP])",
                )
            )
        elif task.doc_stride > window:
            found.append(
                (
                    f"{where}.docStride",
                    f"{task.doc_stride} is longer than a window's {window} context tokens (maxSeqLength "
                    f"- maxQueryLength - {_SQUAD_SPECIAL_TOKENS}): windows would skip text",
                )
            )
    return found


def _deepspeed_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """What DeepSpeed cannot run with: ZeRO stage 0 (plain data parallelism, which DDP is), the
    other engines' gradient compression (DeepSpeed has
    its own, ``communication_data_type``), elastic worlds (a ZeRO checkpoint is sharded for one
    world size), horovodrun (DeepSpeed joins over torch.distributed, not Horovod), and user config
    keys that contradict the job (:func:`bertjob_api.deepspeed.conflicts`)."""
    if spec.distributed.deepspeed is None:
        return []
    found: list[tuple[str, str]] = []
    if spec.distributed.deepspeed.zero_stage not in deepspeed.TRAINED_STAGES:  # 0; the schema bounds it
        stages = ", ".join(map(str, deepspeed.TRAINED_STAGES))
        found.append(
            (
                "spec.distributed.deepspeed.zeroStage",
                "0 is DeepSpeed without ZeRO, the plain data parallelism DDP and Horovod already give; "
                f"leave spec.distributed.deepspeed out, or set zeroStage {stages}",
            )
        )
    if spec.accelerator == "xeon-cpu" and spec.precision == "fp16":
        # DeepSpeed's CPU accelerator refuses fp16 ("Type fp16 is not supported on your device").
        found.append(
            ("spec.precision", "fp16 under DeepSpeed needs a GPU or HPU; on xeon-cpu use bf16 or fp32")
        )
    if spec.distributed.gradient_compression != "none":
        found.append(
            (
                "spec.distributed.gradientCompression",
                "is for DDP and Horovod; with DeepSpeed set communication_data_type in "
                "spec.distributed.deepspeed.config instead",
            )
        )
    if spec.elastic is not None:
        found.append(
            (
                "spec.elastic",
                "DeepSpeed's ZeRO checkpoints are sharded for one world size; elastic training runs "
                "with DDP or Horovod only",
            )
        )
    if spec.launcher == "mpijob" and spec.mpi.command == "horovodrun":
        found.append(
            (
                "spec.mpi.command",
                "DeepSpeed runs under mpirun (it joins through torch.distributed), not horovodrun",
            )
        )
    found += deepspeed.conflicts(spec)
    return found


def _distributed_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """What the launcher cannot run: an accelerator or a compression Horovod lacks (under mpirun:
    launcher mpijob, or trainjob's MPI policy), an elastic range that leaves out the starting node
    count, elastic MPI without horovodrun or on one node, and what a TrainJob cannot carry
    (:func:`trainjob_problems`)."""
    found: list[tuple[str, str]] = []
    mpi = spec.launcher == "mpijob" or (spec.launcher == "trainjob" and spec.train_job.ml_policy == "mpi")
    if mpi and spec.accelerator == "habana-hpu":
        # The Gaudi image has no Horovod: upstream Horovod has no HPU tensors. DeepSpeed under
        # mpirun would join through torch.distributed, but it has never run on a Gaudi: refused too.
        where = (
            "launcher mpijob" if spec.launcher == "mpijob" else "launcher trainjob with trainJob.mlPolicy mpi"
        )
        found.append(
            (
                "spec.launcher",
                f"{where} cannot run accelerator habana-hpu: its ranks use Horovod, which the Gaudi image "
                "lacks (no HPU support upstream); use launcher pytorchjob, or trainjob with mlPolicy torch",
            )
        )
    if mpi and spec.distributed.gradient_compression == "bf16":
        where = "launcher mpijob" if spec.launcher == "mpijob" else "Trainer v2's MPI policy"
        found.append(
            (
                "spec.distributed.gradientCompression",
                f"bf16 is not available under {where}: Horovod compresses to fp16 only "
                "(use fp16 or none, or torchrun: launcher pytorchjob, or trainJob.mlPolicy torch)",
            )
        )
    found += _deepspeed_problems(spec)
    if spec.launcher == "trainjob":
        found += trainjob_problems(spec)
    elastic = spec.elastic
    if elastic is None:
        return found
    nodes = spec.topology.nodes
    if nodes < elastic.min_nodes:
        found.append(
            ("spec.elastic.minNodes", f"{elastic.min_nodes} is more than the {nodes} nodes of spec.topology")
        )
    if nodes > elastic.max_nodes:
        found.append(
            ("spec.elastic.maxNodes", f"{elastic.max_nodes} is fewer than the {nodes} nodes of spec.topology")
        )
    if spec.launcher == "mpijob" and spec.mpi.command != "horovodrun":
        found.append(
            (
                "spec.mpi.command",
                f"elastic training under launcher mpijob needs horovodrun (elastic Horovod), not "
                f"{spec.mpi.command}",
            )
        )
    if spec.launcher == "mpijob" and nodes < 2:
        # horovodrun finds the network interface its hosts share by comparing two of them.
        found.append(
            (
                "spec.topology.nodes",
                "elastic Horovod starts on at least 2 nodes (it compares two hosts' network interfaces); "
                "set nodes to 2 or more, or use launcher pytorchjob",
            )
        )
    return found


# What a PyTorchJob or an MPIJob holds per job and a TrainJob cannot (kubeflow/trainer
# pkg/apis/trainer/v1alpha1/trainjob_types.go: no runPolicy but suspend and activeDeadlineSeconds, and
# runtimePatches that carry no such pod field), with where Trainer v2 keeps it instead.
_NOT_IN_A_TRAINJOB = {
    "spec.runPolicy.cleanPodPolicy": (
        ("run_policy", "clean_pod_policy"),
        "a TrainJob has none (the runtime's JobSet decides what becomes of the pods)",
    ),
    "spec.runPolicy.ttlSecondsAfterFinished": (
        ("run_policy", "ttl_seconds_after_finished"),
        "a TrainJob has none (set ttlSecondsAfterFinished in the runtime's JobSet template)",
    ),
    "spec.runPolicy.backoffLimit": (
        ("run_policy", "backoff_limit"),
        "a TrainJob has none (restarts are the runtime's JobSet failurePolicy.maxRestarts)",
    ),
    "spec.runPolicy.schedulingPolicy": (
        ("run_policy", "scheduling_policy"),
        "a TrainJob has none (gang scheduling is the runtime's podGroupPolicy)",
    ),
    "spec.pod.priorityClassName": (
        ("pod", "priority_class_name"),
        "a TrainJob's runtimePatches cannot set it (set it in the runtime's pod template)",
    ),
    "spec.pod.schedulerName": (
        ("pod", "scheduler_name"),
        "a TrainJob's runtimePatches cannot set it (set it in the runtime's pod template)",
    ),
    "spec.pod.imagePullPolicy": (
        ("pod", "image_pull_policy"),
        "a TrainJob's runtimePatches cannot set it (set it in the runtime's pod template)",
    ),
}
# Trainer v2's torch plugin sets these itself and its webhook refuses a TrainJob that sets them
# (kubeflow/trainer pkg/constants: TorchRunReservedEnvNames).
TORCHRUN_RESERVED_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
# Open MPI's separator in OMPI_MCA_mca_base_env_list, which forwards the variables to the ranks.
MPI_ENV_LIST_SEPARATOR = ";"


# The longest ``spec.trainer.image`` Kubeflow Trainer v2.3's TrainJob CRD takes (its maxLength):
# other launchers pass the image to a pod template, which has no such bound.
TRAINJOB_IMAGE_MAX = 500


def trainjob_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """What launcher trainjob (Kubeflow Trainer v2) cannot run: elastic training (Trainer v2 has no
    elastic policy), horovodrun, fields that live in the Trainer v2 runtime rather than in a
    TrainJob, environment variables that Trainer v2 or Open MPI's forwarding reserve, and an image
    longer than a TrainJob holds (:data:`TRAINJOB_IMAGE_MAX` characters)."""
    found: list[tuple[str, str]] = []
    if len(spec.image) > TRAINJOB_IMAGE_MAX:
        found.append(
            (
                "spec.image",
                f"{len(spec.image):,} characters; a TrainJob's trainer.image holds at most "
                f"{TRAINJOB_IMAGE_MAX} (Kubeflow Trainer's CRD)",
            )
        )
    if spec.elastic is not None:
        found.append(("spec.elastic", "Kubeflow Trainer v2 has no elastic training; use launcher pytorchjob"))
    policy = spec.train_job.ml_policy
    if policy == "mpi" and spec.mpi.command != "mpirun":
        found.append(("spec.mpi.command", "Trainer v2's MPI runtime starts the ranks with mpirun"))
    if policy == "mpi" and spec.mpi.ssh_auth_mount_path != MpiSpec().ssh_auth_mount_path:
        found.append(
            ("spec.mpi.sshAuthMountPath", "under launcher trainjob the runtime's mlPolicy.mpi sets it")
        )
    for field, ((part, name), where) in _NOT_IN_A_TRAINJOB.items():
        if getattr(getattr(spec, part), name) is not None:
            found.append((field, where))
    for index, env in enumerate(spec.pod.env):
        name = str(env.get("name", ""))
        if policy == "torch" and name in TORCHRUN_RESERVED_ENV:
            found.append((f"spec.pod.env[{index}].name", f"{name} is set by Trainer v2's torch plugin"))
        if policy == "mpi" and MPI_ENV_LIST_SEPARATOR in name:
            found.append(
                (
                    f"spec.pod.env[{index}].name",
                    f"{kubenames.shown(name)} holds {MPI_ENV_LIST_SEPARATOR!r}, which separates the "
                    "variables Open MPI forwards to the ranks",
                )
            )
    return found


# Kueue's TrainJob integration is built against one Kubeflow Trainer API (its go.mod): Kueue v0.17.0,
# which the tests run (hack/versions.env), and v0.18 and v0.19 against Trainer v2.2, and Kueue names
# Trainer v2.3 (the TrainJob that launcher trainjob renders and the tests run) from v0.20.0 on, saying
# that v2.2 and v2.3 are not API-compatible. No Kueue the tests can build (the Go module proxy's,
# v0.19.2 at most) queues a Trainer v2.3 TrainJob, so that pair is untested (docs/launchers.md).
KUEUE_TRAINJOB_UNTESTED = (
    "Kueue queues the Trainer v2.3 TrainJob that launcher trainjob creates from Kueue v0.20 on; Kueue "
    "v0.17 to v0.19 are built against Trainer v2.2, and no Kueue has queued a TrainJob in this "
    "project's tests: check the cluster's Kueue, or queue with launcher pytorchjob, which Kueue v0.17.0 "
    "queues in the tests (docs/launchers.md)"
)


def warnings(spec: JobSpec) -> list[tuple[str, str]]:
    """What ``spec`` may meet on a cluster without being wrong, as ``(field path, message)`` pairs,
    [] for none: ``spec.queueName`` under launcher trainjob (:data:`KUEUE_TRAINJOB_UNTESTED`). Not
    refused: whether it runs depends on the cluster's Kueue, which no check of a job can see."""
    if spec.launcher == "trainjob" and spec.queue_name is not None:
        return [("spec.queueName", KUEUE_TRAINJOB_UNTESTED)]
    return []


def cluster_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """What only matters when the job runs as pods (not for ``bertjob run`` on this machine):
    volume names and mount paths, and every path the job writes lying on a writable volume, so
    that shards and checkpoints outlive the container and are visible to every rank."""
    found: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for index, volume in enumerate(spec.volumes):
        where = f"spec.volumes[{index}]"
        found += _volume_source_problems(volume.source, volume.name, f"{where}.source")
        if volume.name in RESERVED_VOLUMES:
            found.append(
                (f"{where}.name", f"{volume.name} is the operator's own volume; choose another name")
            )
        if volume.name in seen:
            found.append((f"{where}.name", f"{volume.name} is also spec.volumes[{seen[volume.name]}]"))
        seen.setdefault(volume.name, index)
        if PurePosixPath(volume.mount_path) in {PurePosixPath(path) for path in RESERVED_VOLUMES.values()}:
            found.append(
                (f"{where}.mountPath", f"{volume.mount_path} is where the operator mounts its own volume")
            )
    writable = [PurePosixPath(volume.mount_path) for volume in volumes(spec) if not volume.read_only]
    outputs = {
        "spec.data.shards": spec.data.shards,
        "spec.checkpoint.path": spec.checkpoint.path,
        "spec.export.path": spec.export.path,
        "spec.logging.path": spec.logging.path,
    }
    for field, path in outputs.items():
        if path is None:
            continue
        if not path.startswith("/"):
            found.append((field, f"{kubenames.printable(path)} must be an absolute path in the container"))
        elif not any(PurePosixPath(path).is_relative_to(mount) for mount in writable):
            mounts = ", ".join(kubenames.printable(str(mount), 60) for mount in writable) or "none"
            found.append(
                (
                    field,
                    f"{kubenames.printable(path)} is on no writable volume (mounted: {mounts}); add one to "
                    "spec.volumes",
                )
            )
    for index, task in enumerate(spec.finetune):
        for name in ("train", "validation", "init_from"):
            path = getattr(task, name)
            if path is not None and not path.startswith("/"):
                field = f"spec.finetune[{index}].{'initFrom' if name == 'init_from' else name}"
                problem = f"{kubenames.printable(path)} must be an absolute path in the container"
                found.append((field, problem))
    return found + pod_problems(spec)


def pod_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """What the API server would refuse in the objects ``spec.pod`` passes through to the pods as
    written (affinity, tolerations, env, securityContext: :mod:`bertjob_api.passthrough`), with its
    own checks the schema lacks: environment variable names, tolerations' operators and effects,
    and nodeSelector's label keys."""
    pod = spec.pod
    found: list[tuple[str, str]] = []
    for key in pod.node_selector:
        problem = kubenames.qualified_name_problem(key)
        if problem is not None:
            found.append(("spec.pod.nodeSelector", problem))
    if pod.affinity is not None:
        found += passthrough.problems(pod.affinity, "Affinity", "spec.pod.affinity")
    if pod.security_context is not None:
        found += passthrough.problems(pod.security_context, "PodSecurityContext", "spec.pod.securityContext")
    for index, env in enumerate(pod.env):
        where = f"spec.pod.env[{index}]"
        schema = passthrough.problems(env, "EnvVar", where)
        found += schema
        if not schema and (problem := kubenames.env_var_name_problem(env["name"])) is not None:
            found.append((f"{where}.name", problem))
    for index, toleration in enumerate(pod.tolerations):
        where = f"spec.pod.tolerations[{index}]"
        schema = passthrough.problems(toleration, "Toleration", where)
        found += schema or _toleration_problems(toleration, where)
    return found


def _toleration_problems(toleration: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """The API server's checks of a schema-valid toleration (its validateTolerations)."""
    found: list[tuple[str, str]] = []
    key, value = toleration.get("key", ""), toleration.get("value", "")
    operator, effect = toleration.get("operator", "Equal"), toleration.get("effect", "")
    if key and (problem := kubenames.qualified_name_problem(key)) is not None:
        found.append((f"{where}.key", problem))
    if operator not in TOLERATION_OPERATORS:
        found.append((f"{where}.operator", f"{kubenames.shown(operator)} is not Exists or Equal"))
    elif not key and operator != "Exists":
        found.append((f"{where}.operator", "must be Exists when key is empty (a toleration of every taint)"))
    elif operator == "Exists" and value:
        found.append((f"{where}.value", "must be empty when operator is Exists"))
    elif operator == "Equal" and (problem := kubenames.label_value_problem(value)) is not None:
        found.append((f"{where}.value", problem))
    if effect and effect not in TAINT_EFFECTS:
        found.append(
            (f"{where}.effect", f"{kubenames.shown(effect)} is not one of {', '.join(TAINT_EFFECTS)}")
        )
    return found


def _volume_source_problems(source: dict[str, Any], name: str, where: str) -> list[tuple[str, str]]:
    """A volume source is one Kubernetes volume type, without the volume's own name."""
    if "name" in source:
        # It would replace the volume's name in the pod and slip past the reserved-name check.
        return [
            (
                f"{where}.name",
                f"a volume's name is {where.removesuffix('.source')}.name; a source has none of its own",
            )
        ]
    found = passthrough.problems({"name": name, **source}, "Volume", where)
    if not found and len(source) != 1:
        types = ", ".join(map(str, source)) or "none"
        found.append(
            (
                where,
                f"must hold exactly one volume type, such as persistentVolumeClaim or emptyDir "
                f"(found: {types})",
            )
        )
    return found


# Names the children and the Kubeflow operators make from the job's: a Job's name is a label value,
# and a Service's (one per Kubeflow pod) a DNS-1035 label, so each is at most 63 characters.
def derived_names(job: BertPretrainJob) -> dict[str, str]:
    """The names made from the job's that must be DNS labels, each with what it names."""
    name, spec = job.metadata.name, job.spec
    names = {f"{name}-prepare": "the data-preparation Job"} if spec.prepare.enabled else {}
    workers = max(spec.topology.nodes, spec.elastic.max_nodes if spec.elastic else 0)
    if spec.launcher == "mpijob":
        names[f"{name}-launcher"] = "mpi-operator's launcher Job"
        names[f"{name}-worker-{workers - 1}"] = "mpi-operator's last Worker pod"
    elif spec.launcher == "trainjob":
        # JobSet names a pod <jobset>-<replicated job>-<job index>-<pod index>, its hostname.
        names[f"{name}-{TRAINJOB_NODE}-0-{workers - 1}"] = "Trainer v2's last node pod"
        if spec.train_job.ml_policy == "mpi":
            names[f"{name}-{TRAINJOB_LAUNCHER}-0-0"] = "Trainer v2's MPI launcher pod"
            names[f"{name}-mpi-ssh-auth"] = "Trainer v2's SSH key Secret"
    else:
        if spec.elastic is None:
            names[f"{name}-master-0"] = "the training operator's Master Service"
            workers -= 1
        if workers > 0:
            names[f"{name}-worker-{workers - 1}"] = "the training operator's last Worker Service"
    return names


def metadata_problems(job: BertPretrainJob) -> list[tuple[str, str]]:
    """What the API server would refuse in ``metadata`` (Kubernetes' ObjectMeta: its schema,
    label keys and values, annotation keys), and a name too long (:func:`name_problems`)."""
    meta = job.metadata
    document = {"name": meta.name, "namespace": meta.namespace, **(meta.model_extra or {})}
    found = passthrough.problems(document, "ObjectMeta", "metadata")
    if found:
        return found
    for field in ("labels", "annotations"):
        for key, value in document.get(field, {}).items():
            problem = kubenames.qualified_name_problem(key)
            if problem is None and field == "labels":
                problem = kubenames.label_value_problem(value)
            if problem is not None:
                found.append((kubenames.field_path(f"metadata.{field}", [key]), problem))
    return found + name_problems(job)


def name_problems(job: BertPretrainJob) -> list[tuple[str, str]]:
    """``metadata.name`` too long for a name made from it (:func:`derived_names`)."""
    name = job.metadata.name
    over = [
        f"{derived} ({what})"
        for derived, what in derived_names(job).items()
        if len(derived) > kubenames.MAX_LABEL
    ]
    if not over:
        return []
    longest = max(len(derived) - len(name) for derived in derived_names(job))
    return [
        (
            "metadata.name",
            f"{len(name)} characters is too long for the names made from it, which would exceed "
            f"{kubenames.MAX_LABEL}: {', '.join(over)}; use at most {kubenames.MAX_LABEL - longest}",
        )
    ]


def check(spec: JobSpec, source: str = "<spec>", training: bool = True, cluster: bool = False) -> JobSpec:
    """Return ``spec`` unchanged if it is consistent (``training``: see :func:`problems`;
    ``cluster``: also :func:`cluster_problems`, as the operator checks it).

    Raises:
        SpecError: listing every problem found.
    """
    found = problems(spec, training) + (cluster_problems(spec) if cluster else [])
    if found:
        raise SpecError(source, found)
    return spec


# What a spec is checked for, by who runs it (see checked).
Purpose = Literal["cluster", "training", "no-training"]


def checked(spec: JobSpec, source: str = "<spec>", purpose: Purpose = "training") -> JobSpec:
    """``spec`` with :func:`bertjob_api.defaults.with_defaults` applied, after the checks that
    ``purpose`` needs: the one way in to :func:`check` for the operator, the CLI and the trainer.

    - ``"cluster"``: the job as pods will run it (the operator, through :func:`cluster_job`, and
      ``bertjob validate``): every check, :func:`cluster_problems` included (volumes, pod
      settings, and every output path absolute and on a writable volume).
    - ``"training"``: the whole job in this process group (``python -m bertpretrain run`` in a pod
      the operator has already checked as a cluster job, and ``bertjob run`` on a machine where
      the paths are the user's own, relative ones included): :func:`problems`.
    - ``"no-training"``: a stage that does not train (``python -m bertpretrain prepare`` and
      ``export``): :func:`problems` without those that only training has (evaluation needs
      held-out shards).

    Raises:
        SpecError: listing every problem found.
    """
    return check(with_defaults(spec), source, training=purpose != "no-training", cluster=purpose == "cluster")


def cluster_job(job: BertPretrainJob, source: str = "<job>") -> BertPretrainJob:
    """``job`` as the operator runs it: its spec with :func:`bertjob_api.defaults.with_defaults`
    applied, after every check (:func:`metadata_problems`, and :func:`checked` for a cluster).

    Raises:
        SpecError: listing every problem found.
    """
    problems = metadata_problems(job)
    try:
        spec = checked(job.spec, source, "cluster")
    except SpecError as error:
        raise SpecError(source, problems + error.problems) from None
    if problems:
        raise SpecError(source, problems)
    job = job.model_copy(update={"spec": spec})
    # Only of a job that passed the rest: metadata refused for its depth cannot be written out.
    problems = stored_size_problems(to_document(job))
    if problems:
        raise SpecError(source, problems)
    return job


def stored_size_problems(document: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A problem when ``document`` (the job after defaults, as :func:`bertjob_api.spec.to_document`
    gives it) written as the operator stores it, the ``job.yaml`` of its ConfigMap, exceeds the
    :data:`bertjob_api.jobfile.MAX_BYTES` (1 MiB) Kubernetes allows a ConfigMap's data; it names
    the field that takes most of that room (the deepest one holding over half of its parent's
    bytes), with its size and the whole file's."""
    size = _stored_bytes(document)
    if size <= MAX_BYTES:
        return []
    path, value = "", document
    while True:
        children = _children(path, value)
        if not children:
            break
        sizes = {child: _stored_bytes({"field": child_value}) for child, child_value in children.items()}
        largest = max(sizes, key=sizes.__getitem__)
        if 2 * sizes[largest] < _stored_bytes({"field": value}):
            break
        path, value = largest, children[largest]
    message = (
        f"takes {format_size(_stored_bytes({'field': value}))} of the {format_size(size)} job file the "
        f"operator stores in the job's ConfigMap ({JOB_FILE}), which Kubernetes limits to "
        f"{format_size(MAX_BYTES)}; keep large values in a file on a volume"
    )
    return [(path or "spec", message)]


def _stored_bytes(document: Any) -> int:
    return len(dump(document).encode("utf-8"))


def _children(path: str, value: Any) -> dict[str, Any]:
    """The fields (``spec.pod.env``) or items (``spec.pod.env[3]``) of ``value`` at ``path``, each
    named as :func:`bertjob_api.kubenames.field_path` names it (a key that is not a plain name is
    quoted: ``spec.pod.nodeSelector["a b"]``)."""
    if isinstance(value, Mapping):
        return {kubenames.field_path(path, [str(key)]): item for key, item in value.items()}
    if isinstance(value, list):
        return {f"{path}[{index}]": item for index, item in enumerate(value)}
    return {}


# The most bytes one object rendered for a job (its ConfigMap, ServiceAccount, Role, RoleBinding,
# data Job, and the launcher's PyTorchJob, MPIJob or TrainJob) may take as compact JSON, as the API
# server stores a custom resource in etcd: 1 MiB (1,048,576 bytes). etcd refuses a request over
# 1.5 MiB (its default --max-request-bytes, 1572864), and what the API server adds to an object
# before storing it (managedFields, ownerReferences, its own metadata) must fit in the rest; the API
# server also refuses a request body over 3 MiB, and a ConfigMap's data over 1 MiB
# (bertjob_api.jobfile.MAX_BYTES). A job file within its own 1 MiB can still render past this, since
# its image and env appear once per replica (a 900,000-character image makes a 1.8 MB PyTorchJob
# of two nodes). Built-in kinds (the ConfigMap, the Job) are stored as protobuf, a little smaller than
# their JSON: for them the limit errs on the safe side.
MAX_OBJECT_BYTES = 1 << 20
# A string of a rendered object that holds no value of the job whole is searched for the job's
# strings of at least this many bytes (an env name inside Open MPI's list of forwarded variables).
_SEARCHED_BYTES = 4096


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as compact JSON in UTF-8, as the API server stores an object in etcd."""
    return len(_json(value).encode("utf-8", "surrogatepass"))


def object_size_problems(
    document: Mapping[str, Any], objects: Iterable[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """A problem for each of ``objects`` (what ``bertjob.render`` makes of ``document``, the job
    after defaults as :func:`bertjob_api.spec.to_document` gives it) whose compact JSON exceeds
    :data:`MAX_OBJECT_BYTES`: the API server could not store it. Each names the field of
    ``document`` that makes the object large (:func:`_largest_field`), the object
    (``kind/name``), its size in bytes and the limit; [] when every object fits. Costs one
    serialization per object unless one is too large."""
    found: list[tuple[str, str]] = []
    for obj in objects:
        size = json_bytes(obj)
        if size <= MAX_OBJECT_BYTES:
            continue
        path, share = _largest_field(document, _weights(document, obj))
        name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        found.append(
            (
                path,
                f"takes {format_size(share)} of {name}, which would be {size} bytes as JSON, more than "
                f"the {MAX_OBJECT_BYTES} bytes ({format_size(MAX_OBJECT_BYTES)}) the operator allows one "
                "object it creates (etcd stores at most 1.5 MiB); use a smaller value (a large one belongs "
                "in a file on a volume)",
            )
        )
    return found


def _json(value: Any) -> str:
    # default=str: a value JSON has no type for (a date YAML read) is measured as its text.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


# A scalar or key as :func:`_weights` counts it: a string as itself, another scalar with its type
# (True, 1 and 1.0 are equal in Python and different in JSON).
_Scalar = str | tuple[str, Any]


def _scalar(value: Any) -> _Scalar:
    return value if isinstance(value, str) else (type(value).__name__, value)


def _scalars(value: Any) -> Iterator[_Scalar]:
    """Every scalar and every mapping key within ``value`` (plain dicts and lists, as JSON or
    :func:`bertjob_api.spec.to_document` gives them)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield from map(str, item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            yield _scalar(item)


def _weights(document: Mapping[str, Any], obj: Mapping[str, Any]) -> dict[_Scalar, float]:
    """Bytes of ``obj`` that each scalar or key of ``document`` accounts for, at each place of
    ``document`` that holds it.

    The job's ConfigMap holds the whole document as its ``job.yaml`` text: there each counts once.
    Another object holds values of the job as its own (the image once per replica, each env entry
    per container): a value counts as often as ``obj`` holds it, shared between the places of the
    document that hold it, and a long string of the job counts too where it lies inside one of the
    object's strings that the job does not hold whole."""
    job = Counter(_scalars(document))

    def size(value: _Scalar) -> int:
        return json_bytes(value if isinstance(value, str) else value[1])

    if obj.get("kind") == "ConfigMap" and JOB_FILE in (obj.get("data") or {}):
        return {value: size(value) / count for value, count in job.items()}
    held = Counter(_scalars(obj))
    counts: dict[_Scalar, float] = {value: float(held[value]) for value in job}
    searched = [value for value in job if isinstance(value, str) and len(value) >= _SEARCHED_BYTES]
    for text, count in held.items():
        if isinstance(text, str) and len(text) >= _SEARCHED_BYTES and text not in job:
            for value in searched:
                # As a part of a longer string, without quotes of its own.
                if (times := text.count(value)) > 0:
                    counts[value] += count * times * (size(value) - 2) / size(value)
    return {value: count * size(value) / job[value] for value, count in counts.items() if count}


def _largest_field(document: Mapping[str, Any], weights: Mapping[_Scalar, float]) -> tuple[str, int]:
    """The field of ``document`` that accounts for most of the bytes ``weights`` gives its scalars
    and keys, with those bytes: from the whole, the largest field or item as long as it holds at
    least half of its parent's (a 1 MiB image is ``spec.image``, ten thousand small env entries
    ``spec.pod.env``), as :func:`stored_size_problems` names one."""
    totals: dict[str, float] = {}

    def total(path: str, value: Any, key: float = 0.0) -> float:
        # A field of a mapping counts its key's bytes (``key``) with its value's.
        if isinstance(value, dict):
            inner = sum(
                total(kubenames.field_path(path, [str(name)]), item, weights.get(str(name), 0.0))
                for name, item in value.items()
            )
        elif isinstance(value, list):
            inner = sum(total(f"{path}[{index}]", item) for index, item in enumerate(value))
        else:
            inner = weights.get(_scalar(value), 0.0)
        totals[path] = key + inner
        return key + inner

    total("", document)
    path, value = "", document
    while children := _children(path, value):
        largest = max(children, key=totals.__getitem__)
        if 2 * totals[largest] < totals[path] or totals[largest] == 0:
            break
        path, value = largest, children[largest]
    return path or "spec", round(totals[path])
