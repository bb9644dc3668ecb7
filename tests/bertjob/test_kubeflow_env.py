"""tests/kubeflow_env.py: what the Kubeflow operators give the pods of rendered children, and what
torchrun makes of it."""

from __future__ import annotations

from typing import Any

import pytest

from bertjob.launchers.mpijob import LAUNCHER_WRAPPER, RANK_COMMAND
from bertjob.render import render
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import valid_job, with_value
from tests.kubeflow_env import (
    mpijob_discover_hosts,
    mpijob_hostfile,
    mpijob_launcher_command,
    pytorchjob_pod_command,
    pytorchjob_pod_env,
    trainjob_mpi_hostfile,
    trainjob_mpi_launcher_command,
    trainjob_mpi_launcher_env,
    trainjob_node_command,
    trainjob_node_env,
)

# torchrun run by bertpretrain.launch, which passes a rank's exit code through.
LAUNCHER = ["python", "-m", "bertpretrain.launch"]
TORCHRUN = [*LAUNCHER, "--module", "bertpretrain", "run", "--config", "/etc/bertjob/job.yaml"]


def _child(nodes: int, processes: int, **changes: Any) -> dict[str, Any]:
    document = valid_job()
    for field, value in {
        "spec.topology": {"nodes": nodes, "processesPerNode": processes},
        "spec.phases.0.globalBatchSize": 96,
        "spec.phases.1.globalBatchSize": 48,
        "spec.pod": {"env": [{"name": "OMP_NUM_THREADS", "value": "4"}]},
        **{f"spec.{name}": value for name, value in changes.items()},
    }.items():
        document = with_value(document, field, value)
    return render(parse_job(document))[-1]


ELASTIC = {"minNodes": 1, "maxNodes": 4, "maxRestarts": 5}


def test_a_single_node_master_gets_the_whole_world() -> None:
    child = _child(1, 2)

    env = pytorchjob_pod_env(child, "Master", 0)

    assert env == {
        "OMP_NUM_THREADS": "4",
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "WORLD_SIZE": "2",
        "RANK": "0",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "0",
        "PET_NNODES": "1",
    }  # BERTJOB_NAME and BERTJOB_NAMESPACE come from the downward API (valueFrom): left out
    assert pytorchjob_pod_command(child, "Master") == TORCHRUN


