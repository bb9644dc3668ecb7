"""What the operator, the trainer and the manifests must agree on, each written once.

The operator renders pods that mount these volumes at these paths and set these variables; the
trainer reads them there and exits with these codes, which the children's ``restartPolicy`` and
``podFailurePolicy`` act on; the trainer patches these status fields, which the CRD declares. The
kustomize YAML keeps its own literals (it is usable by hand), and ``tests/bertjob_api/
test_contract.py`` checks them against this module. As Kubeflow's SDK keeps its ``constants.py``.
"""

from __future__ import annotations

import signal
from typing import Final

# The custom resource.
GROUP: Final = "bertjob.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "BertPretrainJob"
PLURAL: Final = "bertpretrainjobs"


def job_path(namespace: str, name: str) -> str:
    """The API server's path of one BertPretrainJob, e.g.
    ``/apis/bertjob.dev/v1alpha1/namespaces/default/bertpretrainjobs/demo``."""
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"


def status_path(namespace: str, name: str) -> str:
    """The path of a BertPretrainJob's status subresource, which the operator and the trainer's
    progress reports patch."""
    return job_path(namespace, name) + "/status"


# The job file: a ConfigMap key, mounted into every trainer pod by the volume JOB_CONFIG_VOLUME.
JOB_FILE: Final = "job.yaml"
CONFIG_DIR: Final = "/etc/bertjob"
JOB_PATH: Final = f"{CONFIG_DIR}/{JOB_FILE}"

# The trainer pod's volumes (kustomize/base/trainer-pod.yaml): the job file, the scratch volume a
# job's volume of the same name replaces, and the shared memory that DataLoader workers and NCCL use.
JOB_CONFIG_VOLUME: Final = "job-config"
DATA_VOLUME: Final = "data"
DATA_MOUNT_PATH: Final = "/data"
SHM_VOLUME: Final = "dshm"
SHM_MOUNT_PATH: Final = "/dev/shm"
TMP_VOLUME: Final = "tmp"
TMP_MOUNT_PATH: Final = "/tmp"
# The projected token of progress reports (PROGRESS_AUDIENCE below).
PROGRESS_TOKEN_VOLUME: Final = "progress-token"
PROGRESS_TOKEN_DIR: Final = f"/var/run/secrets/{GROUP}"
# Volume names a job's own volumes may not take, with where the base mounts them.
RESERVED_VOLUMES: Final = {
    JOB_CONFIG_VOLUME: CONFIG_DIR,
    SHM_VOLUME: SHM_MOUNT_PATH,
    TMP_VOLUME: TMP_MOUNT_PATH,
    PROGRESS_TOKEN_VOLUME: PROGRESS_TOKEN_DIR,
}

# The vocabulary's files, as the data stage writes them (under <spec.data.shards>/vocab) and as the
# Hugging Face export carries them (spec.export.path), where users and fine-tuning jobs read them.
VOCAB_FILE: Final = "vocab.txt"
TOKENIZER_FILE: Final = "tokenizer.json"

# The trainer container's name in the base's trainer pod (kustomize/base/trainer-pod.yaml), whose
# fields the launchers' replicas take; the data Job's one container, which its podFailurePolicy names.
TRAINER_CONTAINER: Final = "trainer"
PREPARE_CONTAINER: Final = "prepare"
# The label every child pod carries with its job's name; NAME_ENV is read from it (a fieldRef).
JOB_LABEL: Final = f"{GROUP}/job"

# The trainer's entry point and its commands: `python -m bertpretrain <command> --config JOB_PATH`.
TRAINER_MODULE: Final = "bertpretrain"
LAUNCH_MODULE: Final = "bertpretrain.launch"
PREPARE_COMMAND: Final = "prepare"
RUN_COMMAND: Final = "run"
# The whole job in one process, then a fill-mask demonstration: what `bertjob run job.yaml` starts.
LOCAL_COMMAND: Final = "local"
# spec.finetune alone, on the job's export or each task's initFrom (`run` and `local` end with it).
FINETUNE_COMMAND: Final = "finetune"
# Where fine-tuning writes, below spec.checkpoint.path: FINETUNE_RESULTS (every task's metrics per
# seed, their median and best) and, for a builtin task, its generated files in <task name>/.
FINETUNE_DIR: Final = "finetune"
FINETUNE_RESULTS: Final = "finetune.json"

# Kubeflow Trainer v2 (spec.launcher trainjob). The ClusterTrainingRuntimes the chart installs,
# one per ML policy; a TrainJob refers to one of them unless spec.trainJob.runtimeRef names another.
TORCH_RUNTIME: Final = "bertjob-torch"
MPI_RUNTIME: Final = "bertjob-mpi"
# Trainer v2's names (kubeflow/trainer pkg/constants/constants.go): `node` is both the replicated job
# whose pods run the trainer and their container, which Trainer v2 gives the trainer's image,
# resources and environment (and, under MPI, the hostfile and SSH keys); `launcher` is the MPI
# runtime's replicated job that runs mpirun.
TRAINJOB_NODE: Final = "node"
TRAINJOB_LAUNCHER: Final = "launcher"
# The `manager` of the TrainJob's runtimePatches entry that carries our pod settings.
RUNTIME_PATCH_MANAGER: Final = f"{GROUP}/operator"

