"""What the Kubeflow operators give the pods of a rendered child, without a cluster.

Pure functions of a child manifest as :func:`bertjob.render.render` returns it (a dict), so that a
test can start the very command a pod would run, with the environment it would get, on one
machine: every pod on one host, the rendezvous address replaced by ``master_addr``.

Sources (read for these functions; Apache-2.0, The Kubeflow Authors):

- training-operator v1 (release 1.9, whose PyTorchJob CRD is in ``../shared/upstream-crds``):
  ``pkg/controller.v1/pytorch/envvar.go`` (``setPodEnv``: ``PYTHONUNBUFFERED``; beside a Master
  ``WORLD_SIZE`` = replicas x ``nprocPerNode``, ``RANK`` = ``PET_NODE_RANK`` = the index, plus
  one for Workers, ``PET_NPROC_PER_NODE``; ``PET_NNODES`` = replicas without an elasticPolicy),
  ``master.go`` (``MASTER_PORT``, ``PET_MASTER_PORT``: the Master's ``pytorchjob-port``;
  ``MASTER_ADDR``, ``PET_MASTER_ADDR``: ``<name>-master-0``), ``elastic.go`` (``PET_RDZV_ENDPOINT``
  = ``rdzvHost`` or ``<name>-worker-0``, colon, ``rdzvPort`` or the Worker's ``pytorchjob-port``;
  ``PET_RDZV_BACKEND`` (default ``c10d``); ``PET_NNODES`` = ``<min>:<max>``; ``PET_MAX_RESTARTS``,
  ``PET_NPROC_PER_NODE`` (from the deprecated ``elasticPolicy.nProcPerNode`` only),
  ``PET_RDZV_ID``, ``PET_RDZV_CONF``, ``PET_STANDALONE`` when set), and
  ``pkg/apis/kubeflow.org/v1/pytorch_defaults.go`` (replicas default to 1, ``nprocPerNode`` to
  ``auto``, a missing min or max replica count to the other).
- mpi-operator v2beta1 (v0.8): ``pkg/controller/mpi_job_controller.go`` (``newConfigMap``: the
  hostfile, one ``<name>-worker-<i>.<name>.<namespace>.svc slots=<slotsPerWorker>`` line per
  Worker for Open MPI; ``updateDiscoverHostsInConfigMap``: ``discover_hosts.sh``, one
  ``echo <host>`` per running Worker; both mounted on the Launcher at ``/etc/mpi``).
"""

from __future__ import annotations

from typing import Any

PYTORCH_CONTAINER = "pytorch"
PYTORCH_PORT_NAME = "pytorchjob-port"
PYTORCH_DEFAULT_PORT = 23456
MPI_HOSTFILE = "/etc/mpi/hostfile"
MPI_DISCOVER_HOSTS = "/etc/mpi/discover_hosts.sh"


def _pytorch_container(replica: dict[str, Any]) -> dict[str, Any]:
    containers = replica["template"]["spec"]["containers"]
    return dict(next(c for c in containers if c["name"] == PYTORCH_CONTAINER))


def _pytorch_port(replica: dict[str, Any]) -> int:
    """``getPortFromPyTorchJob``: the ``pytorchjob-port`` of the ``pytorch`` container (the
    defaulter adds 23456 when the container declares none)."""
    ports = _pytorch_container(replica).get("ports", [])
    return int(
        next((p["containerPort"] for p in ports if p.get("name") == PYTORCH_PORT_NAME), PYTORCH_DEFAULT_PORT)
    )


