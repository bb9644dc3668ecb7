"""The lifecycle end to end: data Job, suspend/resume, spec changes, deletion, operator restart.

Same harness as test_handlers_e2e.py: the session's ``cluster`` runs `kopf run` against kmock's
emulator, and the test plays Kubeflow's operators and the Job controller by patching status.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi

from bertjob_api.spec import GROUP, PLURAL, VERSION
from bertjob_testing.kube_emulator import Cluster
from tests.bertjob.e2e import CHILD_RESOURCES, LAUNCHERS, PYTORCHJOBS, children_of
from tests.bertjob.e2e import named_job as _job
from tests.kubeflow_env import kubeflow_condition


def _running(cluster: Cluster, name: str, resource: str = PYTORCHJOBS) -> None:
    cluster.status_when(name, "Pending")
    running = [kubeflow_condition("Created"), kubeflow_condition("Running")]
    cluster.report(resource, name, {"conditions": running})
    cluster.status_when(name, "Running")


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    [found] = [c for c in status["conditions"] if c["type"] == type_]
    return found


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_suspend_and_resume_reach_the_child(cluster: Cluster, launcher: str) -> None:
    name, resource = f"pausing-{launcher}", CHILD_RESOURCES[launcher]
    cluster.create_job(_job(name, launcher))
    _running(cluster, name, resource)

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": True}}})
    status = cluster.status_when(name, "Suspended")

    assert _condition(status, "Suspended")["status"] == "True"
    assert status["observedGeneration"] == 2
    child = cluster.wait_for(
        "the child suspended",
        lambda: (c := cluster.object(resource, name)) and c["spec"]["runPolicy"]["suspend"] and c,
    )
    assert child["spec"]["runPolicy"]["suspend"] is True
    # Kubeflow's operator has not caught up yet and still says Running: the job stays Suspended.
    cluster.report(
        resource, name, {"conditions": [kubeflow_condition("Created"), kubeflow_condition("Running")]}
    )
    cluster.report(resource, name, {"conditions": [kubeflow_condition("Suspended")]})
    assert cluster.status_when(name, "Suspended")

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": False}}})
    cluster.status_when(name, "Pending")
    assert cluster.object(resource, name)["spec"]["runPolicy"]["suspend"] is False  # type: ignore[index]
    cluster.report(
        resource,
        name,
        {"conditions": [kubeflow_condition("Suspended", "False"), kubeflow_condition("Running")]},
    )
    status = cluster.status_when(name, "Running")
    reasons = cluster.reasons_when(name, lambda reasons: reasons.count("Running") >= 2)
    assert reasons.count("Suspended") == 1 and reasons.count("Running") == 2


def test_a_spec_change_while_running_applies_only_what_is_safe(cluster: Cluster) -> None:
    cluster.create_job(_job("changed"))
    _running(cluster, "changed")
    image_before = cluster.object(PYTORCHJOBS, "changed")

    cluster.patch_job("changed", {"spec": {"image": "evil:latest", "runPolicy": {"backoffLimit": 7}}})

    status = cluster.wait_for(
        "SpecChangeRefused",
        lambda: (s := cluster.job("changed")["status"]).get("observedGeneration") == 2 and s,
    )
    refused = _condition(status, "SpecChangeRefused")
    assert (refused["status"], refused["reason"]) == ("True", "UnsafeChange")
    assert "spec.image" in refused["message"] and "backoffLimit" not in refused["message"]
    assert status["phase"] == "Running"
    child = cluster.wait_for(
        "backoffLimit on the child",
        lambda: (
            (c := cluster.object(PYTORCHJOBS, "changed"))
            and c["spec"]["runPolicy"].get("backoffLimit") == 7
            and c
        ),
    )
    assert "evil:latest" not in str(child) and image_before is not None
    cluster.wait_for(
        "a SpecChangeRefused warning naming spec.image",
        lambda: [
            e
            for e in cluster.events("changed")
            if e["reason"] == "SpecChangeRefused" and "spec.image" in e["message"]
        ],
    )

    # Undoing the refused change, with a safe one, clears the condition.
    cluster.patch_job(
        "changed", {"spec": {"image": "ghcr.io/bertjob/trainer:0.1.0", "runPolicy": {"backoffLimit": 3}}}
    )
    status = cluster.wait_for(
        "the change applied",
        lambda: (s := cluster.job("changed")["status"]).get("observedGeneration") == 3 and s,
    )
    assert (_condition(status, "SpecChangeRefused")["status"], status["phase"]) == ("False", "Running")


def test_an_invalid_change_is_refused_whole(cluster: Cluster) -> None:
    cluster.create_job(_job("invalid-change"))
    cluster.status_when("invalid-change", "Pending")

    cluster.patch_job(
        "invalid-change", {"spec": {"topology": {"processesPerNode": 3}, "runPolicy": {"backoffLimit": 2}}}
    )

    status = cluster.wait_for(
        "the refusal",
        lambda: (s := cluster.job("invalid-change")["status"]).get("observedGeneration") == 2 and s,
    )
    assert "spec.phases[0].globalBatchSize" in _condition(status, "SpecChangeRefused")["message"]
    assert "backoffLimit" not in cluster.object(PYTORCHJOBS, "invalid-change")["spec"]["runPolicy"]  # type: ignore[index]


def test_a_spec_fixed_after_failing_is_rendered_again(cluster: Cluster) -> None:
    cluster.create_job(_job("fixed", spec__topology__processesPerNode=3))
    cluster.status_when("fixed", "Failed")

    cluster.patch_job("fixed", {"spec": {"topology": {"processesPerNode": 2}}})

    status = cluster.status_when("fixed", "Pending")
    # The failure's conditions gone (its kstatus Stalled too), the new children's in their place.
    assert [c["type"] for c in status["conditions"]] == ["Created", "Ready", "Reconciling"]
    assert "completionTime" not in status and status["observedGeneration"] == 2
    assert set(children_of(cluster, "fixed")) >= {"v1/configmaps", PYTORCHJOBS}


def test_the_trainers_progress_is_never_overwritten(cluster: Cluster) -> None:
    cluster.create_job(_job("progressing"))
    cluster.status_when("progressing", "Pending")
    progress = {"phase": 1, "step": 50, "totalSteps": 100, "loss": 6.5, "updateTime": "2026-01-01T00:00:00Z"}
    cluster.report(f"{GROUP}/{VERSION}/{PLURAL}", "progressing", {"progress": progress})

    _running(cluster, "progressing")
    cluster.patch_job("progressing", {"spec": {"runPolicy": {"suspend": True}}})
    status = cluster.status_when("progressing", "Suspended")

    assert status["progress"] == progress


def test_deleting_the_job_deletes_every_child(cluster: Cluster) -> None:
    job = cluster.create_job(_job("deleted"))
    cluster.status_when("deleted", "Pending")
    children = children_of(cluster, "deleted")
    assert all(
        [ref.get("uid") for ref in obj["metadata"]["ownerReferences"] if ref.get("controller")]
        == [job["metadata"]["uid"]]
        for objects in children.values()
        for obj in objects
    )

    CustomObjectsApi(cluster.api).delete_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "deleted"
    )

    cluster.wait_for("the children gone", lambda: children_of(cluster, "deleted") == {})
    assert cluster.operator is not None and cluster.operator.poll() is None


def test_the_data_job_runs_before_the_training_job(cluster: Cluster) -> None:
    cluster.create_job(_job("prepared", spec__prepare={"enabled": True}))

    status = cluster.status_when("prepared", "Preparing")
    children = children_of(cluster, "prepared")
    assert PYTORCHJOBS not in children and len(children["batch/v1/jobs"]) == 1
    [data_job] = children["batch/v1/jobs"]
    assert [c["kind"] for c in status["children"]] == ["Job"]
    # A safe change made while the data is prepared reaches the training job created afterwards.
    cluster.patch_job("prepared", {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 600}}})
    cluster.wait_for(
        "the change to be observed",
        lambda: cluster.job("prepared")["status"].get("observedGeneration") == 2,
    )

    cluster.report(
        "batch/v1/jobs",
        data_job["metadata"]["name"],
        {"conditions": [{"type": "Complete", "status": "True"}]},
    )

    status = cluster.status_when("prepared", "Pending")
    assert [c["kind"] for c in status["children"]] == ["Job", "PyTorchJob"]
    assert _condition(status, "Prepared")["status"] == "True"
    [training] = children_of(cluster, "prepared")[PYTORCHJOBS]
    assert training["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 600


def test_a_failed_data_job_fails_the_job(cluster: Cluster) -> None:
    cluster.create_job(_job("unprepared", spec__prepare={"enabled": True}))
    cluster.status_when("unprepared", "Preparing")
    [data_job] = children_of(cluster, "unprepared")["batch/v1/jobs"]

    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": "out of retries",
    }
    cluster.report("batch/v1/jobs", data_job["metadata"]["name"], {"conditions": [failed]})

    status = cluster.status_when("unprepared", "Failed")
    assert _condition(status, "Failed")["reason"] == "PrepareFailed"
    assert "BackoffLimitExceeded" in _condition(status, "Failed")["message"]
    assert PYTORCHJOBS not in children_of(cluster, "unprepared")


def test_an_operator_restart_adopts_the_children_without_duplicates(cluster: Cluster) -> None:
    cluster.create_job(_job("restarted"))
    cluster.create_job(_job("restarted-running"))
    _running(cluster, "restarted-running")
    cluster.status_when("restarted", "Pending")
    before = children_of(cluster, "restarted")

    cluster.stop()
    # While the operator is away, the child finishes and a new job arrives.
    cluster.report(PYTORCHJOBS, "restarted-running", {"conditions": [kubeflow_condition("Succeeded")]})
    cluster.create_job(_job("while-away"))
    cluster.start()

    cluster.status_when("restarted-running", "Succeeded")
    cluster.status_when("while-away", "Pending")
    cluster.report(PYTORCHJOBS, "restarted", {"conditions": [kubeflow_condition("Running")]})
    cluster.status_when("restarted", "Running")
    for name in ("restarted", "restarted-running", "while-away"):
        counts = {resource: len(found) for resource, found in children_of(cluster, name).items()}
        assert counts and set(counts.values()) == {1}, (name, counts)
    assert children_of(cluster, "restarted").keys() == before.keys()


def test_metrics_and_readiness_are_served(cluster: Cluster) -> None:
    cluster.create_job(_job("measured"))
    cluster.create_job(_job("measured-bad", spec__topology__processesPerNode=3))
    cluster.status_when("measured", "Pending")
    cluster.status_when("measured-bad", "Failed")

    with urllib.request.urlopen(f"{cluster.metrics}/readyz", timeout=5) as ready:
        assert ready.status == 200

    def scrape() -> str | None:
        with urllib.request.urlopen(f"{cluster.metrics}/metrics", timeout=5) as response:
            text = response.read().decode()
        wanted = ('bertjob_jobs{phase="Pending"}', 'bertjob_reconcile_errors_total{error="permanent"')
        return text if all(metric in text for metric in wanted) else None

    text = cluster.wait_for("the metrics", scrape)
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(samples['bertjob_jobs{phase="Pending"}']) >= 1
    assert float(samples['bertjob_reconcile_duration_seconds_count{handler="create"}']) >= 1
    assert float(samples['bertjob_jobs{phase="Failed"}']) >= 1
    assert float(samples['bertjob_reconcile_errors_total{error="permanent",handler="create"}']) >= 1


def _refused_at(cluster: Cluster, name: str, generation: int) -> dict[str, Any]:
    """The job's status once the spec change of ``generation`` has been refused."""
    return cluster.wait_for(
        f"the refusal of generation {generation}",
        lambda: (
            (s := cluster.job(name)["status"]).get("observedGeneration") == generation
            and _condition(s, "SpecChangeRefused")["status"] == "True"
            and s
        ),
    )


