"""The ``mpijob`` launcher: an mpi-operator MPIJob (kubeflow.org/v2beta1) running mpirun or horovodrun.

A Launcher pod runs ``spec.mpi.command`` over the hostfile mpi-operator writes (one line per
Worker, ``slotsPerWorker`` = processes per node) with ``-np`` = world size; ``nodes`` Worker pods
only run sshd, and the ranks start in them over ssh and run the trainer's command directly: the
trainer reads its rank and world from Open MPI's (``OMPI_COMM_WORLD_*``) or Horovod's
(``HOROVOD_*``) variables and talks through Horovod, so no rendezvous address is needed. Ranks
started over ssh do not see the pod's environment: mpirun forwards the Launcher's variables the
trainer needs (``-x``); horovodrun forwards its whole environment. mpirun's placement on the
accelerator (:data:`bertjob_api.contract.MPIRUN_MCA_ENV`: one process per socket on Xeon) is not on
its line but in the Launcher's environment, as the Open MPI MCA variables (``OMPI_MCA_*``) that
mpirun reads, as the kustomize tree's accelerator component sets them by hand; under horovodrun,
which passes its own placement to mpirun, the patch deletes them.

An elastic job (``spec.elastic``, horovodrun only) runs elastic Horovod: no hostfile, but
``--host-discovery-script`` on the ``discover_hosts.sh`` that mpi-operator keeps listing the
running Workers (one ``echo <host>`` each, without slots, hence ``--slots-per-host``), between
``--min-np`` and ``--max-np`` processes.

With DeepSpeed (``spec.distributed.deepspeed``, mpirun only) the ranks join through
``torch.distributed``, whose rendezvous needs rank 0's address: mpirun sets ``MASTER_ADDR`` to the
first Worker's name in the hostfile (``<job>-worker-0.<job>.<namespace>.svc``, where mpirun starts
rank 0) and ``MASTER_PORT`` to :data:`DEEPSPEED_MASTER_PORT` in every rank (``-x NAME=VALUE``).

Preemption: the Launcher runs mpirun (or horovodrun) under ``python -m bertpretrain.mpilaunch``
(:data:`LAUNCHER_WRAPPER`) and each rank the trainer under ``python -m bertpretrain.mpilaunch
--rank`` (:data:`RANK_COMMAND`): a SIGTERM to the Launcher reaches every rank at once (mpirun
forwards SIGUSR2, which each rank's wrapper turns into SIGTERM; mpirun's own SIGTERM would abort
the ranks, and horovodrun over MPI does not pass it on), the ranks checkpoint and exit 143, and the
Launcher exits with the ranks' code (143, 200, ...), where mpirun after a SIGTERM, and
``horovodrun --gloo`` always, say 0 or 1. The Workers run sshd under ``python -m
bertpretrain.mpilaunch --worker`` (:data:`WORKER_WRAPPER`): sshd exits at once on SIGTERM, which
would kill the ranks on its pod before they checkpoint; the wrapper passes the SIGTERM to the ranks
and stops sshd once they have ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from bertjob.launchers import (
    DELETE,
    DIRECTIVE,
    ChildKind,
    KubeflowJob,
    MergePatch,
    PodNames,
    job_patch,
    pod_context,
)
from bertjob_api.contract import (
    JOB_PATH,
    MPIRUN_MCA_ENV,
    NAME_ENV,
    NAMESPACE_ENV,
    RUN_COMMAND,
    TRAINER_MODULE,
)
from bertjob_api.spec import Accelerator, ElasticSpec, JobSpec

# Names and commands of kustomize/base/mpijob.yaml and the accelerator components; the patch finds
# the containers by these names, and tests/bertjob/test_kustomize.py checks that the base runs the
# same trainer command as these.
LAUNCHER_CONTAINER = "launcher"
WORKER_CONTAINER = "worker"
# Both written by mpi-operator into the ConfigMap it mounts on the Launcher at /etc/mpi.
HOSTFILE = "/etc/mpi/hostfile"
DISCOVER_HOSTS = "/etc/mpi/discover_hosts.sh"
REPLICA_SPECS = "mpiReplicaSpecs"
TRAINER_COMMAND = ["python", "-m", TRAINER_MODULE, RUN_COMMAND, "--config", JOB_PATH]
# bertpretrain.mpilaunch: before mpirun or horovodrun on the Launcher's line, and before the trainer
# in each rank's (the image's python finds it on the Workers too).
MPILAUNCH_MODULE = "bertpretrain.mpilaunch"
LAUNCHER_WRAPPER = ["python", "-m", MPILAUNCH_MODULE, "--"]
RANK_COMMAND = ["python", "-m", MPILAUNCH_MODULE, "--rank", "--", *TRAINER_COMMAND]
# Before sshd on the Workers: their SIGTERM goes to the ranks, and sshd ends once they have.
WORKER_WRAPPER = ["python", "-m", MPILAUNCH_MODULE, "--worker", "--"]
# Variables every rank needs from the Launcher: the job, for progress reports.
FORWARDED_ENV = [NAME_ENV, NAMESPACE_ENV]
ACCELERATOR_ENV: dict[Accelerator, list[str]] = {"habana-hpu": ["PT_HPU_LAZY_MODE"]}
# The port of rank 0's torch.distributed store under DeepSpeed (torchrun's default).
DEEPSPEED_MASTER_PORT = 29500


class MPIJobLauncher(KubeflowJob):
    """Renders ``spec`` as an MPIJob; see :class:`bertjob.launchers.Launcher`."""

    child = ChildKind(group="kubeflow.org", version="v2beta1", kind="MPIJob", plural="mpijobs")
    component = "mpijob"

    def patch(self, spec: JobSpec, *, name: str, namespace: str, pods: PodNames) -> MergePatch:
        """The patch of the built MPIJob; see :meth:`bertjob.launchers.Launcher.patch`."""
        ssh = PurePosixPath(spec.mpi.ssh_auth_mount_path)
        launcher = pod_context(spec, pods, container=LAUNCHER_CONTAINER, labels=pods.labels, trainer=False)
        launcher["env"] = [*launcher["env"], *launcher_mca_env(spec)]
        replicas: list[dict[str, Any]] = [
            {
                "name": "Launcher",
                "count": None,
                "trainer": False,
                "pod": launcher,
                "container": {"command": launcher_command(spec, name, namespace)},
            },
            {
                "name": "Worker",
                "count": spec.topology.nodes,
                "trainer": True,
                "pod": pod_context(spec, pods, container=WORKER_CONTAINER, labels=pods.labels, trainer=True),
                # mpi-operator's non-root layout: the user's sshd configuration beside the keys.
                "container": {
                    "command": [
                        *WORKER_WRAPPER,
                        "/usr/sbin/sshd",
                        "-De",
                        "-f",
                        str(ssh.parent / ".sshd_config"),
                    ]
                },
            },
        ]
        return job_patch(
            spec,
            name=name,
            namespace=namespace,
            pods=pods,
            replica_specs=REPLICA_SPECS,
            fields={"slotsPerWorker": spec.topology.processes_per_node, "sshAuthMountPath": str(ssh)},
            replicas=replicas,
        )

    def trainer_template(self, child: Mapping[str, Any]) -> dict[str, Any]:
        """The Worker's pod template (the Launcher runs mpirun only)."""
        return dict(child["spec"][REPLICA_SPECS]["Worker"]["template"])


