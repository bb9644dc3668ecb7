"""What the operator's end-to-end tests share: the launchers, the children's resources, a job's
children as the emulator stores them, and job documents by name."""

from __future__ import annotations

from typing import Any

from bertjob.render import JOB_LABEL
from bertjob_testing.jobs import valid_job, with_value
from bertjob_testing.kube_emulator import Cluster

LAUNCHERS = ["pytorchjob", "mpijob"]
CHILD_RESOURCES = {"pytorchjob": "kubeflow.org/v1/pytorchjobs", "mpijob": "kubeflow.org/v2beta1/mpijobs"}
# Resources a job's children may be of.
OWNED = (
    "v1/configmaps",
    "v1/serviceaccounts",
    "rbac.authorization.k8s.io/v1/roles",
    "rbac.authorization.k8s.io/v1/rolebindings",
    "batch/v1/jobs",
    *CHILD_RESOURCES.values(),
)


def children_of(cluster: Cluster, name: str) -> dict[str, list[dict[str, Any]]]:
    """Every object labelled as ``name``'s, by resource."""
    return {
        resource: found
        for resource in OWNED
        if (
            found := [
                obj
                for obj in cluster.stored(resource, "default")
                if (obj["metadata"].get("labels") or {}).get(JOB_LABEL) == name
            ]
        )
    }


PYTORCHJOBS = CHILD_RESOURCES["pytorchjob"]


def named_job(name: str, launcher: str = "pytorchjob", **fields: Any) -> dict[str, Any]:
    """A valid job named ``name`` for ``launcher``, with ``fields`` set (``a__b`` for ``a.b``)."""
    document = with_value(with_value(valid_job(), "metadata.name", name), "spec.launcher", launcher)
    for dotted, value in fields.items():
        document = with_value(document, dotted.replace("__", "."), value)
    return document