# A change that suspends (or resumes) the job and makes the spec invalid: refused whole.
INVALID_WITH_SUSPEND = "spec.topology.processesPerNode"


@pytest.mark.parametrize("suspend", [True, False], ids=["suspend", "resume"])
def test_an_invalid_change_neither_suspends_nor_resumes_the_training_job(
    cluster: Cluster, suspend: bool
) -> None:
    name = f"invalid-{'suspend' if suspend else 'resume'}"
    cluster.create_job(_job(name, spec__runPolicy={"suspend": not suspend}))
    if suspend:
        _running(cluster, name)
    before = cluster.status_when(name, "Suspended" if not suspend else "Running")

    cluster.patch_job(
        name, {"spec": {"runPolicy": {"suspend": suspend}, "topology": {"processesPerNode": 3}}}
    )

    status = _refused_at(cluster, name, 2)
    assert INVALID_WITH_SUSPEND in _condition(status, "SpecChangeRefused")["message"]
    assert status["phase"] == before["phase"]
    assert [c for c in status["conditions"] if c["type"] == "Suspended"] == [
        c for c in before["conditions"] if c["type"] == "Suspended"
    ]
    assert cluster.object(PYTORCHJOBS, name)["spec"]["runPolicy"]["suspend"] is (not suspend)  # type: ignore[index]
    # A later report of the child does not pick up the refused suspend either.
    cluster.report(
        PYTORCHJOBS, name, {"conditions": [kubeflow_condition("Created"), kubeflow_condition("Running")]}
    )
    expected = "Running" if suspend else "Suspended"
    cluster.wait_for(
        "the child's report to be mirrored",
        lambda: any(c["type"] == "Running" for c in cluster.job(name)["status"]["conditions"]),
    )
    assert cluster.job(name)["status"]["phase"] == expected


