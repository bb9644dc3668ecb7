"""The lifecycle end to end on the real control plane: data Job, suspend/resume, spec changes,
deletion, operator restart.

Same harness as test_handlers_e2e.py: the chart's operator (tests/cluster/conftest.py), each test
in a namespace of its own; the test plays Kubeflow's operators by patching the training job's
status subresource, which the real server holds to the upstream CRD's schema. The data Job is run
by the real Job controller: its pod runs on a kwok node and the test ends it with an exit code.

What the real server changes here: the chart's webhook refuses, at ``kubectl apply``, a change
that the operator would refuse, and (failurePolicy: Fail) any job created while the operator is
away; CEL refuses an indivisible batch at create and at update. The tests of the operator's own
refusals after the fact (a job's status and Events) run in a namespace the webhook does not serve
(``unguarded``), as on a cluster with the chart's default, the webhook off; their invalid spec is
one that only the operator refuses (a checkpoint on no writable volume), since CEL refuses the
others before anything is stored.

Why kwok: no training pod runs: the test writes the child's status as Kubeflow would, so each phase
comes on demand; the data Job's one pod is kwok's, ended at once with the exit 0 or 1 the test
needs (1 meets the data Job's podFailurePolicy), where a real one would first build the shards.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from bertjob.render import JOB_LABEL
from bertjob_api.spec import GROUP, PLURAL, VERSION
from bertjob_testing.cluster.operator import RealCluster as Cluster
from tests.bertjob.e2e import CHILD_RESOURCES, LAUNCHERS, PYTORCHJOBS, children_of, home
from tests.bertjob.e2e import named_job as _job
from tests.kubeflow_env import kubeflow_condition

pytestmark = pytest.mark.xdist_group("operator")

# A spec that the CRD's schema and CEL rules take and only the operator (and its webhook) refuses:
# a checkpoint on no writable volume; the field the refusal names.
INVALID = {"spec__checkpoint__path": "/ckpt"}
INVALID_FIELD = "spec.checkpoint.path"
WEBHOOK_DENIED = 'admission webhook "bertpretrainjobs.bertjob.dev" denied the request'


def _refused_by_the_webhook(cluster: Cluster, name: str, patch: dict[str, Any]) -> str:
    """The message with which the API server refuses ``patch`` of job ``name`` (the webhook's)."""
    with pytest.raises(ApiException) as refused:
        cluster.patch_job(name, patch)
    assert refused.value.status == 422, refused.value
    message = str(json.loads(str(refused.value.body))["message"])
    assert WEBHOOK_DENIED in message, message
    return message


def _end_data_job(cluster: Cluster, name: str, exit_code: int) -> None:
    """End the pod that the Job controller runs for job ``name``'s data Job (kwok, exit code)."""
    cluster.end_pods(f"{JOB_LABEL}={name},app.kubernetes.io/component=prepare", exit_code)


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


def test_a_spec_change_of_a_running_job_is_refused_by_the_webhook(cluster: Cluster) -> None:
    """The API server refuses the whole patch, naming the field the operator would not apply, and
    stores nothing of it; the safe part alone is then taken and reaches the child."""
    cluster.create_job(_job("changed"))
    _running(cluster, "changed")

    message = _refused_by_the_webhook(
        cluster, "changed", {"spec": {"image": "evil:latest", "runPolicy": {"backoffLimit": 7}}}
    )

    assert "spec.image: cannot change once the job has children (phase Running)" in message
    assert "backoffLimit" not in message.partition("spec.image")[0]
    job = cluster.job("changed")
    assert (job["metadata"]["generation"], job["spec"]["image"]) == (1, "ghcr.io/bertjob/trainer:0.1.0")
    cluster.patch_job("changed", {"spec": {"runPolicy": {"backoffLimit": 7}}})
    cluster.wait_for(
        "backoffLimit on the child",
        lambda: (cluster.object(PYTORCHJOBS, "changed") or {})["spec"]["runPolicy"].get("backoffLimit") == 7,
    )
    status = cluster.job("changed")["status"]
    assert status["phase"] == "Running" and "SpecChangeRefused" not in {
        c["type"] for c in status["conditions"]
    }


def test_a_spec_change_while_running_applies_only_what_is_safe(unguarded: Cluster) -> None:
    """Where the webhook does not judge it, the operator applies the safe part and records the
    refusal of the rest."""
    cluster = unguarded
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


def test_an_invalid_change_is_refused_whole(unguarded: Cluster) -> None:
    cluster = unguarded
    cluster.create_job(_job("invalid-change"))
    cluster.status_when("invalid-change", "Pending")

    cluster.patch_job(
        "invalid-change", {"spec": {"checkpoint": {"path": "/ckpt"}, "runPolicy": {"backoffLimit": 2}}}
    )

    status = cluster.wait_for(
        "the refusal",
        lambda: (s := cluster.job("invalid-change")["status"]).get("observedGeneration") == 2 and s,
    )
    assert INVALID_FIELD in _condition(status, "SpecChangeRefused")["message"]
    assert "backoffLimit" not in cluster.object(PYTORCHJOBS, "invalid-change")["spec"]["runPolicy"]  # type: ignore[index]


def test_a_spec_fixed_after_failing_is_rendered_again(unguarded: Cluster) -> None:
    cluster = unguarded
    cluster.create_job(_job("fixed", **INVALID))
    cluster.status_when("fixed", "Failed")

    cluster.patch_job("fixed", {"spec": {"checkpoint": {"path": "/data/checkpoints"}}})

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
        GROUP, VERSION, home(cluster), PLURAL, "deleted"
    )

    # The controller-manager's garbage collector deletes them (the operator has no delete handler).
    cluster.wait_for("the children gone", lambda: children_of(cluster, "deleted") == {})
    assert cluster.operator is not None and cluster.operator.poll() is None


