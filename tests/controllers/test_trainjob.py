"""TrainJob children through the real Kubeflow Trainer v2 and JobSet, on the chart's runtimes: the
pods carry what we rendered and what our pod tests assume Trainer adds (:mod:`tests.kubeflow_env`),
and the runtimes' failure policy decides by exit code: a retryable code (201) restarts the JobSet,
every pod together; a permanent one (1) fails it, and the job's status names the pod. The data
Job's ``podFailurePolicy`` decides the same way through the real Job controller.

Why kwok: the torch runtime's pods ask for nvidia.com/gpu, and exits 201 and 1 are set on demand to
drive the JobSet's failure policy and the data Job's podFailurePolicy; a TrainJob's two ranks train
for real in tests/node/test_distributed.py.
"""

from __future__ import annotations

from typing import Any

from bertjob_api.contract import JOB_LABEL, JOB_PATH, MPI_RUNTIME, TORCH_RUNTIME
from bertjob_testing.cluster.operator import RealCluster
from tests.bertjob.e2e import PYTORCHJOBS, TRAINJOBS, named_job
from tests.cluster.test_kstatus_e2e import judged
from tests.controllers import pods
from tests.kubeflow_env import (
    TRAINJOB_LAUNCHER,
    TRAINJOB_NODE,
    literal_env,
    trainjob_mpi_launcher_command,
    trainjob_mpi_launcher_env,
    trainjob_node_command,
    trainjob_node_env,
)

JOB_NAME_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"


def _runtime(cluster: RealCluster, name: str) -> dict[str, Any]:
    assert cluster.plane is not None
    found = cluster.plane.kubectl.get("clustertrainingruntime", name)
    assert found is not None, f"the chart's ClusterTrainingRuntime {name}"
    return dict(found)


def _job(name: str, policy: str = "torch", **fields: Any) -> dict[str, Any]:
    return named_job(
        name,
        "trainjob",
        spec__topology={"nodes": 2, "processesPerNode": 1},
        spec__trainJob={"mlPolicy": policy},
        **fields,
    )


