"""Two ranks in two pods on the real node, through each launcher's real controller: a PyTorchJob
whose Worker meets the Master at the Master's Service name (torchrun's rendezvous over the pods'
network and CoreDNS), a TrainJob through JobSet on the chart's ``bertjob-torch`` runtime, and an
MPIJob whose launcher starts both ranks over SSH with mpi-operator's keys (mpirun, Horovod).
Each trains the cluster example, shortened, as a world of 2, and ends Succeeded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from bertjob_api.contract import JOB_LABEL
from bertjob_testing.cluster.node import RealNode
from tests.images.buildah_images import Built
from tests.node.test_faults import job
from tests.node.test_training import EXAMPLE, follow

pytestmark = pytest.mark.slow

RUN_S = 900
# Two or three pods on a node of 2 CPUs, beside the operator's: each asks for a share.
RESOURCES = {"requests": {"cpu": "300m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "3Gi"}}
LAUNCHERS: dict[str, dict[str, Any]] = {
    "pytorchjob": {},
    "trainjob": {"trainJob": {"mlPolicy": "torch"}},
    "mpijob": {},
}


def logs(node: RealNode, name: str, namespace: str) -> str:
    """Every container's whole log of every pod of job ``name``, each line prefixed with its pod."""
    return node.plane.kubectl(
        "logs",
        "-l",
        f"{JOB_LABEL}={name}",
        "-n",
        namespace,
        "--all-containers",
        "--prefix",
        "--tail=-1",
        check=False,
    ).stdout


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_ranks_in_two_pods_train_together(
    chart_on_node: RealNode,
    controllers_on_node: object,
    trainer_on_node: Built,
    namespace: str,
    launcher: str,
) -> None:
    node = chart_on_node
    name = f"two-{launcher}"
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    document = job(
        node,
        namespace,
        name,
        launcher=launcher,
        topology={"nodes": 2, "processesPerNode": 1},
        phases=[
            {**phase, "steps": steps, "microBatchSize": phase["globalBatchSize"] // 2}
            for phase, steps in zip(example["phases"], (20, 2), strict=True)
        ],
        checkpoint={**example["checkpoint"], "path": f"/data/checkpoints/{name}"},
        evaluation={"everySteps": 20},
        logging={"everySteps": 5},
        pod={**example["pod"], "resources": RESOURCES},
        **LAUNCHERS[launcher],
    )
    node.plane.kubectl.apply(document, "-n", namespace)
    status, _ = follow(node, name, namespace, RUN_S)
    output = logs(node, name, namespace)
    assert status["phase"] == "Succeeded", f"{json.dumps(status)}\n{output[-5000:]}"
    assert "world size 2" in output and "rank 1 of 2" in output, output[-5000:]
    placed = node.plane.kubectl.get("pods", "-l", f"{JOB_LABEL}={name}", "-n", namespace)["items"]
    assert {p["spec"]["nodeName"] for p in placed} == {node.name}, "a pod ran on a kwok node"
