"""The operator started before its CRD: one clear line, not ready, alive, and serving once it appears.

Its own emulator (the session's ``cluster`` has every CRD from the start): Kubeflow's PyTorchJob
CRD only, no BertPretrainJob CRD and no MPIJob CRD, and a CRD check every second instead of 30.

The emulator: the run's one real API server holds our CRD from the chart's install for every test
that runs the operator, and deleting it there would delete every stored job, so a server without
it is the emulator's (a real one would serve the same absence: a 404 on the resource).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import CustomObjectsApi

from bertjob import prerequisites
from bertjob_api.crd import crd
from bertjob_testing.kube_emulator import Cluster, answers, cluster_crds, running_cluster, serve
from tests.bertjob.e2e import named_job as _job

RETRY_S = 1
MISSING = f"the {prerequisites.OWN_CRD} CRD is not installed"


def _readiness(cluster: Cluster) -> int:
    try:
        with urllib.request.urlopen(f"{cluster.metrics}/readyz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.fixture
def without_our_crd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    crds = cluster_crds(["pytorchjob"], ours=False)
    monkeypatch.setenv(prerequisites.RETRY_ENV, str(RETRY_S))
    with running_cluster(tmp_path, crds) as cluster:
        yield cluster


def _install_our_crd(cluster: Cluster) -> None:
    """What `kubectl apply -f manifests/crd.yaml` does to a real API server: the resource is
    discovered, and the CRD object appears (with a watch event, which kopf follows)."""
    definition = crd()
    serve(cluster.server, definition)
    CustomObjectsApi(cluster.api).create_cluster_custom_object(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", definition
    )


def test_without_its_crd_the_operator_says_so_once_and_waits(without_our_crd: Cluster) -> None:
    cluster = without_our_crd
    cluster.wait_for("the missing-CRD line", lambda: MISSING in cluster.log.read_text())
    # Several checks later: still one line, alive, live but not ready.
    time.sleep(4 * RETRY_S)
    log = cluster.log.read_text()
    assert log.count(MISSING) == 1, log
    [line] = [line for line in log.splitlines() if MISSING in line]
    assert "helm" in line and "manifests/crd.yaml" in line
    assert cluster.operator is not None and cluster.operator.poll() is None
    assert answers(cluster.liveness)
    assert _readiness(cluster) == 503
    # The other launcher's CRD is missing too, but that is not this operator's to hold back on.
    assert "mpijobs.kubeflow.org" not in log

    _install_our_crd(cluster)

    cluster.wait_for("readiness", lambda: _readiness(cluster) == 200)
    log = cluster.log.read_text()
    assert f"the {prerequisites.OWN_CRD} CRD is installed now" in log
    assert "the mpijobs.kubeflow.org CRD is not installed" in log
    cluster.create_job(_job("after-the-crd"))
    status = cluster.status_when("after-the-crd", "Pending")
    assert [child["kind"] for child in status["children"]] == ["PyTorchJob"]
    assert cluster.operator.poll() is None