def test_workers_rank_after_the_master() -> None:
    child = _child(3, 2)

    master = pytorchjob_pod_env(child, "Master", 0, master_addr="10.0.0.1", master_port=29555)
    second = pytorchjob_pod_env(child, "Worker", 1, master_addr="10.0.0.1", master_port=29555)

    assert [env["PET_NODE_RANK"] for env in (master, second)] == ["0", "2"]
    assert [env["RANK"] for env in (master, second)] == ["0", "2"]
    for env in (master, second):
        assert (env["WORLD_SIZE"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("6", "3", "2")
        assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("10.0.0.1", "29555")
        assert "PET_RDZV_ENDPOINT" not in env
    assert pytorchjob_pod_command(child, "Worker") == TORCHRUN


def test_an_elastic_job_is_workers_meeting_at_a_rendezvous() -> None:
    child = _child(2, 2, elastic=ELASTIC)

    assert set(child["spec"]["pytorchReplicaSpecs"]) == {"Worker"}
    assert child["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    envs = [pytorchjob_pod_env(child, "Worker", index, master_port=29400) for index in (0, 1)]

    assert envs[0] == envs[1]
    env = envs[0]
    assert {name: env[name] for name in env if name.startswith("PET_")} == {
        "PET_NPROC_PER_NODE": "2",  # the container's own: the operator sets none without a Master
        "PET_RDZV_ENDPOINT": "127.0.0.1:29400",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ID": "demo",
        "PET_NNODES": "1:4",
        "PET_MAX_RESTARTS": "5",
    }
    assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE"} & set(env)
    assert pytorchjob_pod_env(child, "Worker", 0)["PET_RDZV_ENDPOINT"] == "127.0.0.1:23456"
    assert pytorchjob_pod_command(child, "Worker") == TORCHRUN


def _torchrun(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], command: list[str]) -> Any:
    """What torchrun's own parser, which bertpretrain.launch runs, reads from ``env`` and
    ``command`` (its options default to the PET_* variables present when the parser is built)."""
    run = pytest.importorskip("torch.distributed.run")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert command[: len(LAUNCHER)] == LAUNCHER
    return run.get_args_parser().parse_args(command[len(LAUNCHER) :])


def test_torchrun_reads_a_fixed_world_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    child = _child(3, 2)

    args = _torchrun(
        monkeypatch, pytorchjob_pod_env(child, "Worker", 0), pytorchjob_pod_command(child, "Worker")
    )

    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("3", "2", 1)
    assert (args.master_addr, args.master_port, args.rdzv_backend) == ("127.0.0.1", 23456, "static")
    assert (args.module, args.training_script) == (True, "bertpretrain")


def test_torchrun_reads_an_elastic_world_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    child = _child(2, 2, elastic=ELASTIC)

    args = _torchrun(
        monkeypatch, pytorchjob_pod_env(child, "Worker", 1), pytorchjob_pod_command(child, "Worker")
    )

    assert (args.nnodes, args.nproc_per_node, args.max_restarts) == ("1:4", "2", 5)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", "127.0.0.1:23456", "demo")


def test_the_mpi_hostfile_puts_every_slot_on_one_host() -> None:
    child = _child(2, 3, launcher="mpijob", accelerator="xeon-cpu", phases=_phases(6))

    assert mpijob_hostfile(child) == "localhost slots=6\n"
    assert mpijob_hostfile(child, host="node-a") == "node-a slots=6\n"


def _phases(world: int) -> list[dict[str, Any]]:
    phases = valid_job()["spec"]["phases"]
    return [{**phase, "globalBatchSize": 16 * world} for phase in phases]


def test_the_mpirun_line_runs_the_trainer_under_the_wrappers() -> None:
    child = _child(2, 2, launcher="mpijob", accelerator="nvidia-gpu")

    command = mpijob_launcher_command(child, "/tmp/hostfile")

    assert command[:9] == [*LAUNCHER_WRAPPER, "mpirun", "-np", "4", "--hostfile", "/tmp/hostfile"]
    forwarded = [command[i + 1] for i, arg in enumerate(command) if arg == "-x"]
    assert forwarded == ["BERTJOB_NAME", "BERTJOB_NAMESPACE", "OMP_NUM_THREADS"]
    assert command[9 + 2 * len(forwarded) :] == RANK_COMMAND


def test_the_horovodrun_line_reads_the_same_hostfile() -> None:
    child = _child(2, 2, launcher="mpijob", mpi={"command": "horovodrun"})

    assert mpijob_launcher_command(child, "/tmp/h") == [
        *LAUNCHER_WRAPPER,
        "horovodrun",
        "-np",
        "4",
        "--hostfile",
        "/tmp/h",
        *RANK_COMMAND,
    ]


def test_elastic_horovod_discovers_its_hosts() -> None:
    child = _child(2, 2, launcher="mpijob", mpi={"command": "horovodrun"}, elastic=ELASTIC)

    command = mpijob_launcher_command(child, "/tmp/h", discover_hosts="/tmp/discover.sh")

    assert command == [
        *LAUNCHER_WRAPPER,
        "horovodrun",
        "-np",
        "4",
        "--min-np",
        "2",
        "--max-np",
        "8",
        "--slots-per-host",
        "2",
        "--reset-limit",
        "5",
        "--blacklist-cooldown-range",
        "30",
        "300",
        "--host-discovery-script",
        "/tmp/discover.sh",
        *RANK_COMMAND,
    ]
    assert child["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert mpijob_discover_hosts(child) == "#!/bin/sh\necho localhost:2\necho 127.0.0.1:2\n"
    with pytest.raises(ValueError, match="2 Workers, but only 1 host names"):
        mpijob_discover_hosts(child, hosts=("localhost",))


ANCESTOR = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
MPIRUN = ["mpirun", "python", "-m", "bertpretrain", "run", "--config", "/etc/bertjob/job.yaml"]


def _replicated_job(
    name: str, labels: dict[str, str], container: str = "node", **fields: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "template": {
            "metadata": {"labels": labels},
            "spec": {"template": {"spec": {"containers": [{"name": container, "image": "rt", **fields}]}}},
        },
    }


def _torch_runtime(node_labels: dict[str, str] = ANCESTOR) -> dict[str, Any]:
    """A ClusterTrainingRuntime shaped as the chart's bertjob-torch, with env of its own."""
    env = [{"name": "RUNTIME_ONLY", "value": "r"}, {"name": "SHARED", "value": "runtime"}]
    node = _replicated_job("node", node_labels, command=["runtime-command"], env=env)
    return {
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [node]}}}
    }


