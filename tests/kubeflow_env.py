"""What the Kubeflow operators give the pods of a rendered child, without a cluster.

Pure functions of a child manifest as :func:`bertjob.render.render` returns it (a dict), so that a
test can start the very command a pod would run, with the environment it would get, on one
machine: every pod on one host, the rendezvous address replaced by ``master_addr``.

Sources (read for these functions; Apache-2.0, The Kubeflow Authors):

- training-operator v1 (release 1.9, whose PyTorchJob CRD comes from its Go module):
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
- Trainer v2 (v2.3.0, whose TrainJob and ClusterTrainingRuntime CRDs come from its Go module;
  the stored copies read here are later commits of kubeflow/trainer, and the functions follow what
  they agree on):

  - ``pkg/runtime/framework/plugins/jobset/builder.go`` (``Trainer``, read at 54efa72e): the
    TrainJob's ``trainer`` (image, ``command`` and ``args`` where set, ``resourcesPerNode``, ``env``
    upserted by name) is applied to the containers named ``node`` of the replicated jobs labelled
    ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``, and only those. A stored copy at
    08595084 applies it to every ``node`` container instead (the unmerged kubeflow/trainer#2653);
    the project's integration test ``test/integration/controller/trainjob_controller_test.go``
    (an MPI TrainJob: its env on the node pods, only the MPI variables on the launcher's ``node``
    container), kubeflow/trainer#4030 (tested on v2.1.0) and the open #4050 (2026-09, after
    v2.3.0) say the released behaviour is the first.
  - ``pkg/runtime/framework/plugins/torch/torch.go`` (``EnforceMLPolicy``, read at 06b555d6 and
    85eed65a): in the trainer's ``node`` container, after the TrainJob's env, ``PET_NNODES`` = the
    trainer's node count (``trainer.numNodes``, else the runtime's ``mlPolicy.numNodes``),
    ``PET_NPROC_PER_NODE`` = ``trainer.numProcPerNode`` (else the runtime's, else ``auto``; an
    integer stays as it is when ``resourcesPerNode`` has limits or requests, and becomes 1 when it
    has neither: ``calculateNumProcPerNode``), ``PET_NODE_RANK`` from the pod's
    ``batch.kubernetes.io/job-completion-index`` annotation (the Indexed Job's completion index),
    ``PET_MASTER_ADDR`` = ``<trainjob>-node-0-0.<trainjob>``, ``PET_MASTER_PORT`` =
    ``constants.ContainerTrainerPort`` (29500).
  - ``pkg/runtime/framework/plugins/mpi/mpi.go`` (``EnforceMLPolicy``, ``buildHostFileConfigMap``,
    read at 0242577c): node count = ``trainer.numNodes`` (less one, at least 1, with
    ``runLauncherAsNode``, the launcher then being a node too); slots = ``trainer.numProcPerNode``,
    else the runtime's ``mpi.numProcPerNode``; the hostfile, one ``<trainjob>-node-0-<i>.<trainjob>
    slots=<slots>`` line per node pod, mounted at ``/etc/mpi`` in the launcher's ``node``
    container, whose env gets ``OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile``,
    ``OMPI_MCA_orte_keep_fqdn_hostnames=true``, ``OMPI_MCA_orte_set_default_slots=<slots>`` and
    ``OMPI_MCA_plm_rsh_args=-o ConnectionAttempts=10`` (``pkg/constants/constants.go``).
  - A TrainJob's ``runtimePatches`` are merged into the runtime's template before the plugins run
    (containers and env by name), so their env precedes the trainer's.
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
    env = literal_env(container.get("env", []))
    env["PYTHONUNBUFFERED"] = "1"

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


TRAINJOB_NODE = "node"
TRAINJOB_LAUNCHER = "launcher"
TRAINJOB_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINJOB_ANCESTOR_TRAINER = "trainer"
TRAINJOB_TRAINER_PORT = 29500
MPI_HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"


def _replicated_job(runtime: dict[str, Any], name: str) -> dict[str, Any]:
    """The runtime's replicated job ``name``.

    Raises:
        KeyError: the runtime has none of that name.
    """
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    for job in jobs:
        if job["name"] == name:
            return dict(job)
    raise KeyError(f"the runtime has no replicated job {name!r}: {[job['name'] for job in jobs]}")


def _container(job: dict[str, Any]) -> dict[str, Any]:
    """The replicated job's one container (the chart's runtimes have one per pod)."""
    [container] = job["template"]["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _runs_the_trainer(job: dict[str, Any]) -> bool:
    """Whether builder.go's ``Trainer`` applies the TrainJob's trainer to this replicated job's
    container: the job is labelled as the trainer's and the container is named ``node``."""
    labels = job["template"].get("metadata", {}).get("labels", {})
    trainer = labels.get(TRAINJOB_ANCESTOR_LABEL) == TRAINJOB_ANCESTOR_TRAINER
    return bool(trainer and _container(job)["name"] == TRAINJOB_NODE)