def launcher_command(spec: JobSpec, name: str = "", namespace: str = "") -> list[str]:
    """The Launcher's ``spec.mpi.command`` line under :data:`LAUNCHER_WRAPPER`: every rank of the
    world over the hostfile (or, elastic, the Workers ``discover_hosts.sh`` finds), each running the
    trainer's ``run`` command under :data:`RANK_COMMAND`'s wrapper. ``name`` and ``namespace``: the
    MPIJob's, which name its first Worker for DeepSpeed's rendezvous."""
    world_size = str(spec.topology.world_size)
    if spec.elastic is not None:
        return [
            *LAUNCHER_WRAPPER,
            *elastic_horovodrun(spec.elastic, spec.topology.processes_per_node, world_size),
            *RANK_COMMAND,
        ]
    head = [spec.mpi.command, "-np", world_size, "--hostfile", HOSTFILE]
    if spec.mpi.command == "mpirun":
        names = forwarded_env(spec)
        head += [arg for env_name in names for arg in ("-x", env_name)]
        if spec.distributed.deepspeed is not None:
            first_worker = f"{name}-worker-0.{name}.{namespace}.svc"
            head += ["-x", f"MASTER_ADDR={first_worker}", "-x", f"MASTER_PORT={DEEPSPEED_MASTER_PORT}"]
    return [*LAUNCHER_WRAPPER, *head, *RANK_COMMAND]


def launcher_mca_env(spec: JobSpec) -> list[dict[str, str]]:
    """The Launcher's entries of :data:`~bertjob_api.contract.MPIRUN_MCA_ENV` for the accelerator:
    under mpirun its variables, which the accelerator's component sets too (merged by name, so the
    operator's value holds), and under horovodrun their deletion (``$patch: delete``), except of a
    variable that ``spec.pod.env`` sets: horovodrun gives mpirun its own placement, as before."""
    variables = MPIRUN_MCA_ENV.get(spec.accelerator, {})
    if spec.mpi.command == "mpirun" and spec.elastic is None:
        return [{"name": name, "value": value} for name, value in variables.items()]
    own = {env.get("name") for env in spec.pod.env}
    return [{"name": name, DIRECTIVE: DELETE} for name in variables if name not in own]


def forwarded_env(spec: JobSpec) -> list[str]:
    """The variables mpirun forwards to ranks started over ssh (which do not see the launcher's
    environment): the job's name and namespace, the accelerator's, and ``spec.pod.env``'s."""
    names = FORWARDED_ENV + ACCELERATOR_ENV.get(spec.accelerator, [])
    return names + [str(env["name"]) for env in spec.pod.env if "name" in env]


def elastic_horovodrun(elastic: ElasticSpec, processes_per_node: int, world_size: str) -> list[str]:
    """horovodrun's elastic options: start with ``world_size`` processes, go on between
    ``minNodes`` and ``maxNodes`` nodes of ``processes_per_node`` each, restart at most
    ``maxRestarts`` times (``--reset-limit``). A host whose rank failed is left out for 30 s to
    5 min (``--blacklist-cooldown-range``, longer after each failure), not for good: the Worker
    pod that mpi-operator restarts keeps its host name, and rejoins."""
    return [
        "horovodrun",
        "-np",
        world_size,
        "--min-np",
        str(elastic.min_nodes * processes_per_node),
        "--max-np",
        str(elastic.max_nodes * processes_per_node),
        "--slots-per-host",
        str(processes_per_node),
        "--reset-limit",
        str(elastic.max_restarts),
        "--blacklist-cooldown-range",
        "30",
        "300",
        "--host-discovery-script",
        DISCOVER_HOSTS,
    ]