def _mpi_runtime(
    launcher_labels: dict[str, str] | None = None, launcher_container: str = "node", **policy: Any
) -> dict[str, Any]:
    """A ClusterTrainingRuntime shaped as Trainer v2's own MPI runtimes (the launcher's container
    named node), or as the chart's bertjob-mpi with ``launcher_container="launcher"``."""
    node = _replicated_job("node", ANCESTOR, command=["/usr/sbin/sshd", "-De"])
    env = [{"name": "LAUNCHER_ONLY", "value": "l"}]
    launcher = _replicated_job("launcher", launcher_labels or {}, launcher_container, command=MPIRUN, env=env)
    mpi = {
        "numProcPerNode": 1,
        "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": "/home/mpiuser/.ssh",
        **policy,
    }
    return {
        "spec": {
            "mlPolicy": {"numNodes": 1, "mpi": mpi},
            "template": {"spec": {"replicatedJobs": [node, launcher]}},
        }
    }


def _trainjob(nodes: int, processes: int, **changes: Any) -> dict[str, Any]:
    child = _child(
        nodes,
        processes,
        launcher="trainjob",
        pod={"env": [{"name": "OMP_NUM_THREADS", "value": "4"}, {"name": "SHARED", "value": "job"}]},
        **changes,
    )
    assert child["kind"] == "TrainJob"
    return child


def test_node_1_of_a_two_node_trainjob_gets_the_torch_plugins_world() -> None:
    child = _trainjob(2, 1)

    env = trainjob_node_env(child, _torch_runtime(), 1)

    # torch.go: the runtime's env, the trainer's upserted over it, then the PET_* variables.
    assert env == {
        "RUNTIME_ONLY": "r",
        "SHARED": "job",
        "OMP_NUM_THREADS": "4",
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29500",
    }  # BERTJOB_NAME and BERTJOB_NAMESPACE come from the downward API (valueFrom): left out
    assert (
        trainjob_node_env(child, _torch_runtime(), 0, master_addr="m", master_port=1234)["PET_MASTER_PORT"]
        == "1234"
    )
    with pytest.raises(ValueError, match="node rank 2 of a TrainJob of 2 nodes"):
        trainjob_node_env(child, _torch_runtime(), 2)


def test_the_process_count_is_one_when_resources_say_nothing() -> None:
    child = _trainjob(1, 3)
    child["spec"]["trainer"]["resourcesPerNode"] = {}

    # calculateNumProcPerNode: neither limits nor requests.
    assert trainjob_node_env(child, _torch_runtime(), 0)["PET_NPROC_PER_NODE"] == "1"
    del child["spec"]["trainer"]["resourcesPerNode"]
    assert trainjob_node_env(child, _torch_runtime(), 0)["PET_NPROC_PER_NODE"] == "3"
    child["spec"]["trainer"]["numProcPerNode"] = "auto"
    with pytest.raises(ValueError, match="not modelled"):
        trainjob_node_env(child, _torch_runtime(), 0)


def test_a_node_job_without_the_trainer_label_gets_nothing_of_the_trainjob() -> None:
    child = _trainjob(2, 1)

    assert trainjob_node_env(child, _torch_runtime(node_labels={}), 0) == {
        "RUNTIME_ONLY": "r",
        "SHARED": "runtime",
    }
    assert trainjob_node_command(child, _torch_runtime(node_labels={})) == ["runtime-command"]


def test_torchrun_reads_the_trainjob_world_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    child = _trainjob(3, 2)
    runtime = _torch_runtime()

    assert trainjob_node_command(child, runtime) == TORCHRUN
    args = _torchrun(monkeypatch, trainjob_node_env(child, runtime, 2), trainjob_node_command(child, runtime))

    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("3", "2", 2)
    assert (args.master_addr, args.master_port, args.rdzv_backend) == ("127.0.0.1", 29500, "static")
    assert (args.module, args.training_script) == (True, "bertpretrain")


