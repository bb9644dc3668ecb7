"""The ``pytorchjob`` launcher: a Kubeflow PyTorchJob (training-operator v1) running torchrun.

One pod per node: a Master replica, plus ``nodes - 1`` Worker replicas in the multi-node overlay,
all running the base's ``pytorch`` container. The training operator gives every pod the PET_*
variables torchrun reads, so the topology lives only in ``nprocPerNode`` and the replica counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertjob.launchers import ChildKind, ChildState, JsonPatch, json_pointer, kubeflow_state
from bertjob.spec import Accelerator, JobSpec

# Extended resource each accelerator's device plugin advertises, one device per process.
DEVICE_RESOURCES: dict[Accelerator, str | None] = {
    "nvidia-gpu": "nvidia.com/gpu",
    "habana-hpu": "habana.ai/gaudi",
    "xeon-cpu": None,
}

# Names in kustomize/base/pytorchjob.yaml; each patch first tests that they are where it expects.
CONTAINER = "pytorch"
CONFIG_VOLUME = "job-config"


class PyTorchJobLauncher:
    """Renders ``spec`` as a PyTorchJob; see :class:`bertjob.launchers.Launcher`."""

    child = ChildKind(group="kubeflow.org", version="v1", kind="PyTorchJob", plural="pytorchjobs")

    def overlay(self, spec: JobSpec) -> str:
        """``single-node`` for one node, else ``multi-node`` (Master plus Workers)."""
        return "single-node" if spec.topology.nodes == 1 else "multi-node"

    def patch(self, spec: JobSpec, *, name: str, config_map: str, labels: Mapping[str, str]) -> JsonPatch:
        """Operations on the overlay's PyTorchJob; see :meth:`bertjob.launchers.Launcher.patch`."""
        topology = spec.topology
        ops: JsonPatch = [
            {"op": "replace", "path": "/metadata/name", "value": name},
            # The CRD types nprocPerNode as a string ("auto", "cpu", "gpu" or a number).
            {"op": "replace", "path": "/spec/nprocPerNode", "value": str(topology.processes_per_node)},
        ]
        replicas = ["Master"] if topology.nodes == 1 else ["Master", "Worker"]
        for replica in replicas:
            ops += self._pod_ops(spec, replica, config_map, labels)
        if topology.nodes > 1:
            path = json_pointer("spec", "pytorchReplicaSpecs", "Worker", "replicas")
            ops.append({"op": "replace", "path": path, "value": topology.nodes - 1})
        return ops

    def state(self, child: Mapping[str, Any]) -> ChildState | None:
        """The PyTorchJob's phase from its Kubeflow conditions."""
        return kubeflow_state(child.get("status") or {})

    @staticmethod
    def _pod_ops(spec: JobSpec, replica: str, config_map: str, labels: Mapping[str, str]) -> JsonPatch:
        template = ("spec", "pytorchReplicaSpecs", replica, "template")
        container = (*template, "spec", "containers", "0")
        volume = (*template, "spec", "volumes", "0")
        ops: JsonPatch = [
            {"op": "test", "path": json_pointer(*container, "name"), "value": CONTAINER},
            {"op": "replace", "path": json_pointer(*container, "image"), "value": spec.image},
            {"op": "test", "path": json_pointer(*volume, "name"), "value": CONFIG_VOLUME},
            {"op": "replace", "path": json_pointer(*volume, "configMap", "name"), "value": config_map},
        ]
        ops += [
            {"op": "add", "path": json_pointer(*template, "metadata", "labels", key), "value": value}
            for key, value in labels.items()
        ]
        device = DEVICE_RESOURCES[spec.accelerator]
        if device is not None:
            resources = {"limits": {device: spec.topology.processes_per_node}}
            ops.append({"op": "add", "path": json_pointer(*container, "resources"), "value": resources})
        return ops