def literal_env(env: list[dict[str, Any]]) -> dict[str, str]:
    # valueFrom variables are the kubelet's to resolve: left out, as in pytorchjob_pod_env.
    return {var["name"]: str(var["value"]) for var in env if "value" in var}


def _patched_env(trainjob: dict[str, Any], job_name: str, container_name: str) -> dict[str, str]:
    """The literal env the TrainJob's runtimePatches give container ``container_name`` of
    replicated job ``job_name`` (Trainer v2's webhook refuses a patch of a ``node`` container's)."""
    env: dict[str, str] = {}
    for patch in trainjob["spec"].get("runtimePatches", []):
        spec = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {})
        for job in spec.get("replicatedJobs", []):
            if job.get("name") != job_name:
                continue
            pod = job.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in pod.get("containers", []):
                if container.get("name") == container_name:
                    env.update(literal_env(container.get("env", [])))
    return env


def _container_env(trainjob: dict[str, Any], runtime: dict[str, Any], job_name: str) -> dict[str, str]:
    """The container's literal env in replicated job ``job_name`` before the ML plugins: the
    runtime's, then the TrainJob's patches, then (the trainer's ``node`` container) the trainer's."""
    job = _replicated_job(runtime, job_name)
    container = _container(job)
    env = literal_env(container.get("env", []))
    env.update(_patched_env(trainjob, job_name, container["name"]))
    if _runs_the_trainer(job):
        env.update(literal_env(trainjob["spec"].get("trainer", {}).get("env", [])))
    return env


def _command(trainjob: dict[str, Any], runtime: dict[str, Any], job_name: str) -> list[str]:
    """The container's command line in replicated job ``job_name``: builder.go's ``Trainer`` sets
    the trainer's ``command`` and ``args``, each where given, in the trainer's ``node`` container."""
    job = _replicated_job(runtime, job_name)
    container = _container(job)
    command, args = container.get("command", []), container.get("args", [])
    if _runs_the_trainer(job):
        trainer = trainjob["spec"].get("trainer", {})
        command = trainer["command"] if trainer.get("command") is not None else command
        args = trainer["args"] if trainer.get("args") is not None else args
    return [*command, *args]


def _num_nodes(trainjob: dict[str, Any], runtime: dict[str, Any]) -> int:
    trainer = trainjob["spec"].get("trainer", {})
    return int(trainer.get("numNodes", runtime["spec"].get("mlPolicy", {}).get("numNodes", 1)))


def _torch_proc_per_node(trainjob: dict[str, Any], runtime: dict[str, Any]) -> str:
    """``PET_NPROC_PER_NODE`` as torch.go computes it for an integer count.

    Raises:
        ValueError: the count is a string (``auto``, ``cpu``, ``gpu``), which Trainer v2 resolves
            from the resources per node: not modelled here (the operator always gives a number).
    """
    trainer = trainjob["spec"].get("trainer", {})
    policy = runtime["spec"].get("mlPolicy", {}).get("torch") or {}
    count = trainer.get("numProcPerNode", policy.get("numProcPerNode", "auto"))
    if isinstance(count, str):
        raise ValueError(f"numProcPerNode {count!r} is resolved from resources: not modelled")
    resources = trainer.get("resourcesPerNode")
    if resources is not None and resources.get("limits") is None and resources.get("requests") is None:
        return "1"
    return str(int(count))


