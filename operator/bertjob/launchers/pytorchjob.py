"""The ``pytorchjob`` launcher: a Kubeflow PyTorchJob (training-operator v1) running torchrun.

One pod per node, all running the base's ``pytorch`` container: torchrun, run as ``python -m
bertpretrain.launch`` (kustomize/base/pytorchjob.yaml), the same options and PET_* variables but
exiting with the failed rank's exit code, or 128 + N on signal N, as ``restartPolicy: ExitCode``
needs (torchrun alone exits 1, a permanent failure). A fixed world is a Master replica, plus
``nodes - 1`` Worker replicas in the multi-node overlay: the training operator gives every pod the
PET_* variables torchrun reads (``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR``/``PORT``), so the topology lives only in ``nprocPerNode`` and the replica
counts.

An elastic job (``spec.elastic``) is ``nodes`` Worker replicas and no Master, with an
``elasticPolicy``, as the training operator's elastic examples are: for it the operator sets
``PET_RDZV_ENDPOINT`` to ``<name>-worker-0:<port>`` (the c10d rendezvous, hosted by that pod's
torchrun), ``PET_RDZV_BACKEND``, ``PET_RDZV_ID``, ``PET_NNODES=<min>:<max>`` and
``PET_MAX_RESTARTS``, but no ``PET_NPROC_PER_NODE`` (it sets that only beside a Master, or from the
deprecated ``elasticPolicy.nProcPerNode``), so the Workers' container sets it itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertjob.launchers import ChildKind, KubeflowJob, MergePatch, PodNames, job_patch, pod_context
from bertjob_api.spec import ElasticSpec, JobSpec

# The container name in kustomize/base/pytorchjob.yaml, which the patch finds the container by.
CONTAINER = "pytorch"
REPLICA_SPECS = "pytorchReplicaSpecs"
RDZV_BACKEND = "c10d"


class PyTorchJobLauncher(KubeflowJob):
    """Renders ``spec`` as a PyTorchJob; see :class:`bertjob.launchers.Launcher`."""

    child = ChildKind(group="kubeflow.org", version="v1", kind="PyTorchJob", plural="pytorchjobs")
    component = "pytorchjob"

    def patch(self, spec: JobSpec, *, name: str, namespace: str, pods: PodNames) -> MergePatch:
        """The patch of the built PyTorchJob; see :meth:`bertjob.launchers.Launcher.patch`."""
        nodes = spec.topology.nodes
        processes = str(spec.topology.processes_per_node)
        # The CRD types nprocPerNode as a string ("auto", "cpu", "gpu" or a number).
        fields: dict[str, Any] = {"nprocPerNode": processes}
        removed: list[str] = []
        counts: dict[str, int | None]  # None: the replica count the overlay set
        if spec.elastic is None:
            counts = {"Master": None} if nodes == 1 else {"Master": None, "Worker": nodes - 1}
        else:
            counts = {"Worker": nodes}
            removed.append("Master")
            fields["elasticPolicy"] = elastic_policy(spec.elastic, name)
        pod = pod_context(spec, pods, container=CONTAINER, labels=pods.labels, trainer=True)
        if spec.elastic is not None:
            pod["env"] = [*elastic_env(processes), *pod["env"]]
        replicas = [
            {"name": replica, "count": count, "trainer": True, "pod": pod, "container": {}}
            for replica, count in counts.items()
        ]
        return job_patch(
            spec,
            name=name,
            namespace=namespace,
            pods=pods,
            replica_specs=REPLICA_SPECS,
            fields=fields,
            replicas=replicas,
            removed=removed,
        )

    def trainer_template(self, child: Mapping[str, Any]) -> dict[str, Any]:
        """The Master's pod template, or the Workers' in an elastic job (every replica runs the
        same pod)."""
        replicas = child["spec"][REPLICA_SPECS]
        return dict((replicas.get("Master") or replicas["Worker"])["template"])


def elastic_env(processes: str) -> list[dict[str, str]]:
    """Variables an elastic job's Workers set themselves: ``PET_NPROC_PER_NODE`` (see the module
    docstring), and ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, without which the ranks that torchrun
    restarts after a failure read the previous attempt's keys from the rendezvous store that the
    agents share with them and hang in their first collective (pytorch/pytorch#135712; seen
    with torch 2.13 in tests/bertpretrain/runtime/test_kubeflow_pods.py)."""
    return [
        {"name": "PET_NPROC_PER_NODE", "value": processes},
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
    ]


def elastic_policy(elastic: ElasticSpec, name: str) -> dict[str, Any]:
    """The PyTorchJob's ``elasticPolicy`` for ``spec.elastic``: a c10d rendezvous identified by the
    job's name, between ``minNodes`` and ``maxNodes`` Worker pods."""
    return {
        "minReplicas": elastic.min_nodes,
        "maxReplicas": elastic.max_nodes,
        "rdzvBackend": RDZV_BACKEND,
        "rdzvId": name,
        "maxRestarts": elastic.max_restarts,
    }
