"""Fixtures of the controllers tier: a control plane of its own with the real Kubeflow and Kueue
controllers (:mod:`bertjob_testing.cluster.controllers`), the chart's operator installed on it, and
a namespace per test.

A plane of its own, not the run's shared one: there, tests play Kubeflow's controllers (they write
the children's status), which real controllers watching every namespace would fight. Every test
here is in the xdist group ``controllers``: one operator and one set of controllers for the plane.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bertjob_testing.cluster.controllers import Controllers
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import RealCluster, install, uninstall
from tests.cluster.conftest import _in_namespace, _namespace_name, _own_namespace

GROUP = "controllers"


@pytest.fixture(scope="package")
def controllers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controllers]:
    """A control plane with training-operator, mpi-operator, JobSet, Trainer v2 and Kueue running;
    stopped after the package (its logs stay in pytest's temporary directory)."""
    workdir = tmp_path_factory.mktemp("controllers-plane")
    plane = ControlPlane(workdir)
    plane.start()
    try:
        started = Controllers(plane, workdir / "controllers")
        started.start()
        yield started
    finally:
        plane.stop()


@pytest.fixture(scope="package")
def operator(controllers: Controllers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """The chart installed on the controllers' plane (webhook on) and the operator running under its
    ServiceAccount."""
    cluster = install(controllers.plane, tmp_path_factory.mktemp("controllers-operator"))
    try:
        yield cluster
    finally:
        uninstall(cluster)


@pytest.fixture
def cluster(
    operator: RealCluster, controllers: Controllers, request: pytest.FixtureRequest
) -> Iterator[RealCluster]:
    """The operator's cluster, its calls in a namespace of the test's own."""
    with (
        _own_namespace(controllers.plane, _namespace_name(request)) as name,
        _in_namespace(operator, name) as cluster,
    ):
        yield cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here joins the xdist group ``controllers``."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.xdist_group(GROUP))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failed test reports the plane's events and the last lines of every component's,
    controller's and the operator's log."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    started = funcargs.get("controllers")
    if report.failed and isinstance(started, Controllers):
        report.sections.append(("controllers plane events", started.plane.kubectl.events()))
        report.sections.append(("controllers plane logs", started.plane.logs(40)))
    cluster = funcargs.get("cluster") or funcargs.get("operator")
    if report.failed and isinstance(cluster, RealCluster) and cluster.log.exists():
        report.sections.append(("operator log", cluster.log_tail()))
    return report
