"""The ``trainjob`` launcher: a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1).

A TrainJob holds little of its own: it names a runtime (``spec.trainJob.runtimeRef``, by default the
ClusterTrainingRuntime the chart installs for ``spec.trainJob.mlPolicy``: ``bertjob-torch`` or
``bertjob-mpi``), which Trainer v2 turns into a JobSet, and carries what differs per job:

- ``trainer``: the image, the number of nodes and of processes per node, the resources per node
  (the accelerator's device, one per process), the environment, and under the torch policy the
  command, torchrun as the PyTorchJob runs it (``python -m bertpretrain.launch``), which reads the
  ``PET_*`` variables Trainer v2's torch plugin gives every ``node`` pod. Under the MPI policy the
  TrainJob has no command: the runtime's launcher runs mpirun and its nodes sshd, and a TrainJob's
  command would replace the nodes' (Trainer v2 gives it to the ``node`` containers of the replicated
  job labelled trainer; kubeflow/trainer#4030). Open MPI then forwards the variables the ranks need,
  which the launcher's ``mpirun -x`` names for an MPIJob, from ``OMPI_MCA_mca_base_env_list``; the
  runtime's ``launcher`` container gets them from a second runtime patch (:meth:`finish`).
- ``runtimePatches``: one entry, managed by ``bertjob.dev/operator``, that gives the runtime's
  ``node`` pods what the other launchers' pod templates hold: labels and annotations (the pod
  template's metadata, which a runtime patch may carry), service account, security
  contexts, volumes and mounts, node selector, tolerations, affinity and image pull secrets (and
  under the MPI policy the ``launcher`` pods their labels, annotations and environment).
- ``suspend`` and ``activeDeadlineSeconds`` from ``spec.runPolicy``; Trainer v2 has no other
  run-policy field (the runtime's JobSet holds restarts and gang scheduling), and
  :func:`bertjob_api.validation.trainjob_problems` refuses those.

Trainer v2's status is not Kubeflow's JobCondition list: :func:`bertjob.lifecycle.trainjob_conditions`
reads it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from bertjob import lifecycle
from bertjob.launchers import ChildKind, MergePatch, PodNames, mpijob, pod_context, whole
from bertjob_api.contract import MPIRUN_MCA_ENV, RUNTIME_PATCH_MANAGER, TRAINJOB_LAUNCHER, TRAINJOB_NODE
from bertjob_api.crd import Condition
from bertjob_api.spec import JobSpec

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
RUNTIME_GROUP = "trainer.kubeflow.org"
# Open MPI forwards the variables this lists (';' between them) to every rank, as `mpirun -x` does.
MPI_ENV_LIST = "OMPI_MCA_mca_base_env_list"


class TrainJobLauncher:
    """Renders ``spec`` as a TrainJob; see :class:`bertjob.launchers.Launcher`."""

    child = ChildKind(group=RUNTIME_GROUP, version="v1alpha1", kind="TrainJob", plural="trainjobs")
    component = "trainjob"
    # A TrainJob's activeDeadlineSeconds is immutable (the CRD's rule self == oldSelf), and it has no
    # other run-policy field: only suspend is applied to a running job.
    safe_fields: tuple[str, ...] = ("spec.runPolicy.suspend",)

    def patch(self, spec: JobSpec, *, name: str, namespace: str, pods: PodNames) -> MergePatch:
        """The patch of the built TrainJob; see :meth:`bertjob.launchers.Launcher.patch`."""
        pod = pod_context(spec, pods, container=TRAINJOB_NODE, labels=pods.labels, trainer=True)
        labels = dict(pods.labels)
        if spec.queue_name is not None:
            labels[QUEUE_LABEL] = spec.queue_name
        runtime = spec.train_job.runtime
        trainer: dict[str, Any] = {
            "image": spec.image,
            "numNodes": spec.topology.nodes,
            "numProcPerNode": spec.topology.processes_per_node,
            "env": [whole(env) for env in [*pod["env"], *mpi_env(spec, name)]],
        }
        if pod["resources"] is not None:
            trainer["resourcesPerNode"] = whole(pod["resources"])
        if spec.train_job.ml_policy == "mpi":
            trainer["command"] = None
        node_pod: dict[str, Any] = {key: whole(value) for key, value in pod["fields"].items()}
        if pod["service_account"] is not None:
            node_pod["serviceAccountName"] = pod["service_account"]
        node_pod["volumes"] = [
            {"name": pod["config_volume"], "configMap": {"name": pod["config_map"]}},
            *(whole(extra["volume"]) for extra in pod["volumes"]),
        ]
        node_pod["containers"] = [
            {"name": TRAINJOB_NODE, "volumeMounts": [whole(extra["mount"]) for extra in pod["volumes"]]}
        ]
        metadata: dict[str, Any] = {"labels": pod["labels"]}
        if pod["annotations"]:
            metadata["annotations"] = pod["annotations"]
        node = {
            "name": TRAINJOB_NODE,
            "template": {"spec": {"template": {"metadata": metadata, "spec": node_pod}}},
        }
        job_spec: dict[str, Any] = {
            "runtimeRef": {"apiGroup": RUNTIME_GROUP, "kind": runtime.kind, "name": runtime.name},
            "suspend": spec.run_policy.suspend,
            "trainer": trainer,
            "runtimePatches": [
                {
                    "manager": RUNTIME_PATCH_MANAGER,
                    "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}},
                }
            ],
        }
        if spec.run_policy.active_deadline_seconds is not None:
            job_spec["activeDeadlineSeconds"] = spec.run_policy.active_deadline_seconds
        return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": job_spec}

    def finish(self, spec: JobSpec, child: dict[str, Any]) -> dict[str, Any]:
        """Under the MPI policy, ``child`` with a runtime patch of the ``launcher`` replicated job:
        its pods get the node pods' labels and annotations, and its ``launcher`` container the
        trainer's environment as built (the accelerator's and the job's variables, and
        :func:`mpi_env`), which mpirun forwards to the ranks. Trainer v2 gives the TrainJob's
        environment only to the replicated job labelled trainer (the nodes, which run sshd and whose
        ranks start over ssh without it) and refuses a runtime patch of a container named
        ``node``, so the runtime's launcher container has its own name."""
        if spec.train_job.ml_policy != "mpi":
            return child
        finished = copy.deepcopy(child)
        jobs = _replicated_jobs(finished)
        [node] = [job for job in jobs if job["name"] == TRAINJOB_NODE]
        metadata = copy.deepcopy(node["template"]["spec"]["template"]["metadata"])
        container = {"name": TRAINJOB_LAUNCHER, "env": copy.deepcopy(finished["spec"]["trainer"]["env"])}
        pod = {"metadata": metadata, "spec": {"containers": [container]}}
        jobs.append({"name": TRAINJOB_LAUNCHER, "template": {"spec": {"template": pod}}})
        return finished

    def trainer_template(self, child: Mapping[str, Any]) -> dict[str, Any]:
        """The ``node`` pods' template as Trainer v2 makes it from ``child``'s trainer and our
        runtime patch (the runtime's own fields aside): a pod of one ``node`` container with the
        trainer's image, command, environment and resources per node."""
        trainer = child["spec"]["trainer"]
        [node] = [job for job in _replicated_jobs(child) if job["name"] == TRAINJOB_NODE]
        template = node["template"]["spec"]["template"]
        pod = dict(template["spec"])
        [patched] = pod.pop("containers")
        container = {**patched, "image": trainer["image"], "env": list(trainer.get("env", []))}
        if "command" in trainer:
            container["command"] = list(trainer["command"])
        if "resourcesPerNode" in trainer:
            container["resources"] = trainer["resourcesPerNode"]
        return {"metadata": dict(template.get("metadata", {})), "spec": {**pod, "containers": [container]}}

    def policy_patch(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The merge patch that suspends or resumes a TrainJob with ``fields["suspend"]``; {} without
        it (a TrainJob takes no other run-policy field once created)."""
        return {"spec": {"suspend": fields["suspend"]}} if "suspend" in fields else {}

    def suspended(self, child_spec: object) -> bool:
        """Whether a TrainJob's ``spec.suspend`` is true."""
        return isinstance(child_spec, Mapping) and child_spec.get("suspend") is True

    def conditions(self, child_status: Mapping[str, Any], at: datetime) -> list[Condition]:
        """The TrainJob's status as the job's conditions: :func:`bertjob.lifecycle.trainjob_conditions`."""
        return lifecycle.trainjob_conditions(child_status, at)

    def has_conditions(self, child_status: Mapping[str, Any]) -> bool:
        """Whether :meth:`conditions` finds anything in ``child_status``."""
        return lifecycle.has_trainjob_conditions(child_status)


def _replicated_jobs(child: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The replicated jobs of the TrainJob's runtime patch that the operator manages."""
    [patch] = [
        entry for entry in child["spec"]["runtimePatches"] if entry["manager"] == RUNTIME_PATCH_MANAGER
    ]
    jobs: list[dict[str, Any]] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return jobs


def mpi_env(spec: JobSpec, name: str) -> list[dict[str, str]]:
    """Variables an MPI-policy TrainJob adds to its pods (none under torch): Open MPI's list of the
    variables to forward to the ranks (the job's name and namespace for progress reports, the
    accelerator's, the job's own), its socket binding on Xeon, and with DeepSpeed the rendezvous
    address of rank 0: the first ``node`` pod (Trainer v2 writes the hostfile in pod order,
    ``<job>-node-0-<i>.<job>``), whose ranks mpirun starts first."""
    if spec.train_job.ml_policy != "mpi":
        return []
    env = dict(MPIRUN_MCA_ENV.get(spec.accelerator, {}))
    forwarded = mpijob.forwarded_env(spec)
    if spec.distributed.deepspeed is not None:
        env["MASTER_ADDR"] = f"{name}-{TRAINJOB_NODE}-0-0.{name}"
        env["MASTER_PORT"] = str(mpijob.DEEPSPEED_MASTER_PORT)
        forwarded += ["MASTER_ADDR", "MASTER_PORT"]
    env[MPI_ENV_LIST] = ";".join(dict.fromkeys(forwarded))
    return [{"name": key, "value": value} for key, value in env.items()]
