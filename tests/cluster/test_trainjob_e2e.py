"""Launcher ``trainjob`` end to end: a BertPretrainJob's Kubeflow Trainer v2 TrainJob on the real
control plane.

Same harness as test_e2e_lifecycle.py: the chart's operator, the real API server serving the
upstream TrainJob CRD (trainer.kubeflow.org/v1alpha1, Trainer v2.3.0, its schema and CEL rules
applied to what the operator writes), and the test playing Trainer v2's TrainJob controller by
patching the TrainJob's status subresource as it writes it (conditions Suspended, Complete and
Failed, and ``jobsStatus``: :func:`tests.bertjob.e2e.trainjob_status`). The data Job is run by the
real Job controller, its pod ended by the test (kwok).

A change the webhook refuses (a deadline of a running TrainJob job) is refused at ``kubectl
apply``; the operator's own refusal after the fact is tested in a namespace the webhook does not
serve (``unguarded``, the chart's default of no webhook), as is a job created while the operator is
away (the webhook's failurePolicy: Fail refuses it elsewhere).

Why kwok: no training pod runs: the test writes the TrainJob's status as Trainer v2 would, so each
condition comes on demand; the data Job's pod is kwok's, ended with exit 0 at once. A TrainJob
trains for real through Trainer and JobSet in tests/node/test_distributed.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from bertjob.launchers.trainjob import TrainJobLauncher
from bertjob.render import JOB_LABEL
from bertjob_api.spec import GROUP, PLURAL, VERSION
from bertjob_testing.cluster.operator import RealCluster as Cluster
from tests.bertjob.e2e import TRAINJOBS, children_of, home, trainjob_status
from tests.bertjob.e2e import named_job as _named_job
from tests.k8s_schema import assert_valid

pytestmark = pytest.mark.xdist_group("operator")

IMAGE = "ghcr.io/bertjob/trainer:0.1.0"
# A ConfigMap volume's mode when none is given (0644), as the API server defaults a pod template.
DEFAULT_MODE = 0o644
OWNED_BY = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BertPretrainJob"}


def _job(name: str, **fields: Any) -> dict[str, Any]:
    return _named_job(name, "trainjob", **fields)


def _trainjob(cluster: Cluster, name: str) -> dict[str, Any]:
    found = cluster.object(TRAINJOBS, name)
    assert found is not None, f"no TrainJob {name}"
    return found


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    [found] = [c for c in status["conditions"] if c["type"] == type_]
    return found


def _has(status: dict[str, Any], type_: str) -> bool:
    return any(c["type"] == type_ for c in status.get("conditions") or [])


def _events(cluster: Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    return [event for event in cluster.events(name) if event["reason"] == reason]


def _running(cluster: Cluster, name: str) -> dict[str, Any]:
    """The job's status once its TrainJob reported its `node` Job ready (Trainer v2 writes no
    Running condition; jobsStatus is what says so)."""
    cluster.status_when(name, "Pending")
    cluster.report(TRAINJOBS, name, trainjob_status(ready=1, active=1))
    return cluster.status_when(name, "Running")


def _observed(cluster: Cluster, name: str, generation: int) -> dict[str, Any]:
    return cluster.wait_for(
        f"generation {generation} of {name} observed",
        lambda: (s := cluster.job(name)["status"]).get("observedGeneration") == generation and s,
    )


def _without_pod_defaults(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod spec of a Job as the real server stores it, less the defaults it filled in that a
    TrainJob's template (a custom resource, not defaulted as a pod) lacks: a ConfigMap's or a
    projected volume's ``defaultMode`` and a field reference's ``apiVersion``."""
    pod = copy.deepcopy(pod)
    for volume in pod.get("volumes") or []:
        for source in ("configMap", "projected"):
            if volume.get(source, {}).get("defaultMode") == DEFAULT_MODE:
                del volume[source]["defaultMode"]
    for container in pod.get("containers") or []:
        for variable in container.get("env") or []:
            field_ref = (variable.get("valueFrom") or {}).get("fieldRef") or {}
            if field_ref.get("apiVersion") == "v1":
                del field_ref["apiVersion"]
    return pod