def test_a_torch_trainjob_runs_its_nodes_and_succeeds(cluster: RealCluster) -> None:
    name = "torch"
    cluster.create_job(_job(name))
    nodes = pods.running(cluster, pods.of_job(name, **{JOB_NAME_LABEL: TRAINJOB_NODE}), 2)
    trainjob = cluster.object(TRAINJOBS, name)
    assert trainjob is not None
    runtime = _runtime(cluster, TORCH_RUNTIME)

    for rank, pod in enumerate(
        sorted(nodes, key=lambda p: p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"])
    ):
        node = pods.container(pod, TRAINJOB_NODE)
        assert node["command"] + node.get("args", []) == trainjob_node_command(trainjob, runtime)
        assert (node["command"] + node.get("args", []))[-2:] == ["--config", JOB_PATH]
        assert node["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["metadata"]["labels"][JOB_LABEL] == name
        seen = pods.env(pod, TRAINJOB_NODE)
        # The rendezvous address is the first node pod's DNS name; Trainer gives PET_NODE_RANK as a
        # fieldRef to the completion index, which the kubelet resolves (pods.env).
        expected = trainjob_node_env(
            trainjob,
            runtime,
            rank,
            master_addr=seen["PET_MASTER_ADDR"],
            master_port=int(seen["PET_MASTER_PORT"]),
        )
        assert {key: seen[key] for key in expected if key in seen} == expected
        assert seen["PET_MASTER_ADDR"] == f"{name}-{TRAINJOB_NODE}-0-0.{name}"
    assert cluster.status_when(name, "Running")

    for pod in nodes:
        pods.end(cluster, pod, 0)

    assert cluster.status_when(name, "Succeeded")
    conditions, verdict, health = judged(cluster, name)
    assert (verdict, health, conditions["Ready"][0]) == ("Current", "Healthy", "True"), conditions


def test_an_mpi_trainjob_runs_mpirun_on_its_launcher_and_succeeds(cluster: RealCluster) -> None:
    name = "mpi"
    cluster.create_job(
        _job(name, "mpi", spec__accelerator="xeon-cpu", spec__image="ghcr.io/bertjob/trainer:0.1.0-xeon")
    )
    [launcher] = pods.running(cluster, pods.of_job(name, **{JOB_NAME_LABEL: TRAINJOB_LAUNCHER}), 1)
    trainjob = cluster.object(TRAINJOBS, name)
    assert trainjob is not None
    runtime = _runtime(cluster, MPI_RUNTIME)
    [container] = launcher["spec"]["containers"]
    assert container["command"] + container.get("args", []) == trainjob_mpi_launcher_command(
        trainjob, runtime
    )
    assert literal_env(container.get("env", [])) == trainjob_mpi_launcher_env(
        trainjob, runtime, "/etc/mpi/hostfile"
    )
    assert cluster.status_when(name, "Running")

    for pod in pods.pods(cluster, pods.of_job(name)):
        pods.end(cluster, pod, 0)

    assert cluster.status_when(name, "Succeeded")
    conditions, verdict, health = judged(cluster, name)
    assert (verdict, health, conditions["Ready"][0]) == ("Current", "Healthy", "True"), conditions


def test_the_runtimes_failure_policy_restarts_on_201_and_fails_on_1(cluster: RealCluster) -> None:
    """201 (a lost peer) fails the node's Job (``backoffLimit: 0``) and the JobSet restarts every
    pod; 1 fails the Job by its ``podFailurePolicy`` (reason PodFailurePolicy), and the JobSet's
    failure policy fails it."""
    name = "restarts"
    cluster.create_job(_job(name))
    selector = pods.of_job(name, **{JOB_NAME_LABEL: TRAINJOB_NODE})
    first = pods.running(cluster, selector, 2)
    assert cluster.status_when(name, "Running")

    pods.end(cluster, first[1], 201)

    def restarted() -> list[dict[str, Any]] | None:
        found = pods.running(cluster, selector, 2, "the JobSet's pods running again")
        fresh = {pods.uid(p) for p in found}.isdisjoint(pods.uid(p) for p in first)
        return found if fresh else None

    second = cluster.wait_for("every pod made again", restarted)
    jobset = cluster.object(JOBSETS, name)
    assert jobset is not None and jobset["status"].get("restarts") == 1
    assert cluster.job(name)["status"]["phase"] == "Running"

    pods.end(cluster, second[0], 1)

    status = cluster.status_when(name, "Failed")
    [failed] = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert (
        f"pod {second[0]['metadata']['name']} exited with code 1: a failure no retry mends"
        in failed["message"]
    )


def test_the_data_jobs_failure_policy_retries_201_and_fails_on_1(cluster: RealCluster) -> None:
    name = "prepared"
    # A PyTorchJob's data Job: a TrainJob takes no backoffLimit (its runtime's), and the data Job
    # is the same for every launcher.
    cluster.create_job(
        named_job(name, "pytorchjob", spec__prepare={"enabled": True}, spec__runPolicy={"backoffLimit": 2})
    )
    selector = pods.of_job(name, **{"app.kubernetes.io/component": "prepare"})
    [first] = pods.running(cluster, selector, 1)

    pods.end(cluster, first, 201)

    def retried() -> dict[str, Any] | None:
        found = [p for p in pods.pods(cluster, selector) if pods.uid(p) != pods.uid(first)]
        return found[0] if found and found[0].get("status", {}).get("phase") == "Running" else None

    second = cluster.wait_for("the data Job's pod made again", retried)
    assert cluster.job(name)["status"]["phase"] != "Failed"

    pods.end(cluster, second, 1)

    status = cluster.status_when(name, "Failed")
    assert "PodFailurePolicy" in str(status["conditions"]), status["conditions"]
    assert cluster.object(PYTORCHJOBS, name) is None, "no training job after a failed data Job"
