"""Two test runs on one machine at once (CI's clone and a developer's) do not collide: the two
controllers that would (mpi-operator's constant health port ``:8080``, training-operator's fixed
certificate directory) run twice side by side, each on a control plane of its own, and both stay
up. Not in the ``controllers`` group: it starts planes of its own.

Why kwok: no pod runs, fake or real: two API servers with training-operator and mpi-operator and no
node show that the two controllers' fixed port and directory do not collide."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.build import crds
from bertjob_testing.cluster.components.mpi_operator import LOCK_NAMESPACE, MPIOperator
from bertjob_testing.cluster.components.training_operator import NAMESPACE, TrainingOperator
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.process import running
from bertjob_testing.cluster.webhooks import Site
from tests.cluster.test_harness import NETNS_ROOT

pytestmark = pytest.mark.slow


def start_run(plane: ControlPlane) -> None:
    """etcd, the API server, training-operator and mpi-operator of ``plane``."""
    workdir = plane.workdir
    plane.start(api_only=True)
    site = Site(plane.kubectl, workdir / "controllers", pki.CertificateAuthority(workdir / "webhook-ca"))
    for namespace in (NAMESPACE, LOCK_NAMESPACE):
        plane.kubectl("create", "namespace", namespace)
    files = [f"--filename={path}" for name in ("training-operator", "mpi-operator") for path in crds(name)]
    plane.kubectl("apply", "--server-side", *files)
    plane.kubectl.wait_established()
    plane.start_component(TrainingOperator(site))
    plane.start_component(MPIOperator(site, plane.server))


@pytest.fixture
def two_runs(tmp_path: Path) -> Iterator[list[ControlPlane]]:
    planes: list[ControlPlane] = []
    try:
        for name in ("first", "second"):
            (tmp_path / name).mkdir()
            planes.append(ControlPlane(tmp_path / name))
            start_run(planes[-1])
        yield planes
    finally:
        for plane in planes:
            plane.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason=NETNS_ROOT)
def test_two_runs_hold_the_fixed_port_and_directory_side_by_side(two_runs: list[ControlPlane]) -> None:
    for plane in two_runs:
        pids = plane.pids
        assert running(pids["mpi-operator"]) and running(pids["training-operator"]), plane.logs()
        lease = plane.kubectl.get("lease", "mpi-operator", "-n", LOCK_NAMESPACE)
        assert lease["spec"]["holderIdentity"], "each mpi-operator leads on its own plane"
    first, second = (
        plane.workdir / "controllers" / "training-operator" / "serving-certs" for plane in two_runs
    )
    assert (first / "tls.crt").read_bytes() != (second / "tls.crt").read_bytes(), (
        "each training-operator serves its own run's certificate"
    )
