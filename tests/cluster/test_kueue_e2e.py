"""Kueue keeps its say over a queued child (issue 29, item 3): a child with the
``kueue.x-k8s.io/queue-name`` label (``spec.queueName``) is created suspended, as Kueue holds it
until it admits it; spec changes write to it only the fields the user changed, so neither an
unrelated change nor an operator restart unsuspends it, and a user's resume leaves it to Kueue.

On the real control plane with the chart's operator; the test plays Kueue (it unsuspends the
child: the admission) and Kubeflow's operator (it reports the child's conditions); the data Job is
run by the real Job controller. In a namespace the webhook does not serve (``unguarded``): the
tests change a spec field the operator refuses (the image) and change a spec while the operator is
away, both of which the chart's webhook refuses at apply (failurePolicy: Fail while it is away).
Waits are bounded.

Why kwok: no training pod runs: the test plays Kueue's admission and Kubeflow's reports, so it picks
the moment of each; the data Job's pod is kwok's, ended with exit 0 at once. The real Kueue admits
and preempts (on kwok's GPU nodes) in tests/controllers/test_kueue.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi

from bertjob.render import JOB_LABEL
from bertjob_testing.cluster.operator import RealCluster as Cluster
from tests.bertjob.e2e import PYTORCHJOBS, children_of, home
from tests.bertjob.e2e import named_job as _job
from tests.kubeflow_env import kubeflow_condition

pytestmark = pytest.mark.xdist_group("operator")

QUEUE = "team-a"


def _observed(cluster: Cluster, name: str, generation: int) -> dict[str, Any]:
    return cluster.wait_for(
        f"generation {generation} of {name} observed",
        lambda: (s := cluster.job(name)["status"]).get("observedGeneration") == generation and s,
    )


def _policy_when(cluster: Cluster, name: str, field: str, value: Any) -> dict[str, Any]:
    """The training child's runPolicy once its ``field`` is ``value``."""
    return cluster.wait_for(
        f"{field}: {value} on {name}",
        lambda: (
            (policy := (cluster.object(PYTORCHJOBS, name) or {}).get("spec", {}).get("runPolicy", {}))
            and policy.get(field) == value
            and policy
        ),
    )


def _suspended(cluster: Cluster, name: str) -> bool:
    child = cluster.object(PYTORCHJOBS, name)
    assert child is not None
    return bool(child["spec"]["runPolicy"]["suspend"])


def _admit(cluster: Cluster, name: str) -> None:
    """What Kueue does when it admits the child, and Kubeflow's operator once its pods run."""
    group, version, plural = PYTORCHJOBS.split("/")
    CustomObjectsApi(cluster.api).patch_namespaced_custom_object(
        group, version, home(cluster), plural, name, {"spec": {"runPolicy": {"suspend": False}}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    running = [kubeflow_condition("Created"), kubeflow_condition("Running")]
    cluster.report(PYTORCHJOBS, name, {"conditions": running})


def test_unrelated_changes_and_a_restart_leave_a_queued_child_suspended(unguarded: Cluster) -> None:
    cluster = unguarded
    name = "queued"
    cluster.create_job(_job(name, spec__queueName=QUEUE))
    cluster.status_when(name, "Pending")
    child = cluster.object(PYTORCHJOBS, name)
    assert child is not None and child["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    assert _suspended(cluster, name), "created suspended, for Kueue to admit"

    # A refused field and a safe one, neither of them suspend.
    cluster.patch_job(name, {"spec": {"image": "other:1", "runPolicy": {"backoffLimit": 7}}})
    _observed(cluster, name, 2)
    assert _policy_when(cluster, name, "backoffLimit", 7)["suspend"] is True

    # A safe change made while the operator is away reaches the child after its restart.
    cluster.stop()
    cluster.patch_job(name, {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 60}}})
    cluster.start()
    _observed(cluster, name, 3)
    policy = _policy_when(cluster, name, "ttlSecondsAfterFinished", 60)
    assert (policy["suspend"], policy["backoffLimit"]) == (True, 7)
    assert cluster.job(name)["status"]["phase"] == "Pending"

    _admit(cluster, name)
    cluster.status_when(name, "Running")

    # Once admitted, an unrelated change does not suspend it again either.
    cluster.patch_job(name, {"spec": {"runPolicy": {"backoffLimit": 3}}})
    _observed(cluster, name, 4)
    assert _policy_when(cluster, name, "backoffLimit", 3)["suspend"] is False
    assert cluster.job(name)["status"]["phase"] == "Running"


def test_a_users_resume_leaves_a_queued_child_to_kueue(unguarded: Cluster) -> None:
    cluster = unguarded
    name = "queued-resumed"
    cluster.create_job(_job(name, spec__queueName=QUEUE))
    cluster.status_when(name, "Pending")
    _admit(cluster, name)
    cluster.status_when(name, "Running")

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": True}}})
    cluster.status_when(name, "Suspended")
    _policy_when(cluster, name, "suspend", True)

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": False}}})
    _observed(cluster, name, 3)
    assert cluster.job(name)["status"]["phase"] == "Pending"
    assert _suspended(cluster, name), "resuming is Kueue's, on admission"

    _admit(cluster, name)
    cluster.status_when(name, "Running")


def test_a_training_job_made_after_the_data_job_is_queued_suspended(unguarded: Cluster) -> None:
    cluster = unguarded
    name = "queued-prepared"
    cluster.create_job(_job(name, spec__queueName=QUEUE, spec__prepare={"enabled": True}))
    cluster.status_when(name, "Preparing")
    cluster.patch_job(name, {"spec": {"runPolicy": {"backoffLimit": 5}}})
    _observed(cluster, name, 2)
    assert children_of(cluster, name)["batch/v1/jobs"]

    # The Job controller runs the data Job's pod; it succeeds.
    cluster.end_pods(f"{JOB_LABEL}={name},app.kubernetes.io/component=prepare", 0)

    cluster.status_when(name, "Pending")
    policy = _policy_when(cluster, name, "backoffLimit", 5)
    assert policy["suspend"] is True, "created suspended, for Kueue to admit"
    cluster.patch_job(name, {"spec": {"image": "other:1"}})
    _observed(cluster, name, 3)
    assert _suspended(cluster, name)
    _admit(cluster, name)
    cluster.status_when(name, "Running")
