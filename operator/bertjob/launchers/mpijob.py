"""The ``mpijob`` launcher: an mpi-operator MPIJob (kubeflow.org/v2beta1) running mpirun or horovodrun.

A Launcher pod runs ``spec.mpi.command`` over the hostfile mpi-operator writes (one line per
Worker, ``slotsPerWorker`` = processes per node) with ``-np`` = world size; ``nodes`` Worker pods
only run sshd, and the ranks start in them over ssh. Ranks started over ssh do not see the pod's
environment: mpirun forwards the Launcher's variables the trainer needs (``-x``; horovodrun
forwards its whole environment), and a fixed shell line maps the MPI rank variables to the
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` that torch.distributed reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from bertjob.launchers import (
    ChildKind,
    JsonPatch,
    PodNames,
    job_patch,
    json_pointer,
    pod_context,
)
from bertjob.spec import Accelerator, JobSpec

# Names and commands of kustomize/base/mpijob.yaml and the accelerator components; the patch tests
# the container names, and tests/bertjob/test_kustomize.py checks that the base runs the same
# rank wrapper and trainer command as these.
LAUNCHER_CONTAINER = "launcher"
WORKER_CONTAINER = "worker"
HOSTFILE = "/etc/mpi/hostfile"
RANK_SCRIPT = (
    'export RANK="${OMPI_COMM_WORLD_RANK:-$HOROVOD_RANK}" '
    'WORLD_SIZE="${OMPI_COMM_WORLD_SIZE:-$HOROVOD_SIZE}" '
    'LOCAL_RANK="${OMPI_COMM_WORLD_LOCAL_RANK:-$HOROVOD_LOCAL_RANK}"; exec "$@"'
)
TRAINER_COMMAND = ["python", "-m", "bertpretrain", "run", "--config", "/etc/bertjob/job.yaml"]
# Variables every rank needs from the Launcher: the job (progress reports) and the rendezvous.
FORWARDED_ENV = ["BERTJOB_NAME", "BERTJOB_NAMESPACE", "MASTER_ADDR", "MASTER_PORT"]
ACCELERATOR_ENV: dict[Accelerator, list[str]] = {"habana-hpu": ["PT_HPU_LAZY_MODE"]}
# One process per socket, bound to it (components/xeon-cpu); mpirun's defaults elsewhere.
MPIRUN_BINDING: dict[Accelerator, list[str]] = {"xeon-cpu": ["--map-by", "socket", "--bind-to", "socket"]}


class MPIJobLauncher:
    """Renders ``spec`` as an MPIJob; see :class:`bertjob.launchers.Launcher`."""

    child = ChildKind(group="kubeflow.org", version="v2beta1", kind="MPIJob", plural="mpijobs")
    component = "mpijob"

    def patch(self, spec: JobSpec, *, name: str, pods: PodNames) -> JsonPatch:
        """Operations on the built MPIJob; see :meth:`bertjob.launchers.Launcher.patch`."""
        ssh = PurePosixPath(spec.mpi.ssh_auth_mount_path)
        replicas: list[dict[str, Any]] = [
            {
                "path": json_pointer("spec", "mpiReplicaSpecs", "Launcher"),
                "count": None,
                "trainer": False,
                "pod": pod_context(
                    spec, pods, container=LAUNCHER_CONTAINER, labels=pods.labels, trainer=False
                ),
                "container": {"args": launcher_args(spec)},
            },
            {
                "path": json_pointer("spec", "mpiReplicaSpecs", "Worker"),
                "count": spec.topology.nodes,
                "trainer": True,
                "pod": pod_context(spec, pods, container=WORKER_CONTAINER, labels=pods.labels, trainer=True),
                # mpi-operator's non-root layout: the user's sshd configuration beside the keys.
                "container": {"command": ["/usr/sbin/sshd", "-De", "-f", str(ssh.parent / ".sshd_config")]},
            },
        ]
        return job_patch(
            spec,
            name,
            {
                "/spec/slotsPerWorker": spec.topology.processes_per_node,
                "/spec/sshAuthMountPath": str(ssh),
            },
            replicas,
        )

    def trainer_template(self, child: Mapping[str, Any]) -> dict[str, Any]:
        """The Worker's pod template (the Launcher runs mpirun only)."""
        return dict(child["spec"]["mpiReplicaSpecs"]["Worker"]["template"])


def launcher_args(spec: JobSpec) -> list[str]:
    """The Launcher's ``spec.mpi.command`` line: every rank of the world over the hostfile, each
    running the trainer's ``run`` command through the rank wrapper."""
    head = [spec.mpi.command, "-np", str(spec.topology.world_size), "--hostfile", HOSTFILE]
    if spec.mpi.command == "mpirun":
        names = FORWARDED_ENV + ACCELERATOR_ENV.get(spec.accelerator, [])
        names += [str(env["name"]) for env in spec.pod.env if "name" in env]
        head += MPIRUN_BINDING.get(spec.accelerator, [])
        head += [arg for env_name in names for arg in ("-x", env_name)]
    return [*head, "/bin/sh", "-c", RANK_SCRIPT, "rank", *TRAINER_COMMAND]
