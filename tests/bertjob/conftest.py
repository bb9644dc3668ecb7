"""Fixtures shared by the operator tests: the generated CRD's schema and the upstream Kubeflow ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bertjob.crd import resource_schema
from jobs import REPO
from k8s_schema import load_crd_schema

# Kubeflow's CRDs live in the shared checkout beside the repository, not in it.
UPSTREAM_CRDS = REPO.parent / "shared" / "upstream-crds"


@pytest.fixture(scope="session")
def bertjob_schema() -> dict[str, Any]:
    """openAPIV3Schema of our own CRD, as generated from the spec."""
    return resource_schema()


@pytest.fixture(scope="session")
def pytorchjob_schema() -> dict[str, Any]:
    """openAPIV3Schema of Kubeflow's PyTorchJob kubeflow.org/v1 (skips when shared/ is absent)."""
    return _upstream("kubeflow.org_pytorchjobs.yaml", "v1")


def _upstream(filename: str, version: str) -> dict[str, Any]:
    path: Path = UPSTREAM_CRDS / filename
    if not path.is_file():
        pytest.skip(f"{path} is absent: the upstream Kubeflow CRDs are not checked out beside the repo")
    return load_crd_schema(path, version)
