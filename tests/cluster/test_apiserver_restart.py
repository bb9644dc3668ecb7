"""The operator's API server restarted while jobs change elsewhere, and etcd compacted meanwhile, on
the real control plane: once its API server is back, the operator re-lists and loses nothing (a job
created, changed or deleted, and a child whose status changed, while it was away are each handled)
and duplicates nothing (one child per job, created once).

What a real cluster does that this reproduces: an HA control plane runs several API servers over
one etcd, and they restart one at a time (an upgrade, a crash, a node drained); the other servers
take writes meanwhile. The API server compacts etcd every 5 minutes by default
(``--etcd-compaction-interval``), so an operator whose server was away for longer resumes its
watches from a resourceVersion etcd no longer holds. A restarted server's watch cache starts at the
current revision too: either way it answers the watch with 410 Gone ("too old resource version"),
and kopf must list again (``kopf._cogs.clients.watching.continuous_watch``) rather than resume.
Here the operator's API server is stopped (SIGTERM), a second one over the same etcd (same CA,
service-account keys and issuer; no audit log of its own, so the audit log is the operator's
server's alone) takes the changes, etcd is compacted past every revision the operator saw, and the
operator's server starts again where the operator's kubeconfig points. kopf logs its re-list only
at debug level, so the re-list is read from the audit log instead: after the return, a watch from
a compacted resourceVersion, then a list.

The job whose spec changes while the operator is away changes through the webhook, which the
operator serves: it reads the job's ConfigMap to judge the change, cannot reach its own API server,
and judges the change against the old object instead (before this test it refused every change,
the refused connection not being the API error it fell back on).

Why kwok: not even kwok: no pod needs to run, no controller either (etcd and two API servers only).
The jobs' children are checked as stored objects; their status is written as Kubeflow's training
operator writes it. A deleted job's children are the garbage collector's (tests/cluster/
test_namespace_deleted.py), not the operator's, so no controller-manager runs here.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bertjob.handlers import STORAGE_PREFIX
from bertjob.monitoring import JOBS_RESYNC_ENV
from bertjob_api.contract import PLURAL
from bertjob_testing.cluster.components.apiserver import AUDIT_LOG, APIServer
from bertjob_testing.cluster.components.etcd import Etcd
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.kubectl import Kubectl
from bertjob_testing.cluster.operator import (
    NAMESPACE,
    OPERATOR,
    RealCluster,
    install,
    wait_until,
)
from tests.bertjob.e2e import named_job
from tests.cluster.test_operator import forbidden
from tests.kubeflow_env import kubeflow_condition

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

JOBS_NAMESPACE = "restart"
# The operator's service account, as the API server names it (the chart's Deployment runs as it).
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{OPERATOR}"
SECOND = "kube-apiserver-2"
# Jobs from before the outage: one left alone, one whose child reports Running while the operator
# is away, one suspended and one deleted meanwhile; and two created meanwhile.
KEPT, FOLLOWED, SUSPENDED, DELETED = "kept", "followed", "suspended", "deleted"
BEFORE = (KEPT, FOLLOWED, SUSPENDED, DELETED)
CREATED = ("new-0", "new-1")
HANDLED = "last-handled-configuration"
WAIT_S = 60.0
# The gauge follows the events the phases came with, and forgets the job deleted meanwhile at the
# next resync (every 2 s here): a few seconds at most.
GAUGE_WAIT_S = 5.0
# What each job's phase is once the operator has handled what happened while it was away.
WANTED = {KEPT: "Pending", FOLLOWED: "Running", SUSPENDED: "Suspended", **dict.fromkeys(CREATED, "Pending")}
# kopf's line for a request it tries again (kopf._cogs.clients.api.request): while its API server
# is away (connection refused) or starting (403 before its RBAC caches fill, 503), and for a while
# once it is ready (429 "storage is (re)initializing", with a Retry-After, until the custom
# resources' storage is up).
RETRIED = "will retry: "
WAIT_AND_RETRY = "TooManyRequests"


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealCluster, APIServer]]:
    """etcd, the operator's API server and a second one over the same etcd; the chart installed and
    the operator running against the first."""
    workdir = tmp_path_factory.mktemp("apiserver-restart")
    plane = ControlPlane(workdir / "plane")
    try:
        plane.start(api_only=True)
        # bertjob_jobs recounted from lists every 2 s instead of 60: kopf's re-list sends no DELETED
        # event for the job deleted while the operator was away (bertjob.monitoring.start_resync).
        cluster = install(plane, workdir, env={JOBS_RESYNC_ENV: "2"})
        try:
            second = plane.start_apiserver(SECOND, issuer=plane.server, audit=False)
            yield cluster, second
        finally:
            cluster.stop()
    finally:
        plane.stop()


def _etcd(plane: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to etcd's JSON gateway (``/v3/kv/...``); its answer, or its error as JSON.

    Raises:
        urllib.error.URLError: etcd could not be reached.
    """
    etcd = plane.components["etcd"]
    assert isinstance(etcd, Etcd)
    request = urllib.request.Request(
        f"{etcd.url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return json.loads(error.read())


def _revision(plane: ControlPlane) -> int:
    """etcd's current revision (a Kubernetes resourceVersion is one)."""
    return int(_etcd(plane, "/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})["header"]["revision"])


def _job(kubectl: Kubectl, name: str) -> dict[str, Any] | None:
    return kubectl.get(PLURAL, name, "-n", JOBS_NAMESPACE)


def _settled(kubectl: Kubectl, name: str, phase: str) -> dict[str, Any] | None:
    """Job ``name`` once its phase is ``phase``, its Events posted and kopf's record of the
    handled spec written (nothing of the operator's left in flight); None before."""
    job = _job(kubectl, name)
    status = (job or {}).get("status") or {}
    annotations = (job or {}).get("metadata", {}).get("annotations") or {}
    done = status.get("phase") == phase and not status.get("pendingEvents")
    return job if done and f"{STORAGE_PREFIX}/{HANDLED}" in annotations else None


def _audit_lines(plane: ControlPlane) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (plane.workdir / AUDIT_LOG).read_text().splitlines()]


def _operator_reads(events: list[dict[str, Any]], resource: str) -> list[tuple[str, int]]:
    """The operator's cluster-wide lists and watches of ``resource`` in ``events`` (audit events),
    in order: (verb, the resourceVersion it asked from; 0 for none), one per request. kopf watches
    every namespace here (``--all-namespaces``); the gauge's resync lists one namespace at a time
    (bertjob.monitoring.resync), which is not kopf's re-list and is left out."""
    found, requests = [], set()
    for event in events:
        target = event.get("objectRef") or {}
        # A watch has two events (ResponseStarted, ResponseComplete), a list one: the first counts.
        if (
            event.get("user", {}).get("username") == OPERATOR_USER
            and target.get("resource") == resource
            and event.get("verb") in ("list", "watch")
            and not target.get("namespace")
            and event["auditID"] not in requests
        ):
            requests.add(event["auditID"])
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(event["requestURI"]).query)
            found.append((event["verb"], int(query.get("resourceVersion", ["0"])[0])))
    return found


def _jobs_gauge(cluster: RealCluster) -> dict[str, float]:
    """The operator's ``bertjob_jobs{phase}`` samples, by phase, the zeros left out."""
    with urllib.request.urlopen(f"{cluster.metrics}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("bertjob_jobs{"):
            labels, value = line.rsplit(" ", 1)
            if float(value):
                samples[labels.split('"')[1]] = float(value)
    return samples


@dataclass
class Outage:
    """What the outage left, once every job was handled after the return."""

    cluster: RealCluster
    plane: ControlPlane
    # etcd's revision when the operator's server stopped (every one it saw is at most that), the
    # revision compacted to, and etcd's answer to a read at the first.
    seen: int
    compacted: int
    refused: dict[str, Any]
    outage_s: float
    # Seconds from the return until every job was handled; None: not within WAIT_S.
    handled_s: float | None
    # The audit events of the operator's API server since it started again.
    audited: list[dict[str, Any]]
    # The operator's log lines from its API server's stop until it was ready again, and since.
    away: list[str]
    since_ready: list[str]


@pytest.fixture(scope="module")
def outage(ha: tuple[RealCluster, APIServer]) -> Outage:
    """Four jobs handled; the operator's API server stopped; two jobs created, one suspended, one
    deleted and a child's status changed through the second server; etcd compacted; the operator's
    server started again on its port; every job handled."""
    cluster, second = ha
    plane = cluster.plane
    assert plane is not None
    # Where the operator's kubeconfig points: the server comes back there.
    port = urllib.parse.urlsplit(plane.server).port
    assert port is not None
    other = plane.admin_kubectl(second.url, plane.workdir / f"{SECOND}.kubeconfig")
    plane.kubectl("create", "namespace", JOBS_NAMESPACE)
    for name in BEFORE:
        plane.kubectl.apply(named_job(name), "-n", JOBS_NAMESPACE)
    for name in BEFORE:
        wait_until(f"{name} Pending", lambda n=name: _settled(plane.kubectl, n, "Pending"), WAIT_S)
    seen = _revision(plane)

    log_away = len(cluster.log.read_text().splitlines())
    stopped = time.monotonic()
    plane.stop_component(APIServer.name)
    for name in CREATED:
        other.apply(named_job(name), "-n", JOBS_NAMESPACE)
    suspend = {"spec": {"runPolicy": {"suspend": True}}}
    other("patch", PLURAL, SUSPENDED, "-n", JOBS_NAMESPACE, "--type=merge", "-p", json.dumps(suspend))
    other("delete", PLURAL, DELETED, "-n", JOBS_NAMESPACE, "--wait=false")
    running = {"status": {"conditions": [kubeflow_condition("Created"), kubeflow_condition("Running")]}}
    patch = ["--subresource=status", "--type=merge", "-p", json.dumps(running)]
    other("patch", "pytorchjob", FOLLOWED, "-n", JOBS_NAMESPACE, *patch)
    compacted = _revision(plane)
    answer = _etcd(plane, "/v3/kv/compaction", {"revision": str(compacted), "physical": True})
    assert "error" not in answer, answer
    refused = _etcd(plane, "/v3/kv/range", {"key": base64.b64encode(b"\0").decode(), "revision": str(seen)})

    audited_before = len(_audit_lines(plane))
    plane.start_apiserver(APIServer.name, port=port)
    back = time.monotonic()
    log_ready = len(cluster.log.read_text().splitlines())
    # Not a failure here: the tests say what was not handled.
    handled_s = None
    while handled_s is None and time.monotonic() < back + WAIT_S:
        if all(_settled(plane.kubectl, name, phase) for name, phase in WANTED.items()):
            handled_s = time.monotonic() - back
        time.sleep(0.2)
    log = cluster.log.read_text().splitlines()
    handled = f"{handled_s:.1f} s" if handled_s is not None else f"not {WAIT_S:.0f} s"
    print(
        f"\nthe operator's API server away {back - stopped:.1f} s, {plane.timings[APIServer.name]:.1f} s "
        f"of it starting again (etcd compacted from revision {seen} to {compacted}); every job handled "
        f"{handled} after its return"
    )
    return Outage(
        cluster,
        plane,
        seen,
        compacted,
        refused,
        back - stopped,
        handled_s,
        _audit_lines(plane)[audited_before:],
        log[log_away:log_ready],
        log[log_ready:],
    )


def test_the_operator_re_lists_from_a_compacted_revision_when_its_api_server_returns(outage: Outage) -> None:
    assert outage.compacted > outage.seen
    assert "compacted" in outage.refused.get("error", outage.refused.get("message", "")), outage.refused
    # A watch from a revision before the compaction (answered 410 Gone), then a list.
    reads = _operator_reads(outage.audited, PLURAL)
    resumed = [i for i, (verb, since) in enumerate(reads) if verb == "watch" and 0 < since < outage.compacted]
    assert resumed, f"no watch of {PLURAL} from a compacted revision after the return: {reads}"
    assert any(verb == "list" for verb, _ in reads[resumed[0] + 1 :]), f"no list after the 410: {reads}"


def test_what_changed_while_the_operator_was_away_reaches_the_children_and_the_jobs(outage: Outage) -> None:
    kubectl = outage.plane.kubectl
    # The phases: the new jobs Pending, the child's Running followed, the suspension applied.
    phases = {name: ((_job(kubectl, name) or {}).get("status") or {}).get("phase") for name in WANTED}
    assert phases == WANTED, f"{WAIT_S:.0f} s after the return"
    assert outage.handled_s is not None, "the phases right, not every job settled (Events, kopf's record)"
    child = kubectl.get("pytorchjob", SUSPENDED, "-n", JOBS_NAMESPACE)
    assert child["spec"]["runPolicy"].get("suspend") is True, child["spec"]["runPolicy"]
    assert _job(kubectl, DELETED) is None
    jobs = kubectl.get(PLURAL, "-A")["items"]
    assert not [job["metadata"]["name"] for job in jobs if job["metadata"].get("finalizers")]


def test_every_job_has_one_child_created_once_by_the_operator(outage: Outage) -> None:
    for name in (*BEFORE, *CREATED):
        creates = [
            event["user"]["username"]
            for event in outage.plane.audited_changes("pytorchjobs", JOBS_NAMESPACE, name)
            if event["verb"] == "create"
        ]
        assert creates == [OPERATOR_USER], (name, creates)
    children = outage.plane.kubectl.get("pytorchjobs", "-A")["items"]
    owners = sorted(ref["name"] for child in children for ref in child["metadata"].get("ownerReferences", []))
    # The deleted job's child stays for the garbage collector, which this plane does not run.
    assert owners == sorted((*BEFORE, *CREATED)), owners


def test_the_operator_only_retried_its_requests_while_its_api_server_was_away(outage: Outage) -> None:
    assert not [line for line in outage.away if "Traceback" in line]
    # Away and starting: kopf's requests refused, each tried again, none given up on.
    errors = [line for line in outage.away if "ERROR" in line and RETRIED not in line]
    assert not errors, "\n".join(errors[:20])
    # Ready: only a request the server asked to send again later, tried again; none refused by RBAC.
    errors = [
        line
        for line in outage.since_ready
        if "ERROR" in line and not (RETRIED in line and WAIT_AND_RETRY in line)
    ]
    assert not errors, "\n".join(errors[:20])
    refused = [line for line in forbidden(outage.cluster) if line not in outage.away]
    assert not refused, "\n".join(refused)


def test_the_deleted_job_leaves_the_operators_count_of_jobs(outage: Outage) -> None:
    counted = {"Pending": 3, "Running": 1, "Suspended": 1}
    deadline = time.monotonic() + GAUGE_WAIT_S
    while (gauge := _jobs_gauge(outage.cluster)) != counted and time.monotonic() < deadline:
        time.sleep(0.5)
    assert gauge == counted, f"bertjob_jobs {gauge}; the jobs that exist: {counted}"
