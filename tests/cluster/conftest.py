"""Fixtures of the tests on the real control plane: the chart installed and the operator running
under its ServiceAccount (one for this folder's run), and a namespace per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import RealCluster, install, uninstall


@pytest.fixture(scope="package")
def operator(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """``helm install`` of charts/bertjob (webhook on) into the real API server and the operator
    running as a local process with the chart's ServiceAccount's token; uninstalled after."""
    cluster = install(control_plane, tmp_path_factory.mktemp("operator"))
    try:
        yield cluster
    finally:
        uninstall(cluster)


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, deleted after it (the namespace controller empties it)."""
    name = request.node.name.replace("_", "-").replace("[", "-").replace("]", "").lower()[:50].strip("-")
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failed test that ran the operator reports the operator's log."""
    report = yield
    cluster = getattr(item, "funcargs", {}).get("operator")
    if report.failed and isinstance(cluster, RealCluster) and cluster.log.exists():
        report.sections.append(("operator log", cluster.log_tail()))
    return report
