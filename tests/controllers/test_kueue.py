"""Kueue for real: a ClusterQueue with an ``nvidia.com/gpu`` quota of 8 and a LocalQueue. A queued
job's child is created suspended and waits while another job holds the quota; Kueue admits it when
the quota frees, a job of a higher priority preempts it (Kueue suspends the child, training-operator
deletes its pods), and it runs again when readmitted. Our operator never unsuspends what Kueue
holds: not on a spec change, not after a restart.

One test carries every check: each step needs the state the one before left (who holds the quota).

Why kwok: Kueue's quota is of nvidia.com/gpu and each job's two pods ask for 4 GPUs, which this
machine lacks; kwok's pods end with exit 0 when the test frees the quota, not after a real run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bertjob_testing.cluster.operator import NAMESPACE, OPERATOR, RealCluster
from tests.bertjob.e2e import PYTORCHJOBS, named_job
from tests.controllers import pods

QUEUE = "team-a"
# Who the operator is to the API server: the chart's ServiceAccount.
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{OPERATOR}"
CLUSTER_QUEUE = "gpus"
GPU_QUOTA = 8
# Seconds a held job is watched to stay held (Kueue admits within a second when it can here).
HELD_S = 5


@pytest.fixture
def queue(cluster: RealCluster) -> Iterator[str]:
    """A ClusterQueue of 8 GPUs that preempts lower priorities for higher ones, a LocalQueue of the
    test's namespace on it, and PriorityClasses ``low`` and ``high``; removed after."""
    assert cluster.plane is not None
    objects: list[dict[str, Any]] = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "default",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1000"},
                                    {"name": "memory", "nominalQuota": "10Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": GPU_QUOTA},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": cluster.default_namespace},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
        *(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
            for name, value in (("low", 100), ("high", 1000))
        ),
    ]
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    cluster.plane.kubectl("apply", "-f", "-", input=listed)
    try:
        yield QUEUE
    finally:
        cluster.plane.kubectl(
            "delete", "-f", "-", "--wait=false", "--ignore-not-found", input=listed, check=False
        )


def _job(name: str, priority: str) -> dict[str, Any]:
    """Two nodes of 4 GPUs: the whole quota."""
    return named_job(
        name,
        "pytorchjob",
        spec__topology={"nodes": 2, "processesPerNode": 4},
        spec__queueName=QUEUE,
        spec__pod={"priorityClassName": priority},
    )


def _suspended(cluster: RealCluster, name: str) -> bool:
    child = cluster.object(PYTORCHJOBS, name)
    assert child is not None
    return bool(child["spec"]["runPolicy"].get("suspend"))


def _held(cluster: RealCluster, name: str, why: str) -> None:
    """``name``'s child stays suspended, without pods, for :data:`HELD_S` seconds."""
    deadline = time.monotonic() + HELD_S
    while time.monotonic() < deadline:
        assert _suspended(cluster, name), f"{name} unsuspended {why}"
        assert pods.pods(cluster, pods.of_job(name)) == [], f"{name} has pods {why}"
        time.sleep(0.5)


def _admitted(cluster: RealCluster, name: str) -> list[dict[str, Any]]:
    """Wait until Kueue has admitted ``name`` and its two pods run; them."""
    found = pods.running(cluster, pods.of_job(name), 2, f"{name} admitted and running")
    assert not _suspended(cluster, name)
    assert cluster.status_when(name, "Running")
    return found


def test_kueue_holds_admits_preempts_and_readmits(cluster: RealCluster, queue: str) -> None:
    cluster.create_job(_job("first", "low"))
    first = _admitted(cluster, "first")

    # Within quota no more: the second waits, suspended, through a spec change and a restart.
    cluster.create_job(_job("second", "low"))
    cluster.wait_for("the second's child", lambda: cluster.object(PYTORCHJOBS, "second"))
    _held(cluster, "second", "while the first holds the quota")
    cluster.patch_job("second", {"spec": {"runPolicy": {"backoffLimit": 5}}})
    cluster.wait_for(
        "backoffLimit on the second's child",
        lambda: (cluster.object(PYTORCHJOBS, "second") or {})["spec"]["runPolicy"].get("backoffLimit") == 5,
    )
    cluster.stop()
    cluster.start()
    _held(cluster, "second", "after a spec change and an operator restart")
    assert cluster.job("second")["status"]["phase"] != "Running"

    # The first ends: the quota frees and Kueue admits the second.
    for pod in first:
        pods.end(cluster, pod, 0)
    assert cluster.status_when("first", "Succeeded")
    second = _admitted(cluster, "second")

    # Kueue alone unsuspended the second: no write of the operator's set its suspend to false.
    assert cluster.plane is not None
    writes = cluster.plane.audited_changes("pytorchjobs", cluster.default_namespace, "second")
    assert {event["user"]["username"] for event in writes} >= {OPERATOR_USER}, "the operator's writes audited"
    unsuspending = [
        event
        for event in writes
        if event["user"]["username"] == OPERATOR_USER
        and ((event.get("requestObject") or {}).get("spec") or {}).get("runPolicy", {}).get("suspend")
        is False
    ]
    assert unsuspending == [], "the operator unsuspended a child Kueue holds"

    # A higher priority preempts the second: Kueue suspends its child, its pods go.
    cluster.create_job(_job("urgent", "high"))
    cluster.wait_for("the second preempted", lambda: _suspended(cluster, "second"))
    cluster.wait_for("the second's pods gone", lambda: pods.pods(cluster, pods.of_job("second")) == [])
    urgent = _admitted(cluster, "urgent")
    status = cluster.wait_for(
        "the second no longer Running",
        lambda: (s := cluster.job("second")["status"])["phase"] != "Running" and s,
    )
    assert any(c["type"] == "Suspended" and c["status"] == "True" for c in status["conditions"]), status

    # The urgent one ends: the second is readmitted and runs again, on new pods.
    for pod in urgent:
        pods.end(cluster, pod, 0)
    again = _admitted(cluster, "second")
    assert {pods.uid(p) for p in again}.isdisjoint(pods.uid(p) for p in second)
