"""The chart's ``watchNamespaces`` install on a real API server: ``helm install`` with
``watchNamespaces: [team-a, team-b]`` makes a Role per listed namespace and a ClusterRole for what
kopf reads cluster-wide (CRDs, namespaces, its peering), gives the webhook a ``namespaceSelector``
of the listed namespaces, and runs kopf with one ``--namespace`` per entry (the operator here runs
as the chart's Deployment would, under its ServiceAccount's token).

Checked on the real server, which enforces the Roles and the selector (tests/bertjob/test_rbac_e2e.py
compares the requests against the rendered RBAC on the emulator, which enforces neither): a job in
each listed namespace gets its PyTorchJob and its status up to Succeeded, and a trainer's progress
report reaches its status; a bad job in team-a is refused at ``kubectl apply`` by the webhook; in
team-c, not listed, the same bad job is stored (the webhook is not called) and no job is touched
(no status, child, finalizer or Event, no annotation and no field manager but kubectl's: kopf keeps
its state in annotations); the ServiceAccount may neither list nor create jobs or PyTorchJobs in
team-c or cluster-wide; the operator's log has no refusal and no traceback.

Why kwok: not even kwok: etcd and the API server alone (no controller, no node). The training
operator's PyTorchJob conditions and pods are written from here, and no pod needs to run: what is
tested is the API server's RBAC and admission with the chart's objects, and what the operator asks
of it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bertjob.render import JOB_LABEL
from bertjob_api.contract import PLURAL, PROGRESS_CA_KEY, PROGRESS_URL_KEY
from bertjob_api.crd import resource_schema
from bertjob_testing import cel
from bertjob_testing.admission_cases import JOB_CASES
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import RealCluster, install, wait_until
from bertpretrain.training.progress import StatusReporter
from tests.bertjob.e2e import named_job
from tests.cluster.test_operator import (
    SERVER_DECIDES,
    _phase,
    _report,
    _stand_in_for_the_training_operator,
    forbidden,
)
from tests.cluster.test_progress import _token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WATCHED = ("team-a", "team-b")
UNWATCHED = "team-c"
WEBHOOK_DENIED = 'admission webhook "bertpretrainjobs.bertjob.dev" denied the request'
# A job that only the webhook refuses (neither the CRD's schema nor its CEL rules): where the
# webhook is not called, the API server stores it.
WEBHOOK_ONLY = next(
    case
    for case in JOB_CASES
    if not case["allowed"]
    and not case["schema"]
    and case["id"] not in SERVER_DECIDES
    and not cel.refusals(case["document"], resource_schema())
)
# What kubectl apply writes of its own; any other manager of a job's fields wrote to it.
KUBECTL_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
KUBECTL_MANAGER = "kubectl-client-side-apply"


@pytest.fixture(scope="module")
def watching(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A private API server with namespaces team-a, team-b and team-c, the chart installed with
    ``watchNamespaces: [team-a, team-b]`` and its operator running."""
    plane = ControlPlane(tmp_path_factory.mktemp("watch-namespaces"))
    try:
        plane.start(api_only=True)
        for namespace in (*WATCHED, UNWATCHED):
            plane.kubectl("create", "namespace", namespace)
            # The controller-manager would make it; the pods of a job need it (ServiceAccount admission).
            plane.kubectl("create", "serviceaccount", "default", "-n", namespace)
        cluster = install(plane, tmp_path_factory.mktemp("operator"), "watchNamespaces={team-a,team-b}")
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        plane.stop()


def _in(namespace: str, document: dict[str, Any]) -> str:
    """``document`` in ``namespace``, as JSON for ``kubectl apply -f -`` (without the uid and
    generation of the admission table's stored documents)."""
    moved = copy.deepcopy(document)
    moved["metadata"] = {
        **{key: value for key, value in moved["metadata"].items() if key not in ("uid", "generation")},
        "namespace": namespace,
    }
    return json.dumps(moved)


def _assert_quiet(cluster: RealCluster) -> None:
    refused = forbidden(cluster)
    assert not refused, "the API server refused the operator:\n" + "\n".join(refused)
    log = cluster.log.read_text()
    assert "Traceback" not in log, cluster.log_tail()


