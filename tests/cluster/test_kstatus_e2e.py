"""The kstatus conditions end to end: jobs driven through each phase by the chart's operator on
the real control plane (tests/cluster/conftest.py; the test playing Kubeflow's operator), and at
each phase the live object read back from the real API server and judged three ways: its Ready,
Reconciling and Stalled conditions and observedGeneration; kstatus' verdict on it (what Flux's
``wait`` reads); and Argo CD's health, by examples/gitops/argocd/health.lua run in Lua 5.1.

A job the operator fails or a change it refuses is one that only the operator (and the webhook)
refuses: a checkpoint on no writable volume, in a namespace the webhook does not serve
(``unguarded``, the chart's default of no webhook); the CRD's CEL rules refuse an indivisible
batch before it is stored.

Why kwok: no pod needs to run: the test writes the child's conditions (Running, Succeeded, Failed)
on demand, and each phase is judged on the job as the API server stores it.
"""

from __future__ import annotations

from typing import Any

import pytest

from bertjob_testing.cluster.operator import RealCluster as Cluster
from tests.bertjob.e2e import PYTORCHJOBS
from tests.bertjob.e2e import named_job as _job
from tests.bertjob.test_argocd_health import argocd_health
from tests.kubeflow_env import kubeflow_condition

pytestmark = pytest.mark.xdist_group("operator")

KSTATUS = ("Ready", "Reconciling", "Stalled")


def kstatus_verdict(obj: dict[str, Any]) -> str:
    """kstatus' status of a custom resource it has no special rules for: InProgress while
    ``status.observedGeneration`` differs from ``metadata.generation`` or Reconciling is True,
    Failed while Stalled is True, else Current (sigs.k8s.io/cli-utils pkg/kstatus/status, the
    generic rules: checkGenericProperties)."""
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = obj.get("status") or {}
    generation, observed = obj["metadata"].get("generation"), status.get("observedGeneration")
    if generation is not None and observed is not None and observed != generation:
        return "InProgress"
    for item in status.get("conditions") or []:
        if item["type"] == "Reconciling" and item["status"] == "True":
            return "InProgress"
        if item["type"] == "Stalled" and item["status"] == "True":
            return "Failed"
    return "Current"


def judged(cluster: Cluster, name: str) -> tuple[dict[str, tuple[str, str]], str, str]:
    """The job ``name`` as stored, judged: its kstatus conditions ``{type: (status, reason)}``,
    kstatus' verdict and Argo CD's health."""
    obj = cluster.job(name)
    found = {
        c["type"]: (c["status"], c["reason"]) for c in obj["status"]["conditions"] if c["type"] in KSTATUS
    }
    assert obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
    return found, kstatus_verdict(obj), argocd_health(obj)[0]


def _report(cluster: Cluster, name: str, *types: str) -> None:
    cluster.report(PYTORCHJOBS, name, {"conditions": [kubeflow_condition(type_) for type_ in types]})


def test_a_job_that_runs_and_succeeds(cluster: Cluster) -> None:
    cluster.create_job(_job("kstatus-ok"))

    cluster.status_when("kstatus-ok", "Pending")
    pending = judged(cluster, "kstatus-ok")
    _report(cluster, "kstatus-ok", "Created", "Running")
    cluster.status_when("kstatus-ok", "Running")
    running = judged(cluster, "kstatus-ok")
    _report(cluster, "kstatus-ok", "Created", "Running", "Succeeded")
    cluster.status_when("kstatus-ok", "Succeeded")
    succeeded = judged(cluster, "kstatus-ok")

    assert pending == (
        {"Ready": ("False", "Pending"), "Reconciling": ("True", "Pending")},
        "InProgress",
        "Progressing",
    )
    assert running == ({"Ready": ("True", "Running")}, "Current", "Healthy")
    assert succeeded == ({"Ready": ("True", "Succeeded")}, "Current", "Healthy")


def test_a_job_that_prepares_its_data_first(cluster: Cluster) -> None:
    cluster.create_job(_job("kstatus-data", spec__prepare={"enabled": True}))

    cluster.status_when("kstatus-data", "Preparing")

    assert judged(cluster, "kstatus-data") == (
        {"Ready": ("False", "Preparing"), "Reconciling": ("True", "Preparing")},
        "InProgress",
        "Progressing",
    )


@pytest.mark.parametrize(
    ("name", "fields", "reason"),
    [
        ("kstatus-child-failed", {}, "JobFailed"),
        ("kstatus-invalid", {"spec__checkpoint__path": "/ckpt"}, "InvalidSpec"),
    ],
)
def test_a_failed_job_is_stalled(unguarded: Cluster, name: str, fields: dict[str, Any], reason: str) -> None:
    cluster = unguarded
    cluster.create_job(_job(name, **fields))
    if not fields:
        cluster.status_when(name, "Pending")
        _report(cluster, name, "Created", "Running", "Failed")

    cluster.status_when(name, "Failed")

    assert judged(cluster, name) == (
        {"Ready": ("False", reason), "Stalled": ("True", reason)},
        "Failed",
        "Degraded",
    )


def test_a_suspended_job_is_neither_ready_nor_reconciling(cluster: Cluster) -> None:
    cluster.create_job(_job("kstatus-paused"))
    cluster.status_when("kstatus-paused", "Pending")

    cluster.patch_job("kstatus-paused", {"spec": {"runPolicy": {"suspend": True}}})
    cluster.status_when("kstatus-paused", "Suspended")
    suspended = judged(cluster, "kstatus-paused")
    cluster.patch_job("kstatus-paused", {"spec": {"runPolicy": {"suspend": False}}})
    cluster.status_when("kstatus-paused", "Pending")
    resumed = judged(cluster, "kstatus-paused")

    assert suspended == ({"Ready": ("False", "Suspended")}, "Current", "Suspended")
    assert resumed == (
        {"Ready": ("False", "Pending"), "Reconciling": ("True", "Pending")},
        "InProgress",
        "Progressing",
    )


def test_a_refused_change_stalls_the_job_until_it_is_undone(unguarded: Cluster) -> None:
    cluster = unguarded
    name = "kstatus-refused"
    cluster.create_job(_job(name))
    cluster.status_when(name, "Pending")
    _report(cluster, name, "Created", "Running")
    cluster.status_when(name, "Running")
    image = cluster.job(name)["spec"]["image"]

    cluster.patch_job(name, {"spec": {"image": "evil:latest"}})
    cluster.wait_for("the refusal", lambda: cluster.job(name)["status"].get("observedGeneration") == 2)
    refused = judged(cluster, name)
    cluster.patch_job(name, {"spec": {"image": image}})
    cluster.wait_for("the change applied", lambda: cluster.job(name)["status"].get("observedGeneration") == 3)
    undone = judged(cluster, name)

    stalled = {"Ready": ("False", "SpecChangeRefused"), "Stalled": ("True", "SpecChangeRefused")}
    assert refused == (stalled, "Failed", "Degraded")
    assert cluster.job(name)["status"]["phase"] == "Running"
    assert undone == ({"Ready": ("True", "Running")}, "Current", "Healthy")
