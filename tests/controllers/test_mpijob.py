"""MPIJob children through the real mpi-operator (v2beta1): the Workers start first
(``launcherCreationPolicy: WaitForWorkersReady``), the Launcher is a batch Job's pod with the
hostfile and the SSH keys mpi-operator mounts, and the job succeeds when the Launcher does.

kwok does not restart a container in place, so the Launcher's ``restartPolicy: OnFailure`` (a
kubelet's restart) is not exercised here.

Why kwok: the pods are checked as mpi-operator made them (hostfile, SSH keys, command) and the
Launcher ends with exit 0 in milliseconds, where a real run takes minutes; an MPIJob's two ranks
run over SSH for real in tests/node/test_distributed.py.
"""

from __future__ import annotations

from bertjob_api.contract import JOB_LABEL, MPIRUN_MCA_ENV
from bertjob_testing.cluster.operator import RealCluster
from tests.bertjob.e2e import CHILD_RESOURCES, named_job
from tests.cluster.test_kstatus_e2e import judged
from tests.controllers import pods
from tests.kubeflow_env import MPI_HOSTFILE, mpijob_launcher_command

ROLE = "training.kubeflow.org/job-role"
MPIJOBS = CHILD_RESOURCES["mpijob"]


def test_an_mpijob_runs_mpirun_over_its_workers_and_succeeds(cluster: RealCluster) -> None:
    name = "horovod"
    cluster.create_job(
        named_job(
            name,
            "mpijob",
            spec__accelerator="xeon-cpu",
            spec__image="ghcr.io/bertjob/trainer:0.1.0-xeon",
            spec__topology={"nodes": 2, "processesPerNode": 2},
        )
    )
    workers = pods.running(cluster, pods.of_job(name, **{ROLE: "worker"}), 2)
    [launcher] = pods.running(cluster, pods.of_job(name, **{ROLE: "launcher"}), 1)
    child = cluster.object(MPIJOBS, name)
    assert child is not None

    [container] = launcher["spec"]["containers"]
    assert container["command"] + container.get("args", []) == mpijob_launcher_command(child, MPI_HOSTFILE)
    env = {v["name"]: v.get("value") for v in container["env"]}
    assert MPIRUN_MCA_ENV["xeon-cpu"].items() <= env.items()
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/mpi", child["spec"]["sshAuthMountPath"]} <= mounts, mounts
    assert launcher["metadata"]["labels"][JOB_LABEL] == name
    assert cluster.plane is not None
    hostfile = cluster.plane.kubectl.get("configmap", f"{name}-config", "-n", cluster.default_namespace)
    assert hostfile is not None
    lines = hostfile["data"]["hostfile"].split()
    assert lines == [
        f"{name}-worker-{i}.{name}.{cluster.default_namespace}.svc" if j == 0 else "slots=2"
        for i in range(2)
        for j in range(2)
    ], hostfile["data"]["hostfile"]
    rendered = child["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    for worker in workers:
        [sshd] = worker["spec"]["containers"]
        assert (sshd["command"], sshd["resources"]) == (rendered["command"], rendered["resources"])
    assert cluster.status_when(name, "Running")

    pods.end(cluster, launcher, 0)

    assert cluster.status_when(name, "Succeeded")
    conditions, verdict, health = judged(cluster, name)
    assert (verdict, health, conditions["Ready"][0]) == ("Current", "Healthy", "True"), conditions