@pytest.mark.parametrize("suspend", [True, False], ids=["suspend", "resume"])
def test_an_invalid_change_neither_suspends_nor_resumes_the_data_job(cluster: Cluster, suspend: bool) -> None:
    name = f"invalid-prepare-{'suspend' if suspend else 'resume'}"
    cluster.create_job(_job(name, spec__prepare={"enabled": True}, spec__runPolicy={"suspend": not suspend}))
    before = cluster.status_when(name, "Preparing" if suspend else "Suspended")
    [data_job] = children_of(cluster, name)["batch/v1/jobs"]
    assert data_job["spec"]["suspend"] is (not suspend)

    cluster.patch_job(
        name, {"spec": {"runPolicy": {"suspend": suspend}, "topology": {"processesPerNode": 3}}}
    )

    status = _refused_at(cluster, name, 2)
    assert status["phase"] == before["phase"]
    [data_job] = children_of(cluster, name)["batch/v1/jobs"]
    assert data_job["spec"]["suspend"] is (not suspend)


def test_a_refused_change_does_not_reach_the_training_job_created_later(cluster: Cluster) -> None:
    name = "refused-then-prepared"
    cluster.create_job(_job(name, spec__prepare={"enabled": True}))
    cluster.status_when(name, "Preparing")
    cluster.patch_job(
        name,
        {"spec": {"topology": {"processesPerNode": 3}, "runPolicy": {"suspend": True, "backoffLimit": 9}}},
    )
    _refused_at(cluster, name, 2)
    [data_job] = children_of(cluster, name)["batch/v1/jobs"]

    cluster.report(
        "batch/v1/jobs",
        data_job["metadata"]["name"],
        {"conditions": [{"type": "Complete", "status": "True"}]},
    )

    status = cluster.status_when(name, "Pending")
    assert [c["kind"] for c in status["children"]] == ["Job", "PyTorchJob"]
    [training] = children_of(cluster, name)[PYTORCHJOBS]
    assert training["spec"]["runPolicy"]["suspend"] is False
    assert training["spec"]["runPolicy"].get("backoffLimit") != 9
