"""Fixtures shared by the operator tests: the generated CRD's schema and the upstream Kubeflow ones."""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from bertjob_api.crd import resource_schema
from bertjob_testing.cluster import shared
from bertjob_testing.cluster.build import upstream_crd
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.kube_emulator import Cluster, cluster_crds, running_cluster
from tests.k8s_schema import load_crd_schema

# The images' fixtures (buildah, operator_image, xeon_image) serve tests/images and tests/node.
pytest_plugins = ["tests.images.image_fixtures"]

# bertjob_testing (testing/) is the tests' own, not installed with the package: pytest finds it
# through its pythonpath setting, and the subprocesses the tests start through PYTHONPATH.
TESTING = str(Path(__file__).resolve().parents[1] / "testing")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTING, os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def bertjob_schema() -> dict[str, Any]:
    """openAPIV3Schema of our own CRD, as generated from the spec."""
    return resource_schema()


@pytest.fixture(scope="session")
def pytorchjob_schema() -> dict[str, Any]:
    """openAPIV3Schema of Kubeflow's PyTorchJob kubeflow.org/v1."""
    return _upstream("kubeflow.org_pytorchjobs.yaml", "v1")


@pytest.fixture(scope="session")
def mpijob_schema() -> dict[str, Any]:
    """openAPIV3Schema of mpi-operator's MPIJob kubeflow.org/v2beta1."""
    return _upstream("kubeflow.org_mpijobs.yaml", "v2beta1")


@pytest.fixture(scope="session")
def trainjob_schema() -> dict[str, Any]:
    """openAPIV3Schema of Kubeflow Trainer v2's TrainJob trainer.kubeflow.org/v1alpha1 (v2.3.0)."""
    return _upstream("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1")


def _upstream(filename: str, version: str) -> dict[str, Any]:
    """The schema of ``version`` in an upstream CRD, from its controller's Go module."""
    return load_crd_schema(upstream_crd(filename), version)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """kmock's Kubernetes emulator on 127.0.0.1 with our CRD, Kubeflow's PyTorchJob and MPIJob CRDs and
    Trainer v2's TrainJob CRD, and the operator (`kopf run`) running against it; one for the whole
    session."""
    with running_cluster(tmp_path_factory.mktemp("e2e"), cluster_crds()) as running:
        yield running


def pytest_configure(config: pytest.Config) -> None:
    """The run's controller names the shared cluster's directory before xdist's workers start."""
    if not hasattr(config, "workerinput"):
        shared.configure()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller stops the shared cluster when the whole run is over."""
    if not hasattr(session.config, "workerinput"):
        kept = shared.finish()
        if kept:
            print(f"\nthe test cluster's logs are kept in {kept}")


@pytest.fixture(scope="session")
def control_plane() -> ControlPlane:
    """The real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)
    on 127.0.0.1, built from source and shared by the whole run (:mod:`bertjob_testing.cluster`)."""
    return shared.control_plane()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test that used the real cluster reports the cluster's events and components' logs,
    and the run keeps the logs."""
    report = yield
    _fail_a_skip_in_ci(report, "this test skipped")
    if report.failed and "control_plane" in getattr(item, "fixturenames", ()):
        shared.mark_failed()
        plane = shared.existing()
        if plane is not None:
            report.sections.append(("cluster events", plane.kubectl.events()))
            report.sections.append(("cluster logs", plane.logs()))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """Under CI=true a module skipped as it is collected (a module-level ``importorskip``) fails as a
    skipped test does: its report is a collection's, which pytest_runtest_makereport never sees.
    pytest then stops before running any test, as for any error in collection."""
    report = yield
    _fail_a_skip_in_ci(report, "this module skipped at collection")
    return report


def _fail_a_skip_in_ci(report: pytest.TestReport | pytest.CollectReport, what: str) -> None:
    if report.skipped and os.environ.get("CI") == "true" and not _may_skip_in_ci(report):
        # In CI a missing prerequisite (a tool, a binary, a module, ../shared) fails: only the tests
        # that need a GPU, and cases a test itself declares not applicable, may skip.
        report.outcome = "failed"
        report.longrepr = f"CI=true and {what}: {_skip_reason(report)}"


# Skip reasons allowed under CI=true: a GPU that CI machines never have, and cases that a
# parametrized test declares not applicable to itself.
CI_SKIPS = re.compile(r"GPU|CUDA|cuda|the schema refuses it before any rule runs")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


def _may_skip_in_ci(report: pytest.TestReport | pytest.CollectReport) -> bool:
    return bool(CI_SKIPS.search(_skip_reason(report)))
