"""The ``pytorchjob`` launcher: a Kubeflow PyTorchJob (training-operator v1) running torchrun.

One pod per node: a Master replica, plus ``nodes - 1`` Worker replicas in the multi-node overlay,
all running the base's ``pytorch`` container. The training operator gives every pod the PET_*
variables torchrun reads, so the topology lives only in ``nprocPerNode`` and the replica counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertjob.launchers import (
    ChildKind,
    JsonPatch,
    PodNames,
    job_patch,
    json_pointer,
    pod_context,
)
from bertjob.spec import JobSpec

# The container name in kustomize/base/pytorchjob.yaml; the patch first tests that it is there.
CONTAINER = "pytorch"


class PyTorchJobLauncher:
    """Renders ``spec`` as a PyTorchJob; see :class:`bertjob.launchers.Launcher`."""

    child = ChildKind(group="kubeflow.org", version="v1", kind="PyTorchJob", plural="pytorchjobs")
    component = "pytorchjob"

    def patch(self, spec: JobSpec, *, name: str, pods: PodNames) -> JsonPatch:
        """Operations on the built PyTorchJob; see :meth:`bertjob.launchers.Launcher.patch`."""
        nodes = spec.topology.nodes
        counts = {"Master": None} if nodes == 1 else {"Master": None, "Worker": nodes - 1}
        pod = pod_context(spec, pods, container=CONTAINER, labels=pods.labels, trainer=True)
        replicas = [
            {
                "path": json_pointer("spec", "pytorchReplicaSpecs", replica),
                "count": count,
                "trainer": True,
                "pod": pod,
                "container": {},
            }
            for replica, count in counts.items()
        ]
        return job_patch(
            spec,
            name,
            # The CRD types nprocPerNode as a string ("auto", "cpu", "gpu" or a number).
            {"/spec/nprocPerNode": str(spec.topology.processes_per_node)},
            replicas,
        )

    def trainer_template(self, child: Mapping[str, Any]) -> dict[str, Any]:
        """The Master's pod template (Workers run the same pod)."""
        return dict(child["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
