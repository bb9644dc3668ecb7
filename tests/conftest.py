"""Fixtures shared by the operator tests: the generated CRD's schema and the upstream Kubeflow ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bertjob_api.crd import resource_schema
from bertjob_testing.kube_emulator import UPSTREAM_CRDS, Cluster, cluster_crds, running_cluster
from tests.k8s_schema import load_crd_schema


@pytest.fixture(scope="session")
def bertjob_schema() -> dict[str, Any]:
    """openAPIV3Schema of our own CRD, as generated from the spec."""
    return resource_schema()


@pytest.fixture(scope="session")
def pytorchjob_schema() -> dict[str, Any]:
    """openAPIV3Schema of Kubeflow's PyTorchJob kubeflow.org/v1 (skips when shared/ is absent)."""
    return _upstream("kubeflow.org_pytorchjobs.yaml", "v1")


@pytest.fixture(scope="session")
def mpijob_schema() -> dict[str, Any]:
    """openAPIV3Schema of mpi-operator's MPIJob kubeflow.org/v2beta1 (skips when shared/ is absent)."""
    return _upstream("kubeflow.org_mpijobs.yaml", "v2beta1")


@pytest.fixture(scope="session")
def trainjob_schema() -> dict[str, Any]:
    """openAPIV3Schema of Kubeflow Trainer v2's TrainJob trainer.kubeflow.org/v1alpha1 (v2.3.0; skips
    when shared/ is absent)."""
    return _upstream("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1")


def _upstream(filename: str, version: str) -> dict[str, Any]:
    path: Path = UPSTREAM_CRDS / filename
    if not path.is_file():
        pytest.skip(f"{path} is absent: the upstream Kubeflow CRDs are not checked out beside the repo")
    return load_crd_schema(path, version)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """kmock's Kubernetes emulator on 127.0.0.1 with our CRD, Kubeflow's PyTorchJob and MPIJob CRDs and
    Trainer v2's TrainJob CRD, and the operator (`kopf run`) running against it; one for the whole
    session."""
    with running_cluster(tmp_path_factory.mktemp("e2e"), cluster_crds()) as running:
        yield running
