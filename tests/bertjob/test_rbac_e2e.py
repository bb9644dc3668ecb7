"""RBAC from the operator's own requests: the chart grants what the operator calls, and nothing more,
in both of its scopes.

The emulator records every request made with the operator's token; these tests drive jobs
through every path that calls the API, for every launcher (PyTorchJob, MPIJob and Trainer v2's
TrainJob: children created, a data Job completed, the child's status mirrored, a spec change that
suspends the child, a name conflict), then compare the verbs used per resource
with the chart's rules:

- every namespace (the session's ``cluster``, ``kopf run --all-namespaces``): the ClusterRole of
  manifests/rbac.yaml, the chart's rendering with default values;
- ``watchNamespaces: [a, b]`` (``kopf run --namespace=a --namespace=b``, this module's own
  operator): each namespace's requests against its Role, the requests that name no namespace
  against the ClusterRole, both rendered by ``helm template``; and no request at all for a job in
  a namespace not listed.

The emulator: a real API server keeps no list of the requests it served to one client (only an
audit log, with a policy and a backend of its own), so the requests compared here are the
emulator's record; that the real server enforces the chart's RBAC on every call of the operator's
is tested in tests/cluster/test_operator.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api, CustomObjectsApi

from bertjob.launchers import registry
from bertjob.render import JOB_LABEL, render
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import REPO
from bertjob_testing.kube_emulator import Call, Cluster, cluster_crds, running_cluster
from tests.bertjob.e2e import CHILD_RESOURCES, trainjob_status
from tests.bertjob.e2e import named_job as _job
from tests.helm_chart import CHART, helm_or_skip
from tests.kubeflow_env import kubeflow_condition

# Granted without a request of the operator's own: the OwnerReferencesPermissionEnforcement
# admission plugin lets only those who may update the owner's finalizers set blockOwnerDeletion.
# And called by the progress endpoint only, which the emulator's operator does not serve (no
# certificate Secret, no pods' tokens): its TokenReviews and pod reads are made against the real
# API server in tests/cluster/test_progress.py.
WITHOUT_A_CALL = {
    ("bertjob.dev", "bertpretrainjobs/finalizers"): {"update"},
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("", "pods"): {"get"},
    # kopf's peering, which the emulator's operator runs without (--standalone): on the real API
    # server in tests/cluster/test_replicas.py.
    ("kopf.dev", "clusterkopfpeerings"): {"create", "list", "watch", "patch"},
}
# A training job's status once it runs: Kubeflow's JobConditions, or a TrainJob's ready node Job.
KUBEFLOW_RUNNING = {"conditions": [kubeflow_condition("Created"), kubeflow_condition("Running")]}
RUNNING = {"trainjob": trainjob_status(ready=1, active=1)}
WATCHED = ("a", "b")
UNWATCHED = "c"

Grants = dict[tuple[str, str], set[str]]


def verb(call: Call) -> str:
    """The RBAC verb of a request."""
    if call.method == "GET":
        return "get" if call.named else ("watch" if call.watch else "list")
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[call.method]


def used(calls: list[Call]) -> Grants:
    """Verbs per (apiGroup, resource[/subresource]) of ``calls``."""
    found: Grants = {}
    for call in calls:
        if call.resource:
            resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
            found.setdefault((call.group, resource), set()).add(verb(call))
    return found


def granted(role: dict[str, Any]) -> Grants:
    """Verbs per (apiGroup, resource) that a Role or ClusterRole grants."""
    found: Grants = {}
    for rule in role["rules"]:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found.setdefault((group, resource), set()).update(rule["verbs"])
    return found


def assert_exactly(calls: Grants, grants: Grants) -> None:
    """Every verb called is granted, and every verb granted is called (or in WITHOUT_A_CALL)."""
    missing = {key: verbs - grants.get(key, set()) for key, verbs in calls.items()}
    assert {key: verbs for key, verbs in missing.items() if verbs} == {}, "called but not granted"
    unused = {
        key: verbs - calls.get(key, set()) - WITHOUT_A_CALL.get(key, set()) for key, verbs in grants.items()
    }
    assert {key: verbs for key, verbs in unused.items() if verbs} == {}, "granted but never called"


def _phase(cluster: Cluster, name: str, phase: str, namespace: str) -> None:
    cluster.wait_for(
        f"{namespace}/{name} to be {phase}",
        lambda: (cluster.job(name, namespace).get("status") or {}).get("phase") == phase,
    )


def _all_reach(cluster: Cluster, names: dict[str, str], phase: str) -> None:
    for namespace, name in names.items():
        _phase(cluster, name, phase, namespace)


def _suspend(cluster: Cluster, names: dict[str, str], suspend: bool) -> None:
    for namespace, name in names.items():
        cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": suspend}}}, namespace)


def _drive_every_path(cluster: Cluster, namespaces: tuple[str, ...]) -> None:
    """Each step for a job in every namespace before waiting for any, so that two namespaces take
    about as long as one."""
    for name, launcher in registry.LAUNCHERS.items():
        resource = CHILD_RESOURCES[name]
        jobs = {namespace: f"rbac-{name}" for namespace in namespaces}
        for namespace, job in jobs.items():
            cluster.create_job(_job(job, name, spec__prepare={"enabled": True}), namespace)
        _all_reach(cluster, jobs, "Preparing")
        # Suspended while preparing: the data Job is patched.
        _suspend(cluster, jobs, True)
        _all_reach(cluster, jobs, "Suspended")
        _suspend(cluster, jobs, False)
        _all_reach(cluster, jobs, "Preparing")
        complete = {"conditions": [{"type": "Complete", "status": "True"}]}
        for namespace, job in jobs.items():
            [data_job] = [
                obj
                for obj in cluster.stored("batch/v1/jobs", namespace)
                if (obj["metadata"].get("labels") or {}).get(JOB_LABEL) == job
            ]
            cluster.report("batch/v1/jobs", data_job["metadata"]["name"], complete, namespace)
        _all_reach(cluster, jobs, "Pending")
        running = RUNNING.get(name, KUBEFLOW_RUNNING)
        for namespace, job in jobs.items():
            cluster.report(resource, job, running, namespace)
        _all_reach(cluster, jobs, "Running")
        _suspend(cluster, jobs, True)
        _all_reach(cluster, jobs, "Suspended")
        # A training job's name taken by someone else: the operator reads it to find its owner.
        group, version, plural = resource.split("/")
        taken = {namespace: f"{job}-taken" for namespace, job in jobs.items()}
        for namespace, job in taken.items():
            document = _job(job, name, metadata__namespace=namespace)
            foreign = render(parse_job(document))[-1]
            CustomObjectsApi(cluster.api).create_namespaced_custom_object(
                group, version, namespace, plural, foreign
            )
            cluster.create_job(document, namespace)
        _all_reach(cluster, taken, "Failed")
        assert launcher.child.plural == plural
    succeeded = {"conditions": [kubeflow_condition("Succeeded")]}
    for namespace in namespaces:
        cluster.report(CHILD_RESOURCES["pytorchjob"], "rbac-pytorchjob", succeeded, namespace)
    _all_reach(cluster, dict.fromkeys(namespaces, "rbac-pytorchjob"), "Succeeded")
    # A failed training job: the operator lists the job's pods to name the one that failed.
    failed = {"conditions": [kubeflow_condition("Failed")]}
    for namespace in namespaces:
        cluster.report(CHILD_RESOURCES["mpijob"], "rbac-mpijob", failed, namespace)
    _all_reach(cluster, dict.fromkeys(namespaces, "rbac-mpijob"), "Failed")


def test_the_cluster_role_grants_exactly_what_the_operator_calls(cluster: Cluster) -> None:
    _drive_every_path(cluster, ("default",))

    [role] = [
        obj
        for obj in yaml.safe_load_all((REPO / "manifests" / "rbac.yaml").read_text())
        if obj and obj["kind"] == "ClusterRole"
    ]
    assert_exactly(used(cluster.server.calls), granted(role))


# --- The chart's namespaced scope -------------------------------------------------------------


@pytest.fixture(scope="module")
def chart_rbac() -> list[dict[str, Any]]:
    """The chart's RBAC objects with ``watchNamespaces: [a, b]``."""
    rendered = subprocess.run(
        [
            helm_or_skip(),
            "template",
            "bertjob",
            str(CHART),
            "--namespace=bertjob-system",
            "--show-only=templates/rbac.yaml",
            f"--set-json=watchNamespaces={json.dumps(list(WATCHED))}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [obj for obj in yaml.safe_load_all(rendered) if obj]


@pytest.fixture(scope="module")
def namespaced_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The emulator with namespaces a, b and c, and an operator serving a and b only."""
    crds = cluster_crds()
    with running_cluster(tmp_path_factory.mktemp("namespaced"), crds, namespaces=WATCHED) as running:
        for namespace in (*WATCHED, UNWATCHED):
            CoreV1Api(running.api).create_namespace({"metadata": {"name": namespace}})
        yield running


def test_the_namespaced_roles_grant_exactly_what_the_operator_calls_in_each_namespace(
    namespaced_cluster: Cluster, chart_rbac: list[dict[str, Any]]
) -> None:
    cluster = namespaced_cluster
    cluster.create_job(_job("not-served", "pytorchjob"), UNWATCHED)

    _drive_every_path(cluster, WATCHED)

    calls = cluster.server.calls
    assert {call.namespace for call in calls} == {None, *WATCHED}
    # The release namespace's Role is the progress endpoint's certificate's (not called here).
    roles = {
        obj["metadata"]["namespace"]: obj
        for obj in chart_rbac
        if obj["kind"] == "Role" and not obj["metadata"]["name"].endswith("-progress-tls")
    }
    assert sorted(roles) == sorted(WATCHED)
    for namespace in WATCHED:
        in_namespace = [call for call in calls if call.namespace == namespace]
        assert_exactly(used(in_namespace), granted(roles[namespace]))
    [cluster_role] = [obj for obj in chart_rbac if obj["kind"] == "ClusterRole"]
    assert_exactly(used([call for call in calls if call.namespace is None]), granted(cluster_role))
    # The job outside the scope was never touched: no status, no children.
    assert "status" not in cluster.job("not-served", UNWATCHED)
    assert not cluster.stored("v1/configmaps", UNWATCHED)
