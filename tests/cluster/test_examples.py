"""The examples meant for a cluster, applied as the README says (`kubectl apply -f`, each with its
claims from examples/storage/), on the real API server with the chart installed: the server stores
every job, the operator makes each one's children, and `kubectl get bertpretrainjobs` prints the
CRD's printer columns with a row per job.

Why kwok: no pod needs to run: the server stores each example and the operator makes its children
(no Kubeflow controller makes pods here), and five of the eight ask for GPUs or Gaudis this machine
lacks; tests/node/test_training.py trains bert-tiny-cluster.yaml for real."""

from __future__ import annotations

import json

import pytest
import yaml

from bertjob_api.contract import PLURAL
from bertjob_testing.cluster.operator import RealCluster, wait_until
from bertjob_testing.jobs import EXAMPLES

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("operator")]

# The local demo runs on this machine (`bertjob run`); the webhook refuses it on a cluster.
CLUSTER_EXAMPLES = sorted(
    path.name for path in EXAMPLES.glob("*.yaml") if path.name != "bert-tiny-local.yaml"
)


def test_every_cluster_example_applies_and_kubectl_get_shows_its_columns(
    operator: RealCluster, namespace: str
) -> None:
    plane = operator.plane
    assert plane is not None
    for claim in ("bert-data.yaml", "bert-tiny-data.yaml"):
        plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "storage" / claim))
    names = []
    for example in CLUSTER_EXAMPLES:
        result = plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / example), check=False)
        assert result.returncode == 0, f"{example}: {result.stderr}"
        names.append(yaml.safe_load((EXAMPLES / example).read_text())["metadata"]["name"])

    def all_pending() -> bool:
        jobs = json.loads(plane.kubectl("get", PLURAL, "-n", namespace, "-o", "json").stdout)["items"]
        return len(jobs) == len(names) and all((job.get("status") or {}).get("phase") for job in jobs)

    wait_until("every example job to have a status", all_pending, wait_s=120)
    crd = json.loads(plane.kubectl("get", "crd", f"{PLURAL}.bertjob.dev", "-o", "json").stdout)
    [version] = [v for v in crd["spec"]["versions"] if v["served"]]
    columns = [column["name"].upper() for column in version["additionalPrinterColumns"]]
    table = plane.kubectl("get", "bpj", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", *columns], table[0]
    assert sorted(line.split()[0] for line in table[1:]) == sorted(names)
    failed = json.loads(plane.kubectl("get", PLURAL, "-n", namespace, "-o", "json").stdout)["items"]
    assert [job["metadata"]["name"] for job in failed if job["status"]["phase"] == "Failed"] == []