def trainjob_node_env(
    trainjob: dict[str, Any],
    runtime: dict[str, Any],
    node_rank: int,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
) -> dict[str, str]:
    """The environment of the ``node`` container of node pod ``node_rank`` (its Indexed Job's
    completion index) of the TrainJob ``trainjob`` on the torch runtime ``runtime`` (a
    ClusterTrainingRuntime or TrainingRuntime): the runtime's literal variables, the TrainJob's
    runtime patches' and trainer's (``valueFrom`` ones, which the kubelet resolves, left out), then,
    under a torch policy, the ``PET_*`` variables Trainer v2's torch plugin adds, with
    ``master_addr`` for the first node pod's name and ``master_port`` (default 29500) for its port.

    Raises:
        KeyError: the runtime has no ``node`` replicated job.
        ValueError: ``node_rank`` is not one of the TrainJob's nodes; or the process count is a
            string (see :func:`_torch_proc_per_node`).
    """
    nodes = _num_nodes(trainjob, runtime)
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node rank {node_rank} of a TrainJob of {nodes} nodes")
    env = _container_env(trainjob, runtime, TRAINJOB_NODE)
    torch = runtime["spec"].get("mlPolicy", {}).get("torch") is not None
    if not torch or not _runs_the_trainer(_replicated_job(runtime, TRAINJOB_NODE)):
        return env  # no torch policy, or no trainer container for it: no PET_* at all
    env.update(
        PET_NNODES=str(nodes),
        PET_NPROC_PER_NODE=_torch_proc_per_node(trainjob, runtime),
        PET_NODE_RANK=str(node_rank),
        PET_MASTER_ADDR=master_addr,
        PET_MASTER_PORT=str(master_port or TRAINJOB_TRAINER_PORT),
    )
    return env


def trainjob_node_command(trainjob: dict[str, Any], runtime: dict[str, Any]) -> list[str]:
    """The command line (``command`` then ``args``) of the node pods' ``node`` container: the
    TrainJob trainer's ``command`` and ``args`` where set (when the runtime's ``node`` job runs the
    trainer), else the runtime's.

    Raises:
        KeyError: the runtime has no ``node`` replicated job.
    """
    return _command(trainjob, runtime, TRAINJOB_NODE)


def _mpi_nodes_and_slots(trainjob: dict[str, Any], runtime: dict[str, Any]) -> tuple[int, int]:
    """(pods in the hostfile, slots per pod), as mpi.go counts them."""
    policy = runtime["spec"]["mlPolicy"]["mpi"]
    trainer = trainjob["spec"].get("trainer", {})
    slots = int(trainer.get("numProcPerNode", policy.get("numProcPerNode", 1)))
    nodes = _num_nodes(trainjob, runtime)
    if policy.get("runLauncherAsNode"):
        return max(nodes - 1, 1) + 1, slots
    return nodes, slots


def trainjob_mpi_hostfile(trainjob: dict[str, Any], runtime: dict[str, Any], host: str = "localhost") -> str:
    """Trainer v2's Open MPI hostfile for the TrainJob ``trainjob`` on the MPI runtime
    ``runtime`` with every node pod on ``host``: one line, ``<host> slots=<pods x slots>``, for the
    reason :func:`mpijob_hostfile` gives (Trainer v2 writes one line per pod).

    Raises:
        KeyError: the runtime has no MPI policy.
    """
    pods, slots = _mpi_nodes_and_slots(trainjob, runtime)
    return f"{host} slots={pods * slots}\n"


def trainjob_mpi_launcher_env(
    trainjob: dict[str, Any], runtime: dict[str, Any], hostfile: str
) -> dict[str, str]:
    """The environment of the launcher pod's container (the one that runs mpirun): its literal
    variables as :func:`trainjob_node_env` gathers them (the runtime's, the TrainJob's runtime
    patches of it, and the trainer's only for a ``node`` container of a job labelled as the
    trainer's), then, for a container named ``node``, the Open MPI variables of Trainer v2's MPI
    plugin, with the hostfile at ``hostfile`` instead of ``/etc/mpi/hostfile`` (mpi.go sets them,
    and mounts the hostfile, in containers of that name only).

    Raises:
        KeyError: the runtime has no ``launcher`` replicated job or no MPI policy.
    """
    env = _container_env(trainjob, runtime, TRAINJOB_LAUNCHER)
    if _container(_replicated_job(runtime, TRAINJOB_LAUNCHER))["name"] != TRAINJOB_NODE:
        return env
    _, slots = _mpi_nodes_and_slots(trainjob, runtime)
    env.update(
        {
            MPI_HOSTFILE_ENV: hostfile,
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_set_default_slots": str(slots),
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        }
    )
    return env


def trainjob_mpi_launcher_command(
    trainjob: dict[str, Any], runtime: dict[str, Any], hostfile: str = MPI_HOSTFILE
) -> list[str]:
    """The command line (``command`` then ``args``) of the launcher pod's container, with Trainer
    v2's ``/etc/mpi/hostfile`` replaced by ``hostfile``: the runtime's, or the TrainJob trainer's
    where set when the runtime labels the launcher's job as the trainer's and names its container
    ``node``.

    Raises:
        KeyError: the runtime has no ``launcher`` replicated job.
    """
    return [
        hostfile if arg == MPI_HOSTFILE else arg for arg in _command(trainjob, runtime, TRAINJOB_LAUNCHER)
    ]
