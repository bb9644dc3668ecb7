"""What the operator's end-to-end tests share: the launchers, the children's resources, a job's
children as the emulator or the real API server stores them, job documents by name, and a
TrainJob's status as Kubeflow Trainer v2 writes it."""

from __future__ import annotations

from typing import Any

from bertjob.render import JOB_LABEL
from bertjob_testing.cluster.operator import RealCluster
from bertjob_testing.jobs import valid_job, with_value
from bertjob_testing.kube_emulator import Cluster, answers

# The launchers whose child reports Kubeflow's JobCondition list (tests/kubeflow_env.kubeflow_condition);
# a TrainJob reports Trainer v2's status instead (trainjob_status), tested in test_trainjob_e2e.py.
LAUNCHERS = ["pytorchjob", "mpijob"]
CHILD_RESOURCES = {
    "pytorchjob": "kubeflow.org/v1/pytorchjobs",
    "mpijob": "kubeflow.org/v2beta1/mpijobs",
    "trainjob": "trainer.kubeflow.org/v1alpha1/trainjobs",
}
# Resources a job's children may be of, and those they were once of (ServiceAccount, Role and
# RoleBinding, before progress went through the operator), so that one made again is seen.
OWNED = (
    "v1/configmaps",
    "v1/serviceaccounts",
    "rbac.authorization.k8s.io/v1/roles",
    "rbac.authorization.k8s.io/v1/rolebindings",
    "batch/v1/jobs",
    *CHILD_RESOURCES.values(),
)


def home(cluster: Cluster) -> str:
    """The namespace of a test's jobs: its own on the real cluster (``RealCluster.default_namespace``),
    ``default`` on the emulator."""
    return cluster.default_namespace if isinstance(cluster, RealCluster) else "default"


def children_of(cluster: Cluster, name: str) -> dict[str, list[dict[str, Any]]]:
    """Every object labelled as ``name``'s, by resource, in the test's namespace (:func:`home`)."""
    return {
        resource: found
        for resource in OWNED
        if (
            found := [
                obj
                for obj in cluster.stored(resource, home(cluster))
                if (obj["metadata"].get("labels") or {}).get(JOB_LABEL) == name
            ]
        )
    }


PYTORCHJOBS = CHILD_RESOURCES["pytorchjob"]
TRAINJOBS = CHILD_RESOURCES["trainjob"]


def named_job(name: str, launcher: str = "pytorchjob", **fields: Any) -> dict[str, Any]:
    """A valid job named ``name`` for ``launcher``, with ``fields`` set (``a__b`` for ``a.b``)."""
    document = with_value(with_value(valid_job(), "metadata.name", name), "spec.launcher", launcher)
    for dotted, value in fields.items():
        document = with_value(document, dotted.replace("__", "."), value)
    return document


# What Kubeflow Trainer v2's TrainJob controller writes, by condition type and reason: (status,
# message). Types and reasons: kubeflow/trainer pkg/apis/trainer/v1alpha1/trainjob_types.go
# (Suspended with reason Suspended or Resumed, Failed with reason DeadlineExceeded) and the JobSet
# conditions it copies (pkg/runtime/framework/plugins/jobset: Complete with JobSet's reason
# AllJobsCompleted, Failed with FailedJobs). The Suspended messages are Trainer v2's
# (pkg/constants/constants.go); the others stand in for JobSet's and the deadline's.
TRAINJOB_CONDITIONS = {
    ("Suspended", "Suspended"): ("True", "TrainJob is suspended"),
    ("Suspended", "Resumed"): ("False", "TrainJob is resumed"),
    ("Complete", "AllJobsCompleted"): ("True", "jobset completed successfully"),
    ("Failed", "FailedJobs"): ("True", "jobset failed due to one or more failed jobs"),
    ("Failed", "DeadlineExceeded"): ("True", "TrainJob exceeded its activeDeadlineSeconds"),
}
TRAINJOB_TIME = "2026-01-01T00:00:00Z"


def trainjob_condition(type_: str, reason: str) -> dict[str, str]:
    """A TrainJob condition (metav1.Condition: type, status, reason, message, lastTransitionTime)
    as Trainer v2's controller writes it, for one of :data:`TRAINJOB_CONDITIONS`.

    Raises:
        KeyError: Trainer v2 writes no condition of that type with that reason.
    """
    status, message = TRAINJOB_CONDITIONS[(type_, reason)]
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": TRAINJOB_TIME,
    }


def trainjob_status(
    *conditions: tuple[str, str],
    job: str = "node",
    ready: int = 0,
    active: int = 0,
    succeeded: int = 0,
    failed: int = 0,
    suspended: int = 0,
) -> dict[str, Any]:
    """A TrainJob's ``status`` as Trainer v2 writes it: ``conditions`` (type, reason) by
    :func:`trainjob_condition`, and ``jobsStatus`` with one entry for the replicated job ``job``
    (``node``, Trainer v2's constants.Node), counting its child Jobs as JobSet's
    ReplicatedJobStatus does and Trainer v2 copies it (kubeflow/trainer
    pkg/runtime/framework/plugins/jobset/jobset.go; every field required by the v2.3.0 CRD).
    ``ready`` counts Jobs whose pods are all ready, ``active`` Jobs with a running or pending pod."""
    counts = {"active": active, "failed": failed, "ready": ready, "succeeded": succeeded}
    return {
        "conditions": [trainjob_condition(type_, reason) for type_, reason in conditions],
        "jobsStatus": [{"name": job, **counts, "suspended": suspended}],
    }


def assert_fails_naming(cluster: Cluster, name: str, named: str) -> None:
    """Job ``name`` fails with InvalidSpec naming ``named`` in its condition (at most 1,024
    characters) and in an Event, kstatus says Stalled, no child is made, and the operator lives on:
    on the emulator or the real server alike."""
    status = cluster.status_when(name, "Failed")

    condition, ready, stalled = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("Failed", "True", "InvalidSpec")
    # kstatus: the failure is final until the spec changes (tests/cluster/test_kstatus_e2e.py).
    assert [(c["type"], c["status"], c["reason"]) for c in (ready, stalled)] == [
        ("Ready", "False", "InvalidSpec"),
        ("Stalled", "True", "InvalidSpec"),
    ]
    assert named in condition["message"]
    assert len(condition["message"]) <= 1024
    assert children_of(cluster, name) == {}
    cluster.wait_for(
        f"an InvalidSpec event about {name}",
        lambda: [e for e in cluster.events(name) if e["reason"] == "InvalidSpec" and named in e["message"]],
    )
    assert cluster.operator is not None and cluster.operator.poll() is None and answers(cluster.liveness)