def test_the_data_job_runs_before_the_training_job(cluster: Cluster) -> None:
    cluster.create_job(_job("prepared", spec__prepare={"enabled": True}))

    status = cluster.status_when("prepared", "Preparing")
    children = children_of(cluster, "prepared")
    assert PYTORCHJOBS not in children and len(children["batch/v1/jobs"]) == 1
    assert children["batch/v1/jobs"][0]["spec"]["suspend"] is False
    assert [c["kind"] for c in status["children"]] == ["Job"]
    # A safe change made while the data is prepared reaches the training job created afterwards.
    cluster.patch_job("prepared", {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 600}}})
    cluster.wait_for(
        "the change to be observed",
        lambda: cluster.job("prepared")["status"].get("observedGeneration") == 2,
    )

    _end_data_job(cluster, "prepared", 0)

    status = cluster.status_when("prepared", "Pending")
    assert [c["kind"] for c in status["children"]] == ["Job", "PyTorchJob"]
    assert _condition(status, "Prepared")["status"] == "True"
    [training] = children_of(cluster, "prepared")[PYTORCHJOBS]
    assert training["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 600


def test_a_failed_data_job_fails_the_job(cluster: Cluster) -> None:
    cluster.create_job(_job("unprepared", spec__prepare={"enabled": True}))
    cluster.status_when("unprepared", "Preparing")
    assert children_of(cluster, "unprepared")["batch/v1/jobs"]

    # Exit code 1 matches the data Job's podFailurePolicy (FailJob): the Job controller fails it
    # at once, with its reason PodFailurePolicy.
    _end_data_job(cluster, "unprepared", 1)

    status = cluster.status_when("unprepared", "Failed")
    assert _condition(status, "Failed")["reason"] == "PrepareFailed"
    assert "PodFailurePolicy" in _condition(status, "Failed")["message"]
    assert PYTORCHJOBS not in children_of(cluster, "unprepared")


def test_an_operator_restart_adopts_the_children_without_duplicates(
    unguarded: Cluster, namespace: str
) -> None:
    """In a namespace the webhook does not serve: where it does, the API server refuses a job
    created while the operator is away (the chart's failurePolicy: Fail), shown first."""
    cluster = unguarded
    cluster.create_job(_job("restarted"))
    cluster.create_job(_job("restarted-running"))
    _running(cluster, "restarted-running")
    cluster.status_when("restarted", "Pending")
    before = children_of(cluster, "restarted")

    cluster.stop()
    with pytest.raises(ApiException) as refused:
        cluster.create_job(_job("while-away"), namespace)
    message = json.loads(str(refused.value.body))["message"]
    assert (
        'failed calling webhook "bertpretrainjobs.bertjob.dev"' in message and "connection refused" in message
    )
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


def test_metrics_and_readiness_are_served(unguarded: Cluster) -> None:
    cluster = unguarded
    cluster.create_job(_job("measured"))
    cluster.create_job(_job("measured-bad", **INVALID))
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
INVALID_WITH_SUSPEND = INVALID_FIELD


@pytest.mark.parametrize("suspend", [True, False], ids=["suspend", "resume"])
def test_an_invalid_change_neither_suspends_nor_resumes_the_training_job(
    unguarded: Cluster, suspend: bool
) -> None:
    cluster = unguarded
    name = f"invalid-{'suspend' if suspend else 'resume'}"
    cluster.create_job(_job(name, spec__runPolicy={"suspend": not suspend}))
    if suspend:
        _running(cluster, name)
    before = cluster.status_when(name, "Suspended" if not suspend else "Running")

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": suspend}, "checkpoint": {"path": "/ckpt"}}})

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
def test_an_invalid_change_neither_suspends_nor_resumes_the_data_job(
    unguarded: Cluster, suspend: bool
) -> None:
    cluster = unguarded
    name = f"invalid-prepare-{'suspend' if suspend else 'resume'}"
    cluster.create_job(_job(name, spec__prepare={"enabled": True}, spec__runPolicy={"suspend": not suspend}))
    before = cluster.status_when(name, "Preparing" if suspend else "Suspended")
    [data_job] = children_of(cluster, name)["batch/v1/jobs"]
    assert data_job["spec"]["suspend"] is (not suspend)

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": suspend}, "checkpoint": {"path": "/ckpt"}}})

    status = _refused_at(cluster, name, 2)
    assert status["phase"] == before["phase"]
    [data_job] = children_of(cluster, name)["batch/v1/jobs"]
    assert data_job["spec"]["suspend"] is (not suspend)


def test_a_refused_change_does_not_reach_the_training_job_created_later(unguarded: Cluster) -> None:
    cluster = unguarded
    name = "refused-then-prepared"
    cluster.create_job(_job(name, spec__prepare={"enabled": True}))
    cluster.status_when(name, "Preparing")
    cluster.patch_job(
        name,
        {"spec": {"checkpoint": {"path": "/ckpt"}, "runPolicy": {"suspend": True, "backoffLimit": 9}}},
    )
    _refused_at(cluster, name, 2)
    assert children_of(cluster, name)["batch/v1/jobs"]

    _end_data_job(cluster, name, 0)

    status = cluster.status_when(name, "Pending")
    assert [c["kind"] for c in status["children"]] == ["Job", "PyTorchJob"]
    [training] = children_of(cluster, name)[PYTORCHJOBS]
    assert training["spec"]["runPolicy"]["suspend"] is False
    assert training["spec"]["runPolicy"].get("backoffLimit") != 9