def pytorchjob_pod_env(
    job: dict[str, Any],
    replica_type: str,
    index: int,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
) -> dict[str, str]:
    """The environment of the ``pytorch`` container of pod ``<replica_type>-<index>`` of the
    PyTorchJob ``job``: the container's own variables with a literal ``value`` (``valueFrom`` ones,
    which the kubelet resolves, are left out), then those the training operator appends, the
    later winning as in a pod. Addresses (``<name>-master-0``, the rendezvous host) become
    ``master_addr``, and ports ``master_port`` (default: the job's own container port).
    """
    spec = job["spec"]
    replicas: dict[str, dict[str, Any]] = spec["pytorchReplicaSpecs"]
    container = _pytorch_container(replicas[replica_type])
    env = {var["name"]: str(var["value"]) for var in container.get("env", []) if "value" in var}
    env["PYTHONUNBUFFERED"] = "0"

    policy: dict[str, Any] | None = spec.get("elasticPolicy")
    total = sum(int(replica.get("replicas", 1)) for replica in replicas.values())
    nproc = spec.get("nprocPerNode")
    if nproc is None and (policy is None or "nProcPerNode" not in policy):
        nproc = "auto"
    if "Master" in replicas:
        port = str(master_port or _pytorch_port(replicas["Master"]))
        env.update(
            MASTER_PORT=port, PET_MASTER_PORT=port, MASTER_ADDR=master_addr, PET_MASTER_ADDR=master_addr
        )
        rank = str(index + 1 if replica_type == "Worker" else index)
        # getNprocPerNodeInt: 1 unless nprocPerNode is a number.
        per_node = int(nproc) if nproc is not None and nproc.isdigit() else 1
        env.update(WORLD_SIZE=str(total * per_node), RANK=rank)
        env.update(PET_NPROC_PER_NODE=str(nproc), PET_NODE_RANK=rank)
    if policy is None:
        env["PET_NNODES"] = str(total)
        return env

    port = str(master_port or policy.get("rdzvPort") or _pytorch_port(replicas["Worker"]))
    env["PET_RDZV_ENDPOINT"] = f"{master_addr}:{port}"
    env["PET_RDZV_BACKEND"] = str(policy.get("rdzvBackend", "c10d"))
    low, high = policy.get("minReplicas"), policy.get("maxReplicas")
    if low is None and high is None:
        env["PET_NNODES"] = str(replicas["Worker"].get("replicas", 1))
    else:
        env["PET_NNODES"] = f"{low if low is not None else high}:{high if high is not None else low}"
    if "maxRestarts" in policy:
        env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
    if "nProcPerNode" in policy:
        env["PET_NPROC_PER_NODE"] = str(policy["nProcPerNode"])
    if "rdzvId" in policy:
        env["PET_RDZV_ID"] = str(policy["rdzvId"])
    if policy.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{conf['key']}={conf['value']}" for conf in policy["rdzvConf"])
    if policy.get("standalone"):
        env["PET_STANDALONE"] = ""
    return env


def pytorchjob_pod_command(job: dict[str, Any], replica_type: str) -> list[str]:
    """The command line of the ``pytorch`` container of a ``replica_type`` pod (its ``command``
    followed by its ``args``)."""
    container = _pytorch_container(job["spec"]["pytorchReplicaSpecs"][replica_type])
    return [*container.get("command", []), *container.get("args", [])]


def _mpi_workers_and_slots(job: dict[str, Any]) -> tuple[int, int]:
    spec = job["spec"]
    return int(spec["mpiReplicaSpecs"]["Worker"].get("replicas", 1)), int(spec.get("slotsPerWorker", 1))


def mpijob_hostfile(job: dict[str, Any], host: str = "localhost") -> str:
    """mpi-operator's Open MPI hostfile for the MPIJob ``job`` with every Worker on ``host``.

    mpi-operator writes one ``<worker> slots=<slotsPerWorker>`` line per Worker. With all of them
    on one host, the lines become one, ``<host> slots=<Workers x slotsPerWorker>``: horovodrun's
    ``--hostfile`` reader keeps a repeated host's lines as separate hosts of the same name (and
    so mis-assigns local ranks), while one line reads the same to mpirun and horovodrun.
    """
    workers, slots = _mpi_workers_and_slots(job)
    return f"{host} slots={workers * slots}\n"


def mpijob_discover_hosts(job: dict[str, Any], hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> str:
    """mpi-operator's ``discover_hosts.sh`` (for elastic Horovod) with Worker ``i`` running on
    ``hosts[i]``: one ``echo <host>:<slotsPerWorker>`` line per Worker. (mpi-operator echoes the
    Workers without slots, which horovodrun's ``--slots-per-host`` fills in.) The default names
    are two that horovodrun starts without ssh: elastic Horovod wants two hosts to start (it
    compares their network interfaces), as a real job's two Worker pods are.

    Raises:
        ValueError: more Workers than ``hosts``.
    """
    workers, slots = _mpi_workers_and_slots(job)
    if workers > len(hosts):
        raise ValueError(f"{workers} Workers, but only {len(hosts)} host names: {hosts}")
    return "#!/bin/sh\n" + "".join(f"echo {host}:{slots}\n" for host in hosts[:workers])


def mpijob_launcher_command(
    job: dict[str, Any], hostfile: str, discover_hosts: str = MPI_DISCOVER_HOSTS
) -> list[str]:
    """The Launcher container's command line (``command`` then ``args``) with mpi-operator's
    ``/etc/mpi/hostfile`` replaced by ``hostfile`` and ``/etc/mpi/discover_hosts.sh`` by
    ``discover_hosts``."""
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    paths = {MPI_HOSTFILE: hostfile, MPI_DISCOVER_HOSTS: discover_hosts}
    return [paths.get(arg, arg) for arg in [*launcher.get("command", []), *launcher.get("args", [])]]


def kubeflow_condition(type_: str, status: str = "True") -> dict[str, Any]:
    """A JobCondition as Kubeflow's operators write it into a PyTorchJob's or MPIJob's status."""
    return {
        "type": type_,
        "status": status,
        "reason": f"Job{type_}",
        "message": f"the job is {type_.lower()}",
        "lastUpdateTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
