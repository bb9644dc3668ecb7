"""RBAC from the operator's own requests: the ClusterRole grants what it calls, and nothing more.

The emulator records every request made with the operator's token; this test drives a job
through every path that calls the API (children created, a data Job completed, the child's
conditions mirrored, a spec change, a name conflict), then compares the verbs used per resource
with manifests/rbac.yaml. It also counts what the rest of the session made the operator do.
"""

from __future__ import annotations

from typing import Any

import yaml
from kube_emulator import Call, Cluster
from kubernetes.client import CustomObjectsApi
from test_e2e_lifecycle import _job, _running
from test_handlers_e2e import CHILD_RESOURCES, children_of, kubeflow_condition

from bertjob import launchers
from bertjob.render import render
from bertjob.spec import parse_job
from jobs import REPO

# Granted without a request of the operator's own: the OwnerReferencesPermissionEnforcement
# admission plugin lets only those who may update the owner's finalizers set blockOwnerDeletion,
# and RBAC lets the operator create the trainer's Role (get and patch on bertpretrainjobs/status)
# only if it holds those verbs itself.
WITHOUT_A_CALL = {
    ("bertjob.dev", "bertpretrainjobs/finalizers"): {"update"},
    ("bertjob.dev", "bertpretrainjobs/status"): {"get"},
}


def verb(call: Call) -> str:
    """The RBAC verb of a request."""
    if call.method == "GET":
        return "get" if call.named else ("watch" if call.watch else "list")
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[call.method]


def used(calls: list[Call]) -> dict[tuple[str, str], set[str]]:
    """Verbs per (apiGroup, resource[/subresource]) of ``calls``."""
    found: dict[tuple[str, str], set[str]] = {}
    for call in calls:
        if call.resource:
            resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
            found.setdefault((call.group, resource), set()).add(verb(call))
    return found


def granted() -> dict[tuple[str, str], set[str]]:
    """Verbs per (apiGroup, resource) that manifests/rbac.yaml's ClusterRole grants."""
    [role] = [
        obj
        for obj in yaml.safe_load_all((REPO / "manifests" / "rbac.yaml").read_text())
        if obj["kind"] == "ClusterRole"
    ]
    found: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found.setdefault((group, resource), set()).update(rule["verbs"])
    return found


def _drive_every_path(cluster: Cluster) -> None:
    for name, launcher in launchers.LAUNCHERS.items():
        job = f"rbac-{name}"
        resource = CHILD_RESOURCES[name]
        cluster.create_job(_job(job, name, spec__prepare={"enabled": True}))
        cluster.status_when(job, "Preparing")
        # Suspended while preparing: the data Job is patched.
        cluster.patch_job(job, {"spec": {"runPolicy": {"suspend": True}}})
        cluster.status_when(job, "Suspended")
        cluster.patch_job(job, {"spec": {"runPolicy": {"suspend": False}}})
        cluster.status_when(job, "Preparing")
        [data_job] = children_of(cluster, job)["batch/v1/jobs"]
        complete = {"conditions": [{"type": "Complete", "status": "True"}]}
        cluster.report("batch/v1/jobs", data_job["metadata"]["name"], complete)
        _running(cluster, job, resource)
        cluster.patch_job(job, {"spec": {"runPolicy": {"suspend": True}}})
        cluster.status_when(job, "Suspended")
        # A training job's name taken by someone else: the operator reads it to find its owner.
        group, version, plural = resource.split("/")
        foreign = render(parse_job(_job(f"{job}-taken", name)))[-1]
        CustomObjectsApi(cluster.api).create_namespaced_custom_object(
            group, version, "default", plural, foreign
        )
        cluster.create_job(_job(f"{job}-taken", name))
        cluster.status_when(f"{job}-taken", "Failed")
        assert launcher.child.plural == plural
    cluster.report(
        CHILD_RESOURCES["pytorchjob"], "rbac-pytorchjob", {"conditions": [kubeflow_condition("Succeeded")]}
    )
    cluster.status_when("rbac-pytorchjob", "Succeeded")


def test_the_cluster_role_grants_exactly_what_the_operator_calls(cluster: Cluster) -> None:
    _drive_every_path(cluster)

    calls = used(cluster.server.calls)
    grants = granted()

    assert {
        key: verbs - grants.get(key, set()) for key, verbs in calls.items() if verbs - grants.get(key, set())
    } == {}
    unused: dict[tuple[str, str], Any] = {
        key: verbs - calls.get(key, set()) - WITHOUT_A_CALL.get(key, set()) for key, verbs in grants.items()
    }
    assert {key: verbs for key, verbs in unused.items() if verbs} == {}
