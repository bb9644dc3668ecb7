"""The Kubernetes version floor: what the chart (``kubeVersion``), the README and the chart's
README claim is exactly the oldest version the tests install on, and an API server of that
version (built from source, ``KUBERNETES_FLOOR_VERSION`` in hack/versions.env) takes the CRD
with every CEL rule and decides a job at apply as the current one does.

The CRD's CEL rules carry ``fieldPath``, which Kubernetes added in 1.28: an older API server
refuses the CRD, so the floor cannot be lower than 1.28 without dropping it.

Why kwok: no pod needs to run: an API server of the floor version alone, with no node of any kind,
decides the CRD and each job at apply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from bertjob_testing.admission_cases import JOB_CASES
from bertjob_testing.cluster.catalog import REPO, versions
from bertjob_testing.cluster.controlplane import ControlPlane

FLOOR = versions()["KUBERNETES_FLOOR_VERSION"]
FLOOR_MINOR = ".".join(FLOOR.lstrip("v").split(".")[:2])


def test_the_chart_claims_the_tested_floor() -> None:
    chart = yaml.safe_load((REPO / "charts" / "bertjob" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={FLOOR_MINOR}.0-0"


@pytest.mark.parametrize("readme", ["README.md", "charts/bertjob/README.md"])
def test_the_readmes_claim_the_tested_floor(readme: str) -> None:
    claims = set(re.findall(r"Kubernetes (\d+\.\d+) or newer", (REPO / readme).read_text()))
    assert claims == {FLOOR_MINOR}, f"{readme} claims Kubernetes {sorted(claims)} or newer; tested: {FLOOR}"


@pytest.fixture(scope="module")
def floor_api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd and an API server of the floor version (no controllers, no nodes)."""
    plane = ControlPlane(tmp_path_factory.mktemp("floor"), apiserver="kube-apiserver")
    try:
        plane.start(api_only=True)
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def floor_with_crd(floor_api_server: ControlPlane) -> ControlPlane:
    """The floor's API server with our CRD applied and established."""
    plane = floor_api_server
    version = json.loads(plane.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    assert version == FLOOR
    plane.kubectl("apply", "--server-side", "-f", str(REPO / "manifests" / "crd.yaml"))
    plane.kubectl.wait_established()
    return plane


CEL_CASES = [case for case in JOB_CASES if case["cel"] or case.get("schema")]


@pytest.mark.parametrize("case", CEL_CASES, ids=[case["id"] for case in CEL_CASES])
def test_the_floor_api_server_decides_jobs_with_the_crds_rules(
    floor_with_crd: ControlPlane, case: dict[str, Any]
) -> None:
    """Every case of the admission table that the CRD decides (schema or CEL), at
    ``kubectl apply --dry-run=server`` on the floor's API server (no webhook there)."""
    result = floor_with_crd.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(case["document"]), check=False
    )
    if case["allowed"]:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0, f"{case['id']} was let through"
        for field in case["fields"]:
            assert field in result.stderr, f"{field} not named in: {result.stderr}"