# Set by the operator in every trainer pod, so that the trainer can report its progress.
NAME_ENV: Final = "BERTJOB_NAME"
NAMESPACE_ENV: Final = "BERTJOB_NAMESPACE"

# Progress reports go to the operator, never to the API server (docs/design.md, "Progress through
# the operator"): the trainer POSTs its status fields to the URL in the job's ConfigMap
# (PROGRESS_URL_KEY, under CONFIG_DIR), trusting the CA beside it (PROGRESS_CA_KEY), with the token
# Kubernetes projects into every trainer pod for PROGRESS_AUDIENCE alone (PROGRESS_TOKEN_VOLUME above),
# which lets it do nothing but report for its own job.
PROGRESS_AUDIENCE: Final = GROUP
PROGRESS_TOKEN_FILE: Final = "token"
PROGRESS_URL_KEY: Final = "progress-url"
PROGRESS_CA_KEY: Final = "progress-ca.crt"
# The largest report the operator reads, in bytes (a report is a few hundred).
PROGRESS_MAX_BYTES: Final = 64 * 1024

# mpirun's process placement per accelerator, as the environment variables (OMPI_MCA_<parameter>)
# from which Open MPI reads the MCA parameters that its options set, rather than options on
# mpirun's line: on Xeon one process per socket (`--map-by socket`: rmaps_base_mapping_policy),
# bound to it (`--bind-to socket`: hwloc_base_binding_policy). The operator sets them on the
# MPIJob Launcher (under mpirun) and on an MPI TrainJob's pods; kustomize/components/xeon-cpu keeps
# a literal copy for the Launcher, which tests/bertjob/test_kustomize.py checks against this table.
MPIRUN_MCA_ENV: Final[dict[str, dict[str, str]]] = {
    "xeon-cpu": {
        "OMPI_MCA_rmaps_base_mapping_policy": "socket",
        "OMPI_MCA_hwloc_base_binding_policy": "socket",
    },
}

# The trainer's exit codes. Kubeflow's `restartPolicy: ExitCode` restarts on 128-255 only, and the
# data Job's podFailurePolicy fails at once on the codes a retry would not mend.
EXIT_SUCCESS: Final = 0
EXIT_FAILURE: Final = 1  # bad data, a diverged loss, a missing accelerator: a retry would not mend it
EXIT_INVALID_JOB: Final = 2  # the job file does not pass validation
EXIT_PREEMPTED: Final = 128 + signal.SIGTERM  # 143: SIGTERM after a checkpoint; restart resumes
# Above 128 + 64 (SIGRTMAX), so no signal's death reads the same (unlike 137 for SIGKILL or 143 for
# SIGTERM); retried, since a volume can be grown.
EXIT_DISK_FULL: Final = 200
# This rank was well but another rank of the world was lost (a collective failed or timed out
# because its peer is gone, on this node or another): retried, since the cause is elsewhere, and
# the process that lost the peer never hides the peer's own code (issue 29).
EXIT_PEER_LOST: Final = 201
PERMANENT_EXIT_CODES: Final = (EXIT_FAILURE, EXIT_INVALID_JOB)
RETRYABLE_EXIT_CODES: Final = (EXIT_PREEMPTED, EXIT_DISK_FULL, EXIT_PEER_LOST)
# What each code means, for the job's status when a pod ends with it (the operator's message).
EXIT_MEANINGS: Final[dict[int, str]] = {
    EXIT_FAILURE: "a failure no retry mends (bad data, a diverged loss, a missing accelerator)",
    EXIT_INVALID_JOB: "the job file does not pass validation",
    EXIT_PREEMPTED: "stopped by SIGTERM after a checkpoint",
    EXIT_DISK_FULL: "a volume is full",
    EXIT_PEER_LOST: "another rank of the world was lost",
    128 + signal.SIGKILL: "killed by SIGKILL (often the memory limit)",
}

# `status.results`: one entry per fine-tuning task, patched by the trainer's rank 0 as each task
# ends (bertjob_api.crd.TaskResult). Like `status.progress`, the operator never writes it.
RESULTS_FIELD: Final = "results"
# `status.progress`: the trainer's log values that it patches, by the status field that holds them
# (declared by bertjob_api.crd.Progress), besides phase, step, totalSteps and updateTime.
PROGRESS_FIELD: Final = "progress"
PROGRESS_FIELDS: Final = {
    "loss": "loss",
    "mlm_accuracy": "mlmAccuracy",
    "sequences_per_second": "sequencesPerSecond",
    "budget_left_seconds": "budgetLeftSeconds",
}