def test_a_trainjob_job_gets_an_owned_trainjob(cluster: Cluster, trainjob_schema: dict[str, Any]) -> None:
    name = "tj-created"
    job = cluster.create_job(
        _job(name, spec__queueName="team-a", spec__runPolicy={"activeDeadlineSeconds": 3600})
    )

    status = cluster.status_when(name, "Pending")

    assert status["children"] == [
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name}
    ]
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("Created", "True"),
        ("Ready", "False"),
        ("Reconciling", "True"),
    ]
    assert "TrainJob tj-created" in _condition(status, "Created")["message"]
    trainjob = _trainjob(cluster, name)
    assert trainjob["metadata"]["ownerReferences"] == [
        {
            **OWNED_BY,
            "name": name,
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert trainjob["metadata"]["labels"] == {
        "app.kubernetes.io/name": "bertjob",
        "app.kubernetes.io/component": "train",
        "bertjob.dev/job": name,
        "kueue.x-k8s.io/queue-name": "team-a",
    }
    spec = trainjob["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "bertjob-torch",
    }
    # Queued: created suspended, as Kueue holds it until it admits it (test_kueue_e2e.py).
    assert (spec["suspend"], spec["activeDeadlineSeconds"]) == (True, 3600)
    assert (spec["trainer"]["image"], spec["trainer"]["numNodes"], spec["trainer"]["numProcPerNode"]) == (
        IMAGE,
        1,
        1,
    )
    # What the operator created is a TrainJob the v2.3.0 CRD takes (the real server took it too).
    created = {key: value for key, value in trainjob.items() if key != "metadata"}
    assert_valid(created, trainjob_schema)
    # The trainer reads the job from the ConfigMap that the TrainJob's node pods mount.
    [config_map] = children_of(cluster, name)["v1/configmaps"]
    assert yaml.safe_load(config_map["data"]["job.yaml"])["spec"]["launcher"] == "trainjob"
    volumes = TrainJobLauncher().trainer_template(trainjob)["spec"]["volumes"]
    assert {"name": "job-config", "configMap": {"name": config_map["metadata"]["name"]}} in volumes
    cluster.wait_for("a Pending event", lambda: _events(cluster, name, "Pending"))


def test_the_trainjobs_status_moves_the_job_to_running_and_succeeded(cluster: Cluster) -> None:
    name = "tj-succeeds"
    cluster.create_job(_job(name))
    cluster.status_when(name, "Pending")

    # Jobs listed, none ready yet (pods pulling their image): still Pending.
    cluster.report(TRAINJOBS, name, trainjob_status(active=1))
    status = cluster.wait_for(
        "the jobsStatus mirrored",
        lambda: _has(s := cluster.job(name)["status"], "Running") and s,
    )
    assert status["phase"] == "Pending"
    assert (_condition(status, "Running")["status"], _condition(status, "Running")["reason"]) == (
        "False",
        "NoJobReady",
    )

    status = _running(cluster, name)
    running = _condition(status, "Running")
    assert (running["status"], running["reason"]) == ("True", "JobsReady")
    assert "node" in running["message"]
    [event] = cluster.wait_for("a Running event", lambda: _events(cluster, name, "Running"))
    assert event["type"] == "Normal" and "Pending -> Running" in event["message"]

    cluster.report(TRAINJOBS, name, trainjob_status(("Complete", "AllJobsCompleted"), succeeded=1))

    status = cluster.status_when(name, "Succeeded")
    succeeded = _condition(status, "Succeeded")
    assert (succeeded["status"], succeeded["reason"], succeeded["message"]) == (
        "True",
        "AllJobsCompleted",
        "jobset completed successfully",
    )
    assert succeeded["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert _condition(status, "Running")["status"] == "False"
    assert "completionTime" in status and "Complete" not in {c["type"] for c in status["conditions"]}
    [event] = cluster.wait_for("a Succeeded event", lambda: _events(cluster, name, "Succeeded"))
    assert event["type"] == "Normal"
    # A later report of the finished TrainJob does not move the job back.
    cluster.report(TRAINJOBS, name, trainjob_status(("Complete", "AllJobsCompleted"), ready=1, active=1))
    assert cluster.status_when(name, "Succeeded")


def test_a_failed_trainjob_fails_the_job_with_a_warning_naming_the_reason(cluster: Cluster) -> None:
    name = "tj-deadline"
    cluster.create_job(_job(name, spec__runPolicy={"activeDeadlineSeconds": 60}))
    _running(cluster, name)

    cluster.report(TRAINJOBS, name, trainjob_status(("Failed", "DeadlineExceeded"), failed=1))

    status = cluster.status_when(name, "Failed")
    failed = _condition(status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "DeadlineExceeded")
    [event] = cluster.wait_for("a warning", lambda: _events(cluster, name, "DeadlineExceeded"))
    assert event["type"] == "Warning" and "Running -> Failed" in event["message"]
    assert "activeDeadlineSeconds" in event["message"]


def test_suspend_and_resume_reach_the_trainjob(cluster: Cluster) -> None:
    name = "tj-pausing"
    cluster.create_job(_job(name))
    _running(cluster, name)

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": True}}})

    status = cluster.status_when(name, "Suspended")
    assert (_condition(status, "Suspended")["status"], status["observedGeneration"]) == ("True", 2)
    cluster.wait_for("the TrainJob suspended", lambda: _trainjob(cluster, name)["spec"]["suspend"] is True)
    # Trainer v2 has not caught up yet and still lists the node Job ready: the job stays Suspended.
    cluster.report(TRAINJOBS, name, trainjob_status(ready=1, active=1))
    cluster.report(TRAINJOBS, name, trainjob_status(("Suspended", "Suspended"), suspended=1))
    status = cluster.wait_for(
        "Trainer v2's Suspended condition mirrored",
        lambda: _condition(s := cluster.job(name)["status"], "Suspended")["reason"] == "Suspended" and s,
    )
    assert status["phase"] == "Suspended"
    assert _condition(status, "Running")["status"] == "False"

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": False}}})

    cluster.status_when(name, "Pending")
    cluster.wait_for("the TrainJob resumed", lambda: _trainjob(cluster, name)["spec"]["suspend"] is False)
    # Until Trainer v2 writes Resumed, the job mirrors the TrainJob's Suspended condition as it stands.
    cluster.report(TRAINJOBS, name, trainjob_status(("Suspended", "Resumed"), ready=1, active=1))
    status = cluster.status_when(name, "Running")
    suspended = _condition(status, "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("False", "Resumed")
    reasons = cluster.reasons_when(name, lambda reasons: reasons.count("Running") >= 2)
    assert reasons.count("Suspended") == 1 and reasons.count("Running") == 2
    # Nothing but suspend was ever patched into the TrainJob.
    assert "activeDeadlineSeconds" not in _trainjob(cluster, name)["spec"]


def test_a_deadline_change_of_a_running_trainjob_job_is_refused_by_the_webhook(cluster: Cluster) -> None:
    name = "tj-changed"
    cluster.create_job(_job(name, spec__runPolicy={"activeDeadlineSeconds": 3600}))
    _running(cluster, name)

    with pytest.raises(ApiException) as refused:
        cluster.patch_job(name, {"spec": {"runPolicy": {"activeDeadlineSeconds": 7200}}})

    message = json.loads(str(refused.value.body))["message"]
    assert refused.value.status == 422 and "denied the request" in message, message
    assert "spec.runPolicy.activeDeadlineSeconds: cannot change once the job has children" in message
    assert cluster.job(name)["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600
    assert _trainjob(cluster, name)["spec"]["activeDeadlineSeconds"] == 3600


def test_a_deadline_or_phase_change_of_a_running_trainjob_job_is_refused(unguarded: Cluster) -> None:
    cluster = unguarded
    name = "tj-changed"
    cluster.create_job(_job(name, spec__runPolicy={"activeDeadlineSeconds": 3600}))
    _running(cluster, name)
    before = _trainjob(cluster, name)["spec"]

    # Safe for a PyTorchJob; immutable on a TrainJob (the CRD's rule self == oldSelf).
    cluster.patch_job(name, {"spec": {"runPolicy": {"activeDeadlineSeconds": 7200}}})

    status = _observed(cluster, name, 2)
    refused = _condition(status, "SpecChangeRefused")
    assert (refused["status"], refused["reason"]) == ("True", "UnsafeChange")
    assert refused["message"].endswith(": spec.runPolicy.activeDeadlineSeconds")
    assert status["phase"] == "Running"
    cluster.wait_for(
        "a SpecChangeRefused warning naming activeDeadlineSeconds",
        lambda: [
            e
            for e in _events(cluster, name, "SpecChangeRefused")
            if e["type"] == "Warning" and "spec.runPolicy.activeDeadlineSeconds" in e["message"]
        ],
    )
    assert _trainjob(cluster, name)["spec"] == before

    cluster.patch_job(name, {"spec": {"phases": [{**_job(name)["spec"]["phases"][0], "steps": 500}]}})

    status = _observed(cluster, name, 3)
    message = _condition(status, "SpecChangeRefused")["message"]
    assert "spec.phases" in message and "spec.runPolicy.activeDeadlineSeconds" in message
    assert status["phase"] == "Running"
    assert _trainjob(cluster, name)["spec"] == before


def test_the_data_job_runs_before_the_trainjob(unguarded: Cluster) -> None:
    """The real Job controller deletes the pod of a suspended data Job: the data is prepared once
    the job is resumed, and the TrainJob made then takes neither the refused deadline nor a
    suspend."""
    cluster = unguarded
    name = "tj-prepared"
    cluster.create_job(_job(name, spec__prepare={"enabled": True}))

    status = cluster.status_when(name, "Preparing")
    children = children_of(cluster, name)
    assert TRAINJOBS not in children and [c["kind"] for c in status["children"]] == ["Job"]
    [data_job] = children["batch/v1/jobs"]
    # While the data is prepared: suspend (safe) and a new deadline (refused under trainjob).
    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": True, "activeDeadlineSeconds": 600}}})
    status = cluster.status_when(name, "Suspended")
    assert "spec.runPolicy.activeDeadlineSeconds" in _condition(status, "SpecChangeRefused")["message"]
    cluster.wait_for(
        "the data Job suspended",
        lambda: children_of(cluster, name)["batch/v1/jobs"][0]["spec"].get("suspend") is True,
    )
    assert TRAINJOBS not in children_of(cluster, name)
    selector = f"{JOB_LABEL}={name},app.kubernetes.io/component=prepare"
    cluster.wait_for("the data Job's pod deleted", lambda: not cluster.stored("v1/pods", home(cluster)))

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": False}}})
    cluster.status_when(name, "Preparing")
    cluster.end_pods(selector, 0)

    trainjob = cluster.wait_for("the TrainJob", lambda: cluster.object(TRAINJOBS, name))
    status = cluster.status_when(name, "Pending")
    assert [c["kind"] for c in status["children"]] == ["Job", "TrainJob"]
    assert _condition(status, "Prepared")["status"] == "True"
    assert "spec.runPolicy.activeDeadlineSeconds" in _condition(status, "SpecChangeRefused")["message"]
    assert trainjob["spec"]["suspend"] is False and "activeDeadlineSeconds" not in trainjob["spec"]
    # The data Job's pod is the trainer's node pod (TrainJobLauncher.trainer_template) but for its
    # command and the devices it does not need.
    trainer = TrainJobLauncher().trainer_template(trainjob)["spec"]
    prepare = _without_pod_defaults(data_job["spec"]["template"]["spec"])
    for field in ("serviceAccountName", "securityContext", "volumes"):
        assert prepare.get(field) == trainer.get(field), field
    [container] = prepare["containers"]
    [node] = trainer["containers"]
    assert (container["image"], container["env"]) == (node["image"], node["env"])
    assert container["volumeMounts"] == node["volumeMounts"]
    assert container["command"][-3:] == ["prepare", "--config", "/etc/bertjob/job.yaml"]
    counts = {resource: len(found) for resource, found in children_of(cluster, name).items()}
    assert counts[TRAINJOBS] == 1 and counts["batch/v1/jobs"] == 1


def test_deleting_the_job_deletes_its_trainjob(cluster: Cluster) -> None:
    name = "tj-deleted"
    job = cluster.create_job(_job(name))
    cluster.status_when(name, "Pending")
    children = children_of(cluster, name)
    assert TRAINJOBS in children
    assert all(
        [ref.get("uid") for ref in obj["metadata"]["ownerReferences"] if ref.get("controller")]
        == [job["metadata"]["uid"]]
        for objects in children.values()
        for obj in objects
    )

    CustomObjectsApi(cluster.api).delete_namespaced_custom_object(GROUP, VERSION, home(cluster), PLURAL, name)

    cluster.wait_for("the children gone", lambda: children_of(cluster, name) == {})
    assert cluster.object(TRAINJOBS, name) is None
    assert cluster.operator is not None and cluster.operator.poll() is None


def test_an_operator_restart_leaves_trainjob_jobs_as_they_were(unguarded: Cluster) -> None:
    cluster = unguarded
    waiting, running, away = "tj-restart-waiting", "tj-restart-running", "tj-restart-away"
    cluster.create_job(_job(waiting))
    cluster.create_job(_job(running))
    _running(cluster, running)
    cluster.status_when(waiting, "Pending")
    cluster.wait_for("the Pending event", lambda: _events(cluster, waiting, "Pending"))
    cluster.wait_for("the Running event", lambda: _events(cluster, running, "Running"))
    cluster.wait_for("no event left to post", lambda: not cluster.job(waiting)["status"].get("pendingEvents"))
    before = cluster.job(waiting)["status"]
    trainjobs_before = {name: _trainjob(cluster, name)["spec"] for name in (waiting, running)}

    cluster.stop()
    # While the operator is away, one TrainJob completes and a new job arrives.
    cluster.report(TRAINJOBS, running, trainjob_status(("Complete", "AllJobsCompleted"), succeeded=1))
    cluster.create_job(_job(away))
    cluster.start()

    cluster.status_when(running, "Succeeded")
    cluster.status_when(away, "Pending")
    cluster.wait_for("the Succeeded event", lambda: _events(cluster, running, "Succeeded"))
    cluster.wait_for("the new job's Pending event", lambda: _events(cluster, away, "Pending"))
    assert cluster.job(waiting)["status"] == before
    for name in (waiting, running, away):
        counts = {resource: len(found) for resource, found in children_of(cluster, name).items()}
        assert counts == {
            "v1/configmaps": 1,
            TRAINJOBS: 1,
        }, name
    assert {name: _trainjob(cluster, name)["spec"] for name in (waiting, running)} == trainjobs_before
    # Each Event once: none posted again by the operator that started anew.
    for name, reasons in (
        (waiting, ["Pending"]),
        (running, ["Pending", "Running", "Succeeded"]),
        (away, ["Pending"]),
    ):
        assert sorted(event["reason"] for event in cluster.events(name)) == reasons, name