def test_the_trainjob_hostfile_puts_every_node_slot_on_one_host() -> None:
    child = _trainjob(2, 3, trainJob={"mlPolicy": "mpi"}, accelerator="xeon-cpu", phases=_phases(6))

    assert trainjob_mpi_hostfile(child, _mpi_runtime()) == "localhost slots=6\n"
    assert trainjob_mpi_hostfile(child, _mpi_runtime(), host="node-a") == "node-a slots=6\n"
    # mpi.go: a launcher run as a node takes one of the nodes, but never the last one.
    assert trainjob_mpi_hostfile(child, _mpi_runtime(runLauncherAsNode=True)) == "localhost slots=6\n"
    del child["spec"]["trainer"]["numProcPerNode"]
    assert trainjob_mpi_hostfile(child, _mpi_runtime(numProcPerNode=4)) == "localhost slots=8\n"


def test_the_mpi_launcher_gets_the_hostfile_but_not_the_trainer() -> None:
    child = _trainjob(2, 2, trainJob={"mlPolicy": "mpi"}, accelerator="xeon-cpu", phases=_phases(4))

    env = trainjob_mpi_launcher_env(child, _mpi_runtime(), "/tmp/hostfile")

    assert env == {
        "LAUNCHER_ONLY": "l",
        "OMPI_MCA_orte_default_hostfile": "/tmp/hostfile",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": "2",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
    }
    assert trainjob_mpi_launcher_command(child, _mpi_runtime()) == MPIRUN


def test_a_launcher_labelled_as_the_trainer_gets_the_trainer_env() -> None:
    child = _trainjob(2, 1, trainJob={"mlPolicy": "mpi"}, accelerator="xeon-cpu", phases=_phases(2))

    env = trainjob_mpi_launcher_env(child, _mpi_runtime(launcher_labels=ANCESTOR), "/h")

    assert env["OMPI_MCA_mca_base_env_list"] == "BERTJOB_NAME;BERTJOB_NAMESPACE;OMP_NUM_THREADS;SHARED"
    assert (env["OMP_NUM_THREADS"], env["SHARED"], env["OMPI_MCA_rmaps_base_mapping_policy"]) == (
        "4",
        "job",
        "socket",
    )
    assert "command" not in child["spec"]["trainer"]  # mpirun stays the launcher's command
    assert trainjob_mpi_launcher_command(child, _mpi_runtime(launcher_labels=ANCESTOR)) == MPIRUN


def test_runtime_patches_reach_the_launcher() -> None:
    child = _trainjob(2, 1, trainJob={"mlPolicy": "mpi"}, accelerator="xeon-cpu", phases=_phases(2))
    patch = {
        "manager": "someone",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        _replicated_job(
                            "launcher",
                            {},
                            "launcher",
                            env=[{"name": "PATCHED", "value": "p"}, {"name": "LAUNCHER_ONLY", "value": "x"}],
                        )
                    ]
                }
            }
        },
    }
    child["spec"]["runtimePatches"].append(patch)

    env = trainjob_mpi_launcher_env(child, _mpi_runtime(launcher_container="launcher"), "/h")

    assert (env["PATCHED"], env["LAUNCHER_ONLY"]) == ("p", "x")
    # The node pods (no torch policy here: no PET_*) get the trainer's env and not the launcher's patch.
    node = trainjob_node_env(child, _mpi_runtime(launcher_container="launcher"), 1)
    assert node == {var["name"]: var["value"] for var in child["spec"]["trainer"]["env"] if "value" in var}
    assert "PATCHED" not in node


def test_the_charts_launcher_container_gets_the_operators_patch_and_no_plugin_env() -> None:
    """The chart's launcher container is named launcher: Trainer v2's MPI plugin leaves it alone
    (the runtime mounts the hostfile itself, and mpirun names it), and the operator's runtime patch
    gives it the trainer's environment."""
    child = _trainjob(2, 1, trainJob={"mlPolicy": "mpi"}, accelerator="xeon-cpu", phases=_phases(2))
    runtime = _mpi_runtime(launcher_container="launcher")
    runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["command"] = ["mpirun", "--hostfile", "/etc/mpi/hostfile", "python"]

    env = trainjob_mpi_launcher_env(child, runtime, "/h")

    trainer = {var["name"]: var["value"] for var in child["spec"]["trainer"]["env"] if "value" in var}
    assert env == {"LAUNCHER_ONLY": "l", **trainer}
    assert trainjob_mpi_launcher_command(child, runtime, "/tmp/h") == [
        "mpirun",
        "--hostfile",
        "/tmp/h",
        "python",
    ]