def test_a_job_in_each_watched_namespace_runs_and_reports_progress_under_its_role(
    watching: RealCluster, tmp_path: Path
) -> None:
    plane = watching.plane
    assert plane is not None
    for namespace in WATCHED:
        plane.kubectl("apply", "-n", namespace, "-f", "-", input=_in(namespace, named_job("served")))
    pods = {}
    for namespace in WATCHED:
        status = _phase(watching, namespace, "served", "Pending")
        assert [child["kind"] for child in status["children"]] == ["PyTorchJob"], status
        pods[namespace] = _stand_in_for_the_training_operator(plane, namespace, "served")
        _report(plane, namespace, "served", "Created", "Running")
        _phase(watching, namespace, "served", "Running")

    # A trainer's report from team-a: the operator checks its pod's token (TokenReview, cluster-wide)
    # and reads the pod under team-a's Role.
    config = plane.kubectl.get("configmap", "served-job", "-n", "team-a")["data"]
    ca, token = tmp_path / "ca.crt", tmp_path / "token"
    ca.write_text(config[PROGRESS_CA_KEY])
    token.write_text(_token(plane, "team-a", pods["team-a"][0]))
    reporter = StatusReporter(
        config[PROGRESS_URL_KEY], total_steps=100, token_file=token, ca_file=ca, min_interval_s=0
    )
    assert reporter.report(1, 40, {"loss": 7.25})

    def step() -> Any:
        status = plane.kubectl.get(PLURAL, "served", "-n", "team-a").get("status") or {}
        return (status.get("progress") or {}).get("step")

    wait_until("the report in team-a's job status", lambda: step() == 40)

    for namespace in WATCHED:
        _report(plane, namespace, "served", "Created", "Running", "Succeeded")
        _phase(watching, namespace, "served", "Succeeded")
    _assert_quiet(watching)


def test_a_bad_job_is_refused_in_a_watched_namespace_and_stored_untouched_in_another(
    watching: RealCluster,
) -> None:
    plane = watching.plane
    assert plane is not None
    refused = plane.kubectl(
        "apply", "-n", "team-a", "-f", "-", input=_in("team-a", WEBHOOK_ONLY["document"]), check=False
    )
    assert refused.returncode != 0, f"{WEBHOOK_ONLY['id']} was stored in team-a: {refused.stdout}"
    assert WEBHOOK_DENIED in refused.stderr, refused.stderr
    for field in WEBHOOK_ONLY["fields"]:
        assert field in refused.stderr, f"{field} not named in: {refused.stderr}"

    # Not sent to the webhook in team-c (its namespaceSelector), so stored as the API server takes it.
    stored = plane.kubectl(
        "apply", "-n", UNWATCHED, "-f", "-", input=_in(UNWATCHED, WEBHOOK_ONLY["document"]), check=False
    )
    assert stored.returncode == 0, f"{WEBHOOK_ONLY['id']} refused in {UNWATCHED}: {stored.stderr}"
    plane.kubectl("apply", "-n", UNWATCHED, "-f", "-", input=_in(UNWATCHED, named_job("unserved")))
    # A job in team-a made after them: once it is reconciled, the operator has had its chance at
    # team-c's (one kopf process, a watch per namespace, all started together).
    plane.kubectl("apply", "-n", "team-a", "-f", "-", input=_in("team-a", named_job("after")))
    _phase(watching, "team-a", "after", "Pending")

    for document in (WEBHOOK_ONLY["document"], named_job("unserved")):
        name = document["metadata"]["name"]
        job = plane.kubectl.get(PLURAL, name, "-n", UNWATCHED, "--show-managed-fields")
        assert job is not None, f"{name} not stored in {UNWATCHED}"
        assert not job.get("status"), f"the operator wrote {name}'s status: {job['status']}"
        meta = job["metadata"]
        added = set(meta.get("annotations", {})) - set(document["metadata"].get("annotations", {}))
        assert added <= {KUBECTL_ANNOTATION}, f"annotations on {name} not applied: {added}"
        assert not meta.get("finalizers"), meta
        assert {field["manager"] for field in meta["managedFields"]} == {KUBECTL_MANAGER}, meta
    for kind in ("configmaps", "pytorchjobs"):
        children = plane.kubectl.get(kind, "-n", UNWATCHED, "-l", JOB_LABEL)["items"]
        assert not children, f"children in {UNWATCHED}: {[child['metadata']['name'] for child in children]}"
    assert not plane.kubectl.get("events", "-n", UNWATCHED)["items"], plane.kubectl.events(UNWATCHED)
    _assert_quiet(watching)


@pytest.mark.parametrize("resource", ["bertpretrainjobs.bertjob.dev", "pytorchjobs.kubeflow.org"])
def test_the_service_account_is_granted_in_the_watched_namespaces_only(
    watching: RealCluster, resource: str
) -> None:
    """Asked as the operator's own token (a SelfSubjectAccessReview of the chart's ServiceAccount)."""
    plane = watching.plane
    assert plane is not None

    def can(verb: str, *scope: str) -> str:
        # can-i exits 1 for "no".
        result = plane.kubectl(
            "auth", "can-i", verb, resource, *scope, kubeconfig=watching.operator_config, check=False
        )
        return result.stdout.strip()

    # Jobs are never created by the operator, anywhere.
    granted = ("list", "create") if resource.startswith("pytorchjobs") else ("list",)
    for namespace in WATCHED:
        for verb in granted:
            assert can(verb, "-n", namespace) == "yes", f"{verb} {resource} in {namespace}"
    for verb in ("list", "create"):
        assert can(verb, "-n", UNWATCHED) == "no", f"{verb} {resource} in {UNWATCHED}"
        assert can(verb, "--all-namespaces") == "no", f"{verb} {resource} cluster-wide"
